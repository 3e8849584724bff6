"""The gap stage's pipeline: what, besides the problems the earlier pipelines know, stands
between the customer's configuration and the lab's own best (METHODOLOGY.md, "The gap to
the lab's own best").

The configuration the day has reached (the customer's, with every change proved so far) is
held against the lab's baseline for the same model, node count and engine version. Every
differing field is a candidate (candidates.py), except requirements and what an earlier
stage decided with its own proof. When there is none, the stage spends no lab time.

Decode. The current rates come from runs already taken on this very configuration where
the protocol was the same (the speculative stage's confirmation runs of the deployed
setting: n = 15, two warm-ups, 192 tokens); otherwise it is measured with that protocol.
A calibrated baseline's rates (n = 15 a workload, kept with it) say whether the current
rate is significantly below; only then is anything restarted. Every candidate is
applied at once and measured; if that gains, delta debugging (search.py) finds which
differences carry the gain, screening groups with five short runs a workload; each one
reported is proved alone with fresh n = 15 runs against the current configuration
(Welch's 95 % interval, Bonferroni over the workloads). Every test is Welch's on 20 %
trimmed means (search.trimmed_welch), so that one run a stall made absurd does not decide
it (search.py says why), and a finding reports the trimmed means and the interval it was
proved on, beside the plain means and Welch's interval over all runs. Without a baseline of the lab's own
the firm's best-known configuration stands in, and the measurement of every difference
applied at once is both its rate on this lab and the stage's first comparison.

Cold start. The current configuration's true cold starts (triage's, or reproduce's) are
held against the baseline's; a single start gets a second one before any test (two a side,
"Proof for cold starts"), and only a significantly slower current start is searched, the
same way, on true cold starts.

Every restart is a warm one (caches kept) for decode, and every start of the cold-start
search is a true cold start. A lab fault (a node that does not answer, an agent error)
raises, as in every stage; an engine that refuses a candidate at startup is the
candidate's answer, recorded, and the search goes on.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnostic.pipelines.changes import Change, apply_changes
from diagnostic.pipelines.gap.candidates import Candidate, diff, search_order, with_candidates
from diagnostic.pipelines.gap.search import (
    ALPHA,
    TEST_NAME,
    TRIM,
    Outcome,
    OutOfBudget,
    Runs,
    delta_debug,
    improves,
    prove,
    trimmed_welch,
)
from diagnostic.pipelines.specdec.pipeline import CONFIRM, SCREEN, Protocol
from diagnostic.pipelines.stats import summarize, t_interval, welch

if TYPE_CHECKING:
    from lab.session import LabSession

SECTION_SCHEMA = "diagnostic.gap/1"
# Lab seconds the stage may spend at most (a day with one gap to find stays within 2.5 lab
# hours when the stage spends about a quarter of this).
DEFAULT_BUDGET_LAB_S = 3000.0
RESTART_TIMEOUT_LAB_S = 1800.0
COLD_TIMEOUT_LAB_S = 3600.0
SETTLE_LAB_S = 2.0
# Groups are screened with the speculative stage's short runs; a single difference is
# measured with its confirmation protocol, which is also the proof's.
PROVE = CONFIRM
# True cold starts per side of a cold-start comparison ("Proof for cold starts").
COLD_N = 2
# Before the first restart is observed, what one is assumed to cost (lab s): a warm restart of
# an 8-node Kimi K2 configuration is about 140; estimates err long.
RESTART_GUESS_S = 300.0
RUN_OVERHEAD_GUESS_S = 1.0

Log = Callable[[str], None]
Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class GapBaseline:
    """The baseline the stage compares with: a calibrated one of the lab's own, or the
    firm's best-known configuration (`source: best-known`, no rates: measured on the spot)."""

    source: str  # "calibrate" | "best-known"
    config: dict[str, Any]
    version: int | None = None
    made_at: str | None = None
    stale: str | None = None  # why the lab's own baseline was not used (stale), if one exists
    path: str | None = None
    rates: dict[str, Any] | None = None  # {workload: {n, mean_tps, ci95, samples}}
    cold_start: dict[str, Any] | None = None  # {n, mean_s, samples}

    def samples(self, workload: str) -> list[float]:
        row = (self.rates or {}).get(workload) or {}
        return [float(x) for x in row.get("samples") or []]

    def cold_samples(self) -> list[float]:
        return [float(x) for x in (self.cold_start or {}).get("samples") or []]

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "version": self.version, "made_at": self.made_at,
                "stale": self.stale, "path": self.path, "rates": copy.deepcopy(self.rates),
                "cold_start": copy.deepcopy(self.cold_start)}


