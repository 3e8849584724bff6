"""What staff can do with a held day, and what it does to the day's dates and records:
re-run it from the stage that stopped (on a later calendar day its report is due after that
day), move it, cancel it; each refuses, saying why, when it makes no sense. A stage that
stopped the job (preflight: more nodes than the lab has) can be retried once mended, and
what it found goes with the retry."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from diagnostic.bookings.configs import submit_configuration
from diagnostic.bookings.models import Booking, Lab, LabDay
from diagnostic.jobs.models import DiagnosticJob, Finding, JobEvent, StageRun
from diagnostic.jobs.orchestration import create_job, run_until_done
from diagnostic.jobs.report_versions import lab_day
from diagnostic.staff import actions
from lab.session import NodeUnreachable
from tests.diagnostic.conftest import REFERENCE_CONFIG, Cast
from tests.diagnostic.doubles import FactsSession, healthy_facts

pytestmark = pytest.mark.django_db


def lab_facts(down: str | None = None) -> dict[str, Any]:
    facts: dict[str, Any] = {f"spark-{i:02d}": healthy_facts(f"spark-{i:02d}") for i in range(1, 9)}
    if down:
        facts[down] = NodeUnreachable({down: OSError("connection refused")})
    return facts


@pytest.fixture
def held(cast: Cast, lab: Lab, fast_retries: Any) -> DiagnosticJob:
    day = LabDay.objects.create(lab=lab, date=timezone.localdate() - dt.timedelta(days=3))
    booking = Booking.objects.create(lab_day=day, customer=cast.alice, organisation=cast.organisation_a,
                                     status=Booking.Status.CONFIRMED)
    config = submit_configuration(raw_text=REFERENCE_CONFIG.read_text(), source="yaml", booking=booking)
    job = create_job(config=config, lab=lab, stages=["preflight", "report"])
    run_until_done(str(job.pk), FactsSession(lab_facts(down="spark-02")).factory(), sleep=lambda s: None)
    job.refresh_from_db()
    assert job.status == "held"
    return job


def test_a_rerun_on_a_later_day_makes_the_report_due_after_that_day(
    held: DiagnosticJob, cast: Cast, django_capture_on_commit_callbacks: Any
) -> None:
    assert lab_day(held) == timezone.localdate() - dt.timedelta(days=3)
    assert actions.rerun_plan(held) == {"kept": [], "again": ["preflight", "report"]}
    with django_capture_on_commit_callbacks(execute=False):
        actions.resume_held(held, actor=cast.staff)
    assert lab_day(held) == timezone.localdate()
    run_until_done(str(held.pk), FactsSession(lab_facts()).factory(), sleep=lambda s: None)
    held.refresh_from_db()
    assert held.status == "succeeded"
    assert held.findings["money_back"]["conditions"]["late_report"] is False
    [fault] = held.findings["lab_faults"]
    assert fault["rerun_on"] == timezone.localdate().isoformat()
    event = JobEvent.objects.get(job=held, kind=JobEvent.Kind.RETRIED)
    assert event.actor == cast.staff and event.data["stages"] == ["preflight", "report"]


def test_held_actions_refuse_what_makes_no_sense(held: DiagnosticJob, cast: Cast, lab: Lab) -> None:
    with pytest.raises(actions.ActionRefused, match="held for a lab fault: re-run it"):
        actions.retry_stage(held, "preflight")
    with pytest.raises(actions.ActionRefused, match="choose one of the free lab days listed"):
        actions.move_held(held, "not-a-day")
    past = LabDay.objects.create(lab=lab, date=timezone.localdate() - dt.timedelta(days=1))
    with pytest.raises(actions.ActionRefused, match="is not free"):
        actions.move_held(held, past.pk)
    other_lab = Lab.objects.create(name="other", inventory="sim:x.yaml")
    elsewhere = LabDay.objects.create(lab=other_lab, date=timezone.localdate() + dt.timedelta(days=1))
    with pytest.raises(actions.ActionRefused, match="choose one of the free lab days listed"):
        actions.move_held(held, elsewhere.pk)
    # Cancelled while held: it ends at once, never re-run; then nothing is held any more.
    assert actions.cancel_job(held).startswith("Cancelled")
    held.refresh_from_db()
    assert held.status == "cancelled"
    with pytest.raises(actions.ActionRefused, match="not held for a lab fault"):
        actions.resume_held(held)


def test_a_stage_that_stopped_the_job_is_retried_and_its_findings_go_with_it(
    make_job: Any, django_capture_on_commit_callbacks: Any
) -> None:
    small = FactsSession(lab_facts(), nodes=4)
    job = make_job(["preflight", "report"])
    run_until_done(str(job.pk), small.factory(), sleep=lambda s: None)
    job.refresh_from_db()
    assert job.status == "failed" and job.stop_side == "customer"
    preflight = StageRun.objects.get(job=job, name="preflight")
    assert actions.retryable(preflight)
    assert Finding.objects.filter(job=job, code="config.layout_exceeds_lab").exists()
    with django_capture_on_commit_callbacks(execute=False):
        said = actions.retry_stage(job, "preflight")
    assert said == "Retrying preflight, then report."
    assert not Finding.objects.filter(job=job).exists()
    run_until_done(str(job.pk), FactsSession(lab_facts()).factory(), sleep=lambda s: None)
    job.refresh_from_db()
    assert job.status == "succeeded" and job.stop_side == ""
