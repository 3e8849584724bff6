"""Leases: who may run a stage, and which job holds a lab, decided by the database.

Every transition is one conditional UPDATE that must change exactly one row, so two
workers that find the same stage (a re-delivered message, the reaper, a duplicate
enqueue) cannot both run it: the loser changes nothing and walks away. A lease has an
expiry renewed by its holder's heartbeat; when a worker dies the lease lapses and the
stage or lab becomes claimable again.
"""

from __future__ import annotations

import enum
import logging
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from diagnostic import lifecycle
from diagnostic.bookings.models import Lab
from diagnostic.jobs.models import DiagnosticJob, LabLease, StageRun

log = logging.getLogger(__name__)

Status = StageRun.Status


class Claim(enum.Enum):
    CLAIMED = "claimed"
    QUARANTINED = "quarantined"  # out of attempts: set aside, never run again
    UNAVAILABLE = "unavailable"  # done, or running under someone else's live lease


def _claimable(now: datetime) -> Q:
    return Q(status=Status.PENDING) | Q(status=Status.RUNNING, lease_expires_at__lt=now)


def claim_stage(stage_id: int, *, owner: str, lease_s: float, max_attempts: int) -> Claim:
    """Take the stage for `owner`: pending (or running under an expired lease) becomes
    running with a fresh lease and one more attempt. A stage already tried
    `max_attempts` times is quarantined instead."""
    now = timezone.now()
    claimed = (
        lifecycle.CLAIM.apply(
            StageRun.objects.filter(_claimable(now), pk=stage_id, attempts__lt=max_attempts),
            lease_owner=owner,
            lease_expires_at=now + timedelta(seconds=lease_s),
            attempts=F("attempts") + 1,
            started_at=now,
            finished_at=None,
            progress_percent=0,
            progress_message="",
            status_message="",
            result=None,
            # The log is kept: each attempt appends to what the earlier ones wrote.
        )
    )
    if claimed == 1:
        return Claim.CLAIMED
    if quarantine_stage(stage_id, max_attempts=max_attempts, now=now):
        return Claim.QUARANTINED
    return Claim.UNAVAILABLE


def quarantine_stage(stage_id: int, *, max_attempts: int, now: datetime | None = None) -> bool:
    """Set aside a claimable stage that has used up its attempts; True if this call did."""
    now = now or timezone.now()
    stage = StageRun.objects.filter(pk=stage_id).only("attempts", "last_error").first()
    if stage is None:
        return False
    last = stage.last_error or "the worker running it stopped before finishing (lease expired)"
    message = (
        f"quarantined after {stage.attempts} attempts (limit {max_attempts}); not retried again. "
        f"Last error: {last}"
    )
    changed = lifecycle.QUARANTINE.apply(
        StageRun.objects.filter(_claimable(now), pk=stage_id, attempts__gte=max_attempts),
        status_message=message,
        lease_owner="",
        lease_expires_at=None,
        finished_at=now,
    )
    if changed:
        log.warning("stage quarantined", extra={"stage_id": stage_id, "attempts": stage.attempts})
    return changed == 1


def renew_stage_lease(stage_id: int, *, owner: str, lease_s: float) -> bool:
    """Extend a running stage's lease; False when `owner` no longer holds it."""
    changed = StageRun.objects.filter(pk=stage_id, status=Status.RUNNING, lease_owner=owner).update(
        lease_expires_at=timezone.now() + timedelta(seconds=lease_s)
    )
    return changed == 1


def release_stage(stage_id: int, *, owner: str, error: str) -> bool:
    """Give a running stage back (pending) after a transient failure, keeping the error."""
    changed = lifecycle.RELEASE.apply(
        StageRun.objects.filter(pk=stage_id, lease_owner=owner),
        lease_owner="",
        lease_expires_at=None,
        last_error=error,
        status_message=f"waiting to retry: {error}",
    )
    return changed == 1


def end_stage(
    stage_id: int, *, owner: str, end: lifecycle.Transition, message: str = "", error: str | None = None
) -> bool:
    """End a stage `owner` runs by `end` (failed, quarantined or cancelled: success and a
    stop carry the stage's result, orchestration._complete)."""
    fields: dict[str, object] = {
        "status_message": message,
        "lease_owner": "",
        "lease_expires_at": None,
        "finished_at": timezone.now(),
    }
    if error is not None:
        fields["last_error"] = error
    changed = end.apply(StageRun.objects.filter(pk=stage_id, lease_owner=owner), **fields)
    return changed == 1


def reap_expired_stage_leases(*, max_attempts: int) -> list[str]:
    """Stages whose worker died: back to pending, or quarantined when out of attempts.
    Returns the ids of the jobs that have work to resume."""
    now = timezone.now()
    jobs: set[str] = set()
    expired = StageRun.objects.filter(status=Status.RUNNING, lease_expires_at__lt=now).values_list(
        "pk", "job_id", "attempts"
    )
    for stage_id, job_id, attempts in expired:
        if attempts >= max_attempts:
            quarantine_stage(stage_id, max_attempts=max_attempts, now=now)
            jobs.add(str(job_id))
            continue
        changed = lifecycle.RELEASE.apply(
            StageRun.objects.filter(pk=stage_id, lease_expires_at__lt=now),
            lease_owner="",
            lease_expires_at=None,
            last_error="the worker running it stopped before finishing (lease expired)",
        )
        if changed:
            log.warning("stage lease expired; re-queued", extra={"stage_id": stage_id, "job": str(job_id)})
            jobs.add(str(job_id))
    return sorted(jobs)


