"""Starting the diagnostic a customer confirmed. A job whose lab day is still ahead waits,
queued, for the day (the Celery beat's `start_due_jobs` hands it on then); a job for
today starts at once. With a broker the Celery workers take it; without one (the demo,
`runserver`) it runs in a thread of this process, so the page answers at once and the job
page shows the stages advancing. Without a broker there is no beat either: a job waiting
for a later day starts when `start_due_jobs` runs (or a worker's beat does)."""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

from diagnostic.jobs.labaccess import open_lab_session
from diagnostic.jobs.models import DiagnosticJob
from diagnostic.jobs.orchestration import run_until_done
from diagnostic.jobs.tasks import enqueue_job

log = logging.getLogger(__name__)


def _run_in_process(job_id: str) -> None:
    try:
        run_until_done(job_id, open_lab_session)
    except Exception:  # the thread has no caller to tell; the job row shows what happened
        log.exception("in-process diagnostic failed job=%s", job_id)
    finally:
        connections.close_all()


def start_job(job: DiagnosticJob) -> bool:
    """Hand the job on once the transaction that created it commits; False when it waits
    for its lab day instead."""
    if not settings.CELERY_TASK_ALWAYS_EAGER:
        return enqueue_job(job)
    if job.waits_for_lab_day():
        return False
    job_id = str(job.pk)
    DiagnosticJob.objects.filter(pk=job.pk, status=DiagnosticJob.Status.QUEUED).update(
        released_at=timezone.now()
    )
    transaction.on_commit(
        lambda: threading.Thread(
            target=_run_in_process, args=(job_id,), name=f"job-{job_id}", daemon=True
        ).start()
    )
    return True
