"""A diagnostic runs on its booking's lab day. Confirmed weeks ahead it waits, queued, with
nothing on the broker; the job page says which day it waits for; the lost-job sweep and
a stray delivery leave it waiting; on the day the beat's `start_due_jobs` publishes it
once. A booking for today starts at confirmation. Cancelling the booking before the day
cancels the waiting job; moving it takes the job along.

Services tier: the messages are read back from a real Redis, the rows from PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone

from diagnostic.bookings.models import Booking, LabDay, book_lab_day, cancel_booking, reschedule_booking
from diagnostic.celery import app
from diagnostic.jobs import leases, tasks
from diagnostic.jobs.models import DiagnosticJob, StageRun
from tests.diagnostic.conftest import Cast

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

COMMAND = (
    "vllm serve /models/kimi-k2 --served-model-name moonshotai/Kimi-K2-Instruct-0905 "
    "--tensor-parallel-size 8 --enable-expert-parallel --max-model-len 262144"
)


class Broker:
    """The diagnostic queue in Redis, as the workers would find it."""

    def __init__(self, url: str) -> None:
        import redis

        self.redis = redis.Redis.from_url(url)
        self.queue = app.conf.task_default_queue

    def job_ids(self) -> list[str]:
        ids = []
        for raw in self.redis.lrange(self.queue, 0, -1):
            message = json.loads(raw)
            assert message["headers"]["task"] == "diagnostic.jobs.tasks.run_diagnostic"
            ids.append(message["headers"]["argsrepr"].strip("(),'\""))
        return ids

    def purge(self) -> None:
        self.redis.delete(self.queue)


@pytest.fixture
def broker(postgres: None, redis_url: str, settings: Any) -> Iterator[Broker]:
    settings.CELERY_TASK_ALWAYS_EAGER = False
    queue = Broker(redis_url)
    queue.purge()
    yield queue
    queue.purge()


def days(lab: Any, *offsets: int) -> list[LabDay]:
    today = timezone.localdate()
    return [LabDay.objects.create(lab=lab, date=today + dt.timedelta(days=n)) for n in offsets]


def confirm(cast: Cast, booking: Booking) -> DiagnosticJob:
    response = cast.client("alice").post(
        f"/portal/bookings/{booking.uuid}/config/",
        {"source": "command", "command": COMMAND, "action": "confirm"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    job = DiagnosticJob.objects.get(booking=booking)
    assert response["Location"] == f"/portal/jobs/{job.pk}/"
    return job


def test_a_job_confirmed_weeks_ahead_waits_for_its_lab_day_then_starts_once(
    cast: Cast, lab: Any, broker: Broker, settings: Any
) -> None:
    (ahead,) = days(lab, 21)
    booking = book_lab_day(lab_day=ahead, customer=cast.alice)
    job = confirm(cast, booking)
    assert (job.status, job.released_at) == ("queued", None)
    assert broker.job_ids() == []

    page = cast.client("alice").get(f"/portal/jobs/{job.pk}/").content.decode()
    day = f"{ahead.date:%A} {ahead.date.day} {ahead.date:%B %Y}"
    assert f"Waiting for your lab day ({day})" in page
    listing = cast.client("alice").get("/portal/").content.decode()
    assert f"waiting for your lab day ({day})" in listing
    # The booking can still be moved or cancelled: the diagnostic has not started.
    assert booking.can_change()

    # Neither the beat nor the lost-job sweep takes it before the day, however old it is.
    DiagnosticJob.objects.filter(pk=job.pk).update(created_at=timezone.now() - dt.timedelta(days=3))
    assert tasks.start_due_jobs() == []
    assert leases.lost_queued_jobs(older_than_s=settings.DIAG_QUEUED_REQUEUE_S) == []
    assert tasks.reap_expired_leases() == []
    assert broker.job_ids() == []

    # A delivery that reaches it early (an old message) runs nothing and puts it back.
    DiagnosticJob.objects.filter(pk=job.pk).update(released_at=timezone.now())
    assert tasks.run_diagnostic.apply(args=[str(job.pk)]).get() == tasks.WAITING_FOR_LAB_DAY
    job.refresh_from_db()
    assert (job.status, job.released_at, job.started_at) == ("queued", None, None)
    assert not job.stage_runs.exclude(status=StageRun.Status.PENDING).exists()

    # The day begins: the beat publishes the job, once however often it runs.
    LabDay.objects.filter(pk=ahead.pk).update(date=timezone.localdate())
    assert tasks.start_due_jobs() == [str(job.pk)]
    assert tasks.start_due_jobs() == []
    assert broker.job_ids() == [str(job.pk)]
    job.refresh_from_db()
    assert job.released_at is not None and job.status == "queued"
    page = cast.client("alice").get(f"/portal/jobs/{job.pk}/").content.decode()
    assert "Waiting for your lab day" not in page
    # Freshly handed on, it is not lost yet; a message lost since, it is.
    assert leases.lost_queued_jobs(older_than_s=settings.DIAG_QUEUED_REQUEUE_S) == []
    DiagnosticJob.objects.filter(pk=job.pk).update(released_at=timezone.now() - dt.timedelta(hours=1))
    assert leases.lost_queued_jobs(older_than_s=settings.DIAG_QUEUED_REQUEUE_S) == [str(job.pk)]


def test_a_booking_for_today_starts_at_confirmation(
    cast: Cast, lab: Any, broker: Broker, settings: Any
) -> None:
    settings.BOOKING_SAME_DAY = True
    (today,) = days(lab, 0)
    calendar = cast.client("alice").get("/portal/book/").content.decode()
    assert f'data-date="{today.date:%Y-%m-%d}"' in calendar
    response = cast.client("alice").post("/portal/book/", {"lab_day": today.pk, "confirmed": "yes"})
    assert response.status_code == 302
    booking = Booking.objects.get(lab_day=today)
    job = confirm(cast, booking)
    job.refresh_from_db()
    assert job.released_at is not None
    assert broker.job_ids() == [str(job.pk)]
    assert tasks.start_due_jobs() == []  # already handed on
    page = cast.client("alice").get(f"/portal/jobs/{job.pk}/").content.decode()
    assert "Waiting for your lab day" not in page


def test_today_is_offered_only_with_same_day_booking(cast: Cast, lab: Any, settings: Any) -> None:
    (today,) = days(lab, 0)
    settings.BOOKING_SAME_DAY = False
    response = cast.client("alice").post("/portal/book/", {"lab_day": today.pk, "confirmed": "yes"})
    assert response.status_code == 400
    assert not Booking.objects.exists()


def test_cancelling_before_the_day_cancels_the_waiting_job_and_moving_takes_it_along(
    cast: Cast, lab: Any, broker: Broker
) -> None:
    first, later, other = days(lab, 10, 15, 20)
    moved = book_lab_day(lab_day=first, customer=cast.alice)
    job = confirm(cast, moved)
    reschedule_booking(booking=moved, lab_day=later)
    job.refresh_from_db()
    assert job.booking.lab_day == later and job.waits_for_lab_day()
    assert f"({later.date:%A} {later.date.day}" in job.status_words

    dropped = book_lab_day(lab_day=other, customer=cast.alice)
    waiting = confirm(cast, dropped)
    cancel_booking(booking=dropped)
    waiting.refresh_from_db()
    assert waiting.status == "cancelled"
    assert "booking was cancelled" in waiting.status_message
    assert set(waiting.stage_runs.values_list("status", flat=True)) == {"cancelled"}
    assert broker.job_ids() == []
    # Nothing to start on the day any more.
    LabDay.objects.filter(pk=other.pk).update(date=timezone.localdate())
    assert tasks.start_due_jobs() == []


def test_a_started_diagnostic_pins_the_booking(cast: Cast, lab: Any, broker: Broker) -> None:
    (ahead,) = days(lab, 10)
    booking = book_lab_day(lab_day=ahead, customer=cast.alice)
    job = confirm(cast, booking)
    DiagnosticJob.objects.filter(pk=job.pk).update(status="running", started_at=timezone.now())
    assert not booking.can_change()
    from diagnostic.bookings.models import BookingRefused

    with pytest.raises(BookingRefused, match="has started"):
        cancel_booking(booking=booking)


def test_jobs_without_a_booking_are_not_the_lab_days_business(make_job: Any, broker: Broker) -> None:
    job = make_job(["report"])
    assert job.is_due() and not job.waits_for_lab_day()
    assert tasks.start_due_jobs() == []  # its maker (diagnose, staff) hands it on


def test_the_beat_runs_the_lab_day_start() -> None:
    entry = app.conf.beat_schedule["start-due-jobs"]
    assert entry["task"] == "diagnostic.jobs.tasks.start_due_jobs"
    assert entry["task"] in app.tasks


def test_the_configuration_can_be_replaced_until_the_lab_day(cast: Cast, lab: Any, broker: Broker) -> None:
    (ahead,) = days(lab, 12)
    booking = book_lab_day(lab_day=ahead, customer=cast.alice)
    first = confirm(cast, booking)
    page = cast.client("alice").get(f"/portal/bookings/{booking.uuid}/config/")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="replacing"' in text and f'name="replaces" value="{first.pk}"' in text
    assert "--enable-expert-parallel" in text  # the queued command, ready to change
    job_page = cast.client("alice").get(f"/portal/jobs/{first.pk}/").content.decode()
    assert "change the configuration" in job_page

    changed = COMMAND.replace("--max-model-len 262144", "--max-model-len 131072")
    data = {"source": "command", "command": changed, "action": "confirm", "replaces": str(first.pk)}
    answer = cast.client("alice").post(f"/portal/bookings/{booking.uuid}/config/", data)
    second = DiagnosticJob.objects.exclude(pk=first.pk).get(booking=booking)
    assert answer["Location"] == f"/portal/jobs/{second.pk}/"
    first.refresh_from_db()
    assert first.status == "cancelled" and "replaced by a new configuration" in first.status_message
    assert second.waits_for_lab_day() and second.config.normalized["serving"]["max_model_len"] == 131072
    # The same confirmation sent twice replaces once.
    again = cast.client("alice").post(f"/portal/bookings/{booking.uuid}/config/", data)
    assert again["Location"] == f"/portal/jobs/{second.pk}/"
    assert DiagnosticJob.objects.filter(booking=booking).count() == 2
    assert broker.job_ids() == []

    # Once the diagnostic has started the page leads to it instead.
    DiagnosticJob.objects.filter(pk=second.pk).update(status="running", started_at=timezone.now())
    late = cast.client("alice").get(f"/portal/bookings/{booking.uuid}/config/")
    assert late.status_code == 302 and late["Location"] == f"/portal/jobs/{second.pk}/"
