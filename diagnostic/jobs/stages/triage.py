"""The triage stage: why the customer's cold start takes minutes, each cause proved by a
true cold start with its fix (METHODOLOGY.md, "Loading triage"). Reproduce's cold start
is the customer's when it can serve as evidence; the pipeline measures its own otherwise.

The cold-start telemetry CSV travels in the result's `artifacts`, keyed by its file name,
for whoever writes the job's files (it is written beside findings.json).
"""

from __future__ import annotations

from typing import Any

from diagnostic.jobs.registry import register_stage
from diagnostic.jobs.stage_context import StageContext
from diagnostic.pipelines.triage import TELEMETRY_CSV, run_triage

# True cold starts per waterfall step: one, the methodology's proof (its signature gone, the
# start faster than the step before by more than the lab's start-to-start spread); a second
# per step would cost about as much as the whole waterfall again on an 8-node day. Each
# change is then proved on its own phase over every start of the day (two at least a side).
# The customer's configuration gets two (METHODOLOGY.md, "Proof for cold starts"):
# reproduce's start and one of ours, so that the day's cold-start change has Welch's
# interval against the tuned configuration's two. The second costs one customer start
# (~560 lab s on the reference day) and fills the "without" side of the first change's
# phase, which the proof otherwise filled with a start of every change but that one.
COLD_STARTS_PER_STEP = 1
BASELINE_COLD_STARTS = 2


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
