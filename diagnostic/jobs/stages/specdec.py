"""The specdec stage: the speculative setting that is actually fastest per workload, and
the one to deploy for the customer's mix (METHODOLOGY.md, "Speculative-decoding tuning"),
on the configuration with the earlier stages' proved fixes applied."""

from __future__ import annotations

from typing import Any

from diagnostic.jobs.context import StageContext
from diagnostic.jobs.registry import register_stage
from diagnostic.pipelines.specdec import run_specdec
from diagnostic.pipelines.specdec.pipeline import DEFAULT_BUDGET_LAB_S


def run(ctx: StageContext) -> dict[str, Any]:
    # No ensure_serving: the first trial (the customer's setting, or no speculation when
    # the FP4 stage left that serving) asks the nodes whether they run its launch spec
    # already, as they do when the previous stage left this configuration serving, and
    # measures it without a restart; otherwise it restarts, as every other trial does, so
    # starting the configuration here would be a restart whose engine nobody measures.
    result = run_specdec(
        ctx.session,
        ctx.config,
        log=ctx.log,
        progress=ctx.progress,
        check_cancelled=ctx.check_cancelled,
        # The stage's share of the day, and never more than the search's own bound.
        budget_lab_s=min(ctx.budget_lab_s, DEFAULT_BUDGET_LAB_S),
    )
    ctx.add_findings(result["findings"])
    return {
        "sections": {"speculative": result["section"]},
        "config_changes": result["config_changes"],
        "lab_time_s": result["lab_time_s"],
    }


register_stage("specdec", run)