def resolve_baseline(session: LabSession, config: Mapping[str, Any], *, inventory: str,
                     log: Log, facts: Mapping[str, Any] | None = None,
                     ) -> tuple[GapBaseline | None, str | None]:
    """The baseline for `config` on the lab whose inventory is `inventory` (a path, or
    `sim:SCENARIO`): the lab's own when one is fresh (same engine version, same nodes);
    else the firm's best-known configuration for the model and node count, with the lab's
    engine version. (None, why) when there is neither."""
    from lab import baseline as lb  # the lab's baselines (lab/baseline.py)
    from lab.engines import renormalize

    if inventory.startswith("sim:"):
        directory = lb.baseline_dir_for(None, Path(inventory[len("sim:"):]))
    else:
        directory = lb.baseline_dir_for(Path(inventory), None)
    model = str(config["model"]["id"])
    nodes = int(config["cluster"]["nodes"])
    engine = str(config["engine"]["name"])
    version = str(config["engine"].get("version") or "")
    # The nodes' facts the day already collected (preflight keeps them) fingerprint the lab
    # as well as asking every node again would.
    fingerprint = lb.node_fingerprint(facts if facts else session.facts())
    lookup = lb.find_baseline(directory, model=model, nodes=nodes, engine=engine, version=version,
                              fingerprint=fingerprint)
    found = lookup.baseline
    if found is not None and not lookup.stale:
        log(f"gap: the lab's baseline v{found.version} ({found.source}, {found.made_at}) from {found.path}")
        return GapBaseline(
            source=str(found.source), config=renormalize(found.config), version=found.version,
            made_at=str(found.made_at), stale=None, path=str(found.path) if found.path else None,
            rates=dict(found.rates or {}), cold_start=dict(found.cold_start or {}) or None,
        ), None
    stale = lookup.stale if found is not None else None
    best = lb.best_known(model, nodes, engine)
    if best is None:
        why = (f"the lab's baseline is stale ({stale}) and " if stale else "the lab has no baseline for "
               f"{model} on {nodes} nodes and ") + "the firm has no best-known configuration for it"
        return None, why
    best = copy.deepcopy(dict(best))
    best.setdefault("engine", {})["version"] = version
    best["engine"]["name"] = engine
    log("gap: " + (f"the lab's baseline is stale ({stale}); " if stale else "no baseline of the lab's own; ")
        + "the firm's best-known configuration, measured here")
    return GapBaseline(source="best-known", config=renormalize(best), stale=stale,
                       path=str(found.path) if found is not None and found.path else None), None


# -- the lab side ------------------------------------------------------------------------


@dataclass
class Step:
    """One measurement of the stage: which candidates it applied and what it measured."""

    applied: list[str]
    kind: str  # "decode" | "cold"
    phase: str  # "current" | "all" | "screen" | "prove"
    runs: dict[str, list[float]] | None
    lab_s: float
    restarted: bool
    verdict: str = ""
    error: str | None = None
    rows: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"applied": list(self.applied), "kind": self.kind, "phase": self.phase,
                               "lab_s": round(self.lab_s, 1), "restarted": self.restarted,
                               "verdict": self.verdict}
        if self.kind == "decode":
            out["rates"] = {w: _rate_summary(v) for w, v in (self.runs or {}).items()}
        else:
            out["cold_start"] = _cold_summary((self.runs or {}).get("cold_start_s") or [])
        if self.error:
            out["error"] = self.error
        return out


def _rate_summary(samples: Sequence[float]) -> dict[str, Any]:
    """A step's runs on one workload: mean and interval of all runs, the runs themselves and
    which are flagged as outliers (kept: the reader sees what a stall did, and the tests'
    trimming, not the flag, decides how much they weigh)."""
    s = summarize(samples)
    return {"n": s["n"], "mean_tps": s["mean"], "ci95": s["ci95"], "samples": s["samples"],
            "outliers": s["outliers"]}


def _cold_summary(samples: Sequence[float]) -> dict[str, Any]:
    ci = t_interval(samples) if len(samples) > 1 else None
    return {"n": len(samples), "mean_s": round(statistics.fmean(samples), 3) if samples else None,
            "ci95": [round(ci[0], 3), round(ci[1], 3)] if ci else None,
            "samples": [round(float(x), 3) for x in samples]}


