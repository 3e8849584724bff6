"""Celery tasks of the dashboard: the lab health poll Celery beat runs every
STAFF_LAB_HEALTH_INTERVAL_S, and rendering a report version off the request."""

from __future__ import annotations

from celery import shared_task

from diagnostic.staff.labhealth import poll_all_labs


@shared_task(name="diagnostic.staff.tasks.poll_lab_health", ignore_result=True)
def poll_lab_health() -> list[str]:
    """Poll every lab; returns the labs whose poll failed (the lab unreachable, or the poll
    not completed), each recorded on its LabHealth row for the lab page. A lab's failed
    poll does not stop the others'."""
    return [str(h.lab_id) for h in poll_all_labs() if h.error]


@shared_task(name="diagnostic.staff.tasks.render_report_version", ignore_result=True)
def render_report_version(job_id: str) -> str:
    from diagnostic.jobs.models import DiagnosticJob
    from diagnostic.jobs.report import render_version

    job = DiagnosticJob.objects.select_related("booking__lab_day", "booking__organisation", "lab",
                                               "config").get(pk=job_id)
    return render_version(job).row.version
