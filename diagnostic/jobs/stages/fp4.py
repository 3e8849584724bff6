"""The fp4 stage: whether the customer's NVFP4 kernel path gives correct, degraded or
garbage output, and the fastest backend that is correct (METHODOLOGY.md, "FP4
correctness"), on the configuration with the earlier stages' proved fixes applied."""

from __future__ import annotations

from typing import Any

from diagnostic.jobs.registry import register_stage
from diagnostic.jobs.stage_context import StageContext
from diagnostic.jobs.stages.ensure_serving import ensure_serving
from diagnostic.pipelines.fp4 import run_fp4


def run(ctx: StageContext) -> dict[str, Any]:
    ensure_serving(ctx)
    result = run_fp4(
        ctx.session,
        ctx.config,
        log=ctx.log,
        progress=ctx.progress,
        check_cancelled=ctx.check_cancelled,
        budget_lab_s=ctx.budget_lab_s,
    )
    ctx.add_findings(result["findings"])
    return {
        "sections": {"fp4": result["section"]},
        "config_changes": result["config_changes"],
        "lab_time_s": result["lab_time_s"],
    }


register_stage("fp4", run)
