"""Stage and lab leases: conditional updates decide who runs what."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.utils import timezone

from diagnostic.jobs import leases
from diagnostic.jobs.leases import Claim
from diagnostic.jobs.models import DiagnosticJob, LabLease, StageRun

pytestmark = pytest.mark.django_db
MakeJob = Callable[..., DiagnosticJob]


def first_stage(job: DiagnosticJob) -> StageRun:
    return job.stage_runs.order_by("order").first()  # type: ignore[return-value]


def expire(stage: StageRun) -> None:
    StageRun.objects.filter(pk=stage.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def test_claiming_a_pending_stage_starts_an_attempt_under_a_lease(make_job: MakeJob) -> None:
    stage = first_stage(make_job())
    assert leases.claim_stage(stage.pk, owner="w1", lease_s=60, max_attempts=3) is Claim.CLAIMED
    stage.refresh_from_db()
    assert (stage.status, stage.attempts, stage.lease_owner) == ("running", 1, "w1")
    assert stage.lease_expires_at > timezone.now() + timedelta(seconds=50)


def test_a_stage_under_a_live_lease_cannot_be_claimed_by_another_worker(make_job: MakeJob) -> None:
    stage = first_stage(make_job())
    leases.claim_stage(stage.pk, owner="w1", lease_s=60, max_attempts=3)
    assert leases.claim_stage(stage.pk, owner="w2", lease_s=60, max_attempts=3) is Claim.UNAVAILABLE
    stage.refresh_from_db()
    assert (stage.lease_owner, stage.attempts) == ("w1", 1)


def test_a_stage_whose_lease_expired_is_taken_over_as_a_new_attempt(make_job: MakeJob) -> None:
    stage = first_stage(make_job())
    leases.claim_stage(stage.pk, owner="w1", lease_s=60, max_attempts=3)
    expire(stage)
    assert leases.claim_stage(stage.pk, owner="w2", lease_s=60, max_attempts=3) is Claim.CLAIMED
    stage.refresh_from_db()
    assert (stage.lease_owner, stage.attempts) == ("w2", 2)
    assert not leases.renew_stage_lease(stage.pk, owner="w1", lease_s=60)


def test_a_succeeded_stage_is_never_claimed_again(make_job: MakeJob) -> None:
    stage = first_stage(make_job())
    StageRun.objects.filter(pk=stage.pk).update(status="succeeded", attempts=1)
    assert leases.claim_stage(stage.pk, owner="w1", lease_s=60, max_attempts=3) is Claim.UNAVAILABLE


def test_a_stage_out_of_attempts_is_quarantined_with_its_last_error(make_job: MakeJob) -> None:
    stage = first_stage(make_job())
    for owner in ("w1", "w2", "w3"):
        assert leases.claim_stage(stage.pk, owner=owner, lease_s=60, max_attempts=3) is Claim.CLAIMED
        leases.release_stage(stage.pk, owner=owner, error=f"{owner}: spark-05 unreachable")
    assert leases.claim_stage(stage.pk, owner="w4", lease_s=60, max_attempts=3) is Claim.QUARANTINED
    stage.refresh_from_db()
    assert stage.status == "quarantined"
    assert stage.status_message.startswith("quarantined after 3 attempts (limit 3)")
    assert "w3: spark-05 unreachable" in stage.status_message


def test_the_reaper_requeues_expired_stages_and_leaves_live_ones(make_job: MakeJob) -> None:
    dead, alive = make_job(), make_job()
    dead_stage, alive_stage = first_stage(dead), first_stage(alive)
    leases.claim_stage(dead_stage.pk, owner="dead", lease_s=60, max_attempts=3)
    leases.claim_stage(alive_stage.pk, owner="alive", lease_s=60, max_attempts=3)
    expire(dead_stage)
    assert leases.reap_expired_stage_leases(max_attempts=3) == [str(dead.pk)]
    dead_stage.refresh_from_db()
    alive_stage.refresh_from_db()
    assert (dead_stage.status, dead_stage.lease_owner) == ("pending", "")
    assert "lease expired" in dead_stage.last_error
    assert (alive_stage.status, alive_stage.lease_owner) == ("running", "alive")


def test_the_reaper_quarantines_an_expired_stage_on_its_last_attempt(make_job: MakeJob) -> None:
    job = make_job()
    stage = first_stage(job)
    StageRun.objects.filter(pk=stage.pk).update(attempts=2)
    leases.claim_stage(stage.pk, owner="w", lease_s=60, max_attempts=3)
    expire(stage)
    assert leases.reap_expired_stage_leases(max_attempts=3) == [str(job.pk)]
    stage.refresh_from_db()
    assert stage.status == "quarantined"
    assert "the worker running it stopped before finishing" in stage.status_message


def test_a_running_job_nobody_works_on_is_found_stalled(make_job: MakeJob) -> None:
    busy, stalled = make_job(), make_job()
    DiagnosticJob.objects.filter(pk__in=[busy.pk, stalled.pk]).update(status="running")
    leases.claim_stage(first_stage(busy).pk, owner="w", lease_s=60, max_attempts=3)
    assert leases.stalled_jobs() == [str(stalled.pk)]


def test_only_one_job_holds_a_lab(make_job: MakeJob) -> None:
    first, second = make_job(), make_job()
    assert leases.acquire_lab(first, owner="w1", lease_s=60)
    assert not leases.acquire_lab(second, owner="w2", lease_s=60)
    assert leases.lab_holder(first.lab) == str(first.pk)
    # The holder may re-enter (another delivery of its own task).
    assert leases.acquire_lab(first, owner="w3", lease_s=60)


def test_a_released_or_expired_lab_lease_goes_to_the_next_job(make_job: MakeJob) -> None:
    first, second, third = make_job(), make_job(), make_job()
    leases.acquire_lab(first, owner="w1", lease_s=60)
    leases.release_lab(first)
    assert leases.acquire_lab(second, owner="w2", lease_s=60)
    LabLease.objects.filter(lab=second.lab).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert leases.lab_holder(second.lab) is None
    assert leases.acquire_lab(third, owner="w3", lease_s=60)
    assert not leases.renew_lab(second, owner="w2", lease_s=60)
