"""The triage's findings.json `cold_start` section and its findings, from the observed
cold starts: before and after, the phases, the waterfall of proving runs, the stalls with
their telemetry, and one finding per cause carrying the figures that decided it.

The section's fields (lab seconds throughout):

- `before_s`, `after_s`: the customer's true cold start and ours (all proved changes);
  `root_causes`: the fault codes the customer's start showed; `proved`: those whose
  change removed the signature and the seconds.
- `phases[]`: {run: before|after, node, phase, start_s, end_s}, seconds since the launch.
- `waterfall[]`: {step, mode: baseline | alone (the first change, on the customer's
  configuration alone) | cumulative (a change added to the ones proved before it) | all
  (the last step, every change proved before it and its own)}, fixes (the code the step adds), changes
  (the config changes it adds), cumulative (the codes whose changes the start had: the ones
  proved before it and its own), n (true cold starts), samples_s, cold_start_s (their mean),
  ci95 (n > 1), lab_s, signatures (fault codes seen in that start), delta_s and delta_ci95
  (against the baseline), step_delta_s and step_delta_ci95 (against the step it added its
  change to), signature_gone, proved}; the last proved step is every proved change
  together (`after_s`, `after_samples_s`); `before_ci95`, `after_ci95` when n > 1.
- `stalls[]`: {run, node (the one whose telemetry is kept), nodes, cause (a fault code,
  `unexplained` or `evidence_incomplete`), start_s, end_s, silent_s, phase, decided_by,
  summary, telemetry {t_s, disk_read_mbps, page_cache_gib, cpu_user_pct, cpu_system_pct,
  compilers, gpu_util_pct, data_nic_mbps, mgmt_nic_mbps}, late_node, bootstrap_retries,
  evidence_incomplete {node: why}, why_not}; `unexplained[]`: the customer's stalls that
  were not attributed; `quiet_work[]`: silences with the GPU busy (graph capture), no fault.
- `starts[]`: every true cold start the triage took {start (its step), cold_start_s,
  samples_s, phases_s {weights_load_s, distributed_init_s, kernel_jit_s: the phase's
  longest node, null where no log marks it}, extra (taken only for the proof)}. Each
  cause's finding has as `impact` its own phase on the starts without its change against
  those with it ({metric: <phase>_s, before, after, n_before, n_after, samples {before,
  after: [{start, seconds}]}, ci95 (Welch, two starts a side at least)}), since the stall a
  change removes sits in that phase and no other change touches it (METHODOLOGY.md, "Proof
  for cold starts"). With repeated starts per step, the whole starts carry it instead.
- `notes[]` (e.g. the one-time compile of a kept JIT cache), `lab_time_s`, `steps[]` (lab
  seconds per step, JIT-cache warm-ups, skipped runs), `telemetry_csv` (the file name).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any

from diagnostic.pipelines.changes import Change, get_path
from diagnostic.pipelines.stats import t_interval, welch
from diagnostic.pipelines.triage import frames as fr
from diagnostic.pipelines.triage.coldstart import ColdStart, StallGroup
from diagnostic.pipelines.triage.fixes import Fix
from diagnostic.pipelines.triage.signatures import (
    GPU_WORK,
    INCOMPLETE,
    JIT_COMPILE,
    RENDEZVOUS,
    UNEXPLAINED,
    WEIGHTS_IO,
)
from diagnostic.pipelines.triage.timeline import relative_phases

UNEXPLAINED_CODE = "load.unexplained_stall"
FAULTS_WITH_PHASE = (WEIGHTS_IO, RENDEZVOUS, JIT_COMPILE)


def _phase_at(start: ColdStart, node: str, epoch: float) -> str | None:
    timeline = start.timelines.get(node)
    if timeline is None:
        return None
    return next((name for name, a, b in timeline.phases if a - 1.0 <= epoch < b), None)


def stall_entry(start: ColdStart, group: StallGroup, run: str) -> dict[str, Any]:
    node = group.representative
    a, b = group.members[node]
    readings = group.verdict.readings
    entry: dict[str, Any] = {
        "run": run,
        "node": node,
        "nodes": sorted(group.members),
        "cause": group.cause,
        "start_s": group.start_s,
        "end_s": group.end_s,
        "silent_s": round(group.silent_s, 1),
        "phase": _phase_at(start, node, a),
        "decided_by": group.verdict.decided_by,
        "summary": readings[node].summary if node in readings else None,
        "telemetry": fr.trace(fr.window(start.frames[node], a, b), a),
    }
    if group.verdict.late_node:
        entry["late_node"] = group.verdict.late_node
        entry["bootstrap_retries"] = group.bootstrap_retries
    if group.verdict.incomplete_nodes:
        entry["evidence_incomplete"] = {
            n: f"telemetry covers {100 * float(readings[n].summary.get('coverage') or 0):.0f} % of the window"
            for n in group.verdict.incomplete_nodes}
    if group.verdict.why_not:
        entry["why_not"] = group.verdict.why_not
    return entry


def _phase_seconds(start: ColdStart, phase: str) -> float | None:
    values = [b - a for tl in start.timelines.values() for name, a, b in tl.phases if name == phase]
    return round(median(values), 1) if values else None


def _evidence(start: ColdStart, cause: str) -> dict[str, Any]:
    groups = start.groups(cause)
    decided = dict(max(groups, key=lambda g: g.silent_s).verdict.decided_by)
    silent = round(sum(g.silent_s for g in groups), 1)
    nodes = sorted({n for g in groups for n in g.members})
    evidence: dict[str, Any] = {"silent_s": silent, "nodes": nodes}
    serving = start.config["serving"]
    if cause == WEIGHTS_IO:
        evidence.update({
            "summary": "Shard-progress lines came far apart while the disk read little and in storms, "
                       "the page cache climbed and system CPU stayed high: the loader page-faults the "
                       "checkpoint in.",
            "weights_load_s": _phase_seconds(start, "weights_load"),
            "disk_read_mbps_mean": decided.get("disk_read_mbps_mean"),
            "disk_read_cv": decided.get("disk_read_cv"),
            "page_cache_gib_per_min": decided.get("page_cache_gib_per_min"),
            "page_cache_peak_gib": decided.get("page_cache_gib_end"),
            "cpu_system_pct_median": decided.get("cpu_system_pct_median"),
            "cpu_user_pct_median": decided.get("cpu_user_pct_median"),
            "loader": {"load_format": serving["load_format"],
                       "safetensors_load_strategy": serving["safetensors_load_strategy"]},
        })
    elif cause == JIT_COMPILE:
        evidence.update({
            "summary": "After the weights loaded, the log fell silent while compiler processes kept the CPU "
                       "busy with the disk and GPU idle: kernels compiled from scratch.",
            "kernel_jit_s": _phase_seconds(start, "kernel_jit"),
            "compilers_median": decided.get("compilers_median"),
            "compilers_peak": decided.get("compilers_peak_range", [None, None])[1]
            if decided.get("compilers_peak_range") else decided.get("compilers_peak"),
            "cpu_user_pct_median": decided.get("cpu_user_pct_median"),
            "disk_read_mbps_median": decided.get("disk_read_mbps_median"),
            "gpu_util_pct_median": decided.get("gpu_util_pct_median"),
            "jit_cache": serving["jit_cache"],
        })
    elif cause == RENDEZVOUS:
        group = max(groups, key=lambda g: g.silent_s)
        env = start.config.get("env") or {}
        evidence.update({
            "summary": "Right after the processes started, before any weight was read, every node sat idle "
                       f"with its data NICs silent while {group.verdict.late_node} kept talking on its "
                       "management NIC (bootstrap retries"
                       + (f", {group.bootstrap_retries} logged by NCCL" if group.bootstrap_retries else "")
                       + "): the others waited for it at the rendezvous.",
            "stall_s": round(group.silent_s, 1),
            "late_node": group.verdict.late_node,
            "late_node_mgmt_nic_mbps_p90": decided.get("late_node_mgmt_nic_mbps_p90"),
            "other_nodes_mgmt_nic_mbps_p90_max": decided.get("other_nodes_mgmt_nic_mbps_p90_max"),
            "data_nic_mbps_median": decided.get("data_nic_mbps_median"),
            "cpu_user_pct_median": decided.get("cpu_user_pct_median"),
            "bootstrap_retries": group.bootstrap_retries,
            "nccl_socket_ifname": env.get("NCCL_SOCKET_IFNAME"),
            "nccl_ib_hca": env.get("NCCL_IB_HCA"),
            "gloo_socket_ifname": env.get("GLOO_SOCKET_IFNAME"),
        })
    incomplete = sorted({n for g in groups for n in g.verdict.incomplete_nodes})
    if incomplete:
        evidence["evidence_incomplete"] = {
            n: "the telemetry sampler covered too little of the stall on this node; attributed from the "
               "other nodes" for n in incomplete}
    # The nodes whose telemetry decided it (every figure above is their mean; the section's
    # stalls keep each figure's range across them).
    evidence["attributed_from"] = decided.get("nodes", [])
    # Each figure's spread across those nodes, which the report prints beside the figure
    # (reports/sections/findings.py reads `decided_by`'s `<figure>_range`).
    ranges = {k: v for k, v in decided.items() if k.endswith("_range")}
    if ranges:
        evidence["decided_by"] = ranges
    return evidence


_TITLES = {
    WEIGHTS_IO: "Weights load through page faults: {s:.0f} s of slow, bursty disk reads",
    JIT_COMPILE: "Kernels are compiled from scratch on every start: {s:.0f} s of silent compilation",
    RENDEZVOUS: "NCCL waits {s:.0f} s at the rendezvous for a late node",
}


# The phase of the start each cause's stall sits in: the seconds its change removes are that
# phase's (the rendezvous is waited out in distributed init, the page-faulting loader in the
# weights' load, the compile in the JIT phase), and no other change touches them.
CAUSE_PHASE = {WEIGHTS_IO: "weights_load", JIT_COMPILE: "kernel_jit", RENDEZVOUS: "distributed_init"}
PHASE_METRIC = {WEIGHTS_IO: "weights_load_s", JIT_COMPILE: "kernel_jit_s", RENDEZVOUS: "distributed_init_s"}
# True cold starts on each side of a change before its interval counts (METHODOLOGY.md,
# "Proof for cold starts").
MIN_STARTS_PER_SIDE = 2


def phase_seconds(start: ColdStart, cause: str) -> float | None:
    """How long `cause`'s phase held this start: its longest node (every node waits for the
    slowest before the next phase can finish), None when no node's log marks it."""
    phase = CAUSE_PHASE[cause]
    spans = [b - a for tl in start.timelines.values() for name, a, b in tl.phases if name == phase]
    return round(max(spans), 1) if spans else None


