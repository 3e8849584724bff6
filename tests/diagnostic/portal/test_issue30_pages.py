"""Issue 30's customer pages without a browser: every form and YAML mistake at once, file
sizes in human units, booking only from a summary, past days and same-day deadlines said
right, the running day's estimate, and the tuned command and diff downloads."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from diagnostic.bookings.models import Booking, LabDay, book_lab_day
from diagnostic.jobs.models import DiagnosticJob
from diagnostic.portal.job_views import day_estimate
from diagnostic.portal.offer import change_window
from diagnostic.portal.submission import SubmissionError, from_form, from_yaml, human_size
from tests.diagnostic.conftest import Cast
from tests.diagnostic.portal.conftest import Owned

pytestmark = pytest.mark.django_db


def test_an_empty_form_asks_for_each_required_field() -> None:
    with pytest.raises(SubmissionError) as refused:
        from_form({})
    assert set(refused.value.errors) == {"engine__name", "engine__version", "model__id", "cluster__nodes",
                                         "parallel__tp"}


def test_three_form_mistakes_are_reported_together_beside_their_fields() -> None:
    form = {"engine__name": "vllm", "engine__version": "0.34.0",
            "model__id": "moonshotai/Kimi-K2-Instruct-0905", "cluster__nodes": "eight", "parallel__tp": "0",
            "serving__gpu_memory_utilization": "1.5"}
    with pytest.raises(SubmissionError) as refused:
        from_form(form)
    errors = refused.value.errors
    assert set(errors) == {"cluster__nodes", "parallel__tp", "serving__gpu_memory_utilization"}
    assert all(len(m) == 1 for m in errors.values())


def test_a_yaml_file_lists_every_problem_with_its_line() -> None:
    text = ('schema: diagnostic.config/1\nengine: {name: vllm, version: "0.34.0"}\nparallel:\n  tp: 0\n'
            "serving:\n  gpu_memory_utilization: 1.5\nenv:\n  LD_PRELOAD: /tmp/x.so\n")
    with pytest.raises(SubmissionError) as refused:
        from_yaml(text)
    problems = refused.value.errors["yaml_text"]
    assert [p.split(":")[0] for p in problems] == ["line 4", "line 6", "line 8"]


@pytest.mark.parametrize(("size", "words"), [(812, "812 bytes"), (65_536, "64 KiB"), (171_000, "167.0 KiB"),
                                             (3 * 1024 * 1024, "3 MiB")])
def test_file_sizes_are_in_human_units(size: int, words: str) -> None:
    assert human_size(size) == words


def test_a_day_is_booked_only_from_its_summary(cast: Cast, days_ahead: list[LabDay]) -> None:
    client = cast.client("alice")
    summary = client.get(f"/portal/book/summary/?lab_day={days_ahead[0].pk}").content.decode()
    # No price is made up: without PORTAL_LAB_DAY_PRICE the page points to the order.
    assert "Money back" in summary and "as in your order with us" in summary and "sim:" not in summary
    assert client.post("/portal/book/", {"lab_day": days_ahead[0].pk}).status_code == 200
    assert not Booking.objects.exists()
    client.post("/portal/book/", {"lab_day": days_ahead[0].pk, "confirmed": "yes"})
    assert Booking.objects.get().lab_day == days_ahead[0]


def test_cancelling_and_moving_show_a_summary_before_they_act(cast: Cast, days_ahead: list[LabDay]) -> None:
    booking = book_lab_day(lab_day=days_ahead[0], customer=cast.alice)
    client = cast.client("alice")
    assert 'id="cancel-summary"' in client.get(f"/portal/bookings/{booking.uuid}/cancel/").content.decode()
    move = client.get(f"/portal/bookings/{booking.uuid}/reschedule/?lab_day={days_ahead[4].pk}")
    assert 'id="move-summary"' in move.content.decode()
    booking.refresh_from_db()
    assert booking.is_active and booking.lab_day == days_ahead[0]


def test_past_days_are_past_and_a_same_day_deadline_is_not_shown_as_one(
    cast: Cast, lab: Any, settings: Any
) -> None:
    settings.BOOKING_SAME_DAY = True
    today = timezone.localdate()
    for n in range(-7, 3):
        LabDay.objects.create(lab=lab, date=today + dt.timedelta(days=n))
    page = cast.client("alice").get("/portal/book/").content.decode()
    assert 'class="state">too soon' not in page
    if today.weekday():
        assert 'class="state">past' in page
    same_day = book_lab_day(lab_day=LabDay.objects.get(date=today), customer=cast.alice)
    window = change_window(same_day.lab_day, booking=same_day)
    assert not window.open and str(today.year) not in window.words


def test_a_running_day_estimates_its_end_from_the_stages_left(alices: Owned) -> None:
    job = alices.job
    now = timezone.now()
    DiagnosticJob.objects.filter(pk=job.pk).update(status="running", started_at=now)
    job.refresh_from_db()
    job.stage_runs.update(status="pending", lab_seconds=None)
    job.stage_runs.filter(name="preflight").update(status="succeeded", lab_seconds=13.0,
                                                   result={"lab_dilation": 45.0})
    job.stage_runs.filter(name="reproduce").update(status="running", started_at=now, progress_percent=0)
    estimate = day_estimate(job, list(job.stage_runs.order_by("order")), now)
    assert estimate is not None and estimate["known"] and estimate["simulated"]
    assert estimate["end"].endswith("UTC")


def test_the_tuned_command_and_diff_come_with_the_approved_report(cast: Cast, alices: Owned) -> None:
    client = cast.client("alice")
    command = client.get(f"/portal/jobs/{alices.job.pk}/tuned-command.txt")
    assert command.status_code == 200 and "--tensor-parallel-size" in command.content.decode()
    diff = client.get(f"/portal/jobs/{alices.job.pk}/tuned.diff")
    assert diff.status_code == 200 and diff["Content-Disposition"].startswith("attachment")
    page = client.get(f"/portal/jobs/{alices.job.pk}/").content.decode()
    assert 'id="download-tuned-command"' in page and 'id="download-tuned-diff"' in page
    alices.version.approved_at = None
    alices.version.save()
    assert client.get(f"/portal/jobs/{alices.job.pk}/tuned.diff").status_code == 404
