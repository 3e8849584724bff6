"""A lab day the lab closes after a customer confirmed a diagnostic for it (maintenance):
the job does not start that day, the customer is told and may move the booking even
inside the change cutoff, and the job starts on the new day.

Services tier: the broker is a real Redis, the rows PostgreSQL."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from diagnostic.bookings.models import LabDay, book_lab_day, reschedule_booking
from diagnostic.jobs import leases, tasks
from diagnostic.jobs.models import DiagnosticJob
from tests.diagnostic.conftest import Cast
from tests.diagnostic.portal.test_lab_day_start import Broker, broker, confirm, days  # noqa: F401

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def test_a_day_closed_after_confirmation_holds_the_job_and_moving_the_booking_releases_it(
    cast: Cast, lab: Any, broker: Broker, settings: Any  # noqa: F811
) -> None:
    booked, later = days(lab, 1, 9)
    booking = book_lab_day(lab_day=booked, customer=cast.alice)
    job = confirm(cast, booking)
    # The lab closes the day; then the day comes.
    LabDay.objects.filter(pk=booked.pk).update(closed=True, date=timezone.localdate())
    assert tasks.start_due_jobs() == []
    assert leases.lost_queued_jobs(older_than_s=0) == []
    assert broker.job_ids() == []
    # A message that reaches it anyway runs nothing.
    DiagnosticJob.objects.filter(pk=job.pk).update(released_at=timezone.now())
    assert tasks.run_diagnostic.apply(args=[str(job.pk)]).get() == tasks.WAITING_FOR_LAB_DAY
    job.refresh_from_db()
    assert (job.status, job.started_at, job.released_at) == ("queued", None, None)
    assert job.status_words.startswith("on hold: the lab closed on your lab day")

    page = cast.client("alice").get(f"/portal/jobs/{job.pk}/").content.decode()
    assert "On hold: the lab is closed on your lab day" in page
    assert f"/portal/bookings/{booking.uuid}/" in page
    assert "Waiting for your lab day" not in page
    # Inside the usual cutoff, yet the booking may move: the closure was the lab's.
    booking.refresh_from_db()
    assert timezone.now() >= booking.change_deadline() and booking.can_change()
    detail = cast.client("alice").get(f"/portal/bookings/{booking.uuid}/").content.decode()
    assert f'value="{later.pk}"' in detail
    reschedule_booking(booking=booking, lab_day=later)
    job.refresh_from_db()
    assert not job.held_by_closed_day and job.waits_for_lab_day()
    assert tasks.start_due_jobs() == []
    # The new day comes.
    LabDay.objects.filter(pk=booked.pk).update(date=timezone.localdate() - dt.timedelta(days=1))
    LabDay.objects.filter(pk=later.pk).update(date=timezone.localdate())
    assert tasks.start_due_jobs() == [str(job.pk)]
    assert broker.job_ids() == [str(job.pk)]


def test_a_job_that_started_before_its_day_closed_is_not_held(
    cast: Cast, lab: Any, broker: Broker  # noqa: F811
) -> None:
    (today,) = days(lab, 3)
    booking = book_lab_day(lab_day=today, customer=cast.alice)
    job = confirm(cast, booking)
    LabDay.objects.filter(pk=today.pk).update(date=timezone.localdate())
    DiagnosticJob.objects.filter(pk=job.pk).update(started_at=timezone.now(), released_at=timezone.now())
    LabDay.objects.filter(pk=today.pk).update(closed=True)
    job.refresh_from_db()
    assert not job.held_by_closed_day and job.is_due()
    assert DiagnosticJob.objects.filter(pk=job.pk).due().exists()