def has_fix(start: ColdStart, fix: Fix) -> bool:
    """Whether the start ran with every change of `fix` (its configuration as launched)."""
    return bool(fix.changes) and all(get_path(start.config, c["path"]) == c["to"] for c in fix.changes)


def phase_sides(cause: str, fix: Fix, starts: Sequence[ColdStart]) -> tuple[list[ColdStart], list[ColdStart]]:
    """The true cold starts without `fix` and those with it, each with its phase marked."""
    usable = [s for s in starts if phase_seconds(s, cause) is not None]
    return [s for s in usable if not has_fix(s, fix)], [s for s in usable if has_fix(s, fix)]


def phase_impact(cause: str, fix: Fix, starts: Sequence[ColdStart]) -> dict[str, Any] | None:
    """The change's measured effect: the seconds of its own phase on every true cold start
    without it against every one with it, with Welch's 95 % interval when each side has
    two starts or more. Each start's figure is in `samples`, named by its step, so that the
    report's numbers trace back to the starts that gave them."""
    without, with_fix = phase_sides(cause, fix, starts)
    if not without or not with_fix:
        return None
    a = [float(phase_seconds(s, cause) or 0.0) for s in without]
    b = [float(phase_seconds(s, cause) or 0.0) for s in with_fix]
    impact: dict[str, Any] = {
        "metric": PHASE_METRIC[cause], "unit": "s", "better": "lower",
        "before": round(sum(a) / len(a), 1), "after": round(sum(b) / len(b), 1),
        "n": min(len(a), len(b)), "n_before": len(a), "n_after": len(b),
        "phase": CAUSE_PHASE[cause],
        "samples": {"before": [{"start": s.run, "seconds": v} for s, v in zip(without, a, strict=True)],
                    "after": [{"start": s.run, "seconds": v} for s, v in zip(with_fix, b, strict=True)]},
        "against": "every true cold start of this day without the change (the phase's longest node)",
    }
    if len(a) >= MIN_STARTS_PER_SIDE and len(b) >= MIN_STARTS_PER_SIDE:
        test = welch(b, a)
        impact["diff"] = round(float(test["diff"]), 1)
        impact["ci95"] = [round(float(v), 1) for v in test["ci95"]]
        impact["p"] = float(test["p"])
        impact["test"] = "Welch's unequal-variance t-test, two-sided, alpha 0.05"
    return impact


