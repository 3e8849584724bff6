"""The one email module: the report-ready message to the customer, with the PDF attached.

`build_report_email` makes the message from templates (text and HTML bodies);
`send_report_email` sends it through Django's configured backend (SMTP in a deployment)
at most once per report version, using `ReportEmail`'s atomic claim; `write_eml` saves a
message as a .eml file, which is what `diagnose` and `make demo` do instead of sending.
`deliver_report` is the email stage end to end: render the current version, then send it.
"""

from __future__ import annotations

import logging
import smtplib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.utils import make_msgid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection
from django.core.mail.backends.base import BaseEmailBackend
from django.template import Context

from reports import content
from reports.render import RenderedReport, render, template_engine, write_atomically
from reports.sections.appendices import summary_change_rows
from reports.sections.findings import by_impact
from reports.sections.gap import summary_changes

log = logging.getLogger(__name__)

TEXT_TEMPLATE = "email/report_ready.txt"
HTML_TEMPLATE = "email/report_ready.html"


class ReportEmailError(RuntimeError):
    """The message could not be handed to the mail server; the claim is released for a retry."""


def _context(findings: Mapping[str, Any], report: RenderedReport, customer: str) -> dict[str, Any]:
    job = findings.get("job") or {}
    lab, lab_note = content.lab_description(job)
    ordered = by_impact([f for f in findings.get("findings") or [] if isinstance(f, Mapping)])
    numbers: dict[str, list[str]] = {}
    for i, f in enumerate(ordered, start=1):
        numbers.setdefault(str(f.get("code") or "unclassified"), []).append(f"2.{i}")
    # The same list as the summary page, from the same rows.
    changes = summary_changes(summary_change_rows(findings, {c: ", ".join(n) for c, n in numbers.items()}))
    return {
        "changes": changes,
        "customer": customer,
        "job_id": job.get("id", ""),
        "version": report.version,
        "pages": report.pages,
        "lab": lab,
        "lab_note": lab_note,
        "summary": content.summary_rows(findings),
        # In the report's own order (blocking first, then by the size of the measured change).
        "findings": [
            str(f.get("title") or f.get("code"))
            for f in by_impact([f for f in findings.get("findings") or [] if isinstance(f, Mapping)])
        ],
        "money_back_free": report.money_back.eligible,
        "money_back_reason": report.money_back.reason,
    }


def attachment_name(findings: Mapping[str, Any]) -> str:
    """The PDF's file name as the customer sees it."""
    job_id = str((findings.get("job") or {}).get("id") or "report")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in job_id)
    return f"diagnostic-findings-{safe}.pdf"


def build_report_email(
    findings: Mapping[str, Any],
    report: RenderedReport,
    *,
    customer: str,
    to: Sequence[str],
    from_email: str | None = None,
    greeting: str | None = None,
) -> EmailMultiAlternatives:
    """The report-ready message: summary figures in the body, the PDF attached. `greeting`
    opens it (default "Dear <customer>"), for a draft addressed to the firm itself."""
    if not to:
        raise ValueError("to: at least one recipient address is required for the report email")
    engine = template_engine()
    ctx = {**_context(findings, report, customer), "greeting": greeting or f"Dear {customer}"}
    text = engine.get_template(TEXT_TEMPLATE).render(Context(ctx, autoescape=False, use_l10n=False))
    html = engine.get_template(HTML_TEMPLATE).render(Context(ctx, use_l10n=False))
    sender = from_email or str(getattr(settings, "DEFAULT_FROM_EMAIL", "diagnostic@localhost"))
    domain = sender.rsplit("@", 1)[-1] if "@" in sender else "localhost"
    message = EmailMultiAlternatives(
        subject=f"Your serving diagnostic findings (job {ctx['job_id']})",
        body=text,
        from_email=sender,
        to=list(to),
        headers={
            "Message-ID": make_msgid(idstring=report.version, domain=domain),
            "X-Report-Version": report.digest,
        },
    )
    message.attach_alternative(html, "text/html")
    message.attach(attachment_name(findings), report.pdf_path.read_bytes(), "application/pdf")
    return message


