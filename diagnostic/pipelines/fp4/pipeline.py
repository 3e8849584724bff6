"""The FP4 stage: is the customer's kernel path correct, and which backend is the fastest
correct one (METHODOLOGY.md "FP4 correctness").

On the configuration with the earlier stages' fixes applied: read the backend the engine
chose from its log (from the flags and the version's rule where it logs none) and look it
up in the dispatch table; run the four checks (table, canaries, prompt likelihood, kernel
probe) on it. A sound default ends there: no finding, no change. Otherwise learn the names
the version accepts from argparse's refusal of an unknown one (a process that stops at
argument parsing: no engine start), keep those the dispatch table lets run NVFP4 on the
device, restart with each in the version's own order of preference (its MoE line's list
of potential backends; the table's order), switching the layers the evidence implicates,
run the same checks and a short decode measurement (n = 5 per workload), and choose the
fastest backend that passes every check; between equally fast ones (no interval shows
a lead over 5 %) the version's order of preference decides. Speed is measured
without speculative decoding, on the default too: a kernel's cost is the target model's,
and draft acceptance over short runs spreads the rates 5-10 % (3 % without it), which would
hide the cost the stop rule below has to bound. The search ends at the first backend that
passes them with its mean within 5 % of the default's on every workload: the fix then
costs nothing the short measurement resolves (a weight-only backend's 8-15 % shows at
once), and the backends not tried are listed with that reason and the measured difference
with its interval. The report
gets the verdicts before and after, the speed cost of correctness against the broken
default with intervals, and canary examples side by side.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from typing import Any

from scipy import stats as scipy_stats

from diagnostic.pipelines.changes import apply_changes, change
from diagnostic.pipelines.client import EndpointError, session_api_key
from diagnostic.pipelines.fp4 import backends as bk
from diagnostic.pipelines.fp4 import canaries as cn
from diagnostic.pipelines.fp4 import dispatch, likelihood
from diagnostic.pipelines.fp4 import probe as pr
from diagnostic.pipelines.fp4.api import ModelEndpoint
from diagnostic.pipelines.fp4.passrate import GARBAGE, HEALTHY, PassRate, difference_interval
from diagnostic.pipelines.measure.protocol import MeasurementError, measure_on_session
from diagnostic.pipelines.stats import welch
from lab.session import LabError, LabSession, LaunchFailed, spec_bytes

FINDING = "fp4.kernel_dispatch"
SECTION_SCHEMA = "diagnostic.fp4/1"
MEASURE_N = 5
MEASURE_WARMUP = 1
MEASURE_MAX_TOKENS = 128
LAUNCH_TIMEOUT_S = 3600.0
SETTLE_LAB_S = 2.0


def _noop_log(_: str) -> None:
    return None


def _noop_progress(_: float, __: str) -> None:
    return None


def _noop_cancel() -> None:
    return None


class _Stage:
    """One FP4 stage run: the session, the evidence gathered and the lab time spent."""

    def __init__(
        self,
        session: LabSession,
        config: Mapping[str, Any],
        *,
        log: Callable[[str], None],
        progress: Callable[[float, str], None],
        check_cancelled: Callable[[], None],
        budget_lab_s: float | None,
        canary_cap: int | None,
        measure_n: int,
        measure_max_tokens: int,
        probe_seed: int,
    ) -> None:
        self.session = session
        self.config = dict(config)
        # What a candidate backend is launched on: the configuration, without speculative
        # decoding once the default's speed was measured without it (run_fp4).
        self.candidate_base: dict[str, Any] = dict(config)
        self.engine = str(config["engine"]["name"])
        self.version = str(config["engine"]["version"])
        self.log = log
        self.progress = progress
        self.check_cancelled = check_cancelled
        self.budget_lab_s = budget_lab_s
        self.canary_set = cn.load_canaries()
        self.canary_cap = canary_cap
        self.measure_n = measure_n
        self.measure_max_tokens = measure_max_tokens
        self.probe_seed = probe_seed
        self.started = session.clock.now()
        self.notes: list[str] = []
        self.head = session.inventory.head.name
        self._vocab: int | bool | None = False
        # The backend names each layer's flag takes, as the engine listed them (_discover).
        self.accepted: dict[str, list[str]] = {}

    # -- lab time -------------------------------------------------------------------------
    def spent(self) -> float:
        return self.session.clock.now() - self.started

    def over_budget(self) -> bool:
        return self.budget_lab_s is not None and self.spent() >= self.budget_lab_s

    # -- facts ----------------------------------------------------------------------------
    def compute_capability(self) -> str | None:
        facts = self.session.facts([self.head]).get(self.head) or {}
        gpus = facts.get("gpus") or []
        cc = gpus[0].get("compute_capability") if gpus else None
        return str(cc) if cc else None

    def vocab_size(self) -> int | None:
        if self._vocab is False:
            try:
                from tokenizers import Tokenizer

                self._vocab = int(Tokenizer.from_file(str(self.session.tokenizer_path())).get_vocab_size())
            except Exception as exc:  # a tokenizer we cannot read only loses the uniform bound
                self.notes.append(f"no vocabulary size for the uniform-perplexity bound: {exc}")
                self._vocab = None
        return self._vocab if isinstance(self._vocab, int) else None

    # -- launching ------------------------------------------------------------------------
    def launch(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Start `config` warm; the FP4 backends its log names and the lab seconds it took.
        The launch writes a log of its own, read from its beginning."""
        t0 = self.session.clock.now()
        result = self.session.launch(config, cold=False, timeout_s=LAUNCH_TIMEOUT_S)
        lines = self.session.logs(self.head, since=0).text.splitlines()
        return {
            "events": bk.backend_events(self.engine, lines),
            "preference": bk.preference_order(lines),
            "warned_env": bk.unknown_env_warned(self.engine, lines),
            "launch_s": round(result.cold_start_s, 3),
            "lab_s": round(self.session.clock.now() - t0, 3),
        }

    def serving_backends(self) -> dict[str, Any]:
        """The backends of the engine serving `self.config`, starting it if it is not."""
        if not self.session.serves(self.config):
            self.log("fp4: the configuration is not serving; starting it (warm)")
            return self.launch(self.config)
        # The node agent moves each launch's log aside before the next (rotate_log): the
        # file holds the serving launch only, from its first line.
        lines = self.session.logs(self.head, since=0).text.splitlines()
        return {
            "events": bk.backend_events(self.engine, lines),
            "preference": bk.preference_order(lines),
            "warned_env": bk.unknown_env_warned(self.engine, lines),
            "launch_s": None,
            "lab_s": 0.0,
        }

    # -- the checks -----------------------------------------------------------------------
    def checks(self, backend: str, label: str) -> dict[str, Any]:
        """Canaries, likelihood and probe against what is serving now."""
        t0 = self.session.clock.now()
        with ModelEndpoint(self.session.endpoint, api_key=session_api_key(self.session)) as endpoint:

            def ask(canary: cn.Canary) -> str:
                try:
                    return endpoint.chat(canary.prompt, max_tokens=canary.max_tokens)
                except EndpointError as exc:
                    # An error answer is a wrong answer; the reason stays with the check.
                    return f"[request failed: {exc}]"

            suite = cn.run_suite(
                ask,
                self.canary_set,
                cap=self.canary_cap,
                check_cancelled=self.check_cancelled,
                log=lambda m: self.log(f"fp4 {label}: {m}"),
            )
            canary_s = self.session.clock.now() - t0
            t1 = self.session.clock.now()
            lik = likelihood.measure(endpoint)
            lik_s = self.session.clock.now() - t1
            if not lik["available"]:
                self.notes.append(f"{backend}: {lik['reason']}; the other checks decide")
        t2 = self.session.clock.now()
        probe = pr.probe_backend(self.session.agent, self.head, backend, seed=self.probe_seed)
        probe_s = self.session.clock.now() - t2
        rate = suite.rate
        self.log(
            f"fp4 {label} ({backend}): {rate.passed}/{rate.n} canaries passed; perplexity "
            f"{lik.get('perplexity', 'n/a')}; probe "
            f"{'passed' if probe.get('passed') else 'not run' if not probe.get('available') else 'failed'}"
        )
        return {
            "suite": suite,
            "likelihood": lik,
            "probe": probe,
            "lab_s": {
                "canaries": round(canary_s, 3),
                "likelihood": round(lik_s, 3),
                "probe": round(probe_s, 3),
            },
        }

    def rate(self) -> dict[str, Any] | None:
        """Short decode measurement of what is serving: n runs per workload."""
        t0 = self.session.clock.now()
        try:
            # The settle wait is in wall seconds: a few lab seconds, on any lab's dilation.
            m = measure_on_session(
                self.session,
                engine=self.engine,
                version=str(self.config["engine"]["version"]),
                workloads=list(self.config["workloads"]),
                n=self.measure_n,
                warmup=MEASURE_WARMUP,
                max_tokens=self.measure_max_tokens,
                settle_s=self.session.clock.wall_seconds(SETTLE_LAB_S),
            )
        except (MeasurementError, EndpointError) as exc:
            self.notes.append(f"decode rate not measured: {exc}")
            return None
        out: dict[str, Any] = {}
        for workload in self.config["workloads"]:
            w = m.get(workload) or {}
            runs = [r["decode_tps"] for r in w.get("runs") or [] if r.get("decode_tps") is not None]
            out[workload] = {
                "n": w.get("n"),
                "mean_tps": w.get("mean_tps"),
                "ci95": w.get("ci95"),
                "runs": [round(float(x), 4) for x in runs],
            }
        out["lab_s"] = round(self.session.clock.now() - t0, 3)
        return out


