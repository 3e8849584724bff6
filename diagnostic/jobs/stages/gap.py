"""The gap stage: the configuration the day has reached (every earlier stage's proved change
applied) against the lab's own best for the same model, node count and engine version
(METHODOLOGY.md, "The gap to the lab's own best"). Runs after specdec, whose confirmation
runs of the deployed setting are the current rate it needs, and before measure, which then
measures the tuned configuration with whatever this stage proved.

Lab faults raise, as in every stage (the orchestrator holds the day); an engine that
refuses a candidate is that candidate's answer, recorded in the section.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from diagnostic.jobs.registry import register_stage
from diagnostic.jobs.stage_context import StageContext
from diagnostic.pipelines.gap import resolve_baseline, run_gap
from diagnostic.pipelines.gap.pipeline import DEFAULT_BUDGET_LAB_S, PROVE
from diagnostic.pipelines.triage.section import ColdStartSection


def specdec_runs(ctx: StageContext) -> tuple[dict[str, list[float]] | None, str | None]:
    """The speculative stage's confirmation runs of the configuration this stage starts from,
    when they were taken with this stage's proof protocol: the same launch spec (the hash
    every node reported when they were measured) and the same runs. None otherwise."""
    result = ctx.earlier_result("specdec")
    section = ((result or {}).get("sections") or {}).get("speculative") or {}
    if (section.get("protocol") or {}).get("confirm") != PROVE.describe():
        return None, None
    from lab.session import spec_sha256

    specs = ctx.session.uploaded_specs(ctx.config)
    expected = spec_sha256(specs[0]) if specs else None
    rows = [t for t in section.get("trials") or [] if t.get("phase") == "confirm"
            and t.get("status") == "measured" and t.get("spec_sha256") == expected]
    if not rows:
        return None, None
    last = max(int(t["trial"]) for t in rows)
    runs = {str(t["workload"]): [float(x) for x in t.get("samples") or []]
            for t in rows if t["trial"] == last}
    if not all(len(runs.get(w) or ()) >= 2 for w in ctx.config["workloads"]):
        return None, None
    return runs, f"the speculative stage's confirmation runs (trial {last}) of this configuration"


def cold_starts(ctx: StageContext) -> tuple[list[float], str | None]:
    """True cold starts of the configuration with the earlier proved changes: the triage's
    last proved step (every loading fix together), else reproduce's start when no stage
    changed the configuration since."""
    triage = ColdStartSection(ctx.earlier_result("triage"))
    after = triage.after_samples()
    if after:
        return after, "triage's true cold starts with every loading fix"
    if triage and triage.proved == [] and triage.section.get("before_s") is not None:
        samples = triage.baseline_samples() or [float(triage.section["before_s"])]
        return samples, "the customer's true cold start(s) (triage proved no fix)"
    reproduce = ctx.earlier_result("reproduce") or {}
    if reproduce.get("cold_start_s") is not None and not ctx.earlier_changes():
        return [float(reproduce["cold_start_s"])], "reproduce's true cold start"
    return [], None


def _inventory(ctx: StageContext) -> str:
    lab = ctx.job.lab
    value = getattr(lab, "inventory", "")
    return str(value) if isinstance(value, str) else ""


def run(ctx: StageContext) -> dict[str, Any]:
    config: Mapping[str, Any] = ctx.config
    preflight = ctx.earlier_result("preflight") or {}
    baseline, why = resolve_baseline(ctx.session, config, inventory=_inventory(ctx), log=ctx.log,
                                     facts=preflight.get("nodes") or None)
    runs, source = specdec_runs(ctx) if baseline is not None else (None, None)
    cold, cold_source = cold_starts(ctx)
    result = run_gap(
        ctx.session,
        config,
        baseline,
        log=ctx.log,
        progress=ctx.progress,
        check_cancelled=ctx.check_cancelled,
        budget_lab_s=min(ctx.budget_lab_s, DEFAULT_BUDGET_LAB_S),
        current_runs=runs,
        current_source=source,
        current_cold=cold,
        cold_source=cold_source,
        no_baseline_why=why,
    )
    ctx.add_findings(result["findings"])
    return {
        "sections": {"gap": result["section"]},
        "config_changes": result["config_changes"],
        "lab_time_s": result["lab_time_s"],
    }


register_stage("gap", run)