def write_eml(message: EmailMultiAlternatives, path: Path) -> Path:
    """Save the message as an .eml file (what the demo and `diagnose` do instead of sending),
    atomically: a failed write leaves no truncated message at `path`."""
    return write_atomically(path, message.message().as_bytes())


def send_report_email(
    message: EmailMultiAlternatives,
    *,
    job_id: str,
    report_digest: str,
    connection: BaseEmailBackend | None = None,
) -> bool:
    """Send the message unless this report version was already sent (or is being sent).

    Returns True when this call sent it, False when another run had. Raises
    ReportEmailError when the mail server refused or could not be reached; the claim is
    then released so that the next run tries again.
    """
    from reports.models import ReportEmail

    claim = ReportEmail.claim(job_id=job_id, report_digest=report_digest, recipients=list(message.to))
    if claim is None:
        log.info("report email already sent or in flight job=%s version=%s", job_id, report_digest[:12])
        return False
    try:
        message.connection = connection or get_connection(fail_silently=False)
        message.send(fail_silently=False)
    except (smtplib.SMTPException, OSError) as exc:
        claim.mark_failed(f"{type(exc).__name__}: {exc}")
        host = f"{getattr(settings, 'EMAIL_HOST', '?')}:{getattr(settings, 'EMAIL_PORT', '?')}"
        raise ReportEmailError(
            f"the report email for job {job_id} could not be sent via {host}: {exc}; check EMAIL_URL or "
            "EMAIL_HOST/EMAIL_PORT and the server's log; the next run will try again"
        ) from exc
    _record_sent(claim, str(message.extra_headers.get("Message-ID", "")))
    log.info("report email sent job=%s version=%s to=%s", job_id, report_digest[:12], ",".join(message.to))
    return True


# How long the record of a sent message waits out a database that is away. The message
# has gone: a claim left "sending" would be taken over after its lease and the customer
# would get the same report twice, so this write is worth waiting for.
SENT_RECORD_WAIT_S = 120.0


def _record_sent(claim: Any, message_id: str, *, wait_s: float = SENT_RECORD_WAIT_S) -> None:
    from django.db import InterfaceError, OperationalError, connection

    deadline = time.monotonic() + wait_s
    pause = 0.25
    while True:
        try:
            claim.mark_sent(message_id)
            return
        except (OperationalError, InterfaceError):
            if connection.in_atomic_block or time.monotonic() + pause > deadline:
                log.error("report email sent but not recorded: the database is unreachable job=%s",
                          claim.job_id)
                raise
            log.warning("report email sent; waiting for the database to record it job=%s", claim.job_id)
            connection.close()
            time.sleep(pause)
            pause = min(2 * pause, 5.0)


@dataclass(frozen=True)
class Delivery:
    report: RenderedReport
    sent: bool


def deliver_report(
    findings: Mapping[str, Any],
    out_dir: Path,
    *,
    customer: str,
    to: Sequence[str],
    **render_options: Any,
) -> Delivery:
    """The email stage: render the report as it stands now (staff overrides and the first
    send time from the database), then email it once per version."""
    from reports.models import first_sent_at, overrides_for

    job_id = str((findings.get("job") or {}).get("id") or "")
    if not job_id:
        raise ValueError("findings job.id is required to deliver a report (it keys the sent-once record)")
    report = render(
        findings,
        out_dir,
        customer=customer,
        overrides=overrides_for(job_id),
        sent_at=first_sent_at(job_id),
        **render_options,
    )
    message = build_report_email(findings, report, customer=customer, to=to)
    sent = send_report_email(message, job_id=job_id, report_digest=report.digest)
    return Delivery(report=report, sent=sent)
