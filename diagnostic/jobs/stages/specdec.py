"""The specdec stage: the speculative setting that is actually fastest per workload, and
the one to deploy for the customer's mix (METHODOLOGY.md, "Speculative-decoding tuning"),
on the configuration with the earlier stages' proved fixes applied."""

from __future__ import annotations

from typing import Any

from diagnostic.jobs.context import StageContext
from diagnostic.jobs.registry import register_stage
from diagnostic.jobs.stages.serving import ensure_serving
from diagnostic.pipelines.specdec import run_specdec


def run(ctx: StageContext) -> dict[str, Any]:
    ensure_serving(ctx)
    result = run_specdec(
        ctx.session,
        ctx.config,
        log=ctx.log,
        progress=ctx.progress,
        check_cancelled=ctx.check_cancelled,
    )
    for finding in result["findings"]:
        ctx.add_finding(
            finding["code"],
            finding["title"],
            evidence=finding.get("evidence", {}),
            change=finding.get("change"),
            impact=finding.get("impact"),
            blocking=bool(finding.get("blocking", False)),
        )
    return {
        "sections": {"speculative": result["section"]},
        "config_changes": result["config_changes"],
        "lab_time_s": result["lab_time_s"],
    }


register_stage("specdec", run)
