"""Starting the diagnostic a customer confirmed. With a broker the Celery workers take
it; without one (the demo, `runserver`) it runs in a thread of this process, so the page
answers at once and the job page shows the stages advancing."""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import connections, transaction

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


def start_job(job: DiagnosticJob) -> None:
    """Hand the job on once the transaction that created it commits."""
    if settings.CELERY_TASK_ALWAYS_EAGER:
        job_id = str(job.pk)
        transaction.on_commit(
            lambda: threading.Thread(
                target=_run_in_process, args=(job_id,), name=f"job-{job_id}", daemon=True
            ).start()
        )
    else:
        enqueue_job(job)
