"""Bookings and lab days: the database, not a form, keeps one booking per lab day."""

from __future__ import annotations

import datetime

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from diagnostic.bookings.models import Booking, Lab, LabDay, LabDayTaken, LabNode, Organisation, book_lab_day
from tests.diagnostic.doubles import inventory

pytestmark = pytest.mark.django_db


def test_booking_a_free_day_records_the_customers_organisation(lab_day: LabDay, customer: User) -> None:
    booking = book_lab_day(lab_day=lab_day, customer=customer)
    assert booking.organisation.name == "Acme Inference"
    assert booking.status == Booking.Status.REQUESTED


def test_a_booked_day_cannot_be_booked_again(lab_day: LabDay, customer: User, other_customer: User) -> None:
    book_lab_day(lab_day=lab_day, customer=customer)
    with pytest.raises(LabDayTaken, match="already booked"):
        book_lab_day(lab_day=lab_day, customer=other_customer)
    assert Booking.objects.filter(lab_day=lab_day).count() == 1


def test_the_database_refuses_a_second_active_booking_written_directly(
    lab_day: LabDay, customer: User, other_customer: User
) -> None:
    Booking.objects.create(lab_day=lab_day, customer=customer, organisation=customer.customer.organisation)
    with pytest.raises(IntegrityError), transaction.atomic():
        Booking.objects.create(
            lab_day=lab_day, customer=other_customer, organisation=other_customer.customer.organisation
        )


def test_cancelling_a_booking_frees_the_day(lab_day: LabDay, customer: User, other_customer: User) -> None:
    first = book_lab_day(lab_day=lab_day, customer=customer)
    first.status = Booking.Status.CANCELLED
    first.save()
    second = book_lab_day(lab_day=lab_day, customer=other_customer)
    assert second.organisation.name == "Globex Serving"


def test_a_user_without_organisation_cannot_book(lab_day: LabDay) -> None:
    loner = User.objects.create_user("loner")
    with pytest.raises(ValueError, match="belongs to no organisation"):
        book_lab_day(lab_day=lab_day, customer=loner)


def test_a_lab_has_each_date_once(lab: Lab) -> None:
    LabDay.objects.create(lab=lab, date=datetime.date(2025, 5, 6))
    with pytest.raises(IntegrityError), transaction.atomic():
        LabDay.objects.create(lab=lab, date=datetime.date(2025, 5, 6))


def test_organisation_names_are_unique(organisation: Organisation) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        Organisation.objects.create(name=organisation.name)


def test_sim_labs_keep_their_inventory_under_the_sim_state_dir(lab: Lab, sim_state_dir: object) -> None:
    assert lab.is_simulated
    assert lab.inventory_path() == sim_state_dir / "test-lab" / "inventory.yaml"  # type: ignore[operator]
    real = Lab.objects.create(name="in-house", inventory="/etc/diag/inventory.yaml")
    assert not real.is_simulated
    assert str(real.inventory_path()) == "/etc/diag/inventory.yaml"


def test_lab_nodes_mirror_the_inventory(lab: Lab) -> None:
    LabNode.objects.create(lab=lab, name="retired-node")
    lab.sync_nodes(inventory(4))
    assert list(lab.nodes.values_list("name", "role")) == [
        ("spark-01", "head"), ("spark-02", "worker"), ("spark-03", "worker"), ("spark-04", "worker"),
    ]
