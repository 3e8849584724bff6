"""The admin cannot bypass the booking rules: bookings and configurations are read-only
there, cancelling goes through cancel_booking (cutoff, started diagnostic), a customer
cannot be moved to another organisation and a booked day cannot be moved."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from diagnostic.bookings.models import (
    Booking,
    ClusterConfiguration,
    Customer,
    LabDay,
    Organisation,
    book_lab_day,
)
from tests.diagnostic.conftest import Cast

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", None))
    return client


@pytest.fixture
def booked(cast: Cast, lab: Any) -> tuple[Booking, Booking]:
    today = timezone.localdate()
    far, near = (LabDay.objects.create(lab=lab, date=today + dt.timedelta(days=n)) for n in (10, 1))
    ahead = book_lab_day(lab_day=far, customer=cast.alice)
    # Inside the cutoff (made as the portal would never offer it, for the test's sake).
    soon = Booking.objects.create(lab_day=near, customer=cast.alice, organisation=cast.organisation_a)
    return ahead, soon


def test_a_booking_is_shown_but_cannot_be_edited_added_or_deleted(
    admin_client_: Client, booked: tuple[Booking, Booking], cast: Cast
) -> None:
    booking, _ = booked
    before = (booking.lab_day_id, booking.customer_id, booking.status)
    url = f"/admin/bookings/booking/{booking.pk}/change/"
    page = admin_client_.get(url)
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    other_day = LabDay.objects.exclude(pk=booking.lab_day_id).first()
    assert other_day is not None
    moved = admin_client_.post(url, {"lab_day": other_day.pk, "customer": cast.bob.pk, "status": "completed"})
    assert moved.status_code == 403
    booking.refresh_from_db()
    assert (booking.lab_day_id, booking.customer_id, booking.status) == before
    assert admin_client_.get("/admin/bookings/booking/add/").status_code == 403
    deleted = admin_client_.post(f"/admin/bookings/booking/{booking.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 403
    assert admin_client_.get("/admin/bookings/clusterconfiguration/add/").status_code == 403


def test_cancelling_from_the_admin_keeps_the_cutoff(
    admin_client_: Client, booked: tuple[Booking, Booking]
) -> None:
    ahead, soon = booked
    response = admin_client_.post(
        "/admin/bookings/booking/",
        {"action": "cancel_selected", "_selected_action": [ahead.pk, soon.pk]},
        follow=True,
    )
    assert response.status_code == 200
    text = response.content.decode()
    ahead.refresh_from_db()
    soon.refresh_from_db()
    assert (ahead.status, soon.status) == ("cancelled", "requested")
    assert "bookings can be changed until 48 h before the lab day" in text


def test_a_customer_stays_in_their_organisation_and_a_booked_day_stays_put(
    admin_client_: Client, booked: tuple[Booking, Booking], cast: Cast
) -> None:
    booking, _ = booked
    member = Customer.objects.get(user=cast.alice)
    admin_client_.post(
        f"/admin/bookings/customer/{member.pk}/change/",
        {"user": cast.alice.pk, "organisation": cast.organisation_b.pk},
    )
    member.refresh_from_db()
    assert member.organisation == cast.organisation_a
    day = booking.lab_day
    admin_client_.post(
        f"/admin/bookings/labday/{day.pk}/change/",
        {"lab": day.lab_id, "date": (day.date + dt.timedelta(days=3)).isoformat(), "closed": "on"},
    )
    day.refresh_from_db()
    assert day.date == booking.lab_day.date and day.closed  # closing is staff's call; moving is not
    assert Organisation.objects.count() == 2 and ClusterConfiguration.objects.count() == 0
