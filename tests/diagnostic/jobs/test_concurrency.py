"""Services tier: what PostgreSQL guarantees when many workers or requests race.

Every racer is a thread with its own database connection, released by one barrier so
the statements really meet at the server; nothing is mocked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from diagnostic.bookings.models import Booking, LabDay, LabDayTaken, Organisation, book_lab_day
from diagnostic.jobs import leases
from diagnostic.jobs.leases import Claim
from diagnostic.jobs.models import DiagnosticJob, StageRun
from tests.diagnostic.conftest import make_customer

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]
T = TypeVar("T")
MakeJob = Callable[..., DiagnosticJob]


def race(n: int, fn: Callable[[int], T]) -> list[T | BaseException]:
    """Run fn(0..n-1) in n threads released together; results or exceptions in order."""
    barrier = threading.Barrier(n)

    def racer(i: int) -> T | BaseException:
        try:
            connection.ensure_connection()  # connect before the barrier, race after it
            barrier.wait(timeout=30)
            return fn(i)
        except BaseException as exc:
            return exc
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(racer, range(n)))


def test_twenty_concurrent_bookings_of_one_day_yield_exactly_one(postgres: None, lab_day: LabDay) -> None:
    customers: list[User] = [
        make_customer(f"customer-{i}", Organisation.objects.create(name=f"Org {i}")) for i in range(20)
    ]
    outcomes = race(20, lambda i: book_lab_day(lab_day=lab_day, customer=customers[i]))
    booked = [o for o in outcomes if isinstance(o, Booking)]
    refused = [o for o in outcomes if isinstance(o, LabDayTaken)]
    assert len(booked) == 1, outcomes
    assert len(refused) == 19, outcomes
    assert Booking.objects.filter(lab_day=lab_day).exclude(status="cancelled").count() == 1


def test_two_workers_claiming_one_stage_never_both_win(postgres: None, make_job: MakeJob) -> None:
    for _ in range(10):
        stage = make_job().stage_runs.order_by("order").first()
        assert stage is not None
        outcomes = race(
            2, lambda i, pk=stage.pk: leases.claim_stage(pk, owner=f"w{i}", lease_s=60, max_attempts=3)
        )
        assert sorted(o.value for o in outcomes if isinstance(o, Claim)) == ["claimed", "unavailable"]
        stage.refresh_from_db()
        assert stage.attempts == 1


def test_many_workers_taking_over_an_expired_stage_start_one_attempt(
    postgres: None, make_job: MakeJob
) -> None:
    stage = make_job().stage_runs.order_by("order").first()
    assert stage is not None
    leases.claim_stage(stage.pk, owner="dead", lease_s=60, max_attempts=3)
    StageRun.objects.filter(pk=stage.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    outcomes = race(8, lambda i: leases.claim_stage(stage.pk, owner=f"w{i}", lease_s=60, max_attempts=3))
    assert [o for o in outcomes if o is Claim.CLAIMED] == [Claim.CLAIMED]
    stage.refresh_from_db()
    assert stage.attempts == 2


def test_a_stage_whose_workers_keep_dying_is_quarantined_after_three_attempts(
    postgres: None, make_job: MakeJob
) -> None:
    stage = make_job().stage_runs.order_by("order").first()
    assert stage is not None
    for attempt in range(1, 4):
        assert leases.claim_stage(stage.pk, owner=f"w{attempt}", lease_s=60, max_attempts=3) is Claim.CLAIMED
        StageRun.objects.filter(pk=stage.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert leases.claim_stage(stage.pk, owner="w4", lease_s=60, max_attempts=3) is Claim.QUARANTINED
    stage.refresh_from_db()
    assert (stage.status, stage.attempts) == ("quarantined", 3)
    assert "lease expired" in stage.status_message


def test_the_reaper_requeues_only_stages_whose_lease_expired(postgres: None, make_job: MakeJob) -> None:
    jobs = [make_job() for _ in range(3)]
    stages = [j.stage_runs.order_by("order").first() for j in jobs]
    for i, stage in enumerate(stages):
        assert stage is not None
        leases.claim_stage(stage.pk, owner=f"w{i}", lease_s=60, max_attempts=3)
    StageRun.objects.filter(pk__in=[stages[0].pk, stages[2].pk]).update(  # type: ignore[union-attr]
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    reaped = race(3, lambda i: leases.reap_expired_stage_leases(max_attempts=3))
    requeued = sorted({job for outcome in reaped if isinstance(outcome, list) for job in outcome})
    assert requeued == sorted([str(jobs[0].pk), str(jobs[2].pk)])
    assert [StageRun.objects.get(pk=s.pk).status for s in stages] == ["pending", "running", "pending"]  # type: ignore[union-attr]


def test_two_jobs_never_hold_the_lab_together(postgres: None, make_job: MakeJob) -> None:
    jobs = [make_job() for _ in range(4)]
    holding = 0
    most = 0
    lock = threading.Lock()
    acquisitions = [0] * len(jobs)

    def contend(i: int) -> None:
        nonlocal holding, most
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            if not leases.acquire_lab(jobs[i], owner=f"w{i}", lease_s=30):
                continue
            with lock:
                holding += 1
                most = max(most, holding)
            acquisitions[i] += 1
            time.sleep(0.005)
            with lock:
                holding -= 1
            assert leases.release_lab(jobs[i])

    outcomes: list[Any] = race(len(jobs), contend)
    assert [o for o in outcomes if isinstance(o, BaseException)] == []
    assert most == 1
    assert sum(acquisitions) > len(jobs)