# -- verdicts -----------------------------------------------------------------------------


def verdict_of(rate: PassRate, lik: Mapping[str, Any], probe: Mapping[str, Any]) -> tuple[str, list[str]]:
    """garbage | degraded | correct from the checks, and which checks failed.

    Canaries set the floor: below 50 % is garbage whatever else says. Correct needs healthy
    canaries and every check that could run passing; a healthy pass rate with a failing
    probe or likelihood is degraded (the kernel computes something else, even if the
    canaries did not show it yet).
    """
    failed = []
    if rate.rate < HEALTHY:
        failed.append("canaries")
    if lik.get("available") and lik.get("passed") is False:
        failed.append("likelihood")
    if probe.get("available") and not probe.get("passed"):
        failed.append("probe")
    if rate.rate < GARBAGE:
        return "garbage", failed
    return ("correct" if not failed else "degraded"), failed


def _mean_rate(rate: Mapping[str, Any] | None) -> float | None:
    if not rate:
        return None
    means = [
        float(w["mean_tps"]) for w in rate.values() if isinstance(w, dict) and w.get("mean_tps") is not None
    ]
    return statistics.fmean(means) if means else None


def _welch_interval(a: list[float], b: list[float], dof: float) -> tuple[float, float]:
    """95 % interval of mean(a) - mean(b) with Welch's standard error and degrees of freedom."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    half = float(scipy_stats.t.ppf(0.975, dof)) * se if se > 0 else 0.0
    return (diff - half, diff + half)


def _lead(first: Mapping[str, Any], second: Mapping[str, Any]) -> str:
    """How far the fastest correct backend leads the next one, per workload."""
    parts = []
    for workload, cost in (_speed_cost(second.get("rate"), first.get("rate")) or {}).items():
        sig = "significant" if cost["significant"] else "not significant"
        parts.append(
            f"{workload} {cost['diff_tps']:+.2f} tok/s ({cost['diff_pct']:+.1f} %, "
            f"p = {cost['p']:.3g}, {sig})"
        )
    return f"{first['backend']} leads {second['backend']}, the next correct backend: " + (
        "; ".join(parts) if parts else "no comparable rates"
    )


def _as_fast(fastest: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Whether `other` ties with `fastest` by the short measurement: on every workload the
    95 % interval of its difference (Welch) either reaches zero (the measurement cannot say
    it is slower) or lies wholly above -NO_COST_PCT % (whatever it costs is below the cost
    the stage's stop rule treats as none). A backend measurably slower by an amount that may
    exceed that (marlin at -9.7 % [-17.2, -2.1]) is slower, not tied; rates that cannot be
    compared are not as fast."""
    cost = _speed_cost(fastest.get("rate"), other.get("rate"))
    return bool(cost) and all(
        c["diff_pct_ci95"] is not None
        and (c["diff_pct_ci95"][1] >= 0.0 or c["diff_pct_ci95"][0] >= -NO_COST_PCT)
        for c in (cost or {}).values())