class _Lab:
    """Restarts and measurements on the session, with the stage's lab-time ledger."""

    def __init__(self, session: LabSession, config: Mapping[str, Any], *, budget: float, log: Log,
                 progress: Progress, check_cancelled: Callable[[], None]) -> None:
        self.session = session
        self.config = dict(config)
        self.engine = str(config["engine"]["name"])
        self.version = config["engine"].get("version")
        self.workloads = [str(w) for w in config["workloads"]]
        self.budget = budget
        self.log, self.progress, self.check_cancelled = log, progress, check_cancelled
        self.started = session.clock.now()
        self.steps: list[Step] = []
        self.restart_costs: list[float] = []
        self.cold_costs: list[float] = []
        self.run_overheads: list[float] = []
        self.rates_seen: list[float] = []

    def spent(self) -> float:
        return self.session.clock.now() - self.started

    @property
    def restarts(self) -> int:
        return sum(1 for s in self.steps if s.restarted)

    # Estimates, so that a measurement that would not fit the budget is not begun.
    def _measure_s(self, protocol: Protocol) -> float:
        rate = min(self.rates_seen) if self.rates_seen else 10.0
        overhead = statistics.fmean(self.run_overheads) if self.run_overheads else RUN_OVERHEAD_GUESS_S
        return len(self.workloads) * (protocol.n + protocol.warmup) * (protocol.max_tokens / rate + overhead)

    def decode_cost(self, protocol: Protocol) -> float:
        restart = statistics.fmean(self.restart_costs) if self.restart_costs else RESTART_GUESS_S
        return restart + self._measure_s(protocol)

    def cold_cost(self, n: int, guess: float) -> float:
        one = max(self.cold_costs) if self.cold_costs else guess
        return n * one

    def afford(self, cost: float) -> bool:
        return self.spent() + cost <= self.budget

    def config_with(self, changes: Sequence[Change]) -> dict[str, Any]:
        if not changes:
            return self.config
        return apply_changes(self.config, changes, catalog=self.session.inventory.catalog)

    def decode(self, applied: list[str], changes: Sequence[Change], protocol: Protocol, phase: str) -> Step:
        """A warm restart with `changes` (none when the nodes already run it) and `protocol`'s
        runs on every workload."""
        from lab.engines import failure_message
        from lab.session import LaunchFailed, LaunchTimeout

        self.check_cancelled()
        cost = self.decode_cost(protocol)
        if not self.afford(cost):
            raise OutOfBudget(f"{phase} {applied}: about {cost:.0f} lab s, "
                              f"{self.budget - self.spent():.0f} left")
        trial = self.config_with(changes)
        t0 = self.session.clock.now()
        state = self.session.serving_state(trial)
        restarted = not state.serving
        try:
            if restarted:
                state = self.session.relaunch_checked(
                    trial, timeout_s=RESTART_TIMEOUT_LAB_S,
                    on_retry=lambda why: self.log(f"gap: after the restart {why}; again"))
        except (LaunchFailed, LaunchTimeout) as exc:
            tail = getattr(exc, "log_tail", "") or ""
            error = failure_message(self.engine, tail, version=self.version) or str(exc)
            step = Step(applied, "decode", phase, None, self.session.clock.now() - t0, True,
                        verdict="the engine did not start", error=error)
            self.steps.append(step)
            self.log(f"gap: {phase} {', '.join(applied) or 'current'}: refused at startup: {error}")
            return step
        if not state.serving:
            step = Step(applied, "decode", phase, None, self.session.clock.now() - t0, restarted,
                        verdict="not measured", error=f"the engine does not run it: {state.reason}")
            self.steps.append(step)
            return step
        t1 = self.session.clock.now()
        if restarted:
            self.restart_costs.append(t1 - t0)
        result = _measure(self.session, engine=self.engine, version=self.version,
                          workloads=tuple(self.workloads), n=protocol.n, warmup=protocol.warmup,
                          max_tokens=protocol.max_tokens,
                          settle_s=self.session.clock.wall_seconds(SETTLE_LAB_S))
        t2 = self.session.clock.now()
        runs: dict[str, list[float]] = {}
        decode_s = 0.0
        for w in self.workloads:
            samples = [float(x) for x in ((result.get(w) or {}).get("decode") or {}).get("samples") or []]
            runs[w] = samples
            if samples:
                mean = statistics.fmean(samples)
                self.rates_seen.append(mean)
                decode_s += (protocol.n + protocol.warmup) * protocol.max_tokens / mean
        total_runs = (protocol.n + protocol.warmup) * len(self.workloads)
        self.run_overheads.append(max(0.0, (t2 - t1 - decode_s) / total_runs))
        step = Step(applied, "decode", phase, runs, t2 - t0, restarted)
        self.steps.append(step)
        said = ", ".join(f"{w} {statistics.fmean(v):.2f} tok/s (n = {len(v)})" for w, v in runs.items() if v)
        self.log(f"gap: {phase} {', '.join(applied) or 'current'}: {said}; {t2 - t0:.0f} lab s")
        self.progress(min(95.0, 5.0 + 90.0 * self.spent() / max(1.0, self.budget)),
                      f"{phase}: {', '.join(applied) or 'current'}")
        return step

    def cold(self, applied: list[str], changes: Sequence[Change], n: int, phase: str, guess: float) -> Step:
        """`n` true cold starts with `changes` applied: their cold start seconds."""
        from lab.engines import failure_message
        from lab.session import LaunchFailed, LaunchTimeout

        self.check_cancelled()
        cost = self.cold_cost(n, guess)
        if not self.afford(cost):
            raise OutOfBudget(f"{phase} {applied}: about {cost:.0f} lab s, "
                              f"{self.budget - self.spent():.0f} left")
        trial = self.config_with(changes)
        t0 = self.session.clock.now()
        samples: list[float] = []
        for _ in range(n):
            self.check_cancelled()
            t = self.session.clock.now()
            try:
                launched = self.session.launch(trial, cold=True, timeout_s=COLD_TIMEOUT_LAB_S)
            except (LaunchFailed, LaunchTimeout) as exc:
                tail = getattr(exc, "log_tail", "") or ""
                error = failure_message(self.engine, tail, version=self.version) or str(exc)
                step = Step(applied, "cold", phase, None, self.session.clock.now() - t0, True,
                            verdict="the engine did not start", error=error)
                self.steps.append(step)
                return step
            self.cold_costs.append(self.session.clock.now() - t)
            samples.append(float(launched.cold_start_s))
        step = Step(applied, "cold", phase, {"cold_start_s": samples}, self.session.clock.now() - t0, True)
        self.steps.append(step)
        self.log(f"gap: cold {phase} {', '.join(applied) or 'current'}: "
                 + ", ".join(f"{s:.0f}" for s in samples) + " lab s")
        return step