def _finding(before: ColdStart, cause: str, fix: Fix | None, step: tuple[ColdStart, ColdStart] | None,
             proved: bool, starts: Sequence[ColdStart] = ()) -> dict[str, Any]:
    """One cause's finding; `step` is (the start its change was added to, the start with it);
    `starts`: every true cold start of the triage, for the change's proof on its phase."""
    evidence = _evidence(before, cause)
    seconds = float(evidence.get("stall_s") or evidence["silent_s"])
    change: dict[str, Any] | None = fix.finding_change() if fix is not None else None
    impact = None
    if step is not None:
        base, run = step
        impact = phase_impact(cause, fix, starts or [before, base, run]) if fix is not None else None
        if (impact is None or "ci95" not in impact) and len(base.samples_s) > 1 and len(run.samples_s) > 1:
            # The phases give no interval (a start whose log did not mark the phase), but
            # the steps were repeated: the whole starts carry the interval instead, the
            # start with the change against the one it was added to.
            impact = {"metric": "cold_start_s", "before": round(base.cold_start_s, 1),
                      "after": round(run.cold_start_s, 1), "n": min(len(base.samples_s), len(run.samples_s)),
                      "unit": "s", "better": "lower", "ci95": _delta_ci95(base, run),
                      "against": "your configuration" if base is before
                      else "the waterfall's step before, with the changes proved earlier"}
        evidence["signature_gone_after_fix"] = cause not in run.causes
    if change is not None and not proved:
        change["note"] = (change.get("note", "") + " Not proved on this lab: the cold start with this change "
                          "added did not lose the stall, or was not faster.").strip()
    return {"code": cause, "title": _TITLES[cause].format(s=seconds), "evidence": evidence,
            "change": change, "impact": impact, "blocking": False}


