"""The specdec stage: the speculative setting that is actually fastest per workload, and
the one to deploy for the customer's mix (METHODOLOGY.md, "Speculative-decoding tuning"),
on the configuration with the earlier stages' proved fixes applied."""

from __future__ import annotations

from typing import Any

from diagnostic.jobs.registry import register_stage
from diagnostic.jobs.stage_context import StageContext
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
        none_runs=fp4_none_runs(ctx),
    )
    ctx.add_findings(result["findings"])
    return {
        "sections": {"speculative": result["section"]},
        "config_changes": result["config_changes"],
        "lab_time_s": result["lab_time_s"],
    }


def fp4_none_runs(ctx: StageContext) -> dict[str, Any] | None:
    """The FP4 stage's decode runs of its chosen backend, which it measured on this stage's
    configuration without speculation (the FP4 stage's changes are this configuration's,
    and no stage runs between the two), for the search to read as no speculation's
    screening trial instead of measuring the same thing again; None when it measured none."""
    fp4 = ctx.earlier_result("fp4") or {}
    section = (fp4.get("sections") or {}).get("fp4") or {}
    chosen = section.get("backend_after")
    rate = next((c.get("rate") for c in section.get("candidates") or []
                 if isinstance(c, dict) and c.get("backend") == chosen and c.get("rate")), None)
    protocol = section.get("protocol") or {}
    if not chosen or not isinstance(rate, dict):
        return None
    workloads = {w: {"samples": v.get("runs") or [], "mean_tps": v.get("mean_tps"), "ci95": v.get("ci95")}
                 for w, v in rate.items() if isinstance(v, dict)}
    return {
        "source": f"the FP4 stage ({chosen}, without speculation)",
        "lab_s": rate.get("lab_s"),
        "protocol": {"n": protocol.get("measure_n"), "warmup": protocol.get("measure_warmup"),
                     "max_tokens": protocol.get("measure_max_tokens")},
        "workloads": workloads,
    }


register_stage("specdec", run)