def _measure(session: LabSession, **options: Any) -> dict[str, Any]:
    from diagnostic.pipelines.measure.protocol import measure_on_session

    return measure_on_session(session, **options)


# -- the pipeline --------------------------------------------------------------------------


def _words(after: Runs, before: Runs, better: str) -> str:
    parts = []
    for metric, samples in after.items():
        base = before.get(metric) or ()
        if len(samples) < 2 or len(base) < 2:
            continue
        t = trimmed_welch(samples, base)
        unit = "tok/s" if better == "higher" else "s"
        parts.append(f"{metric} {t['diff']:+.2f} {unit} [{t['ci95'][0]:+.2f}, {t['ci95'][1]:+.2f}]")
    return "; ".join(parts)


def run_gap(
    session: LabSession,
    config: Mapping[str, Any],
    baseline: GapBaseline | None,
    *,
    log: Log,
    progress: Progress,
    check_cancelled: Callable[[], None],
    budget_lab_s: float | None = None,
    current_runs: Mapping[str, Sequence[float]] | None = None,
    current_source: str | None = None,
    current_cold: Sequence[float] | None = None,
    cold_source: str | None = None,
    no_baseline_why: str | None = None,
    screen: Protocol = SCREEN,
    proof: Protocol = PROVE,
    cold_n: int = COLD_N,
) -> dict[str, Any]:
    """Compare `config` with `baseline`, find which differences cost, prove them one by one.

    `current_runs`: decode samples per workload already taken on `config` with `proof`'s
    protocol (`current_source` says where from); measured here when absent. `current_cold`:
    true cold starts of the current configuration taken earlier today (`cold_source`).
    Returns {section, findings, config_changes, lab_time_s}.
    """
    budget = float(budget_lab_s if budget_lab_s is not None else DEFAULT_BUDGET_LAB_S)
    section: dict[str, Any] = {
        "schema": SECTION_SCHEMA,
        "baseline": baseline.describe() if baseline else None,
        "candidates": [],
        "excluded": [],
        "steps": [],
        "proved": [],
        "checked": [],
        "untried": [],
        "context": None,
        "restarts": 0,
        "exhaustive_restarts": 0,
        "lab_time_s": 0.0,
        "budget_lab_s": budget,
        "protocol": {"screen": screen.describe(), "prove": proof.describe(), "cold_n": cold_n,
                     "alpha": ALPHA,
                     "restart": "warm for decode (page cache and JIT cache kept); true cold starts for "
                                "the cold-start search",
                     "decision": f"{TEST_NAME}, robust to a run a stall made absurd; a group is "
                                 "searched further when its runs are significantly better than the "
                                 "current configuration's on some workload; a difference is proved "
                                 "alone with fresh runs, better at 5 % divided by the number of "
                                 "workloads and worse on none"},
    }
    if baseline is None:
        section["summary"] = f"Nothing to compare: {no_baseline_why or 'no baseline'}."
        log(f"gap: {section['summary']}")
        progress(100.0, "no baseline")
        return {"section": section, "findings": [], "config_changes": [], "lab_time_s": 0.0}
    candidates, excluded = diff(config, baseline.config)
    section["candidates"] = [c.describe() for c in candidates]
    section["excluded"] = excluded
    if not candidates:
        section["summary"] = ("Nothing to compare: the configuration matches the baseline in every field "
                              "the stage may change" + (f" ({len(excluded)} difference(s) excluded)"
                                                        if excluded else "") + "; no lab time spent.")
        log(f"gap: {section['summary']}")
        progress(100.0, "nothing to compare")
        return {"section": section, "findings": [], "config_changes": [], "lab_time_s": 0.0}

    lab = _Lab(session, config, budget=budget, log=log, progress=progress, check_cancelled=check_cancelled)
    by_path = {c.path: c for c in candidates}
    findings: list[dict[str, Any]] = []
    proved_changes: list[Change] = []
    summary: list[str] = []

    decode = _decode_search(lab, config, baseline, candidates, by_path, section, current_runs,
                            current_source, screen, proof, summary)
    cold = _cold_search(lab, config, baseline, candidates, by_path, section, current_cold, cold_source,
                        cold_n, summary)
    done: set[str] = set()
    for result in (decode, cold):
        for item in result:
            findings.append(item["finding"])
            if item["path"] not in done:
                done.add(item["path"])
                proved_changes.extend(item["changes"])
    # Proved changes composed in order (several flags of one extra_args list).
    config_changes = _composed(config, [by_path[p] for p in done if p in by_path], proved_changes)
    section["steps"] = [s.describe() for s in lab.steps]
    section["restarts"] = lab.restarts
    cold_exhaustive = len(candidates) * cold_n if section.get("cold_start", {}).get("searched") else 0
    section["exhaustive_restarts"] = len(candidates) + cold_exhaustive
    lab_time = round(lab.spent(), 3)
    section["lab_time_s"] = lab_time
    section["summary"] = " ".join(summary)
    log(f"gap: {len(section['proved'])} proved, {len(section['checked'])} checked; {lab_time:.0f} lab s, "
        f"{lab.restarts} restart(s) against {section['exhaustive_restarts']} for one field at a time")
    progress(100.0, f"{len(section['proved'])} difference(s) proved")
    return {"section": section, "findings": findings, "config_changes": config_changes,
            "lab_time_s": lab_time}


