"""Telling the lab's contact at once when a lab fault holds a day: which job, which lab
day, what stopped it and where, and the staff page to re-run it from."""

from __future__ import annotations

from django.conf import settings
from django.core.mail import send_mail

from diagnostic.jobs.models import DiagnosticJob


def lab_contact(job: DiagnosticJob) -> str:
    """Who hears about the lab's faults: the lab's own contact, else DIAG_LAB_CONTACT_EMAIL."""
    return job.lab.contact_email or settings.DIAG_LAB_CONTACT_EMAIL


def lab_fault_email(job_id: str) -> int:
    """Send the lab contact the held job's fault; returns the number of messages sent."""
    job = DiagnosticJob.objects.select_related("lab", "booking__lab_day", "organisation").get(pk=job_id)
    fault = job.fault or {}
    day = job.booking.lab_day.date.isoformat() if job.booking is not None else "no booking"
    evidence = fault.get("evidence") or {}
    lines = [
        f"A lab fault stopped diagnostic {job.pk} on lab {job.lab.name} (lab day {day}, "
        f"{job.organisation}).",
        "",
        f"What: {fault.get('summary') or job.status_message}",
        f"Stage: {fault.get('stage', '?')}",
        f"Nodes: {', '.join(fault.get('nodes') or []) or 'the lab as a whole'}",
        f"Error: {fault.get('message', '')}",
    ]
    per_node = evidence.get("nodes") if isinstance(evidence, dict) else None
    if isinstance(per_node, dict):
        lines += [f"  {name}: {why}" for name, why in sorted(per_node.items())]
    lines += [
        "",
        "The day is held: no report goes to the customer, who is told the day will be re-run at no cost.",
        "Once the lab is healthy, re-run it from the stage that stopped, or move it to another free lab day:",
        f"{settings.SITE_URL.rstrip('/')}/staff/jobs/{job.pk}/",
    ]
    return send_mail(
        subject=f"[lab fault] {job.lab.name}: diagnostic held ({fault.get('summary') or 'lab fault'})",
        message="\n".join(lines),
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[lab_contact(job)],
    )
