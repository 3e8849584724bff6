"""Rendering a new report version in the background: the request that asks for it records a
ReportRender and hands it to the workers at once; the review page shows where it stands
(waiting for a worker, being written with its progress, the version it made, or why it
failed) and follows it until it ends. One render of a job at a time."""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from diagnostic.jobs.faults import BROKER_ERRORS
from diagnostic.jobs.models import DiagnosticJob
from diagnostic.portal.job_views import lab_duration
from diagnostic.staff.models import ReportRender

log = logging.getLogger(__name__)

# Until renders have been timed here, one is expected to take this long (WeasyPrint's start
# and a 15-page report on this hardware).
DEFAULT_RENDER_S = 10.0
# The renders whose times make the estimate.
TIMED_RENDERS = 10


class RenderRefused(ValueError):
    pass


def active_render(job: DiagnosticJob) -> ReportRender | None:
    """The job's render that is waiting for a worker or being written (not one that stalled)."""
    now = timezone.now()
    under_way = ReportRender.objects.filter(
        job=job, state__in=(ReportRender.State.QUEUED, ReportRender.State.RUNNING))
    for row in under_way.order_by("-requested_at", "-id"):
        if not row.stalled(now):
            return row
    return None


def request_render(job: DiagnosticJob, *, by: Any = None) -> ReportRender:
    """Record a render of `job`'s report and hand it to the workers (in eager mode, as the
    tests and the demo run, it is written before this returns). Refused while the job runs
    or while another render of it is under way."""
    from diagnostic.staff.tasks import render_report_version

    if not job.is_terminal:
        raise RenderRefused("The report is written when the job ends; it is still running.")
    if active_render(job) is not None:
        raise RenderRefused("A new version is already being rendered; this page shows it when it is written.")
    row = ReportRender.objects.create(job=job, requested_by=by if getattr(by, "pk", None) else None)
    try:
        # Celery's publish retries a broker that is away a few times (under a second), then
        # raises; in eager mode it runs the task here and now.
        render_report_version.delay(str(job.pk), row.pk)
    except BROKER_ERRORS as exc:
        log.error("could not hand the render to the workers", extra={"job": str(job.pk), "error": str(exc)})
        ReportRender.objects.filter(pk=row.pk).update(
            state=ReportRender.State.FAILED, finished_at=timezone.now(),
            error=f"the workers could not be reached (the broker did not answer: {type(exc).__name__}); "
                  "nothing was rendered. Try again in a minute.")
    row.refresh_from_db()
    return row


def expected_seconds() -> float:
    """How long a render takes here: the median of the last renders that were written."""
    timed = [row.seconds for row in ReportRender.objects.filter(
        state=ReportRender.State.DONE, started_at__isnull=False, finished_at__isnull=False,
    ).order_by("-finished_at")[:TIMED_RENDERS]]
    times = [s for s in timed if s is not None and s > 0]
    return statistics.median(times) if times else DEFAULT_RENDER_S


@dataclass(frozen=True)
class RenderProgress:
    """The latest render of a job as the review page shows it."""

    row: ReportRender
    state: str  # queued | running | done | failed | stalled
    percent: int
    said: str  # where it stands, in words
    error: str = ""

    @property
    def following(self) -> bool:
        return self.state in ("queued", "running")


def render_progress(job: DiagnosticJob) -> RenderProgress | None:
    """The job's latest render, in words and with its progress; None when none was asked."""
    row = (ReportRender.objects.filter(job=job).select_related("requested_by")
           .order_by("-requested_at", "-id").first())
    if row is None:
        return None
    now = timezone.now()
    who = f" by {row.requested_by.username}" if row.requested_by else ""
    if row.state == ReportRender.State.QUEUED:
        waited = (now - row.requested_at).total_seconds()
        if row.stalled(now):
            return RenderProgress(row, "stalled", 0, "", error=(
                f"The render asked{who} at {timezone.localtime(row.requested_at):%H:%M} UTC has waited "
                f"{lab_duration(waited)} for a worker: the workers are all busy with lab days, or its "
                "message was lost. Render again (should the first still run, it makes the same version)."))
        said = f"Waiting for a worker (asked{who} {lab_duration(waited)} ago)"
        if waited > 2 * expected_seconds():
            said += "; the workers also run the lab days' stages, and it starts when one is free"
        return RenderProgress(row, "queued", 0, said + ".")
    if row.state == ReportRender.State.RUNNING:
        started = row.started_at or row.requested_at
        elapsed = (now - started).total_seconds()
        if row.stalled(now):
            return RenderProgress(row, "stalled", 0, "", error=(
                f"The render asked{who} at {timezone.localtime(row.requested_at):%H:%M} UTC was still being "
                f"written after {lab_duration(elapsed)}, longer than any render takes: its worker stopped. "
                "Nothing new was kept; render again."))
        expected = expected_seconds()
        percent = max(1, min(95, round(100 * elapsed / expected)))
        left = expected - elapsed
        eta = (f"about {lab_duration(left)} left" if left >= 1
               else "taking longer than usual, still being written")
        return RenderProgress(row, "running", percent, (
            f"Writing the report: {lab_duration(elapsed)} so far, {eta} "
            f"(a render takes about {lab_duration(expected)} here)."))
    if row.state == ReportRender.State.FAILED:
        return RenderProgress(row, "failed", 0, "", error=(
            f"The render asked{who} at {timezone.localtime(row.requested_at):%H:%M} UTC failed: {row.error}. "
            "No version was kept; the versions above are as they were."))
    took = f" in {lab_duration(row.seconds)}" if row.seconds is not None else ""
    at = f" at {timezone.localtime(row.finished_at):%H:%M} UTC" if row.finished_at else ""
    if row.new_version:
        said = f"Last render: version {row.version}, written{at}{took} ({row.pages} pages)."
    else:
        said = (f"Last render{at}{took}: the report is the same as version {row.version}, already kept "
                "(nothing had changed).")
    return RenderProgress(row, "done", 100, said)
