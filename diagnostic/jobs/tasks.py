"""Celery tasks: thin wrappers that take ids and call the orchestration.

`run_diagnostic` runs one stage per delivery and enqueues itself for the next, so no
single task outlives the stage time limit (and the broker's visibility timeout above
it). `reap_expired_leases`, run by celery beat, puts stages whose worker died back in
the queue, nudges jobs nobody is working on, and enqueues again queued jobs whose
message was lost. A database or broker that is away makes a delivery wait and try again
(or leaves the job to the reaper), never fails the job.

A job for a booking runs on its lab day: confirmed ahead of the day it stays queued,
and `start_due_jobs` (celery beat) hands it to the workers once the day has begun in the
lab's time (settings.TIME_ZONE). A delivery that reaches a job before its day puts it
back to waiting instead of running it.
"""

from __future__ import annotations

import logging

from celery import Task, shared_task
from celery.exceptions import Reject
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from diagnostic.jobs import leases
from diagnostic.jobs.faults import BROKER_ERRORS, DATABASE_CONNECTION_ERRORS, reset_connection
from diagnostic.jobs.labaccess import open_lab_session
from diagnostic.jobs.models import DiagnosticJob
from diagnostic.jobs.orchestration import Next, orchestrate, run_until_done, worker_identity

log = logging.getLogger(__name__)


