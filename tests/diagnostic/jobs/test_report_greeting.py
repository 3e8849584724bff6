"""The report email greets the person who booked, by name when we have one, never the
organisation as if it were a person."""

from __future__ import annotations

import pytest
from django.utils import timezone

from diagnostic.bookings.configs import submit_configuration
from diagnostic.bookings.models import Booking, Lab, LabDay
from diagnostic.jobs.orchestration import create_job
from diagnostic.jobs.report_versions import greeting
from tests.diagnostic.conftest import REFERENCE_CONFIG, Cast

pytestmark = pytest.mark.django_db


def test_the_email_greets_the_person_who_booked(cast: Cast, lab: Lab, reference_config: object) -> None:
    day = LabDay.objects.create(lab=lab, date=timezone.localdate())
    booking = Booking.objects.create(lab_day=day, customer=cast.alice, organisation=cast.organisation_a)
    config = submit_configuration(raw_text=REFERENCE_CONFIG.read_text(), source="yaml", booking=booking)
    job = create_job(config=config, lab=lab)
    assert greeting(job) == "Hello", "no name known: no 'Dear Acme Inference'"
    cast.alice.first_name, cast.alice.last_name = "Alice", "Martin"
    cast.alice.save()
    job.refresh_from_db()
    assert greeting(job) == "Dear Alice Martin"
    in_house = create_job(config=reference_config, lab=lab)  # type: ignore[arg-type]
    assert greeting(in_house) == "Draft for review (no booking)"
