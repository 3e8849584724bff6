"""A day's lab-time budget is shared: each stage gets what is left once the later stages
of the job's plan have their reserve."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from diagnostic.jobs.budget import RESERVE_LAB_S, stage_budget_lab_s
from diagnostic.jobs.models import DiagnosticJob, StageRun

pytestmark = pytest.mark.django_db

DAY = ["preflight", "reproduce", "triage", "fp4", "specdec", "measure", "report"]


def spend(job: DiagnosticJob, **seconds: float) -> None:
    for name, lab_s in seconds.items():
        StageRun.objects.filter(job=job, name=name).update(lab_seconds=lab_s, status="succeeded")


def stage(job: DiagnosticJob, name: str) -> StageRun:
    return StageRun.objects.get(job=job, name=name)


def test_a_stage_gets_the_day_less_what_was_spent_and_what_later_stages_reserve(
    make_job: Callable[..., DiagnosticJob], settings: Any
) -> None:
    settings.DIAG_DAY_BUDGET_LAB_S = 7200
    job = make_job(DAY)
    spend(job, preflight=13, reproduce=600, triage=1900, fp4=1000)
    later = RESERVE_LAB_S["measure"] + RESERVE_LAB_S["report"]
    assert stage_budget_lab_s(job, stage(job, "specdec")) == pytest.approx(7200 - 3513 - later)


def test_a_job_budget_overrides_the_setting_and_a_spent_day_leaves_nothing(
    make_job: Callable[..., DiagnosticJob]
) -> None:
    job = make_job(DAY, budget_lab_s=1000)
    spend(job, preflight=13, reproduce=600)
    assert stage_budget_lab_s(job, stage(job, "triage")) == 0.0


def test_stages_not_in_the_plan_reserve_nothing(make_job: Callable[..., DiagnosticJob]) -> None:
    job = make_job(["preflight", "reproduce", "specdec", "report"], budget_lab_s=5000)
    spend(job, preflight=10, reproduce=590)
    left = 5000 - 600 - RESERVE_LAB_S["report"]
    assert stage_budget_lab_s(job, stage(job, "specdec")) == pytest.approx(left)