def _unexplained_finding(before: ColdStart, group: StallGroup) -> dict[str, Any]:
    entry = stall_entry(before, group, "before")
    incomplete = group.cause == INCOMPLETE
    where = ", ".join(entry["nodes"])
    if incomplete:
        title = (f"A {group.silent_s:.0f} s stall on {where} cannot be attributed: the telemetry of "
                 f"{', '.join(group.verdict.incomplete_nodes) or where} is incomplete")
    else:
        title = f"A {group.silent_s:.0f} s stall on {where} matches no known signature"
    keys = ("nodes", "start_s", "end_s", "silent_s", "phase", "summary")
    evidence = {k: entry[k] for k in keys}
    evidence["evidence_incomplete"] = incomplete
    if incomplete:
        evidence["nodes_without_telemetry"] = group.verdict.incomplete_nodes
    evidence["why_not"] = group.verdict.why_not
    evidence["summary_text"] = (
        "Not attributed: the telemetry that would decide it is missing." if incomplete
        else "The log was silent but the telemetry shows none of the known loading faults.")
    return {"code": UNEXPLAINED_CODE, "title": title, "evidence": evidence, "change": None, "impact": None,
            "blocking": False}


def _delta_ci95(before: ColdStart, after: ColdStart) -> list[float] | None:
    """95 % interval of after - before (Welch), when both were measured more than once."""
    if len(before.samples_s) < 2 or len(after.samples_s) < 2:
        return None
    low, high = welch(after.samples_s, before.samples_s)["ci95"]
    return [round(low, 1), round(high, 1)]


