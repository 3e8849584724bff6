"""The calendar's limits on the server (issue 29, item 7), attack by attack: one customer
booked 12 consecutive days in 0.8 s, a day outside the 56-day calendar by URL, and moved a
booking outside it. An organisation now holds at most BOOKING_MAX_OPEN_PER_ORG upcoming
days, days are booked and moved to only inside the calendar, and each refusal says why."""

from __future__ import annotations

import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from diagnostic.bookings.models import (
    Booking,
    Lab,
    LabDay,
    OutsideCalendar,
    QuotaReached,
    book_lab_day,
    booking_window,
)
from tests.diagnostic.conftest import Cast, make_customer

pytestmark = pytest.mark.django_db
# What the confirmation button of a summary page sends.
CONFIRMED = {"confirmed": "yes"}


def book(cast: Cast, who: str, day: LabDay) -> Any:
    return cast.client(who).post("/portal/book/", {"lab_day": day.pk, **CONFIRMED})


def day_at(lab: Lab, date: dt.date) -> LabDay:
    return LabDay.objects.get_or_create(lab=lab, date=date)[0]


# -- the quota -----------------------------------------------------------------------------------
def test_one_customer_cannot_hold_the_whole_calendar(cast: Cast, days_ahead: list[LabDay]) -> None:
    answers = [book(cast, "alice", day) for day in days_ahead[:12]]
    assert [a.status_code for a in answers] == [302] * 3 + [400] * 9
    said = answers[3].content.decode()
    assert "Your organisation already holds 3 upcoming lab days" in said
    assert "at most 3 at a time" in said and "Cancel one of them" in said
    first = days_ahead[0].date
    assert f"{first:%a} {first.day} {first:%b}" in said  # the days held, by name
    assert Booking.objects.filter(organisation=cast.organisation_a).count() == 3
    # Another organisation's days are its own.
    assert book(cast, "bob", days_ahead[12]).status_code == 302


def test_cancelled_completed_and_past_bookings_free_the_quota(
    cast: Cast, lab: Lab, days_ahead: list[LabDay]
) -> None:
    held = [book_lab_day(lab_day=day, customer=cast.alice) for day in days_ahead[:3]]
    assert book(cast, "alice", days_ahead[3]).status_code == 400
    cast.client("alice").post(f"/portal/bookings/{held[0].uuid}/cancel/", CONFIRMED)
    assert book(cast, "alice", days_ahead[3]).status_code == 302
    Booking.objects.filter(pk=held[1].pk).update(status=Booking.Status.COMPLETED)
    assert book(cast, "alice", days_ahead[4]).status_code == 302
    # A day that has taken place holds nothing any more.
    yesterday = day_at(lab, timezone.localdate() - dt.timedelta(days=1))
    Booking.objects.filter(pk=held[2].pk).update(lab_day=yesterday)
    assert book(cast, "alice", days_ahead[5]).status_code == 302
    assert book(cast, "alice", days_ahead[6]).status_code == 400


def test_the_quota_is_a_setting(cast: Cast, days_ahead: list[LabDay], settings: Any) -> None:
    settings.BOOKING_MAX_OPEN_PER_ORG = 1
    assert book(cast, "alice", days_ahead[0]).status_code == 302
    refused = book(cast, "alice", days_ahead[1])
    assert refused.status_code == 400
    assert "already holds 1 upcoming lab day (" in refused.content.decode()
    settings.BOOKING_MAX_OPEN_PER_ORG = 5
    assert [book(cast, "alice", d).status_code for d in days_ahead[1:6]] == [302] * 4 + [400]


def test_the_domain_refuses_beyond_the_quota_when_asked_for_the_customers_rules(
    cast: Cast, days_ahead: list[LabDay]
) -> None:
    for day in days_ahead[:3]:
        book_lab_day(lab_day=day, customer=cast.alice, limits=True)
    with pytest.raises(QuotaReached, match="at most 3"):
        book_lab_day(lab_day=days_ahead[3], customer=cast.alice, limits=True)
    # The firm's own tooling (the demo, staff scripts) books without the customer's rules.
    assert book_lab_day(lab_day=days_ahead[3], customer=cast.alice).is_active


