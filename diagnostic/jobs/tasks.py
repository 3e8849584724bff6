"""Celery tasks: thin wrappers that take ids and call the orchestration.

`run_diagnostic` runs one stage per delivery and enqueues itself for the next, so no
single task outlives the stage time limit (and the broker's visibility timeout above
it). `reap_expired_leases`, run by celery beat, puts stages whose worker died back in
the queue and nudges jobs nobody is working on.
"""

from __future__ import annotations

import logging

from celery import Task, shared_task
from django.conf import settings

from diagnostic.jobs import leases
from diagnostic.jobs.labaccess import open_lab_session
from diagnostic.jobs.models import DiagnosticJob
from diagnostic.jobs.orchestration import Next, orchestrate, run_until_done, worker_identity

log = logging.getLogger(__name__)


@shared_task(bind=True, name="diagnostic.jobs.tasks.run_diagnostic", max_retries=None)
def run_diagnostic(self: Task, job_id: str) -> str:
    if self.request.is_eager:
        # Eager mode (no broker): a retry would recurse at once, so wait in-process.
        return run_until_done(job_id, open_lab_session).status
    outcome = orchestrate(
        job_id, open_lab_session, owner=worker_identity(self.request.id), max_stages=1
    )
    if outcome.next is Next.MORE:
        run_diagnostic.delay(job_id)
    elif outcome.next in (Next.RETRY, Next.LAB_BUSY):
        log.info("job waits", extra={"job": job_id, "reason": outcome.next.value,
                                     "detail": outcome.message, "countdown_s": outcome.countdown})
        raise self.retry(countdown=outcome.countdown)
    return outcome.next.value


@shared_task(name="diagnostic.jobs.tasks.reap_expired_leases")
def reap_expired_leases() -> list[str]:
    """Re-queue work whose worker died; returns the ids of the jobs nudged."""
    jobs = set(leases.reap_expired_stage_leases(max_attempts=settings.DIAG_MAX_STAGE_ATTEMPTS))
    jobs.update(leases.stalled_jobs())
    for job_id in sorted(jobs):
        log.warning("re-queueing job after a lost worker", extra={"job": job_id})
        run_diagnostic.delay(job_id)
    return sorted(jobs)


def enqueue_job(job: DiagnosticJob) -> None:
    """Hand the job to the workers once the transaction that created it commits."""
    run_diagnostic.delay_on_commit(str(job.pk))
