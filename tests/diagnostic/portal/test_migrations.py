"""The ownership migrations on rows that existed before them: configurations get their
booking's organisation (or the house's), jobs their configuration's, bookings a public
id each; the same on SQLite and PostgreSQL (the suite runs on both)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("bookings", "0001_initial"), ("jobs", "0001_initial"), ("reports", "0001_initial")]


def latest() -> list[tuple[str, str]]:
    """Every app at its newest migration: rolling bookings back also unapplied the apps
    that depend on it, and the tests after this one need them."""
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(targets).apps


def test_existing_rows_get_their_owners(settings: Any) -> None:
    old = migrate(BEFORE)
    User = old.get_model("auth", "User")
    Organisation = old.get_model("bookings", "Organisation")
    Customer = old.get_model("bookings", "Customer")
    Lab = old.get_model("bookings", "Lab")
    LabDay = old.get_model("bookings", "LabDay")
    Booking = old.get_model("bookings", "Booking")
    Config = old.get_model("bookings", "ClusterConfiguration")
    Job = old.get_model("jobs", "DiagnosticJob")
    acme = Organisation.objects.create(name="Acme Inference")
    alice = User.objects.create(username="alice")
    Customer.objects.create(user=alice, organisation=acme)
    lab = Lab.objects.create(name="sim:old", inventory="sim:x.yaml")
    days = [LabDay.objects.create(lab=lab, date=f"2026-01-0{n}") for n in (1, 2)]
    bookings = [Booking.objects.create(lab_day=d, customer=alice, organisation=acme) for d in days]
    booked = Config.objects.create(booking=bookings[0], source="yaml", raw_text="", normalized={})
    loose = Config.objects.create(source="yaml", raw_text="", normalized={})
    booked_job = Job.objects.create(config=booked, lab=lab)  # the old schema let job.booking stay empty
    loose_job = Job.objects.create(config=loose, lab=lab)

    new = migrate(latest())
    Config = new.get_model("bookings", "ClusterConfiguration")
    Job = new.get_model("jobs", "DiagnosticJob")
    Booking = new.get_model("bookings", "Booking")
    house = new.get_model("bookings", "Organisation").objects.get(name=settings.DIAG_HOUSE_ORGANISATION)
    assert Config.objects.get(pk=booked.pk).organisation_id == acme.pk
    assert Config.objects.get(pk=loose.pk).organisation_id == house.pk
    job = Job.objects.get(pk=booked_job.pk)
    assert (job.organisation_id, job.booking_id) == (acme.pk, bookings[0].pk)
    assert Job.objects.get(pk=loose_job.pk).organisation_id == house.pk
    uuids = set(Booking.objects.values_list("uuid", flat=True))
    assert len(uuids) == 2 and None not in uuids
