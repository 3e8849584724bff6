"""Ownership in the data: every configuration and job has an organisation, derived from
its booking; links that disagree are refused; bookings are only for members."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from diagnostic.bookings.configs import submit_configuration
from diagnostic.bookings.models import (
    Booking,
    ClusterConfiguration,
    LabDay,
    NotAMember,
    Organisation,
    book_lab_day,
)
from diagnostic.jobs.models import DiagnosticJob
from diagnostic.jobs.orchestration import create_job
from tests.diagnostic.conftest import REFERENCE_CONFIG, Cast

pytestmark = pytest.mark.django_db


def _config(booking: Booking | None = None) -> ClusterConfiguration:
    return submit_configuration(raw_text=REFERENCE_CONFIG.read_text(), source="yaml", booking=booking)


def test_a_configuration_belongs_to_its_bookings_organisation(cast: Cast, days_ahead: list[LabDay]) -> None:
    booking = book_lab_day(lab_day=days_ahead[0], customer=cast.alice)
    assert _config(booking).organisation == cast.organisation_a


def test_a_configuration_without_booking_belongs_to_the_house(db: None) -> None:
    config = _config()
    assert config.organisation == Organisation.house()
    assert not config.organisation.customers.exists()


def test_a_configuration_cannot_be_filed_under_another_organisations_booking(
    cast: Cast, days_ahead: list[LabDay]
) -> None:
    booking = book_lab_day(lab_day=days_ahead[0], customer=cast.alice)
    with pytest.raises(ValidationError, match="organisation of the booking"):
        ClusterConfiguration.objects.create(
            booking=booking, organisation=cast.organisation_b, source="yaml", raw_text="", normalized={}
        )


def test_a_job_takes_its_configurations_organisation_and_booking(
    cast: Cast, days_ahead: list[LabDay]
) -> None:
    booking = book_lab_day(lab_day=days_ahead[0], customer=cast.alice)
    job = create_job(config=_config(booking), lab=booking.lab_day.lab)
    assert job.organisation == cast.organisation_a
    assert job.booking == booking


def test_a_job_whose_booking_is_not_its_configurations_is_refused(
    cast: Cast, days_ahead: list[LabDay]
) -> None:
    mine = book_lab_day(lab_day=days_ahead[0], customer=cast.alice)
    theirs = book_lab_day(lab_day=days_ahead[1], customer=cast.bob)
    with pytest.raises(ValidationError, match="booking the configuration was submitted for"):
        create_job(config=_config(mine), lab=mine.lab_day.lab, booking=theirs)
    assert not DiagnosticJob.objects.exists()


def test_booking_for_an_organisation_one_is_not_a_member_of_is_refused(
    cast: Cast, days_ahead: list[LabDay]
) -> None:
    with pytest.raises(NotAMember, match="not a member"):
        book_lab_day(lab_day=days_ahead[0], customer=cast.alice, organisation=cast.organisation_b)
    assert not Booking.objects.exists()


def test_a_booking_row_with_a_non_member_customer_is_refused(cast: Cast, days_ahead: list[LabDay]) -> None:
    with pytest.raises(ValidationError, match="not a member"):
        Booking.objects.create(lab_day=days_ahead[0], customer=cast.alice, organisation=cast.organisation_b)


def test_staff_cannot_book_through_the_domain_either(cast: Cast, days_ahead: list[LabDay]) -> None:
    with pytest.raises(NotAMember):
        book_lab_day(lab_day=days_ahead[0], customer=cast.staff)


def test_the_scoped_queries_return_only_the_organisations_rows(cast: Cast, days_ahead: list[LabDay]) -> None:
    mine = book_lab_day(lab_day=days_ahead[0], customer=cast.alice)
    book_lab_day(lab_day=days_ahead[1], customer=cast.bob)
    assert list(Booking.objects.for_organisation(cast.organisation_a)) == [mine]
    assert not Booking.objects.for_organisation(None).exists()
    loner = User.objects.create_user("loner")
    assert not hasattr(loner, "customer")