def waterfall_entry(step: str, start: ColdStart, *, fixes: str | None, changes: Sequence[Change], mode: str,
                    before: ColdStart, cause: str | None = None, previous: ColdStart | None = None,
                    cumulative: Sequence[str] = (), proved: bool | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "step": step,
        "mode": mode,
        "fixes": fixes,
        "changes": [dict(c) for c in changes],
        "n": len(start.samples_s),
        "cold_start_s": round(start.cold_start_s, 1),
        "samples_s": [round(v, 1) for v in start.samples_s],
        "lab_s": round(start.lab_s, 1),
        "signatures": start.causes,
    }
    ci = _ci_of(start)
    if ci is not None:
        entry["ci95"] = ci
    if mode != "baseline":
        entry["delta_s"] = round(start.cold_start_s - before.cold_start_s, 1)
        delta = _delta_ci95(before, start)
        if delta is not None:
            entry["delta_ci95"] = delta
    if previous is not None:
        entry["cumulative"] = list(cumulative)
        entry["step_delta_s"] = round(start.cold_start_s - previous.cold_start_s, 1)
        step_delta = _delta_ci95(previous, start)
        if step_delta is not None:
            entry["step_delta_ci95"] = step_delta
    if cause is not None:
        entry["signature_gone"] = cause not in start.causes
    if proved is not None:
        entry["proved"] = proved
    return entry


def _ci_of(start: ColdStart) -> list[float] | None:
    """Student-t 95 % interval of the start's mean, when it was measured more than once."""
    ci = t_interval(start.samples_s) if len(start.samples_s) > 1 else None
    return [round(ci[0], 1), round(ci[1], 1)] if ci else None