# -- the calendar window ---------------------------------------------------------------------------
def test_a_day_beyond_the_calendar_cannot_be_booked_by_url(cast: Cast, lab: Lab) -> None:
    _, end = booking_window()
    last = day_at(lab, end - dt.timedelta(days=1))
    beyond = day_at(lab, end)
    far = day_at(lab, timezone.localdate() + dt.timedelta(days=400))
    page = cast.client("alice").get("/portal/book/").content.decode()
    assert f'data-date="{last.date:%Y-%m-%d}"' in page
    assert f'data-date="{beyond.date:%Y-%m-%d}"' not in page
    for day in (beyond, far):
        refused = book(cast, "alice", day)
        assert refused.status_code == 400
        said = refused.content.decode()
        assert "further ahead than the booking calendar reaches" in said
        assert f"{last.date:%A} {last.date.day} {last.date:%B %Y}" in said
    assert book(cast, "alice", last).status_code == 302
    assert list(Booking.objects.values_list("lab_day", flat=True)) == [last.pk]


def test_the_calendar_reaches_its_configured_days(cast: Cast, lab: Lab, settings: Any) -> None:
    settings.PORTAL_CALENDAR_DAYS = 7
    first, end = booking_window()
    assert (end - first).days <= 14
    assert book(cast, "alice", day_at(lab, end)).status_code == 400
    assert book(cast, "alice", day_at(lab, end - dt.timedelta(days=1))).status_code == 302


def test_past_and_too_soon_days_are_refused_saying_why(cast: Cast, lab: Lab) -> None:
    past = day_at(lab, timezone.localdate() - dt.timedelta(days=3))
    refused = book(cast, "alice", past)
    assert refused.status_code == 400 and "is in the past" in refused.content.decode()
    tomorrow = day_at(lab, timezone.localdate() + dt.timedelta(days=1))
    soon = book(cast, "alice", tomorrow)
    assert soon.status_code == 400
    assert "too soon to book" in soon.content.decode() and "48 hours before its day" in soon.content.decode()
    with pytest.raises(OutsideCalendar):
        book_lab_day(lab_day=past, customer=cast.alice, limits=True)


def test_a_booking_cannot_be_moved_beyond_the_calendar(
    cast: Cast, lab: Lab, days_ahead: list[LabDay]
) -> None:
    booking = book_lab_day(lab_day=days_ahead[0], customer=cast.alice)
    _, end = booking_window()
    beyond = day_at(lab, end + dt.timedelta(days=10))
    page = cast.client("alice").post(
        f"/portal/bookings/{booking.uuid}/reschedule/", {"lab_day": beyond.pk, **CONFIRMED}, follow=True
    ).content.decode()
    assert "further ahead than the booking calendar reaches" in page
    booking.refresh_from_db()
    assert booking.lab_day == days_ahead[0]
    # Inside it, the move is made.
    cast.client("alice").post(f"/portal/bookings/{booking.uuid}/reschedule/",
                              {"lab_day": days_ahead[6].pk, **CONFIRMED})
    booking.refresh_from_db()
    assert booking.lab_day == days_ahead[6]


def test_moving_does_not_count_against_the_quota(cast: Cast, days_ahead: list[LabDay]) -> None:
    held = [book_lab_day(lab_day=day, customer=cast.alice) for day in days_ahead[:3]]
    cast.client("alice").post(f"/portal/bookings/{held[0].uuid}/reschedule/",
                              {"lab_day": days_ahead[9].pk, **CONFIRMED})
    held[0].refresh_from_db()
    assert held[0].lab_day == days_ahead[9]


# -- at the same moment --------------------------------------------------------------------------
@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_twelve_concurrent_bookings_of_one_organisation_yield_the_quota(
    postgres: None, cast: Cast, days_ahead: list[LabDay]
) -> None:
    colleagues = [cast.alice] + [make_customer(f"acme-{i}", cast.organisation_a) for i in range(11)]
    barrier = threading.Barrier(12)

    def racer(i: int) -> Any:
        try:
            connection.ensure_connection()
            barrier.wait(timeout=30)
            return book_lab_day(lab_day=days_ahead[i], customer=colleagues[i], limits=True)
        except BaseException as exc:
            return exc
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=12) as pool:
        outcomes = list(pool.map(racer, range(12)))
    assert sum(isinstance(o, Booking) for o in outcomes) == 3, outcomes
    assert sum(isinstance(o, QuotaReached) for o in outcomes) == 9, outcomes
    assert Booking.objects.filter(organisation=cast.organisation_a).count() == 3