def choose(correct: list[dict[str, Any]], order: list[str], notes: list[str]) -> dict[str, Any] | None:
    """The fix: the fastest backend that passed every check; between equally fast ones
    (_as_fast), the one the version's own default rule prefers (`order`, _preference), so
    the engine keeps its choice where speed does not decide. A correct backend whose rate
    was not measured is taken only when none was."""
    if not correct:
        return None
    rank = {name: i for i, name in enumerate(order)}

    def preferred(c: Mapping[str, Any]) -> int:
        return rank.get(str(c["backend"]), len(rank))

    rated = [c for c in correct if _mean_rate(c.get("rate")) is not None]
    if not rated:
        chosen = min(correct, key=preferred)
        chosen["_why"] = f"{chosen['backend']} passes every check (its speed was not measured)"
        return chosen
    rated.sort(key=lambda c: float(_mean_rate(c.get("rate")) or 0.0), reverse=True)
    fastest = rated[0]
    ties = [c for c in rated if c is fastest or _as_fast(fastest, c)]
    chosen = min(ties, key=preferred)
    if chosen is fastest:
        chosen["_why"] = f"{chosen['backend']} is the fastest FP4 backend that passes every check"
        if len(rated) > 1:
            notes.append(_lead(chosen, rated[1]))
        return chosen
    chosen["_why"] = (f"{chosen['backend']} passes every check and is as fast as the fastest that does "
                      f"({fastest['backend']}); the version's own order of preference decides between them")
    parts = [f"{w} {c['diff_pct']:+.1f} % [{c['diff_pct_ci95'][0]:+.1f}, {c['diff_pct_ci95'][1]:+.1f}]"
             for w, c in (_speed_cost(fastest.get("rate"), chosen.get("rate")) or {}).items()]
    notes.append(
        f"{chosen['backend']} ties with {fastest['backend']} by the measurement: no interval shows it "
        f"slower, or any cost it shows stays below {NO_COST_PCT:g} % ({'; '.join(parts)}); between tied "
        "correct backends "
        f"the one the version's default rule prefers is chosen ({' > '.join(order)})")
    return chosen


