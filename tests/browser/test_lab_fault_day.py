"""A day a lab fault held, in a real browser: the customer reads in plain words that our lab
had a fault, that the day is re-run at no cost and by when, with no report and nothing
internal; the consultant sees the fault with its evidence on the job page, the held job in
the list, and moves the day to another free lab day behind a confirmation that says which
stages are kept and which run again. The customer's page then waits for the new day.

The hold is made by the orchestrator itself (preflight on a lab whose node does not
answer, through the facts double); the same on the simulated lab over SSH, re-run to a
report, is tests/diagnostic/jobs/test_lab_fault_day.py. Screenshots in out/screenshots/."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from diagnostic.bookings.configs import submit_configuration
from diagnostic.bookings.models import Booking, LabDay
from diagnostic.jobs.models import DiagnosticJob, JobEvent
from diagnostic.jobs.orchestration import create_job, run_until_done
from diagnostic.staff.apps import STAFF_GROUP
from lab.session import NodeUnreachable
from tests.browser.test_staff_review import browser_as
from tests.diagnostic.conftest import (  # noqa: F401
    REFERENCE_CONFIG,
    Cast,
    cast,
    customer,
    lab,
    organisation,
    other_customer,
)
from tests.diagnostic.doubles import FactsSession, healthy_facts

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
INTERNAL = ("spark-", "127.0.0.1", "/var/lib/diag", "NodeUnreachable", "connection refused")


def held_job(cast: Cast, lab: Any, settings: Any) -> DiagnosticJob:  # noqa: F811
    settings.DIAG_RETRY_BASE_S = 0
    settings.DIAG_RETRY_MAX_S = 0
    facts: dict[str, Any] = {f"spark-{i:02d}": healthy_facts(f"spark-{i:02d}") for i in range(1, 9)}
    facts["spark-05"] = NodeUnreachable({"spark-05": OSError("connection refused (10.0.0.15:22)")})
    session = FactsSession(facts)
    lab.sync_nodes(session.inventory)
    day = LabDay.objects.create(lab=lab, date=timezone.localdate())
    booking = Booking.objects.create(lab_day=day, customer=cast.alice, organisation=cast.organisation_a,
                                     status=Booking.Status.CONFIRMED)
    config = submit_configuration(raw_text=REFERENCE_CONFIG.read_text(), source="yaml", booking=booking)
    job = create_job(config=config, lab=lab, stages=["preflight", "reproduce", "report"])
    run_until_done(str(job.pk), session.factory(), sleep=lambda s: None)
    job.refresh_from_db()
    assert job.status == "held", job.status_message
    return job


def test_a_held_day_seen_by_the_customer_and_moved_by_the_consultant(
    browser: Any, live_server: Any, portal_settings: Any, screenshot: Any, cast: Cast, lab: Any,  # noqa: F811
) -> None:
    job = held_job(cast, lab, portal_settings)
    tomorrow = LabDay.objects.create(lab=lab, date=timezone.localdate() + dt.timedelta(days=1))
    errors: list[str] = []

    alice = browser_as(browser, live_server, cast.alice).new_page()
    alice.on("pageerror", lambda exc: errors.append(str(exc)))
    alice.goto(f"{live_server.url}/portal/jobs/{job.pk}/")
    told = alice.inner_text("#lab-fault")
    assert "One of our eight nodes stopped answering during your diagnostic." in told
    assert "This is our problem, not your configuration's" in told
    assert "re-run it at no cost by" in told and "the diagnostic is free" in told
    shown = alice.inner_text("main")
    for word in INTERNAL:
        assert word not in shown, word
    assert alice.locator("#download-report").count() == 0
    assert alice.inner_text("#job-status") == "paused: our lab had a fault"
    screenshot(alice, "lab-fault-customer-held")

    cast.staff.groups.add(Group.objects.get(name=STAFF_GROUP))  # moving a day changes what a customer gets
    staff = browser_as(browser, live_server, cast.staff).new_page()
    staff.on("pageerror", lambda exc: errors.append(str(exc)))
    staff.goto(f"{live_server.url}/staff/?state=held")
    row = staff.locator(f"tr[data-job='{job.pk}']")
    assert "held for a lab fault" in row.inner_text()
    screenshot(staff, "lab-fault-staff-list")
    staff.goto(f"{live_server.url}/staff/jobs/{job.pk}/")
    section = staff.inner_text("#held-for-lab-fault")
    assert "spark-05 did not answer during preflight" in section
    assert "connection refused" in section
    assert "re-run at no cost" in section
    screenshot(staff, "lab-fault-staff-job")

    staff.click("#move-held")
    plan = staff.inner_text("#rerun-plan")
    assert "Runs again\npreflight, reproduce, report" in plan or "preflight, reproduce, report" in plan
    assert staff.locator("#move-day option").all_inner_texts() == [f"{tomorrow.date:%A %-d %B %Y}"]
    screenshot(staff, "lab-fault-staff-move-confirm")
    staff.click("#confirm-action")
    staff.wait_for_url(f"{live_server.url}/staff/jobs/{job.pk}/")
    assert f"Moved to {tomorrow.date:%A %d %B %Y}" in staff.inner_text("main")
    screenshot(staff, "lab-fault-staff-moved")
    job.refresh_from_db()
    assert job.status == "queued" and job.booking.lab_day == tomorrow
    assert JobEvent.objects.filter(job=job, kind=JobEvent.Kind.MOVED, actor=cast.staff).exists()

    alice.goto(f"{live_server.url}/portal/jobs/{job.pk}/")
    assert "Waiting for your lab day" in alice.inner_text("#job-waiting")
    assert alice.locator("#lab-fault").count() == 0
    screenshot(alice, "lab-fault-customer-moved")
    assert errors == []
