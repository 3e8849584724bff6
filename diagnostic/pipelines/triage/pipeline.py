"""The loading triage: why a cold start takes minutes, proven by fixing it
(METHODOLOGY.md, "Loading triage").

From the customer's true cold start (reproduce's, or our own when that evidence is
missing): the per-node timeline, every stall attributed by its telemetry signature, the
change each cause calls for derived from the lab's facts, and then the proof: the changes
added one at a time, cumulatively, a true cold start after each, so that each step shows
its own signature gone and the last one is every proved change together. Each change is
then proved on its own phase over every start of the day, two at least on each side; the
start that fills the gaps (usually one: the last step without the first change) is taken
before the last step, so the lab is left serving what the triage hands on. A configuration
that keeps its JIT cache is measured as its users see it: the cache warmed by one start
first, the one-time compile mentioned as a note.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any

from diagnostic.pipelines.changes import Change, apply_changes, get_path
from diagnostic.pipelines.stats import welch
from diagnostic.pipelines.triage import coldstart as cs
from diagnostic.pipelines.triage import frames as fr
from diagnostic.pipelines.triage import section as rp
from diagnostic.pipelines.triage.fixes import Fix, FixUnavailable, derive, launch_difference
from diagnostic.pipelines.triage.signatures import FAULTS, INCOMPLETE, JIT_COMPILE, RENDEZVOUS, UNEXPLAINED
from lab.session import LabSession, LaunchFailed

# A change is proved when its signature is gone and the start is faster by more than the
# lab's own start-to-start spread (a few seconds) and this share of the start.
MIN_GAIN_S = 5.0
MIN_GAIN_SHARE = 0.02
# The run name of reproduce's start when it is one of the customer's samples.
REPRODUCE_RUN = "reproduce"


def _noop_log(_: str) -> None:
    return None


def _noop_progress(_: float, __: str) -> None:
    return None


def _noop_cancel() -> None:
    return None


def _kernel_key(config: Mapping[str, Any]) -> str:
    """What a kept JIT cache's contents depend on, as far as our fixes go: everything but
    the loader and the NCCL/gloo variables (neither changes the compiled kernels)."""
    view = copy.deepcopy(dict(config))
    serving = view.get("serving") or {}
    for key in ("load_format", "safetensors_load_strategy"):
        serving.pop(key, None)
    env = view.get("env") or {}
    for key in [k for k in env if k.startswith(("NCCL_", "GLOO_"))]:
        env.pop(key)
    view.pop("reported", None)
    return json.dumps(view, sort_keys=True, default=str)


class Triage:
    """One triage run: its observations, lab time and notes."""

    def __init__(self, session: LabSession, config: dict[str, Any], *, log: Callable[[str], None],
                 progress: Callable[[float, str], None], check_cancelled: Callable[[], None],
                 budget_lab_s: float | None, repeats: int = 1, baseline_repeats: int | None = None) -> None:
        self.session = session
        self.repeats = max(1, int(repeats))
        self.baseline_repeats = self.repeats if baseline_repeats is None else max(1, int(baseline_repeats))
        self.config = config
        self.log = log
        self.progress = progress
        self.check_cancelled = check_cancelled
        self.budget_lab_s = budget_lab_s
        self.began = session.clock.now()
        self.notes: list[str] = []
        self.warmed: set[str] = set()  # kernel keys whose kept JIT cache holds compiled kernels
        # Starts measured for a later step's configuration (by its launch), not yet used.
        self.seen: dict[str, cs.ColdStart] = {}
        self.steps: list[dict[str, Any]] = []  # lab time per step
        self.facts: dict[str, Any] = {}
        # The rendezvous change, once the customer's start showed the rendezvous and the
        # change was derived (None before that, or when there is none to prove).
        self.rendezvous_changes: list[Change] | None = None
        self.baseline_known = False

    def wants_nccl(self, config: Mapping[str, Any]) -> bool:
        """Whether a start of `config` asks NCCL for its INFO lines (NCCL_DEBUG=INFO):
        where a rendezvous stall may show, the only stall NCCL's lines speak of. That is
        the customer's own start (nothing is known yet) and, once its evidence showed a
        rendezvous, each step that does not carry the rendezvous change. Every other start
        is launched exactly as its configuration renders, so the lab is left serving the
        configuration the triage hands on, and the next stage finds it serving."""
        if not self.baseline_known:
            return True
        if self.rendezvous_changes is None:
            return False
        return not all(get_path(config, c["path"]) == c["to"] for c in self.rendezvous_changes)

    def spent(self) -> float:
        return self.session.clock.now() - self.began

    def over_budget(self) -> bool:
        return self.budget_lab_s is not None and self.spent() >= self.budget_lab_s

    def cold_start(self, config: dict[str, Any], run: str, *, have: int = 0,
                   repeats: int | None = None, filling: dict[str, Any] | None = None) -> cs.ColdStart:
        """True cold starts of `config` as its users see it, `repeats` of them (`have` fewer
        when some were measured already): when it keeps its JIT cache and nothing has filled
        that cache yet, one warm start fills it first.

        `filling`: launch this instead, once: `config` with a kept JIT cache that nothing has
        filled yet. An empty kept cache compiles every kernel as a cache that is not kept
        does, so the start is `config`'s own (its evidence shows the same compile) and it
        leaves the cache filled for the step that keeps it, which then needs no warm-up."""
        if filling is not None:
            start = cs.observe(self.session, filling, run, facts=self.facts,
                               check_cancelled=self.check_cancelled, nccl_debug=self.wants_nccl(filling))
            self.warmed.add(_kernel_key(filling))
            if JIT_COMPILE not in start.causes:
                # The kept cache was filled already (a cache volume outlives a lab day): this
                # start is the cache-keeping configuration's as its users see it, not
                # `config`'s. Keep it for that step and measure `config` itself.
                self.log(f"{run}: the kept JIT cache was filled already (no compile in a start with it, "
                         f"{start.cold_start_s:.1f} lab s); measuring the step without it")
                self.seen[_launch_key(filling)] = start
                own = self.cold_start(config, run, have=have, repeats=repeats)
                self.steps[-1]["lab_s"] = round(self.steps[-1]["lab_s"] + start.lab_s, 1)
                self.steps[-1]["next_step_start_lab_s"] = round(start.lab_s, 1)
                return own
            start.config = config
            self.notes.append(f"The {run} step started with the kept JIT cache attached but empty: it "
                              "compiled as a start without one does, and filled the cache for the step "
                              "that keeps it.")
            self.steps.append({"step": run, "lab_s": round(start.lab_s, 1), "warm_up_lab_s": 0.0,
                               "cold_start_s": start.cold_start_s, "n": 1, "fills_jit_cache": True})
            for group in start.stalls:
                self.log(f"{run}: {cs.describe(group)}")
            self.log(f"{run}: cold start {start.cold_start_s:.1f} lab s, n = 1, launched with the kept "
                     f"JIT cache attached and empty, which it filled ({start.lab_s:.0f} lab s spent)")
            return start
        earlier = self.seen.pop(_launch_key(config), None)
        if earlier is not None and (self.repeats if repeats is None else repeats) - have <= 1:
            self.log(f"{run}: cold start {earlier.cold_start_s:.1f} lab s, n = 1, measured by the step "
                     "before (its start found the kept cache filled)")
            earlier.run = run
            self.steps.append({"step": run, "lab_s": 0.0, "warm_up_lab_s": 0.0,
                               "cold_start_s": earlier.cold_start_s, "n": 1, "measured_by_step_before": True})
            return earlier
        warm_up_s = 0.0
        key = _kernel_key(config)
        if config["serving"]["jit_cache"] == "persisted" and key not in self.warmed:
            self.log(f"{run}: warming the kept JIT cache with one start first")
            t = self.session.clock.now()
            self.session.launch(config, cold=False, timeout_s=cs.LAUNCH_TIMEOUT_LAB_S)
            warm_up_s = self.session.clock.now() - t
            self.warmed.add(key)
            self.check_cancelled()
        nccl_debug = self.wants_nccl(config)
        start = cs.observe(self.session, config, run, facts=self.facts, check_cancelled=self.check_cancelled,
                           nccl_debug=nccl_debug)
        if config["serving"]["jit_cache"] == "persisted":
            self.warmed.add(key)
        for _ in range(max(0, (self.repeats if repeats is None else repeats) - have - 1)):
            again = cs.observe(self.session, config, run, facts=self.facts,
                               check_cancelled=self.check_cancelled, nccl_debug=nccl_debug)
            start.add_start(again)
            start.lab_s += again.lab_s
        start.lab_s += warm_up_s
        self.steps.append({"step": run, "lab_s": round(start.lab_s, 1), "warm_up_lab_s": round(warm_up_s, 1),
                           "cold_start_s": start.cold_start_s, "n": len(start.samples_s)})
        for group in start.stalls:
            self.log(f"{run}: {cs.describe(group)}")
        self.log(f"{run}: cold start {start.cold_start_s:.1f} lab s, n = {len(start.samples_s)} "
                 f"({start.lab_s:.0f} lab s spent)")
        return start

    def baseline(self, reproduce: Mapping[str, Any] | None) -> cs.ColdStart:
        config = self.config
        persisted = config["serving"]["jit_cache"] == "persisted"
        if reproduce is not None:
            start, why = cs.from_reproduce(self.session, config, reproduce, facts=self.facts)
            if start is not None:
                if not persisted:
                    self.log(f"the customer's cold start is reproduce's: {start.cold_start_s:.1f} lab s")
                    self.steps.append({"step": "customer configuration (reproduce's start)", "lab_s": 0.0,
                                       "warm_up_lab_s": 0.0, "cold_start_s": start.cold_start_s})
                    for group in start.stalls:
                        self.log(f"reproduce's start: {cs.describe(group)}")
                    # Reproduce records where each log ended and when it launched, so its
                    # start reads exactly as one of ours. Evidence that leaves a stall
                    # unnamed, a node without telemetry or a node without log lines is
                    # checked on a start of our own before anything is attributed.
                    doubt = _doubt(start)
                    if not doubt and self.baseline_repeats <= 1:
                        self.log("attributing on reproduce's start: every stall has its signature")
                        return start
                    if doubt:
                        self.log(f"reproduce's start: {doubt}; measuring one of our own to attribute on")
                    # Reproduce's start is one sample: ours make up the rest (one at least).
                    more = self.cold_start(config, "before", have=1, repeats=max(2, self.baseline_repeats))
                    if start.causes != more.causes:
                        theirs = ", ".join(start.causes) or "no signature"
                        ours = ", ".join(more.causes) or "no signature"
                        self.log(f"reproduce's start, rebuilt, showed {theirs}; ours shows {ours}: "
                                 "attributing on ours")
                    # Reproduce's start stays a start of its own for the proof on the phases.
                    start.run = REPRODUCE_RUN
                    more.add_start(start, first=True)
                    return more
                # Reproduce's start filled the kept cache: it was this lab's first boot, not
                # what the customer's users see. Note its compile, then measure again.
                self.warmed.add(_kernel_key(config))
                first_jit = start.groups(JIT_COMPILE)
                if first_jit:
                    silent = max(g.silent_s for g in first_jit)
                    self.notes.append(
                        f"The first start on this lab compiled kernels for {silent:.0f} s; the configuration "
                        "keeps its JIT cache, so later starts reuse it. The cold start reported is a later "
                        "one: page cache dropped, the cache volume kept.")
                self.log("the configuration keeps its JIT cache: measuring a start after reproduce's "
                         f"first one ({start.cold_start_s:.1f} lab s)")
            else:
                self.log(f"not using reproduce's cold start: {why}; measuring our own")
        else:
            self.log("no cold start from reproduce; measuring our own")
        before = self.cold_start(config, "before", repeats=self.baseline_repeats)
        if persisted and not self.notes:
            self.notes.append("The configuration keeps its JIT cache: its cold start was measured after one "
                              "start had filled the cache, as its users see it.")
        return before


def _launch_key(config: Mapping[str, Any]) -> str:
    view = dict(config)
    view.pop("reported", None)
    return json.dumps(view, sort_keys=True, default=str)


def _filling(triage: Triage, variant: dict[str, Any], fill: list[Change] | None) -> dict[str, Any] | None:
    """`variant` with the kept JIT cache, when its start can fill that cache for the next
    step: one start a step (repeats compile no more once the cache is filled), a variant
    that keeps no cache itself, and a cache nothing has filled yet."""
    if not fill or triage.repeats > 1 or variant["serving"]["jit_cache"] == "persisted":
        return None
    filling = apply_changes(variant, fill)
    if filling["serving"]["jit_cache"] != "persisted" or _kernel_key(filling) in triage.warmed:
        return None
    return filling


def _doubt(start: cs.ColdStart) -> str:
    """Why a start's evidence cannot decide alone (empty when it can): a node without log
    lines, or a stall that matches no signature or lacks telemetry on any of its nodes."""
    if start.missing_logs:
        return "no log lines from " + ", ".join(sorted(start.missing_logs))
    unsure = [g for g in start.stalls if g.cause in (UNEXPLAINED, INCOMPLETE)]
    if unsure:
        return "; ".join(cs.describe(g) for g in unsure)
    # Attributed from the other nodes, a stall is still a guess about the silent ones.
    gaps = sorted({n for g in start.stalls for n in g.verdict.incomplete_nodes})
    if gaps:
        return "no telemetry from " + ", ".join(gaps) + " during a stall"
    return ""


def _proved(before: cs.ColdStart, after: cs.ColdStart, cause: str) -> bool:
    """The signature is gone and the start is faster than the step before it (`before`);
    with repeated starts, the 95 % interval of the change also excludes zero."""
    gain = before.cold_start_s - after.cold_start_s
    if cause in after.causes or gain <= max(MIN_GAIN_S, MIN_GAIN_SHARE * before.cold_start_s):
        return False
    if len(before.samples_s) > 1 and len(after.samples_s) > 1:
        return bool(welch(after.samples_s, before.samples_s)["ci95"][1] < 0)
    return True


def run_triage(session: LabSession, config: dict[str, Any], *, log: Callable[[str], None] = _noop_log,
               progress: Callable[[float, str], None] = _noop_progress,
               check_cancelled: Callable[[], None] = _noop_cancel, budget_lab_s: float | None = None,
               reproduce: Mapping[str, Any] | None = None, repeats: int = 1,
               baseline_repeats: int | None = None) -> dict[str, Any]:
    """Triage the cold start of `config` (normalized) on the lab behind `session`.

    `reproduce` is the reproduce stage's result, whose cold start serves as the customer's
    when it is a true cold start of this configuration with 1 Hz telemetry. `repeats`: true
    cold starts per step (2 or more give each step a 95 % interval); `baseline_repeats`:
    those of the customer's configuration (default `repeats`), so that the day's before and
    after can have an interval when the steps cannot afford repeats. Returns the
    `cold_start` section, the findings, the proved `config_changes`, `lab_time_s`, and
    `telemetry_csv` (the telemetry of the customer's cold start and of ours, 1 Hz per node,
    for the customer's own analysis).
    """
    triage = Triage(session, config, log=log, progress=progress, check_cancelled=check_cancelled,
                    budget_lab_s=budget_lab_s, repeats=repeats, baseline_repeats=baseline_repeats)
    progress(2, "reading the nodes' facts")
    session.push_agent()
    triage.facts = session.facts()
    check_cancelled()
    progress(5, "the customer's true cold start")
    before = triage.baseline(reproduce)
    triage.baseline_known = True
    check_cancelled()
    nodes = before.nodes
    fixes: dict[str, Fix] = {}
    for cause in before.causes:
        try:
            fixes[cause] = derive(cause, config, triage.facts, nodes)
        except FixUnavailable as exc:
            triage.notes.append(f"{cause}: no change to try ({exc}).")
            log(f"{cause}: no change derived: {exc}")
    if RENDEZVOUS in fixes:
        triage.rendezvous_changes = fixes[RENDEZVOUS].changes
    # The waterfall: each change added to the ones proved before it, one true cold start per
    # step, so that the last step is every proved change together and each step shows what
    # its own change removed. A change that does not prove itself is left out of the later steps.
    order = step_order(before, list(fixes))
    base_config = config
    current = before
    proved: list[str] = []
    runs: list[tuple[str, list[Change], cs.ColdStart, cs.ColdStart]] = []
    extra: list[cs.ColdStart] = []
    for i, cause in enumerate(order):
        if i == len(order) - 1:
            # The proof's own starts go before the last step, so that the last start is the
            # configuration handed on (the next stage finds it serving) and, with a kept JIT
            # cache, they find the cache the step before filled.
            upcoming = apply_changes(base_config, fixes[cause].changes)
            extra += phase_proof_starts(triage, [before, *(r[2] for r in runs), *extra], [upcoming], fixes,
                                        [*proved, cause], upcoming)
        if triage.over_budget():
            left = ", ".join(fixes[c].label for c in order[i:])
            triage.notes.append(f"Lab-time budget spent: not proved: {left}.")
            log(f"lab-time budget spent before {left}")
            break
        progress(10 + 80 * i / max(1, len(order)), f"proving {fixes[cause].label}")
        # The step before a kept-JIT-cache step fills that cache with its own compile.
        fill = fixes[order[i + 1]].changes if i + 1 < len(order) and order[i + 1] == JIT_COMPILE else None
        started = _try_fix(triage, fixes[cause], cause, base_config, fill=fill)
        if started is None:
            continue
        applied, start = started
        fixes[cause] = applied
        runs.append((cause, applied.changes, start, current))
        if _proved(current, start, cause):
            proved.append(cause)
            base_config = apply_changes(base_config, applied.changes)
            current = start
        else:
            why = ("its signature is still there" if cause in start.causes
                   else "the start was not faster beyond the lab's start-to-start spread")
            triage.notes.append(f"{applied.label}: not proved ({why}); the later steps leave it out.")
            log(f"{applied.label}: not proved: {why}")
    after = current
    if fixes and not proved:
        triage.notes.append("No change was proved: the configuration's cold start is left as it is.")
    # A step that did not prove itself changes what the proof needs: fill what is left.
    extra += phase_proof_starts(triage, [before, *(r[2] for r in runs), *extra], [], fixes, proved,
                                after.config)
    if after is not before:
        # A proof start of the final configuration itself is one more sample of the day's after.
        for start in extra:
            if start is not after and _launch_key(start.config) == _launch_key(after.config):
                after.add_start(start)
    progress(95, "writing the cold-start section")
    built = rp.build_result(before, after, runs, fixes, proved, triage.notes, triage.steps,
                            lab_time_s=triage.spent(), extra=extra)
    # The customer's start and ours, each node's seconds counted from that launch's origin
    # on the node's own clock (the proving runs stay in the section's waterfall).
    starts = {"before": before} if after is before else {"before": before, "after": after}
    frames = {(run, node): (s.frames[node], s.origin - (s.timelines[node].lab_offset_s
                                                        if node in s.timelines else 0.0))
              for run, s in starts.items() for node in s.nodes}
    built["telemetry_csv"] = fr.telemetry_table(frames).to_csv(index=False, float_format="%.2f")
    progress(100, f"cold start {before.cold_start_s:.0f} s -> {after.cold_start_s:.0f} s")
    return built


# Starts the proof may add at most: one covers every gap of the reference waterfall (the
# last step without the first change lacks the first change and has the others).
MAX_PROOF_STARTS = 2


def _short_sides(configs: list[dict[str, Any]], fixes: Mapping[str, Fix],
                 causes: list[str]) -> dict[tuple[str, bool], int]:
    """{(cause, with its fix): starts missing} for each change whose phase has fewer than
    two true cold starts on a side, among starts of `configs`."""
    short = {}
    for cause in causes:
        with_fix = sum(1 for c in configs if _has(c, fixes[cause]))
        for side, have in ((False, len(configs) - with_fix), (True, with_fix)):
            if have < rp.MIN_STARTS_PER_SIDE:
                short[(cause, side)] = rp.MIN_STARTS_PER_SIDE - have
    return short


def _has(config: Mapping[str, Any], fix: Fix) -> bool:
    return bool(fix.changes) and all(get_path(config, c["path"]) == c["to"] for c in fix.changes)


def phase_proof_starts(triage: Triage, taken: list[cs.ColdStart], upcoming: list[dict[str, Any]],
                       fixes: Mapping[str, Fix], causes: list[str],
                       final: dict[str, Any]) -> list[cs.ColdStart]:
    """The true cold starts the proof still needs (METHODOLOGY.md, "Proof for cold starts"):
    each change is measured on its own phase over every start of the day, with and without
    it, and needs two on each side. The starts taken (and `upcoming`, the waterfall's last
    step, about to be taken) count; where a side has one, the start added is the one that
    fills most gaps at once: the final configuration, or the final one without one change
    (it lacks that change and has every other, so one start serves several sides). Nothing
    is added past the lab-time budget; the finding then says its interval is missing."""
    extra: list[cs.ColdStart] = []
    if triage.repeats > 1:
        return extra  # every step has its own interval on repeated whole starts
    configs = [p.config for s in taken for p in s.physical()] + list(upcoming)
    for _ in range(MAX_PROOF_STARTS):
        short = _short_sides(configs, fixes, causes)
        if not short:
            break
        if triage.over_budget():
            triage.notes.append("Lab-time budget spent: some changes' phases have one true cold start on a "
                                "side, so their findings have no interval.")
            break
        candidates: list[tuple[str, dict[str, Any]]] = [("every proved change", final)]
        for cause in causes:
            reverted = [{"path": c["path"], "from": c["to"], "to": c["from"]} for c in fixes[cause].changes]
            candidates.append((f"every proved change but {fixes[cause].label}",
                               apply_changes(final, reverted)))

        def covers(config: dict[str, Any], short: dict[tuple[str, bool], int] = short) -> int:
            return sum(1 for (cause, side) in short if _has(config, fixes[cause]) == side)

        label, config = max(candidates, key=lambda item: covers(item[1]))
        if not covers(config):
            break
        triage.check_cancelled()
        gaps = ", ".join(f"{fixes[c].label} {'with' if side else 'without'} it" for c, side in short)
        triage.log(f"proof of the phases: one more true cold start, {label} (for {gaps})")
        try:
            start = triage.cold_start(config, f"proof: {label}")
        except LaunchFailed as exc:
            triage.notes.append(f"The proof's start ({label}) did not start: {exc.reason}.")
            break
        configs.append(start.config)
        extra.append(start)
    return extra


def step_order(before: cs.ColdStart, causes: list[str]) -> list[str]:
    """The order the waterfall adds the changes in: the causes whose stalls cost the most
    first, and a JIT-cache change last: its first start fills the kept cache, and that start
    is shortest when every other change is already in."""
    cost = {c: sum(g.silent_s for g in before.groups(c)) for c in causes}
    return sorted(causes, key=lambda c: (c == JIT_COMPILE, -cost[c]))


def _try_fix(triage: Triage, fix: Fix, cause: str, base: dict[str, Any], *,
             fill: list[Change] | None = None) -> tuple[Fix, cs.ColdStart] | None:
    """The cold start of `base` (the changes proved so far) with the fix added; when the
    engine refuses the change, the next candidate. `fill`: the next step's kept-JIT-cache
    change, which this start carries (empty cache, the same compile) to fill that cache."""
    head = triage.session.specs_for(base)[0]
    for candidate in [fix, *fix.alternatives]:
        variant = apply_changes(base, candidate.changes)
        candidate.flags, candidate.env = launch_difference(head, triage.session.specs_for(variant)[0])
        filling = _filling(triage, variant, fill)
        try:
            return candidate, triage.cold_start(variant, candidate.label, filling=filling)
        except LaunchFailed as exc:
            triage.notes.append(f"{candidate.label}: the engine did not start with it ({exc.reason}).")
            triage.log(f"{candidate.label}: launch failed on {exc.node}: {exc.reason}")
    triage.notes.append(f"{cause}: every change tried was refused by the engine.")
    return None


__all__ = ["FAULTS", "run_triage"]
