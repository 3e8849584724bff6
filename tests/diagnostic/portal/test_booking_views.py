"""Booking through the portal: the calendar's states, booking a free day, a day taken
meanwhile answering "just taken" (never a 500), and cancelling or moving up to the cutoff."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from diagnostic.bookings.models import Booking, LabDay, book_lab_day
from tests.diagnostic.conftest import Cast

pytestmark = pytest.mark.django_db
# What the confirmation button of a summary page sends.
CONFIRMED = {"confirmed": "yes"}


def test_the_calendar_shows_available_booked_yours_and_closed(cast: Cast, days_ahead: list[LabDay]) -> None:
    book_lab_day(lab_day=days_ahead[0], customer=cast.alice)
    book_lab_day(lab_day=days_ahead[1], customer=cast.bob)
    LabDay.objects.filter(pk=days_ahead[2].pk).update(closed=True)
    page = cast.client("alice").get("/portal/book/").content.decode()
    assert f'data-date="{days_ahead[3].date:%Y-%m-%d}"' in page
    for taken in days_ahead[:3]:
        assert f'data-date="{taken.date:%Y-%m-%d}"' not in page
    assert page.count('class="state">yours') == 1
    assert page.count('class="state">booked') == 1
    assert page.count('class="state">closed') == 1


def test_booking_a_free_day_leads_to_the_bookings_page(cast: Cast, days_ahead: list[LabDay]) -> None:
    response = cast.client("alice").post("/portal/book/", {"lab_day": days_ahead[0].pk, **CONFIRMED})
    booking = Booking.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/portal/bookings/{booking.uuid}/"
    assert booking.organisation == cast.organisation_a and booking.customer == cast.alice


def test_a_day_taken_meanwhile_says_just_taken(cast: Cast, days_ahead: list[LabDay]) -> None:
    book_lab_day(lab_day=days_ahead[0], customer=cast.bob)
    response = cast.client("alice").post("/portal/book/", {"lab_day": days_ahead[0].pk, **CONFIRMED})
    assert response.status_code == 409
    assert "was just taken" in response.content.decode()
    assert Booking.objects.count() == 1


@pytest.mark.parametrize("value", ["", "nope", "999999", "-1"])
def test_a_bad_day_is_a_page_not_a_crash(cast: Cast, days_ahead: list[LabDay], value: str) -> None:
    response = cast.client("alice").post("/portal/book/", {"lab_day": value, **CONFIRMED})
    assert response.status_code == 400


def test_days_inside_the_cutoff_are_not_offered_nor_bookable(cast: Cast, lab: Any) -> None:
    tomorrow = LabDay.objects.create(lab=lab, date=timezone.localdate() + dt.timedelta(days=1))
    page = cast.client("alice").get("/portal/book/").content.decode()
    assert f'data-date="{tomorrow.date:%Y-%m-%d}"' not in page
    answer = cast.client("alice").post("/portal/book/", {"lab_day": tomorrow.pk, **CONFIRMED})
    assert answer.status_code == 400


def test_cancelling_before_the_cutoff_frees_the_day(cast: Cast, days_ahead: list[LabDay]) -> None:
    booking = book_lab_day(lab_day=days_ahead[0], customer=cast.alice)
    cast.client("alice").post(f"/portal/bookings/{booking.uuid}/cancel/", CONFIRMED)
    booking.refresh_from_db()
    assert booking.status == Booking.Status.CANCELLED
    assert book_lab_day(lab_day=days_ahead[0], customer=cast.bob).is_active


def test_changes_after_the_cutoff_are_refused_with_the_reason(
    cast: Cast, days_ahead: list[LabDay], settings: Any
) -> None:
    booking = book_lab_day(lab_day=days_ahead[0], customer=cast.alice)
    settings.BOOKING_CHANGE_CUTOFF_H = 24 * 30
    page = cast.client("alice").post(f"/portal/bookings/{booking.uuid}/cancel/", CONFIRMED, follow=True)
    assert "that time has passed" in page.content.decode()
    booking.refresh_from_db()
    assert booking.status != Booking.Status.CANCELLED


def test_moving_a_booking_to_a_free_day(cast: Cast, days_ahead: list[LabDay]) -> None:
    booking = book_lab_day(lab_day=days_ahead[0], customer=cast.alice)
    page = cast.client("alice").post(
        f"/portal/bookings/{booking.uuid}/reschedule/", {"lab_day": days_ahead[5].pk, **CONFIRMED},
        follow=True
    )
    booking.refresh_from_db()
    assert booking.lab_day == days_ahead[5]
    assert "Moved from" in page.content.decode()


def test_moving_onto_a_taken_day_says_just_taken(cast: Cast, days_ahead: list[LabDay]) -> None:
    booking = book_lab_day(lab_day=days_ahead[0], customer=cast.alice)
    book_lab_day(lab_day=days_ahead[5], customer=cast.bob)
    page = cast.client("alice").post(
        f"/portal/bookings/{booking.uuid}/reschedule/", {"lab_day": days_ahead[5].pk, **CONFIRMED},
        follow=True
    )
    booking.refresh_from_db()
    assert booking.lab_day == days_ahead[0]
    assert "was just taken" in page.content.decode()


def test_another_organisation_cannot_cancel(cast: Cast, days_ahead: list[LabDay]) -> None:
    booking = book_lab_day(lab_day=days_ahead[0], customer=cast.alice)
    assert cast.client("bob").post(f"/portal/bookings/{booking.uuid}/cancel/", CONFIRMED).status_code == 404
    booking.refresh_from_db()
    assert booking.is_active


def test_forms_need_the_csrf_token(cast: Cast, days_ahead: list[LabDay]) -> None:
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(cast.alice)
    assert strict.post("/portal/book/", {"lab_day": days_ahead[0].pk, **CONFIRMED}).status_code == 403
    assert not Booking.objects.exists()


def test_a_calendar_without_lab_days_says_so(cast: Cast, lab: Any) -> None:
    page = cast.client("alice").get("/portal/book/").content.decode()
    assert "No lab days are open for booking yet" in page and "<table" not in page