def _composed(config: Mapping[str, Any], proved: Sequence[Candidate], fallback: list[Change]) -> list[Change]:
    if not proved:
        return []
    try:
        return with_candidates(config, proved)
    except ValueError:
        return fallback


def _current_decode(lab: _Lab, current_runs: Mapping[str, Sequence[float]] | None,
                    current_source: str | None, proof: Protocol, section: dict[str, Any]) -> Runs | None:
    if current_runs and all(len(current_runs.get(w) or ()) >= 2 for w in lab.workloads):
        runs = {w: [float(x) for x in current_runs[w]] for w in lab.workloads}
        section["current"] = {"source": current_source or "earlier runs on this configuration",
                              "rates": {w: _rate_summary(v) for w, v in runs.items()}, "lab_s": 0.0}
        return runs
    step = lab.decode([], [], proof, "current")
    step.verdict = "the current configuration"
    section["current"] = {"source": "measured here", "rates": {w: _rate_summary(v) for w, v in
                                                               (step.runs or {}).items()},
                          "lab_s": round(step.lab_s, 1)}
    return step.runs


def _decode_search(lab: _Lab, config: Mapping[str, Any], baseline: GapBaseline,
                   candidates: list[Candidate], by_path: dict[str, Candidate], section: dict[str, Any],
                   current_runs: Mapping[str, Sequence[float]] | None, current_source: str | None,
                   screen: Protocol, proof: Protocol, summary: list[str]) -> list[dict[str, Any]]:
    workloads = lab.workloads
    paths = [c.path for c in search_order(candidates)]
    try:
        current = _current_decode(lab, current_runs, current_source, proof, section)
    except OutOfBudget as exc:
        section["untried"].extend(paths)
        summary.append(f"Decode not compared: {exc}.")
        return []
    if not current:
        summary.append("The current configuration could not be measured; decode not compared.")
        return []
    gap: dict[str, Any] = {}
    if baseline.rates:
        below = []
        for w in workloads:
            theirs = baseline.samples(w)
            if len(theirs) < 2 or len(current.get(w) or ()) < 2:
                continue
            t = trimmed_welch(current[w], theirs)
            gap[w] = {"current_tps": round(t["mean_a"], 4), "baseline_tps": round(t["mean_b"], 4),
                      "diff_tps": round(t["diff"], 4), "ci95": [round(x, 4) for x in t["ci95"]],
                      "p": t["p"], "below": bool(t["different"] and t["diff"] < 0),
                      "estimate": f"{TRIM * 100:.0f} % trimmed mean"}
            if gap[w]["below"]:
                below.append(w)
        section["gap"] = gap
        if not below:
            why = ("not searched on decode: the current rate is not significantly below the baseline's ("
                   + "; ".join(f"{w} {g['diff_tps']:+.2f} tok/s [{g['ci95'][0]:+.2f}, {g['ci95'][1]:+.2f}]"
                               for w, g in gap.items()) + ")")
            for p in paths:
                section["checked"].append({"path": p, "metric": "decode", "why": why})
            summary.append(f"Decode: the current rate is not significantly below the baseline's; "
                           f"{len(paths)} difference(s) not restarted.")
            return []
        summary.append("Decode: the current rate is significantly below the baseline's on "
                       + ", ".join(below) + ".")
    # Every difference at once: the first comparison (with a best-known baseline, also its rate here).
    single = len(candidates) == 1
    try:
        whole = lab.decode(paths, with_candidates(config, candidates), proof if single else screen, "all")
    except OutOfBudget as exc:
        section["untried"].extend(paths)
        summary.append(f"Decode: every difference at once was not measured ({exc}).")
        return []
    if whole.runs is None:
        whole.verdict = "the engine did not start with every difference applied"
        summary.append("Decode: the engine did not start with every difference applied; searched one by one.")
        outcome = Outcome(costly=[(p, None) for p in paths])
    else:
        if baseline.source != "calibrate" or not baseline.rates:
            section["gap"] = {w: {"current_tps": round(statistics.fmean(current[w]), 4),
                                  "baseline_tps": round(statistics.fmean(v), 4), "measured_here": True}
                              for w, v in whole.runs.items() if v and current.get(w)}
        gains = improves(whole.runs, current, better="higher")
        closes = gains and (not baseline.rates or not any(
            improves({w: baseline.samples(w)}, {w: whole.runs.get(w) or []}, better="higher")
            for w in workloads))
        whole.verdict = ("closes the gap" if closes else "narrows the gap" if gains else "does not close")
        if not gains:
            words = _words(whole.runs, current, "higher")
            why = f"every difference at once changed nothing significant: {words}"
            for p in paths:
                section["checked"].append({"path": p, "metric": "decode", "why": why})
            summary.append("Decode: every difference applied at once is not significantly faster; "
                           "what remains lies outside the candidates.")
            return []
        outcome = delta_debug(
            paths, whole.runs, current,
            lambda group, one: _group(lab, config, by_path, group, proof if one else screen),
            better="higher", describe=lambda a, b: _words(a, b, "higher"),
        ) if not single else Outcome(costly=[(paths[0], whole.runs)])
    return _prove_all(lab, config, baseline, by_path, outcome, current, proof, section, summary, "decode")


