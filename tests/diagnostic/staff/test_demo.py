"""The seeded demo demonstrates: its consultant can act, its reports are on time, and a
simulated lab can be left serving for a visitor to watch a run."""

from __future__ import annotations

import datetime as dt
import io

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from diagnostic.bookings.models import Lab, LabDay
from diagnostic.staff import demo
from reports.moneyback import report_deadline

pytestmark = pytest.mark.django_db


def test_the_demo_consultant_is_in_the_staff_group_and_may_approve_and_refund() -> None:
    staff = next(p for p in demo.CAST if p.organisation is None)
    user = demo._user(staff, "demo-pass-123")
    assert user.is_staff
    assert user.groups.filter(name="staff").exists()
    assert user.has_perm("jobs.approve_report") and user.has_perm("jobs.decide_refund")
    customer = demo._user(demo.CAST[0], "demo-pass-123")
    assert not customer.groups.exists() and not customer.has_perm("jobs.approve_report")


@pytest.mark.parametrize("weekday", range(7))
def test_every_seeded_day_has_its_report_on_time_whatever_the_weekday(weekday: int) -> None:
    # 2026-11-30 is a Monday; a report approved at the last minute of seeding day is on time.
    today = dt.date(2026, 11, 30) + dt.timedelta(days=weekday)
    sent = dt.datetime.combine(today, dt.time(23, 59), tzinfo=dt.UTC)
    for person in demo.CAST:
        if person.organisation is not None:
            assert sent < report_deadline(today + dt.timedelta(days=person.day_offset)), person


def test_the_seeded_days_are_on_two_labs_and_leave_today_free_on_the_calendar_lab() -> None:
    seeded = [(p.lab, p.day_offset) for p in demo.CAST if p.organisation is not None]
    assert len(set(seeded)) == len(seeded)
    assert all(offset < 0 for _, offset in seeded)
    second = demo._lab_of(demo.CAST[1])
    # The second lab opens only its seeded day, so the calendar (one lab) never shows it.
    assert list(LabDay.objects.filter(lab=second).values_list("date", flat=True)) == [
        timezone.localdate() - dt.timedelta(days=1)]


def test_serve_lab_refuses_an_unknown_or_real_lab_naming_the_labs() -> None:
    demo.demo_lab()
    with pytest.raises(CommandError, match=r"--lab .nope. is not a lab here; labs: sim:reference-kimi"):
        call_command("serve_lab", "--lab", "nope")
    Lab.objects.create(name="real", inventory="/etc/lab/inventory.yaml")
    with pytest.raises(CommandError, match=r"only a simulated lab"):
        call_command("serve_lab", "--lab", "real")


def test_serve_lab_serves_the_demo_lab_and_stops(tmp_path, settings) -> None:  # type: ignore[no-untyped-def]
    settings.DIAG_SIM_STATE_DIR = str(tmp_path)
    lab = demo.demo_lab()
    out = io.StringIO()
    call_command("serve_lab", "--for-seconds", "0.5", stdout=out)
    text = out.getvalue()
    assert f"inventory at {lab.inventory_path()}" in text
    assert text.rstrip().endswith(f"stopped {demo.LAB_NAME}")