def _speed_cost(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """after - before per workload, tok/s and %, with Welch's 95 % interval."""
    if not before or not after:
        return None
    out: dict[str, Any] = {}
    for workload, b in before.items():
        a = after.get(workload)
        if not isinstance(b, dict) or not isinstance(a, dict):
            continue
        if len(b.get("runs") or []) < 2 or len(a.get("runs") or []) < 2:
            continue
        w = welch(a["runs"], b["runs"])
        mean_b = float(b["mean_tps"])
        ci = _welch_interval(a["runs"], b["runs"], float(w["dof"]))
        out[workload] = {
            "before_tps": round(mean_b, 3),
            "after_tps": round(float(a["mean_tps"]), 3),
            "diff_tps": round(float(a["mean_tps"]) - mean_b, 3),
            "diff_ci95": [round(float(x), 3) for x in ci] if ci else None,
            "diff_pct": round(100.0 * (float(a["mean_tps"]) - mean_b) / mean_b, 2) if mean_b else None,
            "diff_pct_ci95": [round(100.0 * float(x) / mean_b, 2) for x in ci] if ci and mean_b else None,
            "p": round(float(w["p"]), 4),
            "significant": bool(w["different"]),
        }
    return out or None


# -- the stage ----------------------------------------------------------------------------


def _candidate_record(
    stage: _Stage,
    backend: str,
    *,
    launch: Mapping[str, Any] | None,
    checks: Mapping[str, Any] | None,
    rate: Mapping[str, Any] | None,
    cc: str | None,
    expressed: list[dict[str, Any]] | None,
    status: str,
    reason: str = "",
) -> dict[str, Any]:
    layer = None
    if launch and launch.get("events"):
        layer = launch["events"][0]["layer"]
    row = dispatch.find_row(
        engine=stage.engine, version=stage.version, compute_capability=cc, backend=backend, layer=layer
    )
    rec: dict[str, Any] = {
        "backend": backend,
        "status": status,
        "dispatch": dispatch.dispatch_label(row),
        "table_row": dispatch.row_summary(row),
        "expressed_as": expressed,
    }
    if reason:
        rec["reason"] = reason
    if launch is not None:
        rec["launch"] = {
            "engine_chose": [e["backend"] for e in launch.get("events") or []],
            "start_s": launch.get("launch_s"),
            "lab_s": launch.get("lab_s"),
        }
    if checks is not None:
        suite: cn.SuiteResult = checks["suite"]
        rec["checks"] = {
            "canaries": suite.as_dict(),
            "likelihood": checks["likelihood"],
            "probe": checks["probe"],
            "lab_s": checks["lab_s"],
        }
        rec["_suite"] = suite
    rec["rate"] = rate
    return rec


def ran_by_rule(engine: str, version: str, config: Mapping[str, Any], cc: str | None) -> list[dict[str, Any]]:
    """Which backend each layer ran when the log does not say (SGLang on GB10 logs no
    backend line): the flag's value, or the version's default rule for the device from the
    dispatch table when the flag says auto. Layers whose flag the version lacks and whose
    rule the table does not record are left out."""
    serving = config.get("serving") or {}
    out: list[dict[str, Any]] = []
    for layer in ("moe", "linear"):
        chosen = serving.get(bk.FIELD_OF_LAYER[layer])
        has_flag = bk.backend_flag(engine, version, layer) is not None
        if has_flag and chosen not in (None, "auto"):
            out.append({"backend": str(chosen), "layer": layer, "line": None, "source": "flags",
                        "rule": f"{bk.backend_flag(engine, version, layer)} {chosen}"})
            continue
        default = dispatch.default_backend(engine=engine, version=version, compute_capability=cc, layer=layer)
        if default is not None:
            out.append({"backend": default, "layer": layer, "line": None, "source": "flags",
                        "rule": f"{engine} {version}'s default on compute capability {cc}"})
    return out


def run_fp4(
    session: LabSession,
    config: Mapping[str, Any],
    *,
    log: Callable[[str], None] = _noop_log,
    progress: Callable[[float, str], None] = _noop_progress,
    check_cancelled: Callable[[], None] = _noop_cancel,
    budget_lab_s: float | None = None,
    canary_cap: int | None = None,
    measure_n: int = MEASURE_N,
    measure_max_tokens: int = MEASURE_MAX_TOKENS,
    probe_seed: int = pr.DEFAULT_SEED,
) -> dict[str, Any]:
    """Run the FP4 stage on `config` (normalized, earlier stages' changes applied)."""
    stage = _Stage(
        session,
        config,
        log=log,
        progress=progress,
        check_cancelled=check_cancelled,
        budget_lab_s=budget_lab_s,
        canary_cap=canary_cap,
        measure_n=measure_n,
        measure_max_tokens=measure_max_tokens,
        probe_seed=probe_seed,
    )
    progress(2, "reading the FP4 backend the engine chose")
    cc = stage.compute_capability()
    first = stage.serving_backends()
    events = _backends_that_ran(stage, first, cc)
    backend_before = events[0]["backend"] if events else "unknown"
    layers, table_row = _layers_to_switch(stage, events, backend_before, cc)
    if table_row is not None:
        log(
            f"fp4: the dispatch table has {table_row['id']} for {backend_before} on {stage.engine} "
            f"{stage.version}, compute capability {cc}: {table_row['status']}"
        )

    progress(8, f"checking the {backend_before} backend")
    checks = stage.checks(backend_before, "before")
    likelihood.judge([checks["likelihood"]], vocab_size=stage.vocab_size())
    verdict_before, _ = verdict_of(checks["suite"].rate, checks["likelihood"], checks["probe"])
    rate_before = _rate_without_speculation(stage) if verdict_before != "correct" else stage.rate()
    before = _candidate_record(
        stage,
        backend_before,
        launch=first,
        checks=checks,
        rate=rate_before,
        cc=cc,
        expressed=None,
        status="customer",
    )
    candidates = [before]

    chosen: dict[str, Any] | None = None
    source: dict[str, Any] = {}
    if verdict_before != "correct":
        source = _search_correct(stage, first, layers, cc, backend_before, rate_before, candidates)
    for c in candidates:
        if c.get("checks"):
            suite = c["_suite"]
            c["verdict"], c["failed_checks"] = verdict_of(
                suite.rate, c["checks"]["likelihood"], c["checks"]["probe"]
            )
    verdict_before = before["verdict"]
    if verdict_before != "correct":
        correct = [c for c in candidates[1:] if c.get("verdict") == "correct"]
        chosen = choose(correct, (source.get("preference") or {}).get("order") or [], stage.notes)
    progress(95, "writing the FP4 section")
    return _result(stage, config, before, candidates, chosen, table_row, source, layers, cc)


def _backends_that_ran(stage: _Stage, first: dict[str, Any], cc: str | None) -> list[dict[str, Any]]:
    """The FP4 backend of each layer in the customer's launch, with notes on how it is known."""
    # What the log names, and for the layers it does not (SGLang 0.5.23 names its MoE runner
    # while it reads its arguments and no linear backend; 0.5.12 names neither) the flags
    # and the version's default rule.
    logged = list(first["events"])
    named = {e.get("layer") or "moe" for e in logged}
    by_rule = [e for e in ran_by_rule(stage.engine, stage.version, stage.config, cc)
               if e["layer"] not in named]
    events = logged + by_rule
    first["events"] = events
    if by_rule:
        what = ", ".join(f"{e['layer']} {e['backend']}" for e in by_rule)
        stage.notes.append(
            (f"{stage.engine} {stage.version} logs no FP4 backend line on this device: the backend that "
             f"ran is known from the flags and the version's default rule ({what})") if not logged else
            (f"{stage.engine} {stage.version}'s log names the "
             + ", ".join(f"{e.get('layer') or 'moe'} backend" for e in logged)
             + f"; the rest is known from the flags and the version's default rule ({what})"))
    elif not events:
        stage.notes.append(
            "the engine log names no FP4 backend and the dispatch table has no default rule for this "
            "version and device; the customer's kernel path is checked without a dispatch-table lookup"
        )
    pinned = bk.pinned_env(stage.config)
    if pinned:
        warned = [n for n in sorted(pinned) if n in (first.get("warned_env") or [])]
        stage.notes.append(
            f"{', '.join(sorted(pinned))} in the configuration's environment: {stage.engine} {stage.version} "
            "reads no such variable, so it chose no backend ("
            + (f"the engine's log warns 'Unknown vLLM environment variable detected' for {', '.join(warned)}"
               if warned else "it is in none of the version's environment lists")
            + "); the backend is chosen by flags alone, and a fix removes the variable"
        )
    return events


def _search_correct(
    stage: _Stage, first: Mapping[str, Any], layers: list[str], cc: str | None, backend_before: str,
    rate_before: dict[str, Any] | None, candidates: list[dict[str, Any]],
) -> dict[str, Any]:
    """The customer's backend is wrong: try the others the engine accepts on this device
    until a correct one as fast as the default is found (adding each to `candidates`).
    Returns where the list of backends and their order came from."""
    stage.progress(25, "learning the backends the engine accepts")
    supported, source = _discover(stage, layers)
    order, where = _preference(stage, first.get("preference") or [], layers, cc)
    source["preference"] = {"order": order, "from": where}
    runnable, cannot = _runnable(stage, [b for b in supported if b != backend_before], layers[:1], cc,
                                 order)
    source["not_tried"] = cannot
    candidates.extend(
        _candidate_record(stage, b, launch=None, checks=None, rate=None, cc=cc, expressed=None,
                          status="skipped", reason=why)
        for b, why in cannot.items()
    )
    if cannot:
        stage.log(f"fp4: not trying {', '.join(cannot)} (the dispatch table: no NVFP4 on this device)")
    untried = _try_until_free(stage, runnable, layers, cc, rate_before, candidates)
    # Likelihood is judged against the best perplexity measured on this lab.
    likelihood.judge(
        [c["checks"]["likelihood"] for c in candidates if c.get("checks")], vocab_size=stage.vocab_size()
    )
    if untried and not any(
        verdict_of(c["_suite"].rate, c["checks"]["likelihood"], c["checks"]["probe"])[0] == "correct"
        for c in candidates[1:] if c.get("checks")
    ):
        # The backend that ended the search failed the likelihood check after all: the
        # ones left untried are tried after all.
        stage.notes = [n for n in stage.notes if not n.startswith(FREE_NOTE)]
        _try_until_free(stage, list(untried), layers, cc, None, candidates)
        checked = [c["checks"]["likelihood"] for c in candidates if c.get("checks")]
        likelihood.judge(checked, vocab_size=stage.vocab_size())
    else:
        candidates.extend(
            _candidate_record(stage, b, launch=None, checks=None, rate=None, cc=cc, expressed=None,
                              status="skipped", reason=untried_reason)
            for b, untried_reason in untried.items()
        )
    return source


FREE_NOTE = "the search stopped at the first correct backend as fast as the default"
SPEED_NOTE = (
    "decode rates here are measured without speculative decoding, the default's too: a kernel's "
    "speed cost is the target model's, and draft acceptance over short runs would blur it"
)


def _rate_without_speculation(stage: _Stage) -> dict[str, Any] | None:
    """The default backend's decode rate for comparing candidates with: without speculative
    decoding when the configuration has it (one warm restart of the same backend, its
    kernels compiled already), and every candidate is then launched without it too. When
    that restart fails, the rates are measured as configured."""
    spec = stage.config.get("speculative")
    if not (isinstance(spec, Mapping) and spec.get("method")):
        return stage.rate()
    plain = apply_changes(stage.config, [change("speculative", spec, None, finding=FINDING)])
    stage.progress(20, "restarting the default without speculation to measure its speed")
    try:
        stage.launch(plain)
    except LaunchFailed as exc:
        stage.notes.append(f"the default did not restart without speculative decoding ({exc}); "
                           "rates are measured with it")
        return stage.rate()
    stage.candidate_base = plain
    stage.notes.append(SPEED_NOTE)
    stage.log("fp4: rates without speculative decoding (the default restarted without it)")
    return stage.rate()


# A correct backend whose mean speed is within this share of the default's on every workload
# costs nothing that the short measurement can resolve (n = 5 per workload resolves about
# 4 %: a weight-only backend's 8-15 % cost is shown at once). Its interval is not asked to
# reach zero as well: equally fast kernels measured minutes apart on a busy lab show a
# 1-3 % difference "significant" one time in several, and each such false cost was another
# restart with a kernel compile (~500 lab s) for a backend no faster.
NO_COST_PCT = 5.0


def _no_cost(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> str | None:
    """How a correct candidate compares with the broken default when it costs nothing: on
    every workload its mean is within NO_COST_PCT % below the default's (or above); the
    difference's 95 % interval (Welch) is given with it. Else None. Each further
    candidate is a restart with a kernel compile; the version tries its backends in its own
    order of preference, so one that matches the default's speed ends the search."""
    cost = _speed_cost(before, after)
    if not cost or any(not c.get("diff_pct_ci95") or c["diff_pct"] < -NO_COST_PCT
                       for c in cost.values()):
        return None
    return "; ".join(f"{w} {c['diff_pct']:+.1f} % [{lo:+.1f}, {hi:+.1f}]"
                     for w, c in cost.items() for lo, hi in [c["diff_pct_ci95"]])


def _try_until_free(
    stage: _Stage,
    backends: list[str],
    layers: list[str],
    cc: str | None,
    rate_before: Mapping[str, Any] | None,
    candidates: list[dict[str, Any]],
) -> dict[str, str]:
    """Restart with each backend in turn and check it, until one passes the canaries and the
    probe at no speed cost against the default (`rate_before`; None: try them all): its mean
    within NO_COST_PCT % of the default's. Correctness then costs nothing, which is
    this stage's question: a backend faster than the engine's own default would be speed
    tuning, and each try is a restart with a kernel compile. Returns {backend: why} for
    those left untried (empty when all were)."""
    for i, backend in enumerate(backends):
        stage.check_cancelled()
        stage.progress(30 + 60 * i / max(1, len(backends)), f"restarting with the {backend} backend")
        record = _try_candidate(stage, backend, layers, cc)
        candidates.append(record)
        checks = record.get("checks")
        if rate_before is None or not checks or record.get("rate") is None:
            continue
        if verdict_of(record["_suite"].rate, {}, checks["probe"])[0] != "correct":
            continue
        free = _no_cost(rate_before, record["rate"])
        if free is None or i == len(backends) - 1:
            continue
        left = backends[i + 1:]
        why = (f"not tried: {backend} passed the canaries and the probe with no speed cost against the "
               f"default beyond {NO_COST_PCT:g} % ({free})")
        stage.notes.append(f"{FREE_NOTE} ({backend}: {free}); not tried: {', '.join(left)}, each a restart "
                           "with a kernel compile")
        stage.log(f"fp4: {backend} is correct at the default's speed ({free}); not trying {', '.join(left)}")
        return dict.fromkeys(left, why)
    return {}


# An argparse refusal ends the process within seconds: a discovery start that runs longer
# than this did not refuse (lab seconds).
DISCOVERY_TIMEOUT_LAB_S = 120.0
DISCOVERY_POLL_LAB_S = 1.0


def _refusal(stage: _Stage, flag: str) -> tuple[list[str] | None, str]:
    """Start the head rank alone with `flag` set to a name no version has: argparse stops
    it at once and lists the names it takes. No weight is read, no kernel compiled: the
    answer costs seconds, not a cold start. Returns the names (None when the engine listed
    none) and the engine's words."""
    session = stage.session
    spec = dict(session.uploaded_specs(stage.config)[0])
    node = str(spec["node"])
    spec["argv"] = bk.refusal_argv(list(spec["argv"]), flag)
    work_dir = next(n.work_dir for n in session.inventory.nodes if n.name == node)
    path = f"{work_dir}/launch/fp4-discovery.json"
    session.stop()
    conn = session.ssh[node]
    conn.makedirs(f"{work_dir}/launch")
    conn.put_bytes(spec_bytes(spec), path)
    began = session.clock.now()
    try:
        session.agent(node, "launch", "--spec", path)
        while session.clock.now() - began < DISCOVERY_TIMEOUT_LAB_S:
            if not session.agent(node, "status").get("running"):
                break
            session.clock.sleep(DISCOVERY_POLL_LAB_S)
        text = session.logs(node, since=0).text
    finally:
        session.stop([node])
    return bk.supported_from_error(text, flag), text[-2000:]


def _discover(stage: _Stage, layers: list[str]) -> tuple[list[str], dict[str, Any]]:
    """The backend names the version takes for each layer switched, from argparse's
    refusal of a name it does not have (one seconds-long start per flag, stopped at
    argument parsing: no engine start); the table's declared choices where the engine's
    words give no list. The candidates are the first layer's names (the MoE's: the experts
    are most of the weights); the other layers follow a candidate where their flag takes
    it (_layers_for)."""
    t0 = stage.session.clock.now()
    per_layer: dict[str, list[str]] = {}
    how: dict[str, str] = {}
    said: dict[str, str] = {}
    for layer in layers:
        flag = bk.backend_flag(stage.engine, stage.version, layer)
        if flag is None:
            continue
        names: list[str] | None = None
        try:
            names, words = _refusal(stage, flag)
            if names is None:
                last = words.strip().splitlines()[-1] if words.strip() else "no output"
                stage.notes.append(f"{flag}: the engine did not list its choices when refusing an unknown "
                                   f"name ({last}); the version's declared choices stand in")
        except LabError as exc:
            stage.notes.append(f"{flag}: discovery failed ({exc}); the version's declared choices stand in")
        if names is None:
            names = bk.declared_choices(stage.engine, stage.version, layer)
            how[flag] = f"{stage.engine} {stage.version}'s declared choices"
        else:
            how[flag] = "argparse's refusal of an unknown name"
            said[flag] = next((line.strip() for line in reversed(words.splitlines())
                               if "invalid choice" in line), "")
            stage.log(f"fp4: {flag} takes {', '.join(names)}")
        per_layer[layer] = [n for n in names if n != "auto"]
    if not per_layer:
        return [], {"how": "none: the version has no backend flag", "supported": [],
                    "lab_s": round(stage.session.clock.now() - t0, 3)}
    stage.accepted = per_layer
    primary = next(iter(per_layer.values()))
    return primary, {
        "how": how,
        "flags": {str(bk.backend_flag(stage.engine, stage.version, layer)): names
                  for layer, names in per_layer.items()},
        "supported": primary,
        "unknown_name": bk.UNKNOWN_BACKEND,
        "engine_said": said,
        "lab_s": round(stage.session.clock.now() - t0, 3),
    }


def _layers_to_switch(stage: _Stage, events: list[dict[str, Any]], backend: str,
                      cc: str | None) -> tuple[list[str], dict[str, Any] | None]:
    """The layers whose backend a candidate replaces, and the dispatch-table row for the
    suspect backend. Of the layers running the suspect backend (the MoE's, or the first the
    log names), those the table reports bad or degraded for it on this device when it
    reports any (vLLM on GB10: the MoE; the linear kernel keeps the version's choice), all
    of them otherwise. Each candidate's own checks say whether that switch is enough."""
    running = [str(e["layer"]) for e in events if e["backend"] == backend] or ["moe"]
    rows = {layer: dispatch.find_row(engine=stage.engine, version=stage.version, compute_capability=cc,
                                     backend=backend, layer=layer) for layer in running}
    implicated = [layer for layer in running if (rows[layer] or {}).get("status") in ("bad", "degraded")]
    layers = implicated or running
    row = rows[layers[0]] or next((r for r in rows.values() if r is not None), None)
    return layers, row


def _preference(stage: _Stage, logged: list[str], layers: list[str],
                cc: str | None) -> tuple[list[str], list[str]]:
    """The order in which the version's default rule considers backends on this device,
    and where it was read: the engine's own MoE line's list where its log gives one (a
    run whose flag named a backend lists only that one), then the dispatch table's
    capability order for the first layer switched (read from the same rule's source).
    Candidates are tried in this order, and it decides between equally fast correct
    backends (choose)."""
    block = dispatch.capability(engine=stage.engine, version=stage.version, compute_capability=cc,
                                layer=layers[0]) if layers else None
    from_log = logged if "moe" in layers and len(logged) > 1 else []
    table = [str(n) for n in (block or {}).get("can") or []]
    where = (["the engine's MoE line ('out of potential backends')"] if from_log else []) + (
        [f"dispatch table {block['id']}"] if block and table else [])
    return list(dict.fromkeys([*from_log, *table])), where


def _runnable(stage: _Stage, names: list[str], layers: list[str],
              cc: str | None, order: list[str]) -> tuple[list[str], dict[str, str]]:
    """The names the dispatch table lets run NVFP4 on the device for every layer, and why
    each other one is not tried."""
    keep: list[str] = []
    left: dict[str, str] = {}
    for name in names:
        for layer in layers:
            block = dispatch.capability(engine=stage.engine, version=stage.version, compute_capability=cc,
                                        layer=layer)
            ok, why = dispatch.can_run(name, block)
            if not ok:
                left[name] = f"{layer}: {why}"
                break
        else:
            keep.append(name)
    # Tried in the version's own order of preference (_preference); names it does not rank
    # keep the engine's order, after them.
    rank = {name: i for i, name in enumerate(order)}
    keep.sort(key=lambda n: rank.get(n, len(rank)))
    return keep, left


def _layers_for(stage: _Stage, backend: str, layers: list[str], cc: str | None) -> list[str]:
    """The layers of `layers` a candidate is set on: those whose flag takes its name (as the
    engine listed them, else as the version declares them) and that the dispatch table lets
    run it on the device. A layer left out keeps the backend it ran (SGLang 0.5.23's
    --fp4-gemm-backend has no `cutlass`, say)."""
    out = []
    for layer in layers:
        takes = stage.accepted.get(layer)
        if takes is None:
            takes = bk.declared_choices(stage.engine, stage.version, layer)
        block = dispatch.capability(engine=stage.engine, version=stage.version, compute_capability=cc,
                                    layer=layer)
        if backend != "auto" and backend in takes and dispatch.can_run(backend, block)[0]:
            out.append(layer)
    return out


def _try_candidate(stage: _Stage, backend: str, layers: list[str], cc: str | None) -> dict[str, Any]:
    skip = None
    switch = _layers_for(stage, backend, layers, cc)
    if not layers or switch[:1] != layers[:1]:
        skip = (f"{stage.engine} {stage.version} has no flag choice that selects it for "
                f"{layers[0] if layers else 'any layer'}")
    elif stage.over_budget():
        skip = f"the stage's lab-time budget ({stage.budget_lab_s:g} s) was spent"
    if skip is not None:
        return _candidate_record(stage, backend, launch=None, checks=None, rate=None, cc=cc, expressed=None,
                                 status="skipped", reason=skip)
    expressed = bk.backend_changes(stage.config, backend, switch)
    kept = [layer for layer in layers if layer not in switch]
    if kept:
        stage.notes.append(f"{backend}: set on {'/'.join(switch)} only; {'/'.join(kept)} keeps the backend "
                           f"it ran ({stage.engine} {stage.version} cannot select {backend} there)")
    variant = apply_changes(stage.candidate_base, expressed)
    try:
        launch = stage.launch(variant)
    except LaunchFailed as exc:
        # The only difference from a configuration that starts is this backend: its failure
        # (at model init, with the engine's error) says the backend cannot run here, not
        # that the customer's configuration is at fault.
        return _candidate_record(
            stage,
            backend,
            launch=None,
            checks=None,
            rate=None,
            cc=cc,
            expressed=expressed,
            status="unsupported",
            reason=f"the engine did not start with it: {exc.reason}",
        )
    if not launch["events"]:
        launch["events"] = ran_by_rule(stage.engine, stage.version, variant, cc)
    chose = [e["backend"] for e in launch["events"]]
    if chose and backend not in chose:
        return _candidate_record(
            stage,
            backend,
            launch=launch,
            checks=None,
            rate=None,
            cc=cc,
            expressed=expressed,
            status="not_used",
            reason=f"the engine ran {', '.join(chose)} instead",
        )
    checks = stage.checks(backend, backend)
    # Only a backend that may yet be chosen needs its speed: the canaries and the probe
    # already rule the others out, and their rate would only cost lab time.
    verdict, _ = verdict_of(checks["suite"].rate, {}, checks["probe"])
    rate = stage.rate() if verdict == "correct" else None
    if rate is None and verdict != "correct":
        stage.notes.append(f"{backend}: not rated ({verdict} by canaries or probe)")
    return _candidate_record(
        stage, backend, launch=launch, checks=checks, rate=rate, cc=cc, expressed=expressed, status="measured"
    )


def _public(c: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in c.items() if not k.startswith("_")}


def _report_row(c: Mapping[str, Any]) -> dict[str, Any]:
    """The flat per-backend row the report's table reads."""
    checks = c.get("checks") or {}
    lik = checks.get("likelihood") or {}
    probe = checks.get("probe") or {}
    canaries = checks.get("canaries") or {}
    rate = c.get("rate") or {}
    return {
        "backend": c["backend"],
        "dispatch": c["dispatch"],
        "status": c["status"],
        "canary_pass_rate": canaries.get("rate"),
        "canaries": canaries.get("n"),
        "perplexity": lik.get("perplexity"),
        "probe_max_rel_error": probe.get("max_rel_error"),
        "decode_tps_code": (rate.get("code") or {}).get("mean_tps"),
        "decode_tps_prose": (rate.get("prose") or {}).get("mean_tps"),
        "verdict": c.get("verdict", c["status"]),
    }


def _result(
    stage: _Stage,
    config: Mapping[str, Any],
    before: dict[str, Any],
    candidates: list[dict[str, Any]],
    chosen: dict[str, Any] | None,
    table_row: dict[str, Any] | None,
    source: Mapping[str, Any],
    layers: list[str],
    cc: str | None,
) -> dict[str, Any]:
    verdict = str(before["verdict"])
    suite_before: cn.SuiteResult = before["_suite"]
    lab_time = round(stage.spent(), 3)
    section: dict[str, Any] = {
        "schema": SECTION_SCHEMA,
        "verdict": verdict,
        "verdict_after": chosen["verdict"] if chosen else (verdict if verdict == "correct" else None),
        "backend_before": before["backend"],
        "backend_after": chosen["backend"]
        if chosen
        else (before["backend"] if verdict == "correct" else None),
        "layers": layers,
        "compute_capability": cc,
        "engine": {"name": stage.engine, "version": stage.version},
        "canary_set": _canary_set(stage),
        "canaries": suite_before.rate.n,
        "canary_pass_rate": {
            "before": round(suite_before.rate.rate, 4),
            "after": round(chosen["_suite"].rate.rate, 4)
            if chosen
            else (round(suite_before.rate.rate, 4) if verdict == "correct" else None),
        },
        "canary_ci95": {
            "before": [round(x, 4) for x in suite_before.rate.ci95],
            "after": [round(x, 4) for x in chosen["_suite"].rate.ci95] if chosen else None,
        },
        "canaries_after": chosen["_suite"].rate.n if chosen else None,
        "perplexity": {
            "before": before["checks"]["likelihood"].get("perplexity"),
            "after": chosen["checks"]["likelihood"].get("perplexity") if chosen else None,
            "reference_passage_tokens": before["checks"]["likelihood"].get("tokens"),
        },
        "probe": {c["backend"]: c["checks"]["probe"] for c in candidates if c.get("checks")},
        "candidates": [_public(c) for c in candidates],
        "candidates_source": dict(source) or None,
        "backends": [_report_row(c) for c in candidates if c.get("checks")],
        "table_row": dispatch.row_summary(table_row),
        "dispatch_table": {"version": dispatch.load_table().version, "sha256": dispatch.load_table().sha256},
        "examples": {
            "before": suite_before.examples(),
            "after": chosen["_suite"].examples() if chosen else [],
        },
        "speed_cost": _speed_cost(before.get("rate"), chosen.get("rate")) if chosen else None,
        "protocol": _protocol(stage),
        "notes": stage.notes
        + (
            ["the default backend passed every check; no other backend was tried"]
            if verdict == "correct"
            else []
        ),
        "lab_time_s": lab_time,
    }
    findings: list[dict[str, Any]] = []
    config_changes: list[dict[str, Any]] = []
    if verdict != "correct":
        findings.append(_finding(stage, section, before, chosen))
        if chosen:
            config_changes = [
                change(
                    c["path"],
                    c["from"],
                    c["to"],
                    finding=FINDING,
                    why=str(chosen.get("_why") or f"{chosen['backend']} passes every check"),
                )
                for c in chosen["expressed_as"]
            ]
    section["config_changes"] = config_changes
    return {
        "section": section,
        "findings": findings,
        "config_changes": config_changes,
        "lab_time_s": lab_time,
        "tuned_config": apply_changes(config, config_changes) if config_changes else None,
    }


def _canary_set(stage: _Stage) -> dict[str, Any]:
    return {
        "name": stage.canary_set.name,
        "sha256": stage.canary_set.sha256,
        "size": len(stage.canary_set),
        "base": stage.canary_set.base,
        "extend_by": stage.canary_set.extend_by,
    }


def _protocol(stage: _Stage) -> dict[str, Any]:
    return {
        "measure_n": stage.measure_n,
        "measure_warmup": MEASURE_WARMUP,
        "measure_max_tokens": stage.measure_max_tokens,
        "healthy_at": HEALTHY,
        "garbage_below": GARBAGE,
        "canary_cap": stage.canary_cap or len(stage.canary_set),
        "perplexity_max_ratio": likelihood.MAX_RATIO,
        "probe_seed": stage.probe_seed,
    }


def _finding(
    stage: _Stage, section: Mapping[str, Any], before: Mapping[str, Any], chosen: Mapping[str, Any] | None
) -> dict[str, Any]:
    rate_b: PassRate = before["_suite"].rate
    verdict = section["verdict"]
    backend = section["backend_before"]
    what = "fluent nonsense" if verdict == "garbage" else "wrong answers part of the time"
    evidence: dict[str, Any] = {
        "summary": (
            f"{stage.engine} {stage.version} dispatched NVFP4 to {backend} on compute capability "
            f"{section['compute_capability']}; it produces {what}: {rate_b.passed}/{rate_b.n} canaries "
            f"passed, with no error in the log."
        ),
        "backend": backend,
        "verdict": verdict,
        "canaries_passed": f"{rate_b.passed}/{rate_b.n}",
        "canary_set_sha256": section["canary_set"]["sha256"],
        "perplexity_before": section["perplexity"]["before"],
        "perplexity_after": section["perplexity"]["after"],
        "probe_max_rel_error": (section["probe"].get(backend) or {}).get("max_rel_error"),
        "failed_checks": before.get("failed_checks"),
    }
    if section["table_row"]:
        evidence["known_bad_source"] = ", ".join(section["table_row"]["sources"])
        evidence["table_row"] = section["table_row"]["id"]
    if chosen is None:
        evidence["summary"] += " No backend the engine accepts passed every check."
        return {
            "code": FINDING,
            "title": f"The FP4 kernel path ({backend}) gives {what}; no correct backend found",
            "evidence": evidence,
            "change": None,
            "impact": None,
            "blocking": False,
        }
    rate_a: PassRate = chosen["_suite"].rate
    config_map = {c["path"]: {"from": c["from"], "to": c["to"]} for c in chosen["expressed_as"]}
    env = {
        c["path"].split(".", 1)[1]: c["to"] for c in chosen["expressed_as"] if c["path"].startswith("env.")
    }
    change_block: dict[str, Any] = {
        "config": config_map,
        "flags": bk.flags_for(stage.engine, chosen["expressed_as"]),
        "note": f"{chosen.get('_why') or chosen['backend'] + ' passes every check'} "
        f"({rate_a.passed}/{rate_a.n} canaries).",
    }
    if env:
        change_block["env"] = env
    cost = section.get("speed_cost") or {}
    if cost:
        parts = [f"{w}: {c['diff_tps']:+.2f} tok/s ({c['diff_pct']:+.1f} %)" for w, c in cost.items()]
        change_block["note"] += (
            " Speed cost of correctness against the broken default: " + "; ".join(parts) + "."
        )
    low, high = difference_interval(rate_b, rate_a)
    return {
        "code": FINDING,
        "title": f"The default FP4 kernel ({backend}) gives {what}; {chosen['backend']} is correct",
        "evidence": evidence,
        "change": change_block,
        "impact": {
            "metric": "canary_pass_rate",
            "before": round(rate_b.rate, 4),
            "after": round(rate_a.rate, 4),
            "ci95": [round(low, 4), round(high, 4)],
            "n": rate_a.n,
            "unit": "share of canaries",
            "better": "higher",
        },
        "blocking": False,
    }
