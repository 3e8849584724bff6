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

# True cold starts per waterfall step: one, the methodology's proof (its signature gone, the
# start faster than the step before by more than the lab's start-to-start spread); a second
# per step would cost about as much as the whole waterfall again on an 8-node day. The
# customer's configuration gets one, reproduce's own start, when its evidence names every
# stall (the triage measures one more of its own otherwise): a second customer start costs
# about 600 lab s on the reference day, a twelfth of the day, to put an interval on a
# difference of minutes between starts that differ from one another by a second or two.
COLD_STARTS_PER_STEP = 1
BASELINE_COLD_STARTS = 1


def run(ctx: StageContext) -> dict[str, Any]:
    reproduce = ctx.earlier_result("reproduce")
    budget = ctx.budget_lab_s
    repeats = COLD_STARTS_PER_STEP
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
