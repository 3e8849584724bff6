"""What a consultant can do to a job from its page: cancel it, retry a stage that failed
(with the stages that did not run after it, and the report), and write the report again.
Each returns a sentence for the page; each refuses, saying why, when it makes no sense."""

from __future__ import annotations

from django.db import transaction

from diagnostic.jobs.models import DiagnosticJob, StageRun
from diagnostic.portal.jobrun import start_job

RETRYABLE = (StageRun.Status.FAILED, StageRun.Status.QUARANTINED)


class ActionRefused(ValueError):
    pass


def cancel_job(job: DiagnosticJob) -> str:
    if not job.request_cancel():
        raise ActionRefused(f"the job already ended ({job.status}); nothing to cancel")
    return "Cancel requested: the running stage stops at its next check and the job ends cancelled."


def retry_stage(job: DiagnosticJob, stage_name: str) -> str:
    """Run a failed or quarantined stage again from its beginning, then every stage after
    it that did not succeed, and the report (it must include the retried stage)."""
    with transaction.atomic():
        locked = DiagnosticJob.objects.select_for_update().get(pk=job.pk)
        if not locked.is_terminal:
            raise ActionRefused("the job is still running; cancel it or wait for it to end before a retry")
        stage = locked.stage_runs.filter(name=stage_name).first()
        if stage is None:
            raise ActionRefused(f"this job has no stage {stage_name!r}")
        if stage.status not in RETRYABLE:
            raise ActionRefused(f"{stage_name} is {stage.status}; only a failed or stopped stage is retried")
        again = locked.stage_runs.filter(order__gte=stage.order).exclude(status=StageRun.Status.SUCCEEDED)
        names = list(again.order_by("order").values_list("name", flat=True))
        again.update(status=StageRun.Status.PENDING, status_message="", attempts=0, lease_owner="",
                     lease_expires_at=None, progress_percent=0, progress_message="", finished_at=None)
        locked.stage_runs.filter(name="report").update(
            status=StageRun.Status.PENDING, status_message="", attempts=0, lease_owner="",
            lease_expires_at=None, progress_percent=0, progress_message="", finished_at=None)
        DiagnosticJob.objects.filter(pk=locked.pk).update(
            status=DiagnosticJob.Status.QUEUED, status_message="", finished_at=None, cancel_requested=False
        )
        locked.refresh_from_db()
        start_job(locked)
    # In the order they run: the stages after the retried one that did not succeed, then the report.
    rerun = [n for n in names if n not in (stage_name, "report")]
    rerun += [] if stage_name == "report" else ["report"]
    return f"Retrying {stage_name}" + (f", then {', '.join(rerun)}" if rerun else "") + "."


def rerun_report(job: DiagnosticJob) -> str:
    from diagnostic.staff.tasks import render_report_version

    if not job.is_terminal:
        raise ActionRefused("the report is written when the job ends; it is still running")
    render_report_version.delay(str(job.pk))
    return "A new report version is being written from the findings and the staff's edits."
