"""Portal views of a diagnostic job: its page, the stage table the page polls for, and
the downloads (report PDF, tuned configuration) that exist once staff approved a report."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from diagnostic.jobs.models import DiagnosticJob, StageRun
from diagnostic.portal.deliverables import approved_versions, report_file, tuned_configuration_yaml
from diagnostic.portal.scoping import customer_required, get_job_for_customer

STOPPED = (StageRun.Status.FAILED, StageRun.Status.QUARANTINED)
STAGE_WORDS = {
    "pending": "waiting",
    "running": "running",
    "succeeded": "done",
    "failed": "failed",
    "quarantined": "stopped",
    "cancelled": "cancelled",
}


def lab_duration(seconds: float | None) -> str:
    """Lab time as people say it: 14 s, 10 min 5 s, 1 h 20 min."""
    if seconds is None:
        return "—"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _stopped_by(job: DiagnosticJob, stages: list[StageRun]) -> dict[str, str] | None:
    """The stage that stopped the job and why, in the words a customer can read."""
    stage = next((s for s in stages if s.status in STOPPED), None)
    if stage is None:
        return None
    blocking = job.finding_set.filter(blocking=True).order_by("id").first()
    reason = (blocking.title if blocking else "") or stage.status_message or _first_line(stage.last_error)
    return {"stage": stage.name, "reason": reason or "the stage could not complete"}


NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                "eleven", "twelve")


def _count(n: int) -> str:
    return NUMBER_WORDS[n] if 0 <= n < len(NUMBER_WORDS) else str(n)


def lab_fault_words(job: DiagnosticJob) -> dict[str, str]:
    """A held day as the customer is told it: that our lab had a fault, in plain words and
    nothing internal (no node names, addresses, ports or paths), and that the day is re-run
    at no cost, by when."""
    fault = job.fault or {}
    nodes = len(fault.get("nodes") or [])
    total = job.lab.nodes.count()  # mirrored from the inventory; 0 when not known yet
    ours = f"our {_count(total)} nodes" if total > nodes else "our nodes"
    if nodes == 1:
        where = f"one of {ours}"
    elif nodes > 1:
        where = f"{_count(nodes)} of {ours}"
    else:
        where = "our lab"
    what = "stopped answering" if fault.get("what") in ("node_unreachable", "ssh", "agent_failed") \
        else "had a fault"
    money = (job.findings or {}).get("money_back") or {}
    try:
        by = dt.date.fromisoformat(str(money.get("rerun_by")))
    except ValueError:
        rerun_by = ""
    else:
        rerun_by = f"{by:%A} {by.day} {by:%B %Y}"
    return {"what": f"{where[0].upper()}{where[1:]} {what} during your diagnostic.", "rerun_by": rerun_by}


def _stage_context(job: DiagnosticJob) -> dict[str, Any]:
    stages = list(job.stage_runs.order_by("order"))
    held = job.is_held
    rows = [
        {
            "name": s.name,
            "state": STAGE_WORDS.get(s.status, s.status),
            "status": s.status,
            "lab_time": lab_duration(s.lab_seconds),
            # A stage's last word: while it runs, its progress; once done, its outcome when
            # it set one, else its last progress line.
            "summary": "paused: our lab had a fault" if held and not s.is_done
            else (s.status_message or s.progress_message)
            if s.is_done
            else (s.progress_message or s.status_message),
            "progress": s.progress_percent,
        }
        for s in stages
    ]
    total = sum(s.lab_seconds or 0 for s in stages)
    waiting = job.waits_for_lab_day()
    return {
        "job": job,
        "waiting_for": job.booking.lab_day if waiting and job.booking is not None else None,
        "held_by_closed_day": job.booking.lab_day if job.held_by_closed_day and job.booking else None,
        "can_change_booking": waiting and job.booking is not None and job.booking.can_change(),
        "stages": rows,
        "lab_total": lab_duration(total) if total else "",
        "stopped_by": _stopped_by(job, stages) if job.is_terminal else None,
        "lab_fault": lab_fault_words(job) if held else None,
        "poll_ms": 0 if job.is_terminal else settings.PORTAL_POLL_MS,
    }


@customer_required
def job_detail(request: HttpRequest, job_id: str) -> HttpResponse:
    job = get_job_for_customer(request, job_id)
    context = _stage_context(job)
    context["reports"] = list(approved_versions(job))
    return render(request, "portal/job.html", context)


@customer_required
def job_stages(request: HttpRequest, job_id: str) -> HttpResponse:
    job = get_job_for_customer(request, job_id)
    context = _stage_context(job)
    context["reports"] = list(approved_versions(job))
    response = render(request, "portal/_stages.html", context)
    response["Cache-Control"] = "no-store"
    return response


@customer_required
def job_report(request: HttpRequest, job_id: str) -> FileResponse:
    job = get_job_for_customer(request, job_id)
    versions = list(approved_versions(job))
    wanted = request.GET.get("version", "")
    chosen = (
        next((v for v in versions if v.version == wanted), None)
        if wanted
        else (versions[-1] if versions else None)
    )
    path = report_file(chosen) if chosen is not None else None
    if path is None:
        raise Http404("no approved report for this job yet")
    name = f"diagnostic-report-{str(job.pk)[:8]}-{chosen.version}.pdf"  # type: ignore[union-attr]
    return FileResponse(path.open("rb"), content_type="application/pdf", as_attachment=True, filename=name)


@customer_required
def job_tuned_config(request: HttpRequest, job_id: str) -> HttpResponse:
    job = get_job_for_customer(request, job_id)
    if not approved_versions(job).exists():
        raise Http404("the tuned configuration comes with the approved report")
    response = HttpResponse(tuned_configuration_yaml(job), content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="tuned-config-{str(job.pk)[:8]}.yaml"'
    return response