def _group(lab: _Lab, config: Mapping[str, Any], by_path: Mapping[str, Candidate], group: Sequence[str],
           protocol: Protocol) -> Runs | None:
    phase = "prove" if len(group) == 1 and protocol == PROVE else "screen"
    step = lab.decode(list(group), with_candidates(config, [by_path[p] for p in group]), protocol, phase)
    return step.runs


def _cold_group(lab: _Lab, config: Mapping[str, Any], by_path: Mapping[str, Candidate], group: Sequence[str],
                n: int, guess: float) -> Runs | None:
    step = lab.cold(list(group), with_candidates(config, [by_path[p] for p in group]), n,
                    "prove" if len(group) == 1 else "screen", guess)
    return step.runs


def _prove_all(lab: _Lab, config: Mapping[str, Any], baseline: GapBaseline, by_path: Mapping[str, Candidate],
               outcome: Outcome, current: Runs, proof: Protocol | None, section: dict[str, Any],
               summary: list[str], kind: str, cold_n: int = COLD_N,
               cold_guess: float = 0.0) -> list[dict[str, Any]]:
    better = "higher" if kind == "decode" else "lower"
    for group, why in outcome.cleared:
        for p in group:
            section["checked"].append({"path": p, "metric": kind, "why": why})
    section["untried"].extend(p for p in outcome.untried if p not in section["untried"])
    out: list[dict[str, Any]] = []
    for path, runs in outcome.costly:
        alone: Runs | None = runs
        if alone is None:
            try:
                alone = (_group(lab, config, by_path, [path], proof) if kind == "decode" and proof
                         else _cold_group(lab, config, by_path, [path], cold_n, cold_guess))
            except OutOfBudget as exc:
                section["untried"].append(path)
                summary.append(f"{path} not proved alone ({exc}).")
                continue
        if alone is None:
            section["checked"].append({"path": path, "metric": kind,
                                       "why": "the engine did not start with it applied alone"})
            continue
        measured: Runs = alone
        verdict = prove(measured, current, better=better)
        said = "proved alone" if verdict["proved"] else "not proved alone"
        for step in lab.steps:
            if step.applied == [path] and id(step.runs) == id(measured):
                step.verdict = f"{step.verdict}; {said}" if step.verdict else said
        if not verdict["proved"]:
            words = _words(measured, current, better)
            section["checked"].append({"path": path, "metric": kind,
                                       "why": f"no measurable effect alone: {words}"})
            continue
        item = _finding(lab, config, baseline, by_path[path], measured, current, verdict, kind)
        section["proved"].append(item["proved"])
        summary.append(item["finding"]["title"] + ".")
        out.append(item)
    return out


