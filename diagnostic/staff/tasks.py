"""Celery tasks of the dashboard: the lab health poll Celery beat runs every
STAFF_LAB_HEALTH_INTERVAL_S, and rendering a report version off the request (the review
page follows it through its ReportRender row)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from diagnostic.staff.labhealth import poll_all_labs

log = logging.getLogger(__name__)


@shared_task(name="diagnostic.staff.tasks.poll_lab_health", ignore_result=True)
def poll_lab_health() -> list[str]:
    """Poll every lab; returns the labs whose poll failed (the lab unreachable, or the poll
    not completed), each recorded on its LabHealth row for the lab page. A lab's failed
    poll does not stop the others'."""
    return [str(h.lab_id) for h in poll_all_labs() if h.error]


def failure_text(exc: BaseException) -> str:
    """What the review page says of a failed render: the error's last line, with its kind."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    said = lines[-1] if lines else "no message"
    return f"{type(exc).__name__}: {said}"[:2000]


@shared_task(name="diagnostic.staff.tasks.render_report_version", ignore_result=True)
def render_report_version(job_id: str, render_id: int | None = None) -> str:
    """Write a new version of the job's report from its findings and the staff's edits,
    recording how it went on the ReportRender row `render_id` (made here when the request
    came without one): the version it made, or why it failed. A failure is recorded, not
    raised: the consultant reads it on the review page, where the render was asked for."""
    from diagnostic.jobs.models import DiagnosticJob
    from diagnostic.jobs.report_versions import render_version
    from diagnostic.staff.models import ReportRender

    job = DiagnosticJob.objects.select_related("booking__lab_day", "booking__organisation", "lab",
                                               "config").get(pk=job_id)
    row = (ReportRender.objects.filter(pk=render_id, job=job).first() if render_id is not None
           else None) or ReportRender.objects.create(job=job)
    ReportRender.objects.filter(pk=row.pk).update(state=ReportRender.State.RUNNING, started_at=timezone.now())
    before = set(job.report_versions.values_list("digest", flat=True))
    try:
        made = render_version(job).row
    except Exception as exc:
        log.exception("rendering a report version failed", extra={"job": job_id})
        ReportRender.objects.filter(pk=row.pk).update(
            state=ReportRender.State.FAILED, finished_at=timezone.now(), error=failure_text(exc))
        return ""
    ReportRender.objects.filter(pk=row.pk).update(
        state=ReportRender.State.DONE, finished_at=timezone.now(), digest=made.digest,
        new_version=made.digest not in before, pages=made.pages)
    return made.version