# How long publishing the next step keeps trying a broker that is away (a restart takes
# seconds: about 40 s here); after that the job is left to the reaper.
PUBLISH_RETRY_POLICY = {"max_retries": 10, "interval_start": 0.5, "interval_step": 1.0, "interval_max": 5.0}
# A submission waits less for the broker than a worker does: someone is waiting on it.
SUBMIT_RETRY_POLICY = {"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0}
# The wait before a delivery that found the database away tries again.
DATABASE_RETRY_COUNTDOWN_S = 5.0


WAITING_FOR_LAB_DAY = "waiting_for_lab_day"


def _waits_for_lab_day(job_id: str) -> bool:
    jobs = DiagnosticJob.objects.filter(pk=job_id)
    return jobs.waiting_for_lab_day().exists() or jobs.held_by_closed_day().exists()


@shared_task(bind=True, name="diagnostic.jobs.tasks.run_diagnostic", max_retries=None)
def run_diagnostic(self: Task, job_id: str) -> str:
    try:
        early = _waits_for_lab_day(job_id)
    except DATABASE_CONNECTION_ERRORS:
        early = False  # orchestrate meets the outage too and waits it out below
    if early:
        # Handed on before its lab day (an old message, a manual enqueue): the job goes
        # back to waiting and the lab-day start hands it on again on the day.
        leases.mark_unreleased(job_id)
        log.info("job waits for its lab day", extra={"job": job_id})
        return WAITING_FOR_LAB_DAY
    if self.request.is_eager:
        # Eager mode (no broker): a retry would recurse at once, so wait in-process.
        return run_until_done(job_id, open_lab_session).status
    owner = worker_identity(self.request.id)
    try:
        outcome = orchestrate(job_id, open_lab_session, owner=owner, max_stages=1)
    except DATABASE_CONNECTION_ERRORS as exc:
        # The stage records are written through short outages; one this long, or one
        # between stages, sends the delivery back to wait rather than failing the job.
        log.warning("database unreachable; the job waits",
                    extra={"job": job_id, "error": f"{type(exc).__name__}: {exc}"})
        reset_connection()
        _wait(self, job_id, DATABASE_RETRY_COUNTDOWN_S, owner)
        return "database_unreachable"
    if outcome.next is Next.MORE:
        _publish(job_id, owner)
    elif outcome.next in (Next.RETRY, Next.LAB_BUSY):
        log.info("job waits", extra={"job": job_id, "reason": outcome.next.value,
                                     "detail": outcome.message, "countdown_s": outcome.countdown})
        _wait(self, job_id, outcome.countdown, owner)
    return outcome.next.value


def _publish(job_id: str, owner: str) -> bool:
    """Enqueue the job's next step, riding out a broker restart; when the broker stays
    away, let the job's lab lease lapse so that the reaper's next pass takes it up."""
    try:
        run_diagnostic.apply_async((job_id,), retry=True, retry_policy=PUBLISH_RETRY_POLICY)
    except BROKER_ERRORS as exc:
        log.error("could not enqueue the job's next step; leaving it to the reaper",
                  extra={"job": job_id, "error": f"{type(exc).__name__}: {exc}"})
        try:
            leases.renew_lab(job_id, owner=owner, lease_s=0)
        except DATABASE_CONNECTION_ERRORS:
            pass  # the lease lapses by itself
        return False
    return True


def _wait(task: Task, job_id: str, countdown: float, owner: str) -> None:
    """Retry this delivery after `countdown`; raises celery's Retry when it is queued."""
    try:
        retry = task.retry(countdown=countdown, throw=False)
    except Reject as rejected:
        # Celery turns a failed publish of the retry into Reject; the job's leases lapse
        # and the reaper takes it up once the broker is back.
        log.error("could not schedule the job's retry; leaving it to the reaper",
                  extra={"job": job_id, "error": str(rejected.reason)})
        return
    raise retry


@shared_task(name="diagnostic.jobs.tasks.reap_expired_leases")
def reap_expired_leases() -> list[str]:
    """Re-queue work whose worker died, and jobs whose message was lost; returns the ids
    of the jobs nudged."""
    jobs = set(leases.reap_expired_stage_leases(max_attempts=settings.DIAG_MAX_STAGE_ATTEMPTS))
    jobs.update(leases.stalled_jobs())
    lost = set(leases.lost_queued_jobs(older_than_s=settings.DIAG_QUEUED_REQUEUE_S))
    for job_id in sorted(jobs | lost):
        reason = "its message was lost while queued" if job_id in lost else "a lost worker"
        log.warning(f"re-queueing job after {reason}", extra={"job": job_id})
        run_diagnostic.delay(job_id)
    return sorted(jobs | lost)


@shared_task(name="diagnostic.jobs.tasks.start_due_jobs")
def start_due_jobs() -> list[str]:
    """Hand to the workers the booked jobs whose lab day has begun; returns their ids. Each
    job is claimed (released_at set) before it is published, so two beats publish it once;
    a publish that fails leaves it to the lost-job sweep."""
    started = []
    for job_id in leases.jobs_due_to_start():
        if not leases.mark_released(job_id):
            continue
        log.info("lab day has begun; starting the job", extra={"job": job_id})
        try:
            run_diagnostic.apply_async((job_id,), retry=True, retry_policy=PUBLISH_RETRY_POLICY)
        except BROKER_ERRORS as exc:
            log.error("could not enqueue the job on its lab day; the reaper will",
                      extra={"job": job_id, "error": f"{type(exc).__name__}: {exc}"})
            continue
        started.append(job_id)
    return started


def enqueue_job(job: DiagnosticJob) -> bool:
    """Hand the job to the workers once the transaction that created it commits, unless
    its booking's lab day is still ahead: then it waits, queued, for `start_due_jobs`, and
    this returns False. A broker that is down does not undo the submission: the job stays
    queued and the reaper enqueues it once it was handed on DIAG_QUEUED_REQUEUE_S ago and
    the broker answers."""
    job_id = str(job.pk)
    if job.waits_for_lab_day():
        log.info("job queued for its lab day", extra={"job": job_id, "starts_at": str(job.lab_day_starts_at)})
        return False
    DiagnosticJob.objects.filter(pk=job.pk, status=DiagnosticJob.Status.QUEUED).update(
        released_at=timezone.now()
    )

    def publish() -> None:
        if settings.CELERY_TASK_ALWAYS_EAGER:
            run_diagnostic.delay(job_id)
            return
        try:
            run_diagnostic.apply_async((job_id,), retry=True, retry_policy=SUBMIT_RETRY_POLICY)
        except BROKER_ERRORS as exc:
            log.error("could not enqueue the new job; the reaper will",
                      extra={"job": job_id, "after_s": settings.DIAG_QUEUED_REQUEUE_S,
                             "error": f"{type(exc).__name__}: {exc}"})

    transaction.on_commit(publish)
    return True
