"""How a lab day's budget of lab seconds is shared among the stages of a job.

METHODOLOGY.md wants the whole day on the reference 8-node lab in two lab hours; measured
on the simulated reference lab at dilation 45 it takes about 10,300 lab s (2.9 hours):
preflight 17, reproduce 620, triage 2,570, fp4 1,150, specdec 3,740, measure 2,230,
report 5. The engine's own starts and decode runs are most of that by LAB_MODEL.md's
formulas; the protocol's cold starts and runs do not fit two hours, so the default day
budget stays three lab hours. Each stage gets what is left of the day once the stages
after it have their reserve: the lab seconds each needs to do its work at all on an
8-node Kimi K2-class day (a true cold start or two, the measurement protocol's runs, the
speculative search's confirmations and seed screens), measured on the reference lab. A
stage that runs out stops early and says what it did not try; the measure stage does not
shorten its protocol.
"""

from __future__ import annotations

from django.conf import settings

from diagnostic.jobs.models import DiagnosticJob, StageRun

RESERVE_LAB_S = {
    "preflight": 30.0,
    "reproduce": 650.0,
    "triage": 2600.0,
    "fp4": 1200.0,
    # The customer's setting and no speculation confirmed, the seed lengths screened, one
    # best confirmed: about 2,900 lab s; the whole search takes about 3,700.
    "specdec": 3000.0,
    "measure": 2300.0,
    "report": 10.0,
}


def day_budget_lab_s(job: DiagnosticJob) -> float:
    budget = job.budget_lab_s if job.budget_lab_s is not None else settings.DIAG_DAY_BUDGET_LAB_S
    return float(budget)


def stage_budget_lab_s(job: DiagnosticJob, stage: StageRun) -> float:
    """Lab seconds `stage` may spend: the day's budget less what the stages before it spent
    and what the stages after it (in this job's plan) reserve; never below zero."""
    runs = list(job.stage_runs.order_by("order").values_list("name", "order", "lab_seconds"))
    spent = sum(seconds or 0.0 for _, order, seconds in runs if order < stage.order)
    reserved = sum(RESERVE_LAB_S.get(name, 0.0) for name, order, _ in runs if order > stage.order)
    return max(0.0, day_budget_lab_s(job) - spent - reserved)