def build_result(before: ColdStart, after: ColdStart,
                 runs: Sequence[tuple[str, list[Change], ColdStart, ColdStart]],
                 fixes: Mapping[str, Fix], proved: Sequence[str], notes: list[str],
                 steps: list[dict[str, Any]], *, lab_time_s: float,
                 extra: Sequence[ColdStart] = ()) -> dict[str, Any]:
    """The pipeline's result: section, findings, proved config_changes and lab time. `runs`:
    the waterfall's steps in order, each (cause, the changes it added, its start, the start
    it added them to); `extra`: starts taken only so that each change's phase has two
    starts on each side."""
    starts: list[ColdStart] = []
    for start in [p for s in [before, *(r[2] for r in runs), *extra] for p in s.physical()]:
        if not any(start is s for s in starts):
            starts.append(start)
    starts.sort(key=lambda s: s.started_at)  # in the order they were taken
    waterfall = [waterfall_entry("customer configuration", before, fixes=None, changes=[], mode="baseline",
                                 before=before)]
    added: dict[str, tuple[ColdStart, ColdStart]] = {}
    had: list[str] = []
    for i, (cause, changes, start, previous) in enumerate(runs):
        added[cause] = (previous, start)
        label = fixes[cause].label
        # "alone": its change on the customer's configuration, nothing else; "cumulative": its
        # change added to every one proved before it; "all": the last step, which has every
        # proved change and its own (its `cumulative` says which).
        mode = "alone" if not had else "all" if i == len(runs) - 1 else "cumulative"
        entry = waterfall_entry(("+ " if had else "") + label, start, fixes=cause, changes=changes,
                                mode=mode, before=before, cause=cause, previous=previous,
                                cumulative=[*had, cause], proved=cause in proved)
        waterfall.append(entry)
        if cause in proved:
            had.append(cause)
    findings = [_finding(before, cause, fixes.get(cause), added.get(cause), cause in proved, starts)
                for cause in before.causes]
    findings += [_unexplained_finding(before, g) for g in before.stalls
                 if g.cause in (UNEXPLAINED, INCOMPLETE)]
    config_changes = [dict(c) for cause in proved for c in fixes[cause].changes]
    phases = [p for tl in before.timelines.values() for p in relative_phases(tl, "before", before.origin)]
    if after is not before:
        phases += [p for tl in after.timelines.values() for p in relative_phases(tl, "after", after.origin)]
    # The customer's stalls, and any left in our start; each proving run's signatures are
    # in its waterfall step.
    stalls = [stall_entry(before, g, "before") for g in before.stalls if g.cause != GPU_WORK]
    if after is not before:
        stalls += [stall_entry(after, g, "after") for g in after.stalls if g.cause != GPU_WORK]
    quiet = [{"run": "before", "nodes": sorted(g.members), "start_s": g.start_s, "end_s": g.end_s,
              "silent_s": round(g.silent_s, 1), "phase": _phase_at(before, g.representative,
                                                                    g.members[g.representative][0]),
              "gpu_util_pct_median": g.verdict.decided_by.get("gpu_util_pct_median")}
             for g in before.stalls if g.cause == GPU_WORK]
    for node in before.missing_logs:
        notes.append(f"{node}: its engine log held no lines of the customer's cold start.")
    section = {
        "before_s": round(before.cold_start_s, 1),
        "after_s": round(after.cold_start_s, 1),
        "before_ci95": _ci_of(before),
        "after_ci95": _ci_of(after),
        # The starts of every proved change together (the last proved step), for the day's
        # before and after; null when nothing was proved.
        "after_samples_s": [round(v, 3) for v in after.samples_s] if after is not before else None,
        "root_causes": before.causes,
        "proved": list(proved),
        "phases": phases,
        "waterfall": waterfall,
        "stalls": stalls,
        "quiet_work": quiet,
        "unexplained": [s for s in stalls
                        if s["run"] == "before" and s["cause"] in (UNEXPLAINED, INCOMPLETE)],
        "notes": notes,
        "lab_time_s": round(lab_time_s, 1),
        "steps": steps,
        "telemetry_csv": "cold-start-telemetry.csv",
        # Every true cold start of the day's triage with the seconds of each cause's phase:
        # the raw samples behind each finding's interval.
        "starts": [{"start": s.run, "cold_start_s": round(s.own_s, 1),
                    "phases_s": {PHASE_METRIC[c]: phase_seconds(s, c) for c in FAULTS_WITH_PHASE},
                    "extra": any(s is e for e in extra)}
                   for s in starts],
    }
    return {"section": section, "findings": findings, "config_changes": config_changes,
            "lab_time_s": round(lab_time_s, 1)}


class ColdStartSection:
    """The `cold_start` section as later stages read it back from the triage's stored result
    (empty when the triage did not run or wrote none), with the questions they ask of it."""

    def __init__(self, triage_result: Mapping[str, Any] | None) -> None:
        sections = (triage_result or {}).get("sections") or {}
        section = sections.get("cold_start") if isinstance(sections, Mapping) else None
        self.section: Mapping[str, Any] = section if isinstance(section, Mapping) else {}

    def __bool__(self) -> bool:
        return bool(self.section)

    @property
    def proved(self) -> list[Any] | None:
        """The causes whose fix was proved; None when the section does not say."""
        value = self.section.get("proved")
        return list(value) if isinstance(value, list) else None

    def baseline_samples(self) -> list[float]:
        """The customer's true cold starts: the waterfall's baseline step."""
        for step in self.section.get("waterfall") or []:
            if step.get("mode") == "baseline" and step.get("samples_s"):
                return [float(v) for v in step["samples_s"]]
        return []

    def after_samples(self) -> list[float]:
        """The true cold starts with every proved loading fix (the final step)."""
        after = self.section.get("after_samples_s")
        return [float(v) for v in after] if isinstance(after, list) else []


def customer_cold_starts(triage_result: Mapping[str, Any] | None,
                         reproduce_result: Mapping[str, Any] | None) -> list[float]:
    """The customer's true cold starts, as the triage measured them, or without it the one
    reproduce took."""
    samples = ColdStartSection(triage_result).baseline_samples()
    if samples:
        return samples
    reproduce = reproduce_result or {}
    return [float(reproduce["cold_start_s"])] if reproduce.get("cold_start_s") is not None else []
