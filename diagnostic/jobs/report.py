"""Report: the job's findings document, assembled from the stages before it, checked
against the schema, and written up as the PDF report (reports app), which also decides
the money-back flag. Emailing it waits for staff approval; `diagnose` writes the message
to a file instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from diagnostic.jobs.context import StageContext
from diagnostic.jobs.findings import SECTIONS, build_findings, validate_findings
from diagnostic.jobs.models import DiagnosticJob, record_report_version
from reports.email import build_report_email, write_eml
from reports.models import first_sent_at, overrides_for
from reports.report import render

# A job run without a booking (the demo, a consultant's `diagnose`) has no customer
# record; the report says so rather than naming anyone.
NO_BOOKING_CUSTOMER = "Reference configuration (no booking)"


def report_dir(job: DiagnosticJob) -> Path:
    return Path(settings.OUT_DIR) / "jobs" / str(job.pk)


def customer_name(job: DiagnosticJob) -> str:
    booking = job.booking
    if booking is None:
        return NO_BOOKING_CUSTOMER
    return booking.organisation.name


def run(ctx: StageContext) -> dict[str, Any]:
    job = ctx.job
    ctx.progress(10, "assembling findings")
    document = build_findings(job)
    validate_findings(document)
    ctx.progress(40, "rendering the PDF report")
    booking = job.booking
    rendered = render(
        document,
        report_dir(job),
        customer=customer_name(job),
        lab_day=booking.lab_day.date if booking is not None else None,
        overrides=overrides_for(str(job.pk)),
        sent_at=first_sent_at(str(job.pk)),
    )
    document["money_back"] = rendered.money_back.as_findings()
    # The portal shows a version once staff approve it (or PORTAL_AUTO_APPROVE does).
    record_report_version(job=job, digest=rendered.digest, pdf_path=str(rendered.pdf_path),
                          pages=rendered.pages)
    validate_findings(document)
    DiagnosticJob.objects.filter(pk=job.pk).update(findings=document)
    # The message staff will approve and send; until then it waits beside the PDF. Without
    # a booking it is addressed to the firm itself, as a draft.
    recipient = booking.customer.email if booking is not None and booking.customer.email else None
    message = build_report_email(document, rendered, customer=customer_name(job),
                                 to=[recipient or settings.DEFAULT_FROM_EMAIL],
                                 greeting=None if booking is not None else "Draft for review (no booking)")
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