def _impact(metric: str, before: Sequence[float], after: Sequence[float], better: str) -> dict[str, Any]:
    """The change as it was proved: before and after are the trimmed means the test compared
    and ci95 its interval, so that after - before is the interval's centre and the money-back
    rule reads the interval the decision rests on. `all_runs` keeps the plain means and
    Welch's interval over every run, stalled ones included, so nothing is hidden."""
    t = trimmed_welch(after, before)
    plain = welch(list(after), list(before))
    return {"metric": metric, "before": round(t["mean_b"], 4), "after": round(t["mean_a"], 4),
            "ci95": [round(x, 4) for x in t["ci95"]], "p": t["p"], "n_before": len(before),
            "n_after": len(after), "better": better, "unit": "tok/s" if better == "higher" else "s",
            "estimate": f"{TRIM * 100:.0f} % trimmed mean" if any(t["trimmed"]) else "mean",
            "test": TEST_NAME if any(t["trimmed"]) else "Welch's test",
            "all_runs": {"before": round(statistics.fmean(before), 4),
                         "after": round(statistics.fmean(after), 4),
                         "ci95": [round(x, 4) for x in plain["ci95"]], "p": plain["p"]}}


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return "unset" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _finding(lab: _Lab, config: Mapping[str, Any], baseline: GapBaseline, candidate: Candidate,
             alone: Runs, current: Runs, verdict: Mapping[str, Any], kind: str) -> dict[str, Any]:
    better = "higher" if kind == "decode" else "lower"
    metrics = list(alone)
    impacts = [_impact(f"{m}_tps" if kind == "decode" else "cold_start_s", current[m], alone[m], better)
               for m in metrics if len(current.get(m) or ()) >= 2 and len(alone[m]) >= 2]
    shown_on = [i for i, m in zip(impacts, metrics, strict=False) if m in verdict["better_on"]]
    # The primary impact: the largest relative gain among the metrics where it is proved.
    primary = max(shown_on or impacts,
                  key=lambda i: abs(i["after"] - i["before"]) / max(1e-9, abs(i["before"])))
    code = candidate.code
    changes = with_candidates(config, [candidate])
    frm, to = _shown(candidate.customer), _shown(candidate.baseline)
    source = "the lab's baseline" if baseline.source == "calibrate" else "the firm's best-known configuration"
    if kind == "decode":
        on = [m for m in metrics if m in verdict["better_on"]]
        figures = "; ".join(f"{i['metric'][:-4]} {i['before']:.1f} → {i['after']:.1f} tok/s "
                            f"(change {i['ci95'][0]:+.1f} to {i['ci95'][1]:+.1f})" for i in impacts)
        if any(i["estimate"] != "mean" for i in impacts):
            figures += f"; {TRIM * 100:.0f} % trimmed means of {impacts[0]['n_before']} runs a side"
        title = f"{candidate.path}: {frm} → {to} (as in {source}) is faster on {' and '.join(on)}"
    else:
        i = impacts[0]
        figures = (f"cold start {i['before']:.0f} → {i['after']:.0f} s (change {i['ci95'][0]:+.0f} to "
                   f"{i['ci95'][1]:+.0f} s, {i['n_before']} and {i['n_after']} true cold starts)")
        title = f"{candidate.path}: {frm} → {to} (as in {source}) starts faster"
    welch_tests = {m: {k: t[k] for k in ("diff", "ci95", "p", "dof", "trimmed")}
                   for m, t in verdict["tests"].items()}
    finding: dict[str, Any] = {
        "code": code,
        "title": title,
        "evidence": {
            "summary": f"{candidate.path} set to {to} alone, against the current configuration: {figures}.",
            "path": candidate.path,
            "from": copy.deepcopy(candidate.customer),
            "to": copy.deepcopy(candidate.baseline),
            "metric": kind,
            "baseline": {"source": baseline.source, "version": baseline.version, "made_at": baseline.made_at},
            "impacts": impacts,
            "welch": welch_tests,
        },
        "change": {"config": {c["path"]: {"from": c["from"], "to": c["to"]} for c in changes},
                   "note": f"as in {source}"},
        "impact": primary,
        "blocking": False,
    }
    proved = {"path": candidate.path, "from": copy.deepcopy(candidate.customer),
              "to": copy.deepcopy(candidate.baseline), "metric": kind, "impact": impacts,
              "welch": welch_tests}
    return {"path": candidate.path, "finding": finding, "proved": proved, "changes": changes}