def stalled_jobs() -> list[str]:
    """Running jobs that nobody is working on: no stage under a live lease and no live
    lab lease (the worker died between stages). Re-enqueueing them is harmless."""
    now = timezone.now()
    live_stage = StageRun.objects.filter(status=Status.RUNNING, lease_expires_at__gte=now)
    live_lab = LabLease.objects.filter(expires_at__gte=now)
    return [
        str(pk)
        for pk in DiagnosticJob.objects.filter(status=DiagnosticJob.Status.RUNNING)
        .exclude(pk__in=live_stage.values("job_id"))
        .exclude(pk__in=live_lab.values("job_id"))
        .values_list("pk", flat=True)
    ]


def lost_queued_jobs(*, older_than_s: float) -> list[str]:
    """Queued jobs that may run (no booking, or their lab day has begun), handed to the
    workers more than `older_than_s` ago (or created then and never handed), whose lab no
    other job holds: their message was lost (the broker was down at submit, or came back
    empty), since a job waiting for a busy lab keeps its own retry in the broker. A job
    whose lab day is still ahead is not lost, it waits. Re-enqueueing them is harmless: a
    second message finds the stage leased or done and walks away."""
    now = timezone.now()
    holders = dict(
        LabLease.objects.filter(job__isnull=False, expires_at__gte=now).values_list("lab_id", "job_id")
    )
    waiting = (
        DiagnosticJob.objects.due(now)
        .queued_since(now - timedelta(seconds=older_than_s))
        .filter(cancel_requested=False)
        .values_list("pk", "lab_id")
    )
    return [str(pk) for pk, lab_id in waiting if holders.get(lab_id, pk) == pk]


def jobs_due_to_start(now: datetime | None = None) -> list[str]:
    """Queued jobs of a booking whose lab day has begun and that were never handed to the
    workers, oldest first: the lab-day start hands them on. A job without a booking is
    handed on by whoever made it (`diagnose` may be running it in its own process)."""
    now = now or timezone.now()
    return [
        str(pk)
        for pk in DiagnosticJob.objects.due(now)
        .filter(
            status=DiagnosticJob.Status.QUEUED, cancel_requested=False, released_at__isnull=True,
            booking__isnull=False,
        )
        .order_by("created_at")
        .values_list("pk", flat=True)
    ]


def mark_released(job_id: str, *, now: datetime | None = None) -> bool:
    """Note that the job is being handed to the workers; False when another caller already
    did (so one beat, not two, publishes it) or the job is no longer queued."""
    changed = DiagnosticJob.objects.filter(
        pk=job_id, status=DiagnosticJob.Status.QUEUED, released_at__isnull=True
    ).update(released_at=now or timezone.now())
    return changed == 1


def mark_unreleased(job_id: str) -> None:
    """A job handed on before its lab day goes back to waiting for it."""
    DiagnosticJob.objects.filter(pk=job_id, status=DiagnosticJob.Status.QUEUED).update(released_at=None)


# -- the lab lease ---------------------------------------------------------------------


def _lease_row(lab: Lab) -> None:
    """Make sure the lab has its lease row; concurrent creators both succeed."""
    if LabLease.objects.filter(lab=lab).exists():
        return
    try:
        with transaction.atomic():
            LabLease.objects.create(lab=lab)
    except IntegrityError:
        pass  # another process created it first; the row is all we need


def acquire_lab(job: DiagnosticJob, *, owner: str, lease_s: float) -> bool:
    """Make `job` the holder of its lab. Succeeds when the lab is free, its lease has
    expired, or the job already holds it (another task of the same job, whose stages
    are serialised by their own leases)."""
    _lease_row(job.lab)
    now = timezone.now()
    free = Q(job__isnull=True) | Q(expires_at__isnull=True) | Q(expires_at__lt=now) | Q(job=job)
    changed = LabLease.objects.filter(free, lab=job.lab).update(
        job=job, owner=owner, acquired_at=now, expires_at=now + timedelta(seconds=lease_s)
    )
    return changed == 1


def renew_lab(job: DiagnosticJob | str, *, owner: str, lease_s: float) -> bool:
    """Extend the lab lease `job` holds; False when it holds none."""
    job_id = str(job.pk) if isinstance(job, DiagnosticJob) else job
    changed = LabLease.objects.filter(job__pk=job_id).update(
        owner=owner, expires_at=timezone.now() + timedelta(seconds=lease_s)
    )
    return changed == 1


def release_lab(job: DiagnosticJob) -> bool:
    changed = LabLease.objects.filter(job=job).update(job=None, owner="", expires_at=None)
    return changed == 1


def lab_holder(lab: Lab) -> str | None:
    """The id of the job holding the lab now, if any."""
    now = timezone.now()
    lease = LabLease.objects.filter(lab=lab, job__isnull=False, expires_at__gte=now).first()
    return str(lease.job_id) if lease else None
