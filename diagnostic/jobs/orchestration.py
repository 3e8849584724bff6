"""Running a diagnostic job: its stages in order, each claimed under a lease, on a lab the
job holds alone.

`orchestrate` does one pass: take the lab, then claim and run pending stages until the
job ends, a stage must wait (a transient fault: retry later with backoff), the lab is
busy, another worker holds the stage, or `max_stages` have run. Which faults are transient
(a database or broker away, an endpoint reset, an SSH drop, a full disk) and which fail the
stage at once (a refused configuration, an engine error) is `faults.classify`'s call; the
records a stage leaves when it ends are written through a database outage. It never sleeps, so
the Celery task can turn every "later" into a countdown; `run_until_done` is the
synchronous loop the diagnose command and eager mode use.

Guarantees: a stage that succeeded never runs again; a retried stage starts from its
beginning (its findings are saved only with its success); a stage that used up its
attempts is quarantined with a message saying so; a cancel request is honoured between
stages and, through the heartbeat, during one. A stage that stops the job (StopJob: the
lab cannot run the configuration) ends "stopped" with the reason in its result; the stages
after it are skipped ("not run: <reason>") except the report, which still says what stopped the
job and whether the engagement is free; the job then ends failed with that reason. Every
change of a job's or a stage's state is a named transition of diagnostic/lifecycle.py.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from diagnostic import lifecycle
from diagnostic.bookings.models import Booking, ClusterConfiguration, Lab
from diagnostic.jobs import leases
from diagnostic.jobs.faults import (
    DATABASE_CONNECTION_ERRORS,
    Fault,
    LabFault,
    classify,
    reset_connection,
    through_outage,
)
from diagnostic.jobs.findings_document import build_findings
from diagnostic.jobs.hygiene import job_owner, nodes_words, shut_down, sweep
from diagnostic.jobs.labaccess import LabAccess, SessionFactory
from diagnostic.jobs.leases import Claim
from diagnostic.jobs.models import DiagnosticJob, Finding, JobEvent, Measurement, StageRun
from diagnostic.jobs.registry import Stage, lookup, select_stages
from diagnostic.jobs.stage_context import StageCancelled, StageContext, StopJob
from lab.session import AgentError, LabSession, NodeUnreachable

log = logging.getLogger(__name__)

JobStatus = DiagnosticJob.Status
StageStatus = StageRun.Status


class Next(enum.Enum):
    FINISHED = "finished"  # the job has ended
    MORE = "more"  # stages remain; run again now
    RETRY = "retry"  # a stage hit a transient fault; run again after `countdown`
    LAB_BUSY = "lab_busy"  # another job holds the lab; try again after `countdown`
    ELSEWHERE = "elsewhere"  # another worker holds the next stage's lease
    HELD = "held"  # a lab fault stopped the job; it waits for staff to re-run it


@dataclass(frozen=True)
class Outcome:
    next: Next
    countdown: float = 0.0
    message: str = ""


def worker_identity(task_id: str | None = None) -> str:
    """Who holds a lease: host, process and (under Celery) the task delivery."""
    base = f"{socket.gethostname()}:{os.getpid()}"
    return f"{base}:{task_id}" if task_id else base


def retry_countdown(attempt: int) -> float:
    """Exponential backoff after the `attempt`-th failed try, capped (the cap stays below
    the broker's visibility timeout; settings check that)."""
    base = float(settings.DIAG_RETRY_BASE_S)
    return float(min(settings.DIAG_RETRY_MAX_S, base * 2 ** max(0, attempt - 1)))


@dataclass(frozen=True)
class TimeLimit:
    """A synchronous run's overall limit: `seconds` from its start, ending at the monotonic
    `deadline`."""

    seconds: float
    deadline: float

    @classmethod
    def starting_now(cls, seconds: float) -> TimeLimit:
        return cls(float(seconds), time.monotonic() + float(seconds))

    @property
    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    @property
    def reached(self) -> bool:
        return self.remaining <= 0

    def reason(self, where: str) -> str:
        return f"the run's time limit of {self.seconds:g} s was reached {where}"


def create_job(
    *,
    config: ClusterConfiguration,
    lab: Lab,
    stages: Iterable[str] | None = None,
    seed: int = 0,
    booking: Booking | None = None,
    created_by: Any = None,
    budget_lab_s: float | None = None,
) -> DiagnosticJob:
    """A queued job with one pending StageRun per selected stage (all by default).
    `budget_lab_s`: lab seconds the whole day may spend (default: the setting)."""
    plan = select_stages(stages)
    with transaction.atomic():
        job = DiagnosticJob.objects.create(
            config=config, lab=lab, seed=seed, booking=booking, created_by=created_by,
            budget_lab_s=budget_lab_s,
        )
        StageRun.objects.bulk_create(
            StageRun(job=job, name=stage.name, order=index) for index, stage in enumerate(plan)
        )
    return job


class Heartbeat:
    """Renews a running stage's lease and the job's lab lease while the stage works, and
    notices a cancel request. Runs in a thread with its own database connection, so a
    stage blocked in a long lab call (a 10-minute cold start) keeps its leases; when the
    worker process dies the renewals stop and the leases lapse."""

    def __init__(self, *, stage_id: int, job_id: str, owner: str, cancel: threading.Event) -> None:
        self.stage_id = stage_id
        self.job_id = job_id
        self.owner = owner
        self.cancel = cancel
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{stage_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            while not self._stop.wait(settings.DIAG_HEARTBEAT_S):
                self.beat()
        finally:
            connections.close_all()

    def beat(self) -> None:
        try:
            if not leases.renew_stage_lease(
                self.stage_id, owner=self.owner, lease_s=settings.DIAG_STAGE_LEASE_S
            ):
                log.warning("stage lease lost", extra={"stage_id": self.stage_id, "owner": self.owner})
                self.lost.set()
                self.cancel.set()
                return
            leases.renew_lab(self.job_id, owner=self.owner, lease_s=settings.DIAG_LAB_LEASE_S)
            if DiagnosticJob.objects.filter(pk=self.job_id, cancel_requested=True).exists():
                self.cancel.set()
        except DatabaseError as exc:
            # One failed renewal is survivable: the lease outlasts several heartbeats. The
            # connection is dropped so that the next beat opens a fresh one (after a
            # database restart the old one is dead for good).
            log.warning("heartbeat could not reach the database",
                        extra={"stage_id": self.stage_id, "error": f"{type(exc).__name__}: {exc}"})
            reset_connection()


# The key a stage's result carries when the stage stopped the job, with the reason, and
# whose the stop was (customer or lab).
STOPPED_JOB = "stopped_job"
STOP_SIDE = "stop_side"


class Verdict(enum.Enum):
    SUCCEEDED = "succeeded"
    STOP_JOB = "stop_job"
    CANCELLED = "cancelled"
    TRANSIENT = "transient"
    FAILED = "failed"
    LEASE_LOST = "lease_lost"
    TIMED_OUT = "timed_out"
    HELD = "held"


@dataclass
class StageEnd:
    verdict: Verdict
    message: str = ""
    # With HELD: the lab fault, as the job records it (what, nodes, evidence).
    fault: dict[str, Any] | None = None


def orchestrate(
    job_id: str,
    session_factory: SessionFactory,
    *,
    owner: str | None = None,
    max_stages: int | None = None,
    time_limit: TimeLimit | None = None,
) -> Outcome:
    """One pass over the job's stages; see the module docstring. With `time_limit` (the
    synchronous `diagnose`), a stage not started by the deadline is not started and one
    running at the deadline is stopped; the job then fails saying so."""
    owner = owner or worker_identity()
    job = DiagnosticJob.objects.select_related("lab", "config").filter(pk=job_id).first()
    if job is None:
        # A message that outlived its job (deleted, or a database restored from backup).
        log.warning("no such job; message dropped", extra={"job": job_id})
        return Outcome(Next.FINISHED, message=f"no job {job_id}")
    early = _before_the_stages(job, session_factory, owner, time_limit)
    if early is not None:
        return early
    access = LabAccess(session_factory, job.lab, owner=job_owner(str(job.pk)),
                       on_open=lambda session: _sweep(job, session))
    ran = 0
    try:
        for stage in list(job.stage_runs.order_by("order")):
            stage.refresh_from_db()
            if stage.is_done:
                continue
            if DiagnosticJob.objects.filter(pk=job.pk, cancel_requested=True).exists():
                return _cancel(job, access)
            if max_stages is not None and ran >= max_stages:
                return Outcome(Next.MORE)
            if time_limit is not None and time_limit.reached:
                return _stop(job, JobStatus.FAILED, time_limit.reason(f"before {stage.name} started"),
                             access=access)
            outcome, ran_it = _take_stage(job, stage, owner, access, time_limit)
            ran += ran_it
            if outcome is not None:
                return outcome
        return _finish(job, access)
    finally:
        access.close()


def _before_the_stages(
    job: DiagnosticJob, session_factory: SessionFactory, owner: str, time_limit: TimeLimit | None
) -> Outcome | None:
    """What ends the pass before any stage: the job ended, held or cancelled, out of time,
    or its lab held by another job. Otherwise the job starts (once) and None is returned."""
    if job.is_terminal:
        return Outcome(Next.FINISHED, message=f"job already {job.status}")
    if job.is_held:
        if job.cancel_requested:
            return _stop(job, JobStatus.CANCELLED, "cancelled on request while held for a lab fault")
        return Outcome(Next.HELD, message=job.status_message)
    if job.cancel_requested:
        # The cancelled job's engines are stopped too (a worker that died left them running).
        cancelling = LabAccess(session_factory, job.lab, owner=job_owner(str(job.pk)))
        try:
            return _cancel(job, cancelling)
        finally:
            cancelling.close()
    if time_limit is not None and time_limit.reached:
        return _stop(job, JobStatus.FAILED, time_limit.reason("before the job could go on"))
    if not leases.acquire_lab(job, owner=owner, lease_s=settings.DIAG_LAB_LEASE_S):
        holder = leases.lab_holder(job.lab)
        return Outcome(
            Next.LAB_BUSY,
            countdown=float(settings.DIAG_LAB_BUSY_RETRY_S),
            message=f"lab {job.lab.name} is held by job {holder}",
        )
    if lifecycle.START.apply(DiagnosticJob.objects.filter(pk=job.pk), started_at=timezone.now()):
        log.info("job started", extra={"job": str(job.pk), "lab": job.lab.name, "owner": owner})
    job.refresh_from_db()
    return None


def _take_stage(
    job: DiagnosticJob, stage: StageRun, owner: str, access: LabAccess, time_limit: TimeLimit | None
) -> tuple[Outcome | None, int]:
    """Claim and run one pending stage (or skip it after a stop). Returns how the pass ends
    because of it (None: go on to the next stage) and whether it ran (1) or not (0)."""
    spec = lookup(stage.name)
    stopped = _stop_reason(job)
    if stopped is not None and not (spec is not None and spec.after_stop):
        _skip(stage, stopped)
        return None, 0
    claim = leases.claim_stage(
        stage.pk, owner=owner, lease_s=settings.DIAG_STAGE_LEASE_S,
        max_attempts=settings.DIAG_MAX_STAGE_ATTEMPTS,
    )
    stage.refresh_from_db()
    if claim is Claim.UNAVAILABLE:
        if stage.is_done:
            return None, 0
        return Outcome(Next.ELSEWHERE, message=f"stage {stage.name} is held by {stage.lease_owner}"), 0
    if claim is Claim.QUARANTINED:
        log.warning("stage quarantined", extra={"job": str(job.pk), "stage": stage.name})
        if spec is None or spec.required:
            return _stop(job, JobStatus.FAILED, f"{stage.name}: {stage.status_message}", access=access), 0
        return None, 0
    end = _run_claimed(job, stage, spec, owner, access, time_limit)
    return _after_stage(job, stage, spec, owner, access, end), 1


def _after_stage(
    job: DiagnosticJob, stage: StageRun, spec: Stage | None, owner: str, access: LabAccess, end: StageEnd
) -> Outcome | None:
    """How the pass goes on after a stage ended by `end` (None: with the next stage)."""
    if end.verdict is Verdict.SUCCEEDED:
        return None
    if end.verdict is Verdict.LEASE_LOST:
        return Outcome(Next.ELSEWHERE, message=end.message)
    if end.verdict is Verdict.STOP_JOB:
        # The stages after it are skipped as the loop reaches them (the stop is read back
        # from the database, so a worker taking over later does the same), except those
        # that run after a stop: the report.
        return None
    if end.verdict is Verdict.CANCELLED:
        return _cancel(job, access)
    if end.verdict is Verdict.TIMED_OUT:
        return _stop(job, JobStatus.FAILED, end.message, access=access)
    if end.verdict is Verdict.HELD:
        return _hold(job, stage, end, access)
    if end.verdict is Verdict.TRANSIENT:
        countdown = retry_countdown(stage.attempts)
        # The job keeps the lab while it waits to retry, and the reaper leaves it be.
        leases.renew_lab(job, owner=owner, lease_s=countdown + settings.DIAG_LAB_LEASE_S)
        return Outcome(Next.RETRY, countdown=countdown, message=end.message)
    # FAILED, or a transient error on the last attempt (quarantined).
    if spec is None or spec.required:
        return _stop(job, JobStatus.FAILED, f"{stage.name}: {end.message}", access=access,
                     side=end.fault.get("side") if end.fault else None)
    return None


@dataclass
class _Ran:
    """How a stage's code returned: its verdict, message and result, and the fault that
    ended it, classified."""

    verdict: Verdict = Verdict.SUCCEEDED
    message: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    fault: Fault | None = None
    failure: BaseException | None = None
    stop_side: str = ""


def _call(spec: Stage, ctx: StageContext) -> _Ran:
    try:
        return _Ran(result=spec.run(ctx))
    except StopJob as stop:
        return _Ran(Verdict.STOP_JOB, stop.reason, stop.result, stop_side=stop.side)
    except StageCancelled as exc:
        return _Ran(Verdict.CANCELLED, str(exc))
    except Exception as exc:
        fault = classify(exc)
        message = f"{fault.kind}: {fault.reason}" if fault.kind != "error" else fault.reason
        ctx.attach("error", traceback.format_exc())
        verdict = Verdict.TRANSIENT if fault.transient else Verdict.FAILED
        return _Ran(verdict, message, fault=fault, failure=exc)


def _run_claimed(
    job: DiagnosticJob, stage: StageRun, spec: Stage | None, owner: str, access: LabAccess,
    time_limit: TimeLimit | None = None,
) -> StageEnd:
    """Run a stage this worker has claimed and record how it ended. The records after the
    run are written through a database outage (faults.through_outage): a stage that did
    its work keeps it across a restart."""
    log_extra = {"job": str(job.pk), "stage": stage.name, "attempt": stage.attempts, "owner": owner}
    if spec is None:
        message = (
            f"no stage named {stage.name!r} is registered in this worker; "
            "deploy the same code to every worker"
        )
        leases.end_stage(stage.pk, owner=owner, end=lifecycle.FAIL, message=message, error=message)
        return StageEnd(Verdict.FAILED, message)

    ctx = StageContext(
        job=job, stage=stage, owner=owner,
        max_attempts=settings.DIAG_MAX_STAGE_ATTEMPTS, access=access,
    )
    ctx.carry_log(stage.log)
    log.info("stage started", extra=log_extra)
    ctx.log(f"attempt {stage.attempts} of {settings.DIAG_MAX_STAGE_ATTEMPTS} by {owner}")
    wall_start = time.monotonic()
    timed_out = threading.Event()
    watchdog = _watchdog(time_limit, ctx.cancel_event, timed_out)
    with Heartbeat(stage_id=stage.pk, job_id=str(job.pk), owner=owner, cancel=ctx.cancel_event) as beat:
        try:
            ran = _call(spec, ctx)
        finally:
            if watchdog is not None:
                watchdog.cancel()
    lab_seconds = access.lab_seconds_since(wall_start)
    if beat.lost.is_set():
        log.warning("stage lease was lost while running; result discarded", extra=log_extra)
        return StageEnd(Verdict.LEASE_LOST, f"lease of {stage.name} was taken over")
    if timed_out.is_set() and time_limit is not None and ran.verdict is not Verdict.SUCCEEDED:
        message = time_limit.reason(f"during {stage.name}; the stage was stopped")
        through_outage(lambda: StageRun.objects.filter(pk=stage.pk, lease_owner=owner).update(
            log=ctx.log_text, lab_seconds=lab_seconds), "stage log")
        through_outage(lambda: leases.end_stage(
            stage.pk, owner=owner, end=lifecycle.FAIL, message=message, error=message), "stage end")
        return StageEnd(Verdict.TIMED_OUT, message)
    if ran.verdict is Verdict.CANCELLED and not through_outage(lambda: _cancel_requested(job),
                                                               "cancel check"):
        ran.verdict = Verdict.FAILED  # a stage raising StageCancelled on its own is a bug

    if ran.verdict in (Verdict.SUCCEEDED, Verdict.STOP_JOB):
        result = ran.result
        if ran.verdict is Verdict.STOP_JOB:
            result = {**result, STOPPED_JOB: ran.message, STOP_SIDE: ran.stop_side}
        end = lifecycle.STOP_JOB if ran.verdict is Verdict.STOP_JOB else lifecycle.SUCCEED
        completed = through_outage(lambda: _complete(ctx, end, result, lab_seconds, ran.message),
                                   "stage completion")
        if not completed:
            return StageEnd(Verdict.LEASE_LOST, f"lease of {stage.name} was taken over")
        log.info("stage succeeded", extra={**log_extra, "lab_seconds": round(lab_seconds, 3)})
        return StageEnd(ran.verdict, ran.message)
    through_outage(lambda: StageRun.objects.filter(pk=stage.pk, lease_owner=owner).update(
        log=ctx.log_text, lab_seconds=lab_seconds), "stage log")
    return _end_unfinished(stage, owner, ran, log_extra)


def _end_unfinished(stage: StageRun, owner: str, ran: _Ran, log_extra: dict[str, Any]) -> StageEnd:
    """Record a stage that did not finish its work: held for a lab fault, cancelled, given
    back to retry a transient fault, quarantined on its last attempt, or failed."""
    message, fault = ran.message, ran.fault
    last = stage.attempts >= settings.DIAG_MAX_STAGE_ATTEMPTS
    if fault is not None and ran.failure is not None and fault.holds_the_day and (
            ran.verdict is Verdict.FAILED or last):
        # The lab's fault, not the configuration's: the stage waits, pending, for staff to
        # re-run the day; the job is held (orchestrate) rather than failed.
        details = lab_fault_details(ran.failure, fault, stage.name)
        held = f"held: {details['summary']}"
        through_outage(lambda: lifecycle.RELEASE.apply(
            StageRun.objects.filter(pk=stage.pk, lease_owner=owner), status_message=held,
            last_error=message, lease_owner="", lease_expires_at=None), "stage hold")
        log.error("stage stopped by a lab fault; the job is held", extra={**log_extra, "error": message})
        return StageEnd(Verdict.HELD, message, fault=details)
    side = fault.side if fault is not None else None
    if ran.verdict is Verdict.CANCELLED:
        through_outage(lambda: leases.end_stage(stage.pk, owner=owner, end=lifecycle.CANCEL,
                                                message="cancelled while running"), "stage end")
        return StageEnd(ran.verdict, message)
    if ran.verdict is Verdict.TRANSIENT and not last:
        countdown = retry_countdown(stage.attempts)
        through_outage(lambda: leases.release_stage(
            stage.pk, owner=owner, error=f"attempt {stage.attempts}: {message}"), "stage release")
        log.warning("stage hit a transient fault; will retry",
                    extra={**log_extra, "error": message, "countdown_s": countdown})
        return StageEnd(ran.verdict, message)
    if ran.verdict is Verdict.TRANSIENT:
        quarantine = (
            f"quarantined after {stage.attempts} attempts (limit {settings.DIAG_MAX_STAGE_ATTEMPTS}); "
            f"not retried again. Last error: {message}"
        )
        through_outage(lambda: leases.end_stage(stage.pk, owner=owner, end=lifecycle.QUARANTINE,
                                                message=quarantine, error=message), "stage end")
        log.error("stage quarantined", extra={**log_extra, "error": message})
        return StageEnd(Verdict.FAILED, quarantine, fault={"side": side} if side else None)
    through_outage(lambda: leases.end_stage(
        stage.pk, owner=owner, end=lifecycle.FAIL, message=message, error=message), "stage end")
    log.error("stage failed", extra={**log_extra, "error": message})
    return StageEnd(Verdict.FAILED, message, fault={"side": side} if side else None)


def _watchdog(
    time_limit: TimeLimit | None, cancel: threading.Event, timed_out: threading.Event
) -> threading.Timer | None:
    """A timer that stops the stage when the run's time limit is reached, through its
    cancel event: the stage stops at its next `check_cancelled`, so a lab call already
    under way (a launch has its own timeout) finishes first."""
    if time_limit is None:
        return None

    def expire() -> None:
        timed_out.set()
        cancel.set()

    timer = threading.Timer(max(0.0, time_limit.remaining), expire)
    timer.daemon = True
    timer.start()
    return timer


def _complete(ctx: StageContext, end: lifecycle.Transition, result: dict[str, Any], lab_seconds: float,
              message: str) -> bool:
    """End the stage by `end` (succeeded, or stopped the job) and save its result, findings
    and measurements, all or nothing, provided this worker still holds its lease."""
    stage = ctx.stage
    with transaction.atomic():
        changed = end.apply(
            StageRun.objects.filter(pk=stage.pk, lease_owner=ctx.owner),
            status_message=message,
            result=result,
            log=ctx.log_text,
            progress_percent=100,
            lab_seconds=lab_seconds,
            finished_at=timezone.now(),
            lease_owner="",
            lease_expires_at=None,
        )
        if changed != 1:
            # A retry after the database went away at the commit: the first try may have
            # landed. Succeeded at this very attempt means it did (a takeover would have
            # counted another attempt).
            return StageRun.objects.filter(
                pk=stage.pk, status=end.target, attempts=stage.attempts
            ).exists()
        Finding.objects.bulk_create(
            Finding(job=ctx.job, stage=stage, code=f.code, title=f.title, blocking=f.blocking,
                    evidence=f.evidence, change=f.change, impact=f.impact)
            for f in ctx.findings
        )
        Measurement.objects.bulk_create(
            Measurement(job=ctx.job, stage=stage, workload=m.workload, configuration=m.configuration,
                        n=m.n, mean_tps=m.mean_tps, ci95_low=m.ci95[0], ci95_high=m.ci95[1],
                        ttft_s=m.ttft_s, samples=m.samples)
            for m in ctx.measurements
        )
    return True


def _cancel_requested(job: DiagnosticJob) -> bool:
    return DiagnosticJob.objects.filter(pk=job.pk, cancel_requested=True).exists()


def _cancel(job: DiagnosticJob, access: LabAccess | None = None) -> Outcome:
    """End a job whose cancel was requested, unless a stage still runs under a live lease
    elsewhere (its heartbeat will stop it and that worker ends the job)."""
    now = timezone.now()
    if job.stage_runs.filter(status=StageStatus.RUNNING, lease_expires_at__gte=now).exists():
        return Outcome(Next.ELSEWHERE, message="cancel requested; waiting for the running stage to stop")
    return _stop(job, JobStatus.CANCELLED, "cancelled on request", access=access)


def _stop(job: DiagnosticJob, status: str, reason: str, *, access: LabAccess | None = None,
          side: str | None = None) -> Outcome:
    """End the job early: stages not run are cancelled, saying why."""
    lifecycle.CANCEL.apply(
        job.stage_runs.all(),
        status_message=f"not run: {reason}",
        lease_owner="",
        lease_expires_at=None,
    )
    return _end_job(job, status, reason, access=access, side=side)


def _stop_result(job: DiagnosticJob) -> dict[str, Any] | None:
    """The result of the stage that stopped the job, when one did."""
    for result in job.stage_runs.filter(status=StageStatus.STOPPED).values_list("result", flat=True):
        if isinstance(result, dict) and result.get(STOPPED_JOB):
            return result
    return None


def _stop_reason(job: DiagnosticJob) -> str | None:
    """Why a stage stopped the job, when one did: its result records the reason."""
    result = _stop_result(job)
    return None if result is None else str(result[STOPPED_JOB])


def _skip(stage: StageRun, reason: str) -> None:
    lifecycle.CANCEL.apply(
        StageRun.objects.filter(pk=stage.pk),
        status_message=f"not run: {reason}",
        lease_owner="",
        lease_expires_at=None,
    )


def _finish(job: DiagnosticJob, access: LabAccess | None = None) -> Outcome:
    stopped = _stop_result(job)
    if stopped is not None:
        return _end_job(job, JobStatus.FAILED, str(stopped[STOPPED_JOB]), access=access,
                        side=str(stopped.get(STOP_SIDE) or DiagnosticJob.Side.CUSTOMER))
    statuses = set(job.stage_runs.values_list("status", flat=True))
    if statuses <= {StageStatus.SUCCEEDED}:
        return _end_job(job, JobStatus.SUCCEEDED, "", access=access)
    troubled = list(
        job.stage_runs.exclude(status=StageStatus.SUCCEEDED).values_list("name", "status")
    )
    summary = ", ".join(f"{name} {status}" for name, status in troubled)
    return _end_job(job, JobStatus.PARTIAL, f"finished without: {summary}", access=access)


def _end_job(job: DiagnosticJob, status: str, message: str, *, access: LabAccess | None = None,
             side: str | None = None) -> Outcome:
    # Whatever the end, the lab is left as it was found: this job's engines stopped.
    _shut_down(job, access, why=f"the job ended {status}")
    now = timezone.now()
    # The final status and the findings document that reports it appear together.
    with transaction.atomic():
        changed = lifecycle.END[status].apply(
            DiagnosticJob.objects.filter(pk=job.pk),
            status_message=message, finished_at=now, stop_side=side or "")
        job.refresh_from_db()
        if changed:
            job.findings = build_findings(job)
            job.save(update_fields=["findings"])
    leases.release_lab(job)
    if changed:
        log.info("job ended", extra={"job": str(job.pk), "status": status, "reason": message})
    return Outcome(Next.FINISHED, message=message)


# -- the lab as found, and lab faults ------------------------------------------------------


def _sweep(job: DiagnosticJob, session: LabSession) -> None:
    """The job's first act on the lab in each pass: stop what an earlier job of this
    platform left running (in the staff's log, never in this customer's findings); an
    engine nobody here started is a lab fault for staff."""
    DiagnosticJob.objects.filter(pk=job.pk, lab_used=False).update(lab_used=True)
    found = sweep(session, str(job.pk))
    if found.stopped:
        earlier = sorted(set(found.stopped.values()))
        JobEvent.objects.create(
            job=job, kind=JobEvent.Kind.LAB_CLEANED,
            message=(f"Stopped the engine an earlier job left running on {nodes_words(found.stopped)}; "
                     f"earlier job(s): {', '.join(earlier)}"),
            data=found.as_dict(),
        )
        log.warning("stopped engines an earlier job left", extra={"job": str(job.pk), **found.as_dict()})
    if found.foreign or found.stop_failed:
        nodes = sorted(set(found.foreign) | set(found.stop_failed))
        what = ("an engine this platform did not start runs" if found.foreign
                else "an earlier job's engine could not be stopped")
        raise LabFault("node_busy", f"{what} on {nodes_words(nodes)}",
                       nodes=nodes, evidence=found.as_dict())


def _shut_down(job: DiagnosticJob, access: LabAccess | None, *, why: str) -> None:
    """Stop this job's engines on every node, and say so in the staff's log. A job that
    never used the lab has nothing to stop; a lab that cannot be reached is recorded (the
    next job's sweep stops what was left)."""
    if access is None or not DiagnosticJob.objects.filter(pk=job.pk, lab_used=True).exists():
        return
    try:
        done = shut_down(access.session(check=False), str(job.pk))
    except Exception as exc:  # the job's end must not wait on a lab that is away
        JobEvent.objects.create(
            job=job, kind=JobEvent.Kind.ENGINES_STOPPED,
            message=f"Could not reach the lab to stop the engines ({why}): {classify(exc).reason}; "
                    "the next job's sweep stops what was left",
            data={"error": classify(exc).reason})
        log.warning("could not stop the engines at the job's end",
                    extra={"job": str(job.pk), "error": f"{type(exc).__name__}: {exc}"})
        return
    JobEvent.objects.create(job=job, kind=JobEvent.Kind.ENGINES_STOPPED,
                            message=f"{why[0].upper()}{why[1:]}: {done.sentence()}", data=done.as_dict())
    log.info("engines stopped", extra={"job": str(job.pk), "why": why, **done.as_dict()})


def _cause_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not c for c in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def lab_fault_details(exc: BaseException, fault: Fault, stage: str) -> dict[str, Any]:
    """A lab fault as the job records it: what it was (a short code), the nodes it concerns,
    the evidence, and one sentence for staff. The customer sees none of it."""
    what, nodes = "lab", []
    evidence: dict[str, Any] = {"error": fault.reason}
    said = ""
    for cause in _cause_chain(exc):
        if isinstance(cause, LabFault):
            what, nodes, evidence = cause.what, cause.nodes, {**cause.evidence, "error": fault.reason}
            said = cause.message
            break
        if isinstance(cause, NodeUnreachable):
            what, nodes = "node_unreachable", sorted(cause.nodes)
            evidence = {"error": fault.reason,
                        "nodes": {name: str(err) for name, err in sorted(cause.nodes.items())}}
            break
        if isinstance(cause, AgentError):
            what, nodes = "agent_failed", [cause.node]
            evidence = {"error": fault.reason, "verb": cause.verb, "code": cause.code}
            break
    else:
        what = {"ssh": "ssh", "endpoint": "endpoint"}.get(fault.kind, "lab")
    where = nodes_words(nodes) if nodes else "the lab"
    summary = said or {
        "node_unreachable": f"{where} did not answer",
        "agent_failed": f"the node agent failed on {where}",
        "ssh": f"SSH to {where} failed",
        "endpoint": "the engine's endpoint stopped answering",
    }.get(what, f"a fault of {where}")
    return {"side": DiagnosticJob.Side.LAB.value, "what": what, "stage": stage, "nodes": nodes,
            "evidence": evidence, "summary": f"{summary} during {stage}", "message": fault.reason}


def _hold(job: DiagnosticJob, stage: StageRun, end: StageEnd, access: LabAccess) -> Outcome:
    """Stop the day for a lab fault: the job waits, held, for staff to re-run it (same day
    or another); nothing of it reaches the customer but a plain message."""
    details = dict(end.fault or {})
    _shut_down(job, access, why="held for a lab fault")
    now = timezone.now()
    details["at"] = now.isoformat()
    summary = str(details.get("summary") or end.message)
    with transaction.atomic():
        changed = lifecycle.HOLD.apply(
            DiagnosticJob.objects.filter(pk=job.pk), status_message=f"held for a lab fault: {summary}",
            stop_side=DiagnosticJob.Side.LAB, fault=details)
        DiagnosticJob.objects.filter(pk=job.pk, first_fault_at__isnull=True).update(first_fault_at=now)
        if changed:
            JobEvent.objects.create(job=job, kind=JobEvent.Kind.LAB_FAULT,
                                    message=f"Held for a lab fault: {summary}. {end.message}", data=details)
        job.refresh_from_db()
        if changed:
            job.findings = build_findings(job)
            job.save(update_fields=["findings"])
            job_id = str(job.pk)
            transaction.on_commit(lambda: _tell_the_lab_contact(job_id))
    leases.release_lab(job)
    log.error("job held for a lab fault", extra={"job": str(job.pk), "stage": stage.name, "fault": summary})
    return Outcome(Next.HELD, message=job.status_message)


def end_held(job: DiagnosticJob, reason: str) -> Outcome:
    """End a held job without a re-run (staff cancelled it); its engines were stopped when
    it was held."""
    return _stop(job, JobStatus.CANCELLED, reason)


def _tell_the_lab_contact(job_id: str) -> None:
    from diagnostic.jobs.notify import lab_fault_email

    try:
        lab_fault_email(job_id)
    except Exception:  # the hold stands whether or not the mail went out
        log.exception("could not email the lab contact about a held job", extra={"job": job_id})


def run_until_done(
    job_id: str,
    session_factory: SessionFactory,
    *,
    owner: str | None = None,
    max_stages: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_step: Callable[[Outcome], None] | None = None,
    time_limit_s: float | None = None,
) -> DiagnosticJob:
    """Run the job to its end in this process, waiting out retries, a busy lab and a
    database that is briefly away (up to DIAG_DB_OUTAGE_S at a time). `on_step` hears every
    pass's outcome (with `max_stages=1`, every stage). `time_limit_s` bounds the whole run:
    no wait outlasts it, and the job fails saying so when it is reached."""
    owner = owner or worker_identity()
    limit = TimeLimit.starting_now(time_limit_s) if time_limit_s is not None else None
    outage_since: float | None = None
    while True:
        try:
            outcome = orchestrate(job_id, session_factory, owner=owner, max_stages=max_stages,
                                  time_limit=limit)
        except DATABASE_CONNECTION_ERRORS as exc:
            # Between stages nothing is lost by waiting: the stage records are written
            # through outages, and a pass only reads and claims.
            now = time.monotonic()
            outage_since = outage_since if outage_since is not None else now
            if now - outage_since > float(settings.DIAG_DB_OUTAGE_S):
                raise
            log.warning("database unreachable between stages; waiting",
                        extra={"job": job_id, "error": f"{type(exc).__name__}: {exc}"})
            reset_connection()
            sleep(1.0)
            continue
        outage_since = None
        if on_step is not None:
            on_step(outcome)
        if outcome.next in (Next.FINISHED, Next.HELD):
            return DiagnosticJob.objects.get(pk=job_id)
        if outcome.next is Next.MORE:
            continue
        # Retries wait their countdown; a stage held elsewhere is looked at again after a
        # heartbeat, by when its lease has been renewed or has started to lapse.
        wait = outcome.countdown if outcome.next is not Next.ELSEWHERE else float(settings.DIAG_HEARTBEAT_S)
        if limit is not None:
            # Wake at the limit rather than after it; the next pass then ends the job.
            wait = max(0.0, min(wait, limit.remaining))
        log.info("waiting", extra={"job": job_id, "reason": outcome.next.value,
                                   "detail": outcome.message, "seconds": wait})
        sleep(wait)
