"""The triage stage: why the customer's cold start takes minutes, each cause proved by a
true cold start with its fix (METHODOLOGY.md, "Loading triage"). Reproduce's cold start
is the customer's when it can serve as evidence; the pipeline measures its own otherwise.

The cold-start telemetry CSV travels in the result's `artifacts`, keyed by its file name,
for whoever writes the job's files (it is written beside findings.json).
"""

from __future__ import annotations

from typing import Any

from diagnostic.jobs.context import StageContext
from diagnostic.jobs.registry import register_stage
from diagnostic.pipelines.triage import TELEMETRY_CSV, run_triage

# True cold starts per step: two give every step and every change a 95 % interval, at
# twice the lab time of one. The customer's configuration always gets two (the first is
# reproduce's own start), so that the day's before and after (the measure stage starts the
# tuned configuration twice) have an interval even when the steps get one each.
COLD_STARTS_PER_STEP = 2
BASELINE_COLD_STARTS = 2
# Lab seconds a step's start costs beyond its cold start (stop, drop caches, telemetry).
STEP_OVERHEAD_LAB_S = 60.0
MAX_STEPS = 4  # three causes alone, then all together


def cold_starts_per_step(budget_lab_s: float, before_s: float | None) -> int:
    """Two per step when the stage's share of the day can pay for them on the worst case
    (every cause found, each step as slow as the customer's start), else one."""
    if before_s is None:
        return 1
    worst = MAX_STEPS * (before_s + STEP_OVERHEAD_LAB_S)
    return COLD_STARTS_PER_STEP if budget_lab_s >= COLD_STARTS_PER_STEP * worst + before_s else 1


def run(ctx: StageContext) -> dict[str, Any]:
    reproduce = ctx.earlier_result("reproduce")
    budget = ctx.budget_lab_s
    repeats = cold_starts_per_step(budget, (reproduce or {}).get("cold_start_s"))
    ctx.log(f"lab-time budget {budget:.0f} s: {repeats} true cold start(s) per step, "
            f"{BASELINE_COLD_STARTS} of the customer's configuration")
    result = run_triage(
        ctx.session,
        ctx.config,
        log=ctx.log,
        progress=ctx.progress,
        check_cancelled=ctx.check_cancelled,
        reproduce=reproduce,
        repeats=repeats,
        baseline_repeats=max(repeats, BASELINE_COLD_STARTS),
        budget_lab_s=budget,
    )
    ctx.add_findings(result["findings"])
    return {
        "sections": {"cold_start": result["section"]},
        "config_changes": result["config_changes"],
        "lab_time_s": result["lab_time_s"],
        "artifacts": {TELEMETRY_CSV: result["telemetry_csv"]},
    }


register_stage("triage", run)