def _cold_search(lab: _Lab, config: Mapping[str, Any], baseline: GapBaseline, candidates: list[Candidate],
                 by_path: dict[str, Candidate], section: dict[str, Any], current_cold: Sequence[float] | None,
                 cold_source: str | None, cold_n: int, summary: list[str]) -> list[dict[str, Any]]:
    theirs = baseline.cold_samples()
    mine = [float(x) for x in current_cold or []]
    info: dict[str, Any] = {"current": _cold_summary(mine), "current_source": cold_source,
                            "baseline": _cold_summary(theirs), "searched": False}
    section["cold_start"] = info
    if not theirs:
        info["verdict"] = ("not compared: the baseline's cold start is not known on this lab"
                           if baseline.source != "calibrate"
                           else "not compared: the baseline has no cold start")
        return []
    if not mine:
        info["verdict"] = "not compared: no true cold start of the current configuration today"
        return []
    guess = max(mine)
    if len(mine) < 2:
        if statistics.fmean(mine) <= max(theirs):
            info["verdict"] = (f"not slower: the current start ({mine[0]:.0f} s) is within the baseline's "
                               f"({min(theirs):.0f} to {max(theirs):.0f} s)")
            return []
        try:
            step = lab.cold([], [], 1, "current", guess)
        except OutOfBudget as exc:
            info["verdict"] = f"not compared: a second current start does not fit ({exc})"
            return []
        step.verdict = "a second true cold start of the current configuration"
        mine += list((step.runs or {}).get("cold_start_s") or [])
        info["current"] = _cold_summary(mine)
    if len(mine) < 2 or len(theirs) < 2:
        info["verdict"] = "not compared: fewer than two true cold starts on a side"
        return []
    t = trimmed_welch(mine, theirs)
    info["test"] = {"diff_s": round(t["diff"], 3), "ci95": [round(x, 3) for x in t["ci95"]], "p": t["p"]}
    if not (t["different"] and t["diff"] > 0):
        info["verdict"] = "not significantly slower than the baseline's"
        return []
    info["searched"] = True
    summary.append(f"Cold start: the current start is significantly slower than the baseline's "
                   f"({t['diff']:+.0f} s).")
    current = {"cold_start_s": mine}
    paths = [c.path for c in search_order(candidates)]
    single = len(paths) == 1
    try:
        whole_runs = _cold_group(lab, config, by_path, paths, cold_n, guess)
    except OutOfBudget as exc:
        info["verdict"] = f"slower; every difference at once not started ({exc})"
        section["untried"].extend(p for p in paths if p not in section["untried"])
        return []
    if whole_runs is None or not improves(whole_runs, current, better="lower"):
        info["verdict"] = "slower, and every difference at once does not start faster"
        for p in paths:
            section["checked"].append({"path": p, "metric": "cold", "why": info["verdict"]})
        return []
    info["verdict"] = "slower; every difference at once starts faster"
    if single:
        outcome = Outcome(costly=[(paths[0], whole_runs)])
    else:
        outcome = delta_debug(paths, whole_runs, current,
                              lambda group, _one: _cold_group(lab, config, by_path, group, cold_n, guess),
                              better="lower", describe=lambda a, b: _words(a, b, "lower"))
    return _prove_all(lab, config, baseline, by_path, outcome, current, None, section, summary, "cold",
                      cold_n=cold_n, cold_guess=guess)
