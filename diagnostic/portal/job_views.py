"""Portal views of a diagnostic job: its page, the stage table the page polls for, and
the downloads (report PDF, tuned configuration, tuned launch command, the diff) that exist
once staff approved a report. While the day runs the page says which stage runs, in words,
how far it is and when the day should end; once it ended, what the approved report says."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from diagnostic.jobs.budget import RESERVE_LAB_S
from diagnostic.jobs.models import DiagnosticJob, StageRun
from diagnostic.portal.deliverables import approved_versions, report_file, results, tuned_files
from diagnostic.portal.scoping import customer_required, get_job_for_customer

STOPPED = (StageRun.Status.STOPPED, StageRun.Status.FAILED, StageRun.Status.QUARANTINED)
STAGE_WORDS = {
    "pending": "waiting",
    "running": "running",
    "succeeded": "done",
    "stopped": "stopped the day",
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
    return {"stage": stage.name, "title": stage_title(stage.name),
            "reason": reason or "the stage could not complete"}


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


# Each stage as the customer reads it: what it does, in their words.
STAGE_TITLES = {
    "preflight": "Checking the lab",
    "reproduce": "Reproducing your configuration",
    "triage": "Finding where the cold start goes",
    "fp4": "Checking the FP4 kernels and their output",
    "specdec": "Tuning speculative decoding",
    "gap": "Comparing with the lab's best configuration",
    "measure": "Measuring the tuned configuration",
    "report": "Writing the report",
}
STAGE_DETAILS = {
    "preflight": "the nodes, the network, the model files and the engine release",
    "reproduce": "your engine started as you run it: its true cold start and decode rate",
    "triage": "each step of the cold start measured and attributed",
    "fp4": "the FP4 backends your engine offers, checked for correct output and speed",
    "specdec": "drafting methods and lengths screened and the best confirmed",
    "gap": "each difference from the lab's best configuration measured",
    "measure": "the tuned configuration started cold and measured like yours",
    "report": "the findings, the PDF and the tuned files",
}


def stage_title(name: str) -> str:
    return STAGE_TITLES.get(name, name.replace("_", " ").capitalize())


def _dilation(stages: list[StageRun], job: DiagnosticJob) -> float | None:
    """Lab seconds per wall second: the lab's, as preflight read it from its inventory; 1 for
    a real lab; None for a simulated lab whose preflight has not said yet."""
    for s in stages:
        if s.name == "preflight" and isinstance(s.result, dict):
            value = s.result.get("lab_dilation")
            if isinstance(value, int | float) and value > 0:
                return float(value)
    booking = job.booking
    lab = booking.lab_day.lab if booking is not None and booking.lab_day.lab_id == job.lab_id else None
    if lab is not None and not lab.is_simulated:
        return 1.0
    return None


def wall_words(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    if minutes < 60:
        return f"about {minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"about {hours} h {rest:02d} min" if rest else f"about {hours} h"


def day_estimate(job: DiagnosticJob, stages: list[StageRun],
                 now: dt.datetime | None = None) -> dict[str, Any] | None:
    """When the day should end: the lab time the stages still to run take on the reference
    lab (budget.RESERVE_LAB_S, what each needs), less what the running one has spent, capped
    by the day's budget, turned into wall time by the lab's dilation. None once it ended or
    before it started."""
    if job.is_terminal or job.is_held or job.started_at is None:
        return None
    moment = now or timezone.now()
    dilation = _dilation(stages, job)
    left = 0.0
    spent = 0.0
    for s in stages:
        reserve = RESERVE_LAB_S.get(s.name, 60.0)
        if s.status == StageRun.Status.RUNNING:
            ran = (moment - s.started_at).total_seconds() * (dilation or 1.0) if s.started_at else 0.0
            spent += ran
            left += max(reserve - ran, reserve * (100 - s.progress_percent) / 100 * 0.25, 0.05 * reserve)
        elif s.status == StageRun.Status.PENDING:
            left += reserve
        else:
            spent += s.lab_seconds or 0.0
    budget = job.budget_lab_s if job.budget_lab_s is not None else settings.DIAG_DAY_BUDGET_LAB_S
    left = max(0.0, min(left, float(budget) - spent)) if budget else left
    if dilation is None:
        return {"known": False, "lab_left": lab_duration(left)}
    wall = left / dilation
    end = timezone.localtime(moment + dt.timedelta(seconds=wall))
    return {"known": True, "lab_left": lab_duration(left), "wall_left": wall_words(wall),
            "end": f"{end:%H:%M} UTC" + ("" if end.date() == timezone.localdate(moment) else f" on {end:%A}"),
            "simulated": dilation != 1.0}


def _summary(s: StageRun, held: bool) -> str:
    """A stage's last word: while it runs, its progress; once done, its outcome when it set
    one (a finished stage's last progress line would be stale: "writing the FP4 section")."""
    if held and not s.is_done:
        return "paused: our lab had a fault"
    if s.status == StageRun.Status.RUNNING:
        return s.progress_message
    if s.status == StageRun.Status.PENDING:
        return s.status_message or STAGE_DETAILS.get(s.name, "")
    message = s.status_message
    if message.startswith("not run: "):
        return "not run: " + message.removeprefix("not run: ")
    if s.status == StageRun.Status.SUCCEEDED:
        return message or STAGE_DETAILS.get(s.name, "")
    return message or _first_line(s.last_error)


def _stage_context(job: DiagnosticJob) -> dict[str, Any]:
    stages = list(job.stage_runs.order_by("order"))
    held = job.is_held
    rows = [
        {
            "name": s.name,
            "title": stage_title(s.name),
            "state": STAGE_WORDS.get(s.status, s.status),
            "status": s.status,
            "lab_time": lab_duration(s.lab_seconds),
            "summary": _summary(s, held),
            "progress": s.progress_percent,
        }
        for s in stages
    ]
    current = next((r for r in rows if r["status"] == StageRun.Status.RUNNING), None)
    if current is None and job.status == DiagnosticJob.Status.RUNNING:
        current = next((r for r in rows if r["status"] == StageRun.Status.PENDING), None)
    total = sum(s.lab_seconds or 0 for s in stages)
    waiting = job.waits_for_lab_day()
    done = sum(1 for s in stages if s.is_done)
    return {
        "job": job,
        "waiting_for": job.booking.lab_day if waiting and job.booking is not None else None,
        "held_by_closed_day": job.booking.lab_day if job.held_by_closed_day and job.booking else None,
        "can_change_booking": waiting and job.booking is not None and job.booking.can_change(),
        "stages": rows,
        "current": current,
        "stage_number": (rows.index(current) + 1) if current else 0,
        "stages_done": done,
        "estimate": day_estimate(job, stages),
        "lab_total": lab_duration(total) if total else "",
        "stopped_by": _stopped_by(job, stages) if job.is_terminal else None,
        "lab_fault": lab_fault_words(job) if held else None,
        "poll_ms": 0 if job.is_terminal else settings.PORTAL_POLL_MS,
    }


def _with_reports(job: DiagnosticJob, context: dict[str, Any]) -> dict[str, Any]:
    """The approved versions and, once the job ended, what the latest says."""
    versions = list(approved_versions(job))
    context["reports"] = versions
    context["results"] = results(versions[-1]) if versions and job.is_terminal else None
    return context


@customer_required
def job_detail(request: HttpRequest, job_id: str) -> HttpResponse:
    job = get_job_for_customer(request, job_id)
    return render(request, "portal/job.html", _with_reports(job, _stage_context(job)))


@customer_required
def job_stages(request: HttpRequest, job_id: str) -> HttpResponse:
    job = get_job_for_customer(request, job_id)
    response = render(request, "portal/_stages.html", _with_reports(job, _stage_context(job)))
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


TUNED_FILES = {
    "yaml": ("tuned-config-{id}.yaml", "application/yaml; charset=utf-8"),
    "command": ("tuned-command-{id}.txt", "text/plain; charset=utf-8"),
    "diff": ("tuned-{id}.diff", "text/x-diff; charset=utf-8"),
}


def _tuned_download(request: HttpRequest, job_id: str, which: str) -> HttpResponse:
    """One of the tuned files, as the latest approved report states it; they come with the
    approved report, not before."""
    job = get_job_for_customer(request, job_id)
    versions = list(approved_versions(job))
    if not versions:
        raise Http404("the tuned configuration comes with the approved report")
    name, content_type = TUNED_FILES[which]
    response = HttpResponse(tuned_files(job, versions[-1])[which], content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{name.format(id=str(job.pk)[:8])}"'
    return response


@customer_required
def job_tuned_config(request: HttpRequest, job_id: str) -> HttpResponse:
    return _tuned_download(request, job_id, "yaml")


@customer_required
def job_tuned_command(request: HttpRequest, job_id: str) -> HttpResponse:
    return _tuned_download(request, job_id, "command")


@customer_required
def job_tuned_diff(request: HttpRequest, job_id: str) -> HttpResponse:
    return _tuned_download(request, job_id, "diff")
