"""Report: the job's findings document, assembled from the stages before it, with the
staff's edits of finding titles, narratives and notes laid over it, checked against the
schema, and written up as the PDF report (reports app), which also decides the money-back
flag. Each distinct report is kept as a version (its PDF, the findings document it was
written from, and what the money-back rule was told) so staff can diff versions and send
the one they approved. Emailing waits for that approval; `diagnose` writes the message to
a file instead.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.utils import timezone

from diagnostic.jobs.findings_document import SECTIONS, build_findings, validate_findings
from diagnostic.jobs.models import DiagnosticJob, FindingEdit, JobEvent, ReportVersion, record_report_version
from diagnostic.jobs.stage_context import StageContext
from reports.email import build_report_email, write_eml
from reports.models import first_sent_at, overrides_for
from reports.moneyback import OverrideEntry, assess
from reports.render import RenderedReport, render, write_atomically

# A job run without a booking (the demo, a consultant's `diagnose`) has no customer
# record; the report says so rather than naming anyone.
NO_BOOKING_CUSTOMER = "Reference configuration (no booking)"
# Where a finding's consultant note goes in the findings document: the report prints
# evidence keys it has no special words for as labelled values ("Consultant note").
NOTE_KEY = "consultant_note"
VERSIONS = "versions"


def report_dir(job: DiagnosticJob) -> Path:
    return Path(settings.OUT_DIR) / "jobs" / str(job.pk)


def version_dir(job: DiagnosticJob, version: str) -> Path:
    return report_dir(job) / VERSIONS / version


def customer_name(job: DiagnosticJob) -> str:
    booking = job.booking
    if booking is None:
        return NO_BOOKING_CUSTOMER
    return booking.organisation.name


def lab_day(job: DiagnosticJob) -> dt.date | None:
    """The day the diagnostic ran: the booked lab day, or the later day a re-run after a
    lab fault ran on (the report is due one business day after the day that completed it)."""
    if job.booking is None:
        return None
    day: dt.date = job.booking.lab_day.date
    reruns = job.events.filter(kind=JobEvent.Kind.RETRIED).values_list("data", flat=True)
    for data in reruns:
        try:
            day = max(day, dt.date.fromisoformat(str((data or {}).get("rerun_on"))))
        except ValueError:
            continue
    return day


def current_edits(job: DiagnosticJob) -> dict[int, dict[str, str]]:
    """Finding id -> {field: its latest edited text}, for the fields staff edited."""
    latest: dict[int, dict[str, str]] = {}
    rows = FindingEdit.objects.filter(finding__job=job).order_by("edited_at", "id")
    for edit in rows.values("finding_id", "field", "after"):
        latest.setdefault(edit["finding_id"], {})[edit["field"]] = edit["after"]
    return latest


def apply_finding_edits(document: dict[str, Any], job: DiagnosticJob) -> dict[str, Any]:
    """Lay the staff's edits over the document's findings, in place: a title replaces the
    title, a narrative the evidence's summary (the paragraph the report opens the finding
    with), a note is added as `evidence.consultant_note`. Every measured value stays as the
    pipeline wrote it."""
    edits = current_edits(job)
    if not edits:
        return document
    rows = list(job.finding_set.order_by("id").values_list("id", "code"))
    entries = document.get("findings") or []
    if len(rows) != len(entries):
        raise ValueError(f"job {job.pk}: {len(entries)} findings in the document, {len(rows)} recorded")
    for (finding_id, code), entry in zip(rows, entries, strict=True):
        if entry.get("code") != code:
            raise ValueError(f"job {job.pk}: finding {finding_id} is {code}, "
                             f"the document has {entry.get('code')}")
        fields = edits.get(finding_id)
        if not fields:
            continue
        title = fields.get(FindingEdit.Field.TITLE, "").strip()
        if title:
            entry["title"] = title
        evidence = dict(entry.get("evidence") or {})
        if FindingEdit.Field.NARRATIVE in fields:
            evidence["summary"] = fields[FindingEdit.Field.NARRATIVE].strip()
        note = fields.get(FindingEdit.Field.NOTE, "").strip()
        if note:
            evidence[NOTE_KEY] = note
        else:
            evidence.pop(NOTE_KEY, None)
        entry["evidence"] = evidence
    return document


@dataclass(frozen=True)
class RenderedVersion:
    row: ReportVersion
    report: RenderedReport
    document: dict[str, Any]


def _entry_json(entry: OverrideEntry) -> dict[str, Any]:
    return {"eligible": entry.eligible, "reason": entry.reason, "by": entry.by, "at": entry.at.isoformat()}


def render_version(job: DiagnosticJob, *, as_of: dt.datetime | None = None) -> RenderedVersion:
    """Write the report as the job stands now, with the staff's edits, and keep it as a
    version: `versions/<version>/` holds its PDF, its findings document and the inputs of
    its money-back decision (so the email sent on approval says what the PDF says)."""
    document = apply_finding_edits(build_findings(job), job)
    validate_findings(document)
    now = as_of or timezone.now()
    sent_at = first_sent_at(str(job.pk))
    overrides = overrides_for(str(job.pk))
    day = lab_day(job)
    rendered = render(
        document, report_dir(job), customer=customer_name(job), lab_day=day,
        as_of=now, overrides=overrides, sent_at=sent_at,
    )
    document["money_back"] = rendered.money_back.as_findings()
    validate_findings(document)
    folder = version_dir(job, rendered.version)
    pdf = folder / "report.pdf"
    # A version's files are written once: the same report rendered again (same digest)
    # must not change what a customer may already have downloaded.
    if not pdf.exists():
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(folder / "findings.json",
                         (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8"))
        inputs = {"as_of": now.isoformat(), "sent_at": sent_at.isoformat() if sent_at else None,
                  "lab_day": day.isoformat() if day else None,
                  "overrides": [_entry_json(e) for e in overrides]}
        write_atomically(folder / "render.json", (json.dumps(inputs, indent=2) + "\n").encode("utf-8"))
        tmp = pdf.with_suffix(".pdf.tmp")
        shutil.copyfile(rendered.pdf_path, tmp)
        tmp.replace(pdf)
    row = record_report_version(job=job, digest=rendered.digest, pdf_path=str(pdf), pages=rendered.pages)
    return RenderedVersion(row, rendered, document)


def version_document(version: ReportVersion) -> dict[str, Any] | None:
    """The findings document a version was written from (None for a version from before
    versions kept their documents)."""
    path = Path(version.pdf_path).parent / "findings.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text("utf-8"))
    return data if isinstance(data, dict) else None


def recipients(job: DiagnosticJob) -> list[str]:
    """The booking's contacts: the customer who booked, then the other members of the
    organisation with an address; a job without a booking goes to the firm itself."""
    booking = job.booking
    if booking is None:
        return [settings.DEFAULT_FROM_EMAIL]
    addresses = [booking.customer.email] if booking.customer.email else []
    for member in booking.organisation.customers.select_related("user").order_by("user__date_joined"):
        email = member.user.email
        if email and member.user.is_active and email not in addresses:
            addresses.append(email)
    return addresses or [settings.DEFAULT_FROM_EMAIL]


def version_message(version: ReportVersion, to: list[str]) -> EmailMultiAlternatives:
    """The report-ready email of one kept version: its PDF attached, its money-back verdict
    recomputed from the very inputs its PDF was written with."""
    folder = Path(version.pdf_path).parent
    document = version_document(version)
    if document is None:
        raise FileNotFoundError(f"report version {version.version} has no findings document in {folder}")
    inputs = json.loads((folder / "render.json").read_text("utf-8"))
    overrides = [
        OverrideEntry(eligible=bool(o["eligible"]), reason=str(o["reason"]), by=str(o["by"]),
                      at=dt.datetime.fromisoformat(o["at"]))
        for o in inputs.get("overrides") or []
    ]
    decision = assess(
        document,
        lab_day=dt.date.fromisoformat(inputs["lab_day"]) if inputs.get("lab_day") else None,
        sent_at=dt.datetime.fromisoformat(inputs["sent_at"]) if inputs.get("sent_at") else None,
        as_of=dt.datetime.fromisoformat(inputs["as_of"]),
        overrides=overrides,
    )
    report = RenderedReport(Path(version.pdf_path), version.digest, version.pages, decision, (), {})
    job = version.job
    return build_report_email(document, report, customer=customer_name(job), to=to,
                              greeting=greeting(job))


def greeting(job: DiagnosticJob) -> str:
    """How the report email opens: the person who booked, by name when we have one (the
    organisation's name is no one to write to)."""
    booking = job.booking
    if booking is None:
        return "Draft for review (no booking)"
    person = booking.customer
    name = person.get_full_name().strip() or person.first_name.strip()
    return f"Dear {name}" if name else "Hello"


def run(ctx: StageContext) -> dict[str, Any]:
    job = ctx.job
    ctx.progress(10, "assembling findings and rendering the PDF report")
    made = render_version(job)
    rendered, document = made.report, made.document
    DiagnosticJob.objects.filter(pk=job.pk).update(findings=document)
    # The message staff will approve and send; until then it waits beside the PDF. Without
    # a booking it is addressed to the firm itself, as a draft.
    message = build_report_email(document, rendered, customer=customer_name(job), to=recipients(job),
                                 greeting=greeting(job))
    eml = write_eml(message, report_dir(job) / "email.eml")
    present = [name for name in SECTIONS if document[name] is not None]
    ctx.progress(100, f"report: {rendered.pages} pages, {len(document['findings'])} findings")
    return {
        "findings": len(document["findings"]),
        "sections_present": present,
        "report_pdf": str(rendered.pdf_path),
        "email_eml": str(eml),
        "report_version": rendered.version,
        "pages": rendered.pages,
        "money_back": document["money_back"],
        "render_seconds": {k: round(v, 3) for k, v in rendered.seconds.items()},
    }
