"""Staff views of jobs: the list (filters, search, rows refreshed in place), a job's page
(stage timeline, plots, actions behind a confirmation page) and a stage's log, which the
page follows while the stage runs."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from diagnostic.bookings.models import Lab, Organisation
from diagnostic.jobs.models import DiagnosticJob, ReportVersion, StageRun
from diagnostic.portal.job_views import STAGE_WORDS, lab_duration
from diagnostic.staff import actions, plots
from diagnostic.staff.access import abilities, staff_group_required, staff_required
from diagnostic.staff.review import is_late
from reports.models import ReportEmail

PAGE_ROWS = 100


def get_job(job_id: Any) -> DiagnosticJob:
    """Any job by id (staff see every organisation's), or 404."""
    try:
        return DiagnosticJob.objects.select_related(
            "lab", "config", "organisation", "booking__lab_day", "booking__organisation"
        ).get(pk=job_id)
    except (DiagnosticJob.DoesNotExist, ValueError):
        raise Http404("no such job") from None


def age(moment: dt.datetime, now: dt.datetime) -> str:
    seconds = max(0.0, (now - moment).total_seconds())
    return lab_duration(seconds)


def filtered_jobs(request: HttpRequest) -> tuple[QuerySet[DiagnosticJob], dict[str, str]]:
    chosen = {k: request.GET.get(k, "").strip() for k in ("state", "lab", "date", "customer", "q")}
    jobs = DiagnosticJob.objects.select_related("lab", "organisation", "booking__lab_day")
    if chosen["state"]:
        jobs = jobs.filter(status=chosen["state"])
    if chosen["lab"].isdigit():
        jobs = jobs.filter(lab_id=int(chosen["lab"]))
    if chosen["customer"].isdigit():
        jobs = jobs.filter(organisation_id=int(chosen["customer"]))
    if chosen["date"]:
        try:
            day = dt.date.fromisoformat(chosen["date"])
        except ValueError:
            chosen["date"] = ""
        else:
            jobs = jobs.filter(Q(booking__lab_day__date=day) | Q(created_at__date=day))
    if chosen["q"]:
        q = chosen["q"]
        jobs = jobs.filter(
            Q(id__istartswith=q) | Q(organisation__name__icontains=q) | Q(lab__name__icontains=q)
            | Q(config__label__icontains=q) | Q(status_message__icontains=q)
        ) if len(q) < 60 else jobs.none()
    return jobs.order_by("-created_at"), chosen


def job_rows(jobs: QuerySet[DiagnosticJob]) -> list[dict[str, Any]]:
    now = timezone.now()
    page = list(jobs[:PAGE_ROWS])
    stages: dict[Any, list[StageRun]] = {}
    for stage in StageRun.objects.filter(job__in=page).order_by("job", "order"):
        stages.setdefault(stage.job_id, []).append(stage)
    # What the customer has of each job's report: one query each, not one per row.
    versions: dict[Any, list[Any]] = {}
    for job_id, approved in ReportVersion.objects.filter(job__in=page).values_list("job_id", "approved_at"):
        versions.setdefault(job_id, []).append(approved)
    sent = set(ReportEmail.objects.filter(job_id__in=[str(j.pk) for j in page],
                                          state=ReportEmail.State.SENT).values_list("job_id", flat=True))
    rows = []
    for job in page:
        mine = stages.get(job.pk, [])
        current = next((s for s in mine if s.status == StageRun.Status.RUNNING), None) or next(
            (s for s in mine if s.status == StageRun.Status.PENDING), None
        )
        done = sum(1 for s in mine if s.is_done)
        rows.append({
            "job": job,
            "customer": job.organisation.name,
            "current": current,
            "current_state": STAGE_WORDS.get(current.status, current.status) if current else "",
            "done": done,
            "total": len(mine),
            "lab_time": lab_duration(sum(s.lab_seconds or 0 for s in mine)),
            "age": age(job.created_at, now),
            "late": job.booking_id is not None and job.is_terminal and is_late(job, now),
            "lab_day": job.booking.lab_day.date if job.booking is not None else None,
            "report": report_state(job, versions.get(job.pk, []), str(job.pk) in sent),
            "ended": (job.status_message or "").split(": ", 1)[-1][:120] if job.is_terminal else "",
        })
    return rows


def report_state(job: DiagnosticJob, approvals: list[Any], sent: bool) -> str:
    """The report as the list shows it: none yet, awaiting approval, approved, sent."""
    if job.is_held:
        return "none: held"
    if not approvals:
        return "none yet" if not job.is_terminal else "not written"
    if sent:
        return "sent"
    return "approved" if any(approvals) else "awaiting approval"


def _list_context(request: HttpRequest) -> dict[str, Any]:
    jobs, chosen = filtered_jobs(request)
    return {
        "rows": job_rows(jobs),
        "chosen": chosen,
        "query": request.GET.urlencode(),
        "states": DiagnosticJob.Status.choices,
        "labs": Lab.objects.order_by("name"),
        "customers": Organisation.objects.order_by("name"),
        "poll_ms": settings.STAFF_POLL_MS,
    }


@staff_required
def job_list(request: HttpRequest) -> HttpResponse:
    return render(request, "staff/jobs.html", _list_context(request))


@staff_required
def job_list_rows(request: HttpRequest) -> HttpResponse:
    response = render(request, "staff/_job_rows.html", _list_context(request))
    response["Cache-Control"] = "no-store"
    return response


def _timeline(job: DiagnosticJob) -> list[dict[str, Any]]:
    now = timezone.now()
    rows = []
    for s in job.stage_runs.order_by("order"):
        lease_live = bool(s.lease_owner and s.lease_expires_at and s.lease_expires_at > now)
        rows.append({
            "stage": s,
            "state": STAGE_WORDS.get(s.status, s.status),
            "lab_time": lab_duration(s.lab_seconds),
            "lease": s.lease_owner if lease_live else "",
            "summary": (s.status_message or s.progress_message) if s.is_done
            else (s.progress_message or s.status_message),
            "retryable": actions.retryable(s),
            "error": s.last_error.strip().splitlines()[-1] if s.last_error.strip() else "",
        })
    return rows


def _job_context(request: HttpRequest, job: DiagnosticJob) -> dict[str, Any]:
    return {
        "job": job,
        "timeline": _timeline(job),
        "lab_total": lab_duration(sum(s.lab_seconds or 0 for s in job.stage_runs.all())),
        "poll_ms": 0 if job.is_terminal else settings.STAFF_POLL_MS,
        **abilities(request),
    }


@staff_required
def job_detail(request: HttpRequest, job_id: Any) -> HttpResponse:
    job = get_job(job_id)
    context = _job_context(request, job)
    reproduce = job.stage_runs.filter(name="reproduce").values_list("result", flat=True).first()
    cold_start = (job.findings or {}).get("cold_start") if isinstance(job.findings, dict) else None
    if cold_start is None and isinstance(reproduce, dict):
        cold_start = (reproduce.get("sections") or {}).get("cold_start")
    context.update(
        telemetry=plots.telemetry_charts(reproduce if isinstance(reproduce, dict) else None),
        waterfall=plots.cold_start_waterfall(cold_start),
        reproduced_s=reproduce.get("cold_start_s") if isinstance(reproduce, dict) else None,
        versions=list(job.report_versions.order_by("created_at", "id")),
        events=list(job.events.select_related("actor").order_by("-at", "-id")[:50]),
        lab_conditions=_lab_conditions(job),
        late=job.booking_id is not None and is_late(job),
    )
    return render(request, "staff/job.html", context)


def _lab_conditions(job: DiagnosticJob) -> list[dict[str, Any]]:
    """What preflight noted about the lab (staff facts, each once with its nodes)."""
    result = job.stage_runs.filter(name="preflight").values_list("result", flat=True).first()
    found = result.get("lab_conditions") if isinstance(result, dict) else None
    return [c for c in found or [] if isinstance(c, dict)]


@staff_required
def job_timeline(request: HttpRequest, job_id: Any) -> HttpResponse:
    job = get_job(job_id)
    response = render(request, "staff/_timeline.html", _job_context(request, job))
    response["Cache-Control"] = "no-store"
    return response


@staff_required
def stage_log(request: HttpRequest, job_id: Any, stage: str) -> HttpResponse:
    job = get_job(job_id)
    run = job.stage_runs.filter(name=stage).first()
    if run is None:
        raise Http404("no such stage")
    if request.GET.get("format") == "json":
        try:
            since = max(0, int(request.GET.get("since", "0")))
        except ValueError:
            since = 0
        text = run.log
        # The log is saved whole and its middle cut when it grows past its limit: when it
        # is shorter than what the page has, the page starts again from the top.
        reset = since > len(text)
        response = JsonResponse({
            "text": text if reset else text[since:],
            "next": len(text),
            "reset": reset,
            "running": not run.is_done,
            "state": STAGE_WORDS.get(run.status, run.status),
            "status": run.status,
            "progress": run.progress_percent,
        })
        response["Cache-Control"] = "no-store"
        return response
    return render(request, "staff/log.html", {
        "job": job, "run": run, "state": STAGE_WORDS.get(run.status, run.status),
        "poll_ms": 0 if run.is_done else settings.STAFF_POLL_MS,
    })


ACTIONS = {
    "cancel": ("Cancel this job", "The running stage stops at its next check; stages not run are cancelled."),
    "retry": ("Retry the stage", "The stage runs again from its beginning, then the stages after it "
              "that did not succeed, and the report."),
    "resume": ("Re-run the held day", "The diagnostic runs again on the same lab day from the stage a lab "
               "fault stopped; the stages that completed are kept. Run it once the lab is healthy again: "
               "a fault that persists holds the day again."),
    "move": ("Move the held day", "The diagnostic moves to another free lab day of this lab and runs from "
             "the stage a lab fault stopped when that day begins; the stages that completed are kept, and "
             "the customer's booking moves with it."),
    "rerun-report": ("Write the report again", "The report is rendered again from the findings and the "
                     "staff's edits. If they changed since the newest version, that is a new version, "
                     "which waits for approval; if not, it is the same version as before."),
}


@staff_group_required
@require_http_methods(["GET", "POST"])
def job_action(request: HttpRequest, job_id: Any, action: str) -> HttpResponse:
    """GET: the confirmation page; POST: do it. Each changes what the customer receives,
    so each is the `staff` group's; other staff look only (403 here, no button)."""
    job = get_job(job_id)
    if action not in ACTIONS:
        raise Http404("no such action")
    stage = request.GET.get("stage", "") or request.POST.get("stage", "")
    if request.method == "GET":
        title, consequence = ACTIONS[action]
        held = action in ("resume", "move")
        return render(request, "staff/confirm.html", {
            "job": job, "action": action, "title": title, "consequence": consequence, "stage": stage,
            "plan": actions.rerun_plan(job) if held else None,
            "days": actions.free_days(job) if action == "move" else None,
            "fault": job.fault if held else None,
        })
    try:
        if action == "cancel":
            said = actions.cancel_job(job)
        elif action == "retry":
            said = actions.retry_stage(job, stage)
        elif action == "resume":
            said = actions.resume_held(job, actor=request.user)
        elif action == "move":
            said = actions.move_held(job, request.POST.get("day", ""), actor=request.user)
        else:
            said = actions.rerun_report(job, by=request.user)
    except actions.ActionRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, said)
    return redirect("staff:job", job_id=job.pk)
