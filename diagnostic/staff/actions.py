"""What a consultant can do to a job from its page: cancel it, retry a stage that failed or
stopped the job (with the stages that did not run after it, and the report), re-run a day a
lab fault held (from the stage that stopped, on the same day or moved to another free lab
day), and write the report again. Each returns a sentence for the page; each refuses,
saying why, when it makes no sense."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from diagnostic import lifecycle
from diagnostic.bookings.models import Booking, LabDay
from diagnostic.jobs.models import DiagnosticJob, Finding, JobEvent, Measurement, StageRun
from diagnostic.jobs.orchestration import end_held
from diagnostic.portal.jobrun import start_job

# A stage that stopped the job (preflight or reproduce said the day cannot go on) may be
# retried once its cause is mended.
RETRYABLE = (StageRun.Status.FAILED, StageRun.Status.QUARANTINED, StageRun.Status.STOPPED)
# How far ahead a held day may be moved: the calendar's window.
MOVE_WINDOW_DAYS = 56
RESET = {"status_message": "", "attempts": 0, "lease_owner": "", "lease_expires_at": None,
         "progress_percent": 0, "progress_message": "", "finished_at": None}


class ActionRefused(ValueError):
    pass


def cancel_job(job: DiagnosticJob) -> str:
    if job.is_held:
        end_held(job, "cancelled by staff while held for a lab fault")
        return "Cancelled: the held day will not be re-run."
    if not job.request_cancel():
        raise ActionRefused(f"the job already ended ({job.status}); nothing to cancel")
    return "Cancel requested: the running stage stops at its next check and the job ends cancelled."


def retryable(stage: StageRun) -> bool:
    return stage.status in RETRYABLE


def _again(job: DiagnosticJob, from_order: int) -> QuerySet[StageRun]:
    """The stages from `from_order` on that will run again: those that did not succeed
    (including one that stopped the job)."""
    return job.stage_runs.filter(order__gte=from_order).exclude(status=StageRun.Status.SUCCEEDED)


def _reset(stages: QuerySet[StageRun]) -> list[str]:
    """Set `stages` to run again from their beginnings; what a stage that is run again
    found before goes with it. Returns their names in order."""
    ids = list(stages.values_list("pk", flat=True))
    names = list(StageRun.objects.filter(pk__in=ids).order_by("order").values_list("name", flat=True))
    Finding.objects.filter(stage_id__in=ids).delete()
    Measurement.objects.filter(stage_id__in=ids).delete()
    lifecycle.RESET.apply(StageRun.objects.filter(pk__in=ids), **RESET, result=None)
    return names


def retry_stage(job: DiagnosticJob, stage_name: str) -> str:
    """Run a failed or quarantined stage again from its beginning, then every stage after
    it that did not succeed, and the report (it must include the retried stage)."""
    with transaction.atomic():
        locked = DiagnosticJob.objects.select_for_update().get(pk=job.pk)
        if locked.is_held:
            raise ActionRefused("the job is held for a lab fault: re-run it from the stage that stopped, "
                                "or move it to another lab day")
        if not locked.is_terminal:
            raise ActionRefused("the job is still running; cancel it or wait for it to end before a retry")
        stage = locked.stage_runs.filter(name=stage_name).first()
        if stage is None:
            raise ActionRefused(f"this job has no stage {stage_name!r}")
        if not retryable(stage):
            raise ActionRefused(f"{stage_name} is {stage.status}; only a failed or stopped stage, or one "
                                "that stopped the job, is retried")
        names = _reset(_again(locked, stage.order))
        lifecycle.RESET.apply(locked.stage_runs.filter(name="report"), **RESET)
        lifecycle.REQUEUE.apply(DiagnosticJob.objects.filter(pk=locked.pk), status_message="",
                                finished_at=None, cancel_requested=False, stop_side="")
        locked.refresh_from_db()
        start_job(locked)
    # In the order they run: the stages after the retried one that did not succeed, then the report.
    rerun = [n for n in names if n not in (stage_name, "report")]
    rerun += [] if stage_name == "report" else ["report"]
    return f"Retrying {stage_name}" + (f", then {', '.join(rerun)}" if rerun else "") + "."


def rerun_report(job: DiagnosticJob, *, by: Any = None) -> str:
    from diagnostic.staff.rendering import RenderRefused, request_render

    if not job.is_terminal:
        raise ActionRefused("the report is written when the job ends; it is still running")
    try:
        made = request_render(job, by=by)
    except RenderRefused as exc:
        raise ActionRefused(str(exc)) from None
    if made.state == made.State.FAILED:
        raise ActionRefused(f"the report could not be written: {made.error}")
    if made.state == made.State.DONE:
        return ("The report was written again from the findings and the staff's edits: "
                + (f"version {made.version}, new, awaiting approval." if made.new_version
                   else f"the same as version {made.version}, already kept."))
    return ("A new report version is being written from the findings and the staff's edits; the report "
            "review page shows its progress.")


# -- a day held for a lab fault -------------------------------------------------------------


def rerun_plan(job: DiagnosticJob) -> dict[str, list[str]]:
    """Which stages a re-run of a held job keeps (completed, still valid: a later stage works
    on the configuration with their proved changes) and which run again."""
    stages = list(job.stage_runs.order_by("order"))
    again = [s.name for s in stages if s.status != StageRun.Status.SUCCEEDED]
    return {"kept": [s.name for s in stages if s.name not in again], "again": again}


def _rerun(locked: DiagnosticJob, *, kind: str, message: str, data: dict[str, Any], actor: Any) -> list[str]:
    names = _reset(_again(locked, 0))
    lifecycle.REQUEUE.apply(DiagnosticJob.objects.filter(pk=locked.pk), status_message="", finished_at=None,
                            cancel_requested=False, stop_side="", released_at=None)
    JobEvent.objects.create(job=locked, kind=kind, message=message, data={**data, "stages": names},
                            actor=actor if getattr(actor, "pk", None) else None)
    return names


def resume_held(job: DiagnosticJob, *, actor: Any = None, now: dt.datetime | None = None) -> str:
    """Re-run a held day on the same lab day, from the stage that stopped; the stages that
    completed are kept."""
    moment = now or timezone.now()
    with transaction.atomic():
        locked = DiagnosticJob.objects.select_for_update().get(pk=job.pk)
        if not locked.is_held:
            raise ActionRefused(f"the job is {locked.get_status_display()}, not held for a lab fault; "
                                "nothing to re-run")
        names = _rerun(locked, kind=JobEvent.Kind.RETRIED,
                       message=f"Re-run on the same day from {names_first(locked)}",
                       data={"rerun_on": timezone.localdate(moment).isoformat()}, actor=actor)
        locked.refresh_from_db()
        start_job(locked)
    return f"Re-running {', '.join(names)}; the stages that completed are kept."


def names_first(job: DiagnosticJob) -> str:
    first = job.stage_runs.exclude(status=StageRun.Status.SUCCEEDED).order_by("order").first()
    return first.name if first is not None else "the report"


def free_days(job: DiagnosticJob, now: dt.datetime | None = None) -> list[LabDay]:
    """The lab days a held diagnostic can move to: its lab's, from today on within the
    calendar window, open and not booked by anyone."""
    today = timezone.localdate(now or timezone.now())
    taken = Booking.objects.exclude(status=Booking.Status.CANCELLED).values_list("lab_day_id", flat=True)
    return list(LabDay.objects.filter(lab=job.lab, closed=False, date__gte=today,
                                      date__lte=today + dt.timedelta(days=MOVE_WINDOW_DAYS))
                .exclude(pk__in=taken).order_by("date"))


def move_held(job: DiagnosticJob, day_id: Any, *, actor: Any = None, now: dt.datetime | None = None) -> str:
    """Move a held diagnostic to another free lab day of its lab: it waits for that day and
    runs from the stage that stopped; the stages that completed are kept."""
    moment = now or timezone.now()
    if job.booking is None:
        raise ActionRefused("this job has no booking (an in-house run): re-run it on the same day instead")
    try:
        day = LabDay.objects.get(pk=int(day_id), lab=job.lab)
    except (LabDay.DoesNotExist, TypeError, ValueError):
        raise ActionRefused("choose one of the free lab days listed") from None
    if day not in free_days(job, moment):
        raise ActionRefused(f"{day.date:%A %d %B %Y} is not free (booked, closed, past or beyond the "
                            f"{MOVE_WINDOW_DAYS}-day calendar); choose one of the free lab days listed")
    try:
        with transaction.atomic():
            locked = DiagnosticJob.objects.select_for_update().get(pk=job.pk)
            if not locked.is_held:
                raise ActionRefused(f"the job is {locked.get_status_display()}, not held for a lab fault; "
                                    "nothing to move")
            booking = Booking.objects.select_for_update().get(pk=locked.booking_id)
            before = booking.lab_day.date
            booking.lab_day = day
            booking.save(update_fields=["lab_day", "updated_at"])
            names = _rerun(locked, kind=JobEvent.Kind.MOVED,
                           message=f"Moved from {before:%Y-%m-%d} to {day.date:%Y-%m-%d}; runs from "
                                   f"{names_first(locked)} that day",
                           data={"rerun_on": day.date.isoformat(), "from": before.isoformat()}, actor=actor)
            locked.refresh_from_db()
            start_job(locked)
    except IntegrityError:
        raise ActionRefused(f"{day.date:%A %d %B %Y} was booked meanwhile; choose another free day") from None
    return (f"Moved to {day.date:%A %d %B %Y}: {', '.join(names)} run that day; "
            "the stages that completed are kept.")
