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

# True cold starts per step: two give every step and every change a 95 % interval (the
# report and the money-back rule read intervals), at twice the lab time of one. The
# customer's first is reproduce's own start.
COLD_STARTS_PER_STEP = 2


def run(ctx: StageContext) -> dict[str, Any]:
    result = run_triage(
        ctx.session,
        ctx.config,
        log=ctx.log,
        progress=ctx.progress,
        check_cancelled=ctx.check_cancelled,
        reproduce=ctx.earlier_result("reproduce"),
        repeats=COLD_STARTS_PER_STEP,
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
        "sections": {"cold_start": result["section"]},
        "config_changes": result["config_changes"],
        "lab_time_s": result["lab_time_s"],
        "artifacts": {TELEMETRY_CSV: result["telemetry_csv"]},
    }


register_stage("triage", run)
