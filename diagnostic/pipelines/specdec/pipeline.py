"""The specdec stage's pipeline: find the speculative setting that is actually fastest, per
workload and for the customer's mix, in bounded lab time (METHODOLOGY.md, "Speculative-
decoding tuning").

Every trial is a warm engine restart (page cache and JIT cache kept) of the configuration
with one speculative setting, then a measurement of every workload; no restart when the
nodes already run the trial's launch spec (the customer's setting the previous stage left
serving, the setting screened last when it is confirmed next), and none measured until every
node's agent reports the spec hash the trial renders. The customer's setting, which every
decision needs, is confirmed first (n = 15); no speculation is screened like any other
setting. Screening trials are short (n = 5) and the k-search (`search.py`) decides which
lengths to screen, dropping a method past its peak and significantly below the leader.
Where the engine logs its acceptance per draft position (vLLM's spec-decode lines), one
trial at a length tells the acceptance model (`model.py`) the rate of every shorter length:
the search then screens one probe per method (the customer's length, or the common
default) and lengthens it only while the predicted peak is at its end; elsewhere it screens
lengths 1 and 2 too and refines on measured rates. The finalists (each workload's best and
the mix's best, by the model's prediction where it reaches, and the settings it ranks
within 2 % of a leader while the budget allows) are confirmed with fresh n = 15 runs; the
decision (`decide.py`) reads confirmation runs only. No speculation is confirmed too when it
is a finalist or when its screening runs leave open whether the customer's setting is
slower than it (harmful); otherwise the test against it reads its screening runs, which are
a fixed reference's, not a selected maximum's, and so carry no winner's curse. Lab time is
the session's clock; the budget reserves what the confirmations will cost, estimated from
the restarts and runs measured so far.
"""

from __future__ import annotations

import json
import shlex
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diagnostic.pipelines.changes import apply_changes, change
from diagnostic.pipelines.specdec.catalog import load_catalog
from diagnostic.pipelines.specdec.decide import (
    ALPHA,
    Deployment,
    WorkloadDecision,
    choose_deployed,
    comparison,
    confirmed_summary,
    decide_workload,
)
from diagnostic.pipelines.specdec.model import Observation, RateModel, fit, rate_bound
from diagnostic.pipelines.specdec.search import (
    MAX_TRIALS_PER_METHOD,
    NO_SPECULATION,
    NONE,
    KSearch,
    Setting,
    search_k,
)
from diagnostic.pipelines.stats import ranking_mean, welch
from lab.config import MAX_SPEC_TOKENS

if TYPE_CHECKING:
    from lab.session import LabSession

SECTION_SCHEMA = "diagnostic.speculative/1"
# Lab seconds the search may spend on an 8-node Kimi K2 configuration (issue 13).
DEFAULT_BUDGET_LAB_S = 4500.0
RESTART_TIMEOUT_LAB_S = 1800.0
# After each workload the measurement waits for requests the server still runs; a couple
# of lab seconds is enough for a single stream (the measure stage keeps its own figure).
SETTLE_LAB_S = 2.0
# Each workload's best screened setting outside the finalists is confirmed too when its runs
# are not significantly below the workload's best's at this level (one-sided Welch) and the
# budget allows: one low n = 5 draw (the mean of five runs at 5 % run noise is off by a few
# percent now and then) must not decide between two lengths whose true rates are within a
# percent of each other, while a length clearly below cannot win and is not confirmed.
RUNNER_UP_ALPHA = 0.05
# Where the acceptance model covers a workload, the settings it predicts within this share of
# the workload's leader are its runner-ups (their curves differ by less than the model's
# error, a percent or two).
RUNNER_UP_WITHIN = 0.02
# A method past its peak whose best length is significantly below (one-sided Welch) the
# leading setting on every workload is not refined further.
PRUNE_ALPHA = 0.01
# A length is not screened when the most its method's own evidence lets it reach, raised by
# this share (five runs' means spread a few percent), stays below the leader on every
# workload (model.rate_bound; engines that report acceptance per position are searched on
# the acceptance model instead).
BOUND_MARGIN = 0.10
DEFAULT_K = 4  # the common default draft length
# Lengths screened too when the engine reports no acceptance per position (search.py).
FALLBACK_SEEDS = (1, 2)
# Confirmations are reserved at their estimated price times this.
CONFIRM_MARGIN = 1.15


@dataclass(frozen=True)
class Protocol:
    """How one phase measures: runs per workload, warm-up runs discarded, tokens per run."""

    n: int
    warmup: int
    max_tokens: int

    def describe(self) -> dict[str, Any]:
        return {"n": self.n, "warmup_discarded": self.warmup, "max_tokens": self.max_tokens}


# Screening asks only which lengths are promising: five runs of 128 tokens after one
# warm-up. Confirmation is the measurement protocol's n = 15 after two warm-ups, with 192
# tokens a run instead of 512. The decode rate is a per-token figure ((N - 1) / decode time
# at batch 1) that does not depend on how many tokens are asked for, while every run's cost
# does. What shorter runs add is spread: the accepted tokens per step vary (about
# sd^2 / (E * N) in relative variance, E tokens a step), and a client's scheduling stall
# weighs more against a shorter decode. On the simulated reference lab at dilation 45 on a
# loaded machine, 128-token confirmations spread 5 to 14 % (one run read 2,877 tok/s after a
# client stall: flagged, never dropped), 192-token ones 4 to 7 %, 256-token ones 3 to 6 %;
# screening at 128 tokens spreads as much as 192 did. The section states what 512 would have
# cost; the measure stage measures the deployed configuration at 512 tokens afterwards.
SCREEN = Protocol(n=5, warmup=1, max_tokens=128)
CONFIRM = Protocol(n=15, warmup=2, max_tokens=192)
# The measurement protocol, which an exhaustive sweep would use.
FULL_PROTOCOL = Protocol(n=15, warmup=2, max_tokens=512)
SWEEP = FULL_PROTOCOL

Log = Callable[[str], None]
Progress = Callable[[float, str], None]
Measure = Callable[..., dict[str, Any]]


def _default_measure(session: LabSession, **options: Any) -> dict[str, Any]:
    from diagnostic.pipelines.measure.protocol import measure_on_session

    return measure_on_session(session, **options)


# -- the customer's setting and the space --------------------------------------------------


def setting_of(config: Mapping[str, Any]) -> Setting:
    spec = config.get("speculative")
    if not spec:
        return NO_SPECULATION
    return Setting(str(spec["method"]), int(spec["num_speculative_tokens"]))


def speculative_block(setting: Setting, draft: str | None, customer_spec: Mapping[str, Any] | None,
                      *, engine: str = "vllm") -> Any:
    """The configuration's `speculative` value for a setting (None: no speculation). n-gram
    keeps the customer's lookup window when they set one, on vLLM: SGLang's releases from
    0.5.12 on have no match-window flags (their n-gram drafts a tree, sized by
    --speculative-num-draft-tokens, the only n-gram parameter tuned there)."""
    if setting.method == NONE:
        return None
    lookup = {"prompt_lookup_max": None, "prompt_lookup_min": None}
    if setting.method == "ngram" and customer_spec and customer_spec.get("method") == "ngram" \
            and engine != "sglang":
        lookup = {k: customer_spec.get(k) for k in lookup}
    return {
        "method": setting.method,
        "draft_model": draft if setting.method == "eagle3" else None,
        "num_speculative_tokens": setting.k,
        **lookup,
    }


# SGLang's n-gram is tuned by the size of its draft tree; the version must have the flag.
SGLANG_NGRAM_FLAG = "--speculative-num-draft-tokens"


def ngram_note(engine: str, version: str) -> str | None:
    """Why n-gram is left out on this engine version (None: it is searched), from the
    version's own flag table."""
    if engine != "sglang":
        return None
    from lab.engines.tables import flag, release

    try:
        table = release(engine, version)
    except LookupError as exc:
        return f"not tried: {exc}"
    if flag(table, SGLANG_NGRAM_FLAG) is None:
        return (f"not tried: SGLang {version} has no {SGLANG_NGRAM_FLAG}, the size of its n-gram draft tree "
                "and the only n-gram parameter this search tunes")
    return None


def lab_draft(session: LabSession, model_id: str, draft_id: str) -> str | None:
    """The lab's own copy of a draft (its path in the lab's catalog), None when the lab
    holds none: the nodes run offline, so a launch names the draft by that path."""
    catalog = session.inventory.catalog
    model = catalog.model(model_id)
    if model is None:
        return None
    held = model.draft(draft_id, "eagle3")
    return held.path if held is not None else None


def model_mtp_heads(session: LabSession) -> int | None:
    """The model's multi-token-prediction heads, from its config.json in the lab's model
    directory (`num_nextn_predict_layers`, DeepSeek-V3 style); None when unreadable."""
    head = session.inventory.head
    try:
        data = json.loads(session.ssh[head.name].get_bytes(f"{head.model_dir}/config.json"))
    except Exception:
        return None
    value = data.get("num_nextn_predict_layers") if isinstance(data, dict) else None
    return int(value) if isinstance(value, int) else None


def speculative_flags(session: LabSession, config: Mapping[str, Any]) -> list[str]:
    """The speculative arguments of the head node's command line for `config`, as the
    engine takes them (what the customer pastes into their own launch command)."""
    # Rendered exactly as the session launches it: admitted by the lab's catalog, the model
    # and its draft named by the lab's paths.
    argv = list(session.specs_for(config)[0]["argv"])
    picked: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i].startswith("--speculative"):
            picked.append(argv[i])
            while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                i += 1
                picked.append(argv[i])
        i += 1
    return picked


def launch_syntax(session: LabSession, config: Mapping[str, Any]) -> str:
    picked = speculative_flags(session, config)
    return shlex.join(picked) if picked else "(no speculative flags: speculation off)"


def choose_finalists(
    screened: Mapping[Setting, Mapping[str, Sequence[float]]],
    customer: Setting,
    workloads: Sequence[str],
    weights: Mapping[str, float] | None = None,
    predicted: Mapping[Setting, Mapping[str, float]] | None = None,
    refused: Collection[Setting] = (),
) -> tuple[list[Setting], list[Setting]]:
    """What to confirm with fresh runs, from the runs the search read (screening runs, or the
    confirmation runs of a setting confirmed first; refused settings absent) and the
    acceptance model's predicted rates (`predicted`, which also reach lengths not measured).

    Finalists, which the decision cannot do without: the customer's setting, each
    workload's best setting, and the best setting for the workload mix
    (`weights`, equal by default), ranked by the model's prediction where it has one and by
    the runs' ranking mean elsewhere. Runner-ups, confirmed while the budget allows: the
    settings the model predicts within RUNNER_UP_WITHIN of a workload's leader, closest
    first; then, among settings the model does not cover, each workload's best measured one
    outside the finalists when it can still win (its runs not significantly below,
    one-sided Welch at RUNNER_UP_ALPHA, the best measured runs there). A short budget
    drops the last of them first. `refused`: settings the engine refused at startup, never chosen.
    """
    predicted = predicted or {}

    def measured(setting: Setting, workload: str) -> float | None:
        runs = (screened.get(setting) or {}).get(workload) or ()
        return ranking_mean(runs) if runs else None

    def score(setting: Setting, workload: str) -> float | None:
        return (predicted.get(setting) or {}).get(workload) or measured(setting, workload)

    settings = [s for s in dict.fromkeys([*screened, *predicted]) if s not in refused]

    def rated(workload: str) -> list[Setting]:
        return [s for s in settings if score(s, workload)]

    finalists: list[Setting] = [customer]
    leaders: dict[str, Setting] = {}
    for w in workloads:
        if rated(w):
            leaders[w] = max(rated(w), key=lambda s: (score(s, w) or 0.0, -s.k))
            if leaders[w] not in finalists:
                finalists.append(leaders[w])
    share = {w: float((weights or {}).get(w, 1.0 if weights is None else 0.0)) for w in workloads}
    share = {w: v for w, v in share.items() if v > 0}
    complete = [s for s in settings if share and all(score(s, w) for w in share)]
    if complete:
        def mix_rate(s: Setting) -> float:
            return 1.0 / sum(v / (score(s, w) or 1.0) for w, v in share.items())

        mix = max(complete, key=lambda s: (mix_rate(s), -s.k))
        if mix not in finalists:
            finalists.append(mix)
    close: dict[Setting, float] = {}  # runner-up the model ranks near a leader -> its ratio
    contenders: dict[Setting, float] = {}  # runner-up by measured runs -> its largest one-sided p
    for w in workloads:
        modelled = [s for s in settings if (predicted.get(s) or {}).get(w)]
        if modelled:
            # The model ranks the lengths it covers; what it puts within RUNNER_UP_WITHIN of
            # the workload's leader is confirmed too, so that the decision, on fresh runs,
            # is not the model's alone where it cannot tell two settings apart.
            top_rate = max(predicted[s][w] for s in modelled)
            for s in modelled:
                ratio = predicted[s][w] / top_rate
                if s not in finalists and ratio >= 1.0 - RUNNER_UP_WITHIN:
                    close[s] = max(ratio, close.get(s, 0.0))
        tried = [s for s in screened if measured(s, w)]
        if not tried:
            continue
        top = max(tried, key=lambda s: (measured(s, w) or 0.0, -s.k))
        others = [s for s in tried if s not in finalists and not (predicted.get(s) or {}).get(w)]
        if not others:
            continue
        second = max(others, key=lambda s: (measured(s, w) or 0.0, -s.k))
        p = 1.0 if second == top else below_p(screened[second][w], screened[top][w])
        if p >= RUNNER_UP_ALPHA:
            contenders[second] = max(p, contenders.get(second, p))
    runner_ups = sorted(close, key=lambda s: (-close[s], s.k)) + sorted(
        (s for s in contenders if s not in close), key=lambda s: (-contenders[s], s.k)
    )
    return finalists, runner_ups


def _ranked(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """A trial's ranking mean per workload (outlier runs left out of the ranking only)."""
    return {w: ranking_mean(r["samples"]) for w, r in rows.items() if r.get("samples")}


def below_p(runs: Sequence[float], leader: Sequence[float]) -> float:
    """One-sided Welch p-value of `runs` being slower than `leader` (1.0 without two runs a side)."""
    if len(runs) < 2 or len(leader) < 2:
        return 1.0
    test = welch(runs, leader)
    return test["p"] / 2.0 if test["diff"] < 0 else 1.0 - test["p"] / 2.0


def none_open(
    read: Mapping[Setting, Mapping[str, Sequence[float]]], customer: Setting, workloads: Sequence[str]
) -> list[str]:
    """The workloads on which the runs read leave open whether the customer's setting is
    slower than no speculation: its runs are not significantly faster (two-sided Welch at
    5 %) than no speculation's. On those, no speculation is confirmed with fresh runs so that
    a harmful verdict rests on n = 15 a side; elsewhere its screening runs answer the test."""
    if customer == NO_SPECULATION:
        return []
    mine, none = read.get(customer) or {}, read.get(NO_SPECULATION) or {}
    open_on = []
    for w in workloads:
        a, b = list(mine.get(w) or ()), list(none.get(w) or ())
        if len(a) < 2 or len(b) < 2 or not comparison(b, a, ALPHA)["faster"]:
            open_on.append(w)
    return open_on


# -- lab time --------------------------------------------------------------------------------


class LabCosts:
    """What restarts and runs have cost so far, to price trials not yet run."""

    def __init__(self) -> None:
        self.restarts: list[float] = []
        self.per_run_fixed: list[float] = []
        self.rates: dict[Setting, dict[str, float]] = {}

    def observe(
        self,
        setting: Setting,
        restart_s: float | None,
        measure_s: float,
        protocol: Protocol,
        rates: Mapping[str, float],
    ) -> None:
        if restart_s is not None:  # None: measured on the engine already serving it
            self.restarts.append(restart_s)
        self.rates.setdefault(setting, {}).update(rates)
        runs = (protocol.n + protocol.warmup) * len(rates)
        decode = sum(
            (protocol.n + protocol.warmup) * protocol.max_tokens / r for r in rates.values() if r > 0
        )
        if runs:
            self.per_run_fixed.append(max(0.0, (measure_s - decode) / runs))

    @property
    def known(self) -> bool:
        # Prices need a restart measured: a trial on the engine already serving costs none.
        return bool(self.restarts)

    def restart_s(self) -> float:
        return statistics.fmean(self.restarts) if self.restarts else 0.0

    def fixed_s(self) -> float:
        return statistics.fmean(self.per_run_fixed) if self.per_run_fixed else 0.0

    def rate(self, setting: Setting, workload: str) -> float | None:
        own = self.rates.get(setting, {}).get(workload)
        if own:
            return own
        # Unmeasured: the slowest rate seen on the workload, so that estimates err long.
        seen = [r[workload] for r in self.rates.values() if r.get(workload)]
        return min(seen) if seen else None

    def trial_s(
        self, setting: Setting, workloads: Sequence[str], protocol: Protocol, *, restart: bool = True
    ) -> float:
        total = self.restart_s() if restart else 0.0
        for w in workloads:
            rate = self.rate(setting, w) or 1.0
            total += (protocol.n + protocol.warmup) * (protocol.max_tokens / rate + self.fixed_s())
        return total

    def sweep_s(self, space: Sequence[Setting], workloads: Sequence[str]) -> float:
        """An exhaustive sweep of `space` at the full protocol, priced from what was measured:
        a measured setting at its own rate, an unmeasured one at the mean rate measured on the
        workload (a sweep would run them all)."""
        mean_rate = {
            w: statistics.fmean([r[w] for r in self.rates.values() if r.get(w)] or [1.0]) for w in workloads
        }
        total = 0.0
        for setting in space:
            total += self.restart_s()
            for w in workloads:
                rate = self.rates.get(setting, {}).get(w) or mean_rate[w]
                total += (SWEEP.n + SWEEP.warmup) * (SWEEP.max_tokens / rate + self.fixed_s())
        return total


# -- the pipeline ------------------------------------------------------------------------------


class _Run:
    """One specdec run's state: the trials, the lab-time ledger, the search results."""

    def __init__(
        self,
        session: LabSession,
        config: Mapping[str, Any],
        *,
        log: Log,
        progress: Progress,
        check_cancelled: Callable[[], None],
        budget_lab_s: float,
        measure: Measure,
        screen: Protocol,
        confirm: Protocol,
    ) -> None:
        self.session = session
        self.config = dict(config)
        self.engine = str(config["engine"]["name"])
        self.version = config["engine"].get("version")
        self.workloads = [str(w) for w in config["workloads"]]
        self.log, self.progress, self.check_cancelled = log, progress, check_cancelled
        self.budget = float(budget_lab_s)
        self.measure_fn = measure
        self.screen_protocol, self.confirm_protocol = screen, confirm
        self.started = session.clock.now()
        self.costs = LabCosts()
        self.trials: list[dict[str, Any]] = []
        self.screened: dict[Setting, dict[str, Any] | None] = {}
        self.confirmed: dict[Setting, dict[str, list[float]]] = {}
        self.confirmed_rows: dict[Setting, dict[str, dict[str, Any]]] = {}
        self.reserve: Callable[[], float] = lambda: 0.0
        self.serving: Setting | None = None  # the setting the last verified trial ran

    def _record_failed(self, base: Mapping[str, Any], status: str, error: str, lab_s: float) -> None:
        for w in self.workloads:
            self.trials.append(
                {
                    **base,
                    "workload": w,
                    "status": status,
                    "error": error,
                    "n": 0,
                    "mean_tps": None,
                    "ci95": None,
                    "lab_s": lab_s,
                    "restart_s": lab_s,
                    "restarted": True,
                }
            )

    def spent(self) -> float:
        return self.session.clock.now() - self.started

    def config_for(self, spec: Any) -> dict[str, Any]:
        """The configuration with `spec` as its speculative setting (None: none)."""
        return apply_changes(
            self.config,
            [change("speculative", self.config.get("speculative"), spec, finding="specdec.trial")],
        )

    # A trial: restart warm with the setting, measure every workload.
    def trial(self, setting: Setting, phase: str, spec: Any) -> dict[str, dict[str, Any]] | None:
        self.check_cancelled()
        protocol = self.screen_protocol if phase == "screen" else self.confirm_protocol
        trial_config = self.config_for(spec)
        index = len({row["trial"] for row in self.trials}) + 1
        base = {
            "trial": index,
            "setting": setting.as_dict(),
            "method": setting.method,
            "k": setting.k,
            "phase": phase,
            "stage": phase,
        }
        t0 = self.session.clock.now()
        from lab.session import LaunchFailed, LaunchTimeout

        # The engine may run this setting already (the configuration the previous stage left
        # serving is the customer's; the last trial's setting is still up when a finalist is
        # the one screened last): then the nodes' own evidence says so and no restart is
        # needed. Otherwise a warm restart.
        known = setting == self.serving or not self.trials
        state = self.session.serving_state(trial_config) if known else None
        restarted = not (state is not None and state.serving)
        mismatch: str | None = None
        try:
            if restarted:
                self.serving = None
                retried: list[str] = []

                def again(why: str) -> None:
                    retried.append(why)
                    self.log(f"trial {index} ({phase}) {setting.label}: after the restart {why}; again")

                state = self.session.relaunch_checked(trial_config, timeout_s=RESTART_TIMEOUT_LAB_S,
                                                      on_retry=again)
                mismatch = retried[0] if retried else None
        except (LaunchFailed, LaunchTimeout) as exc:
            from lab.engines import failure_message

            tail = getattr(exc, "log_tail", "") or ""
            error = failure_message(self.engine, tail, version=self.version) or str(exc)
            lab_s = round(self.session.clock.now() - t0, 3)
            status = "refused" if isinstance(exc, LaunchFailed) else "timeout"
            self.log(f"trial {index} ({phase}) {setting.label}: {status} at startup: {error}")
            self._record_failed(base, status, error, lab_s)
            return None
        if state is None or not state.serving:
            error = f"the engine does not run this setting: {state.reason if state else 'unknown'}"
            self.log(f"trial {index} ({phase}) {setting.label}: not measured: {error}")
            self._record_failed(base, "unverified", error, round(self.session.clock.now() - t0, 3))
            return None
        self.serving = setting
        verified = {
            "restarted": restarted,
            # The head's launch spec hash; every node's agent reported its own spec's hash.
            "spec_sha256": state.expected_sha256.get(self.session.inventory.head.name),
            "nodes_verified": len(state.expected_sha256),
            **({"mismatch_after_restart": mismatch} if mismatch else {}),
        }
        t1 = self.session.clock.now()
        result = self.measure_fn(
            self.session,
            engine=self.engine,
            version=self.version,
            workloads=tuple(self.workloads),
            n=protocol.n,
            warmup=protocol.warmup,
            max_tokens=protocol.max_tokens,
            settle_s=self.session.clock.wall_seconds(SETTLE_LAB_S),
        )
        t2 = self.session.clock.now()
        rows: dict[str, dict[str, Any]] = {}
        rates: dict[str, float] = {}
        for w in self.workloads:
            section = result.get(w) or {}
            samples = [float(x) for x in (section.get("decode") or {}).get("samples") or []]
            row = {
                **base,
                "workload": w,
                "status": "measured",
                "n": len(samples),
                "mean_tps": section.get("mean_tps"),
                "ci95": section.get("ci95"),
                "samples": samples,
                "acceptance": section.get("draft_acceptance"),
                "lab_s": round(t2 - t0, 3),
                "restart_s": round(t1 - t0, 3),
                **verified,
            }
            self.trials.append(row)
            rows[w] = row
            if section.get("mean_tps"):
                rates[w] = float(section["mean_tps"])
        self.costs.observe(setting, t1 - t0 if restarted else None, t2 - t1, protocol, rates)
        said = ", ".join(
            f"{w} {rows[w]['mean_tps'] or 0:.2f} tok/s (n = {rows[w]['n']})" for w in self.workloads
        )
        self.log(f"trial {index} ({phase}) {setting.label}: {said}; {t2 - t0:.0f} lab s")
        self.progress(min(95.0, 5.0 + 90.0 * self.spent() / self.budget), f"{phase}: {setting.label}")
        return rows

    def adopt_screen(self, setting: Setting, earlier: Mapping[str, Any]) -> bool:
        """Take an earlier stage's runs of this very configuration as `setting`'s screening
        trial, when they were measured with the screening protocol on every workload (the
        FP4 stage's rate of its chosen backend without speculation): the same runs a trial
        would take, not taken twice. False when they do not qualify."""
        protocol = earlier.get("protocol") or {}
        if (protocol.get("n"), protocol.get("warmup"), protocol.get("max_tokens")) != (
            self.screen_protocol.n, self.screen_protocol.warmup, self.screen_protocol.max_tokens):
            return False
        per_workload = earlier.get("workloads") or {}
        if any(len((per_workload.get(w) or {}).get("samples") or ()) < 2 for w in self.workloads):
            return False
        index = len({row["trial"] for row in self.trials}) + 1
        rows: dict[str, dict[str, Any]] = {}
        for w in self.workloads:
            got = per_workload[w]
            samples = [float(x) for x in got["samples"]]
            rows[w] = {
                "trial": index, "setting": setting.as_dict(), "method": setting.method, "k": setting.k,
                "phase": "screen", "stage": "screen", "workload": w, "status": "measured",
                "n": len(samples), "mean_tps": got.get("mean_tps"), "ci95": got.get("ci95"),
                "samples": samples, "acceptance": None, "lab_s": 0.0, "restart_s": 0.0,
                "restarted": False, "measured_by": str(earlier.get("source") or "an earlier stage"),
            }
            self.trials.append(rows[w])
        self.screened[setting] = rows
        rates = {w: float(r["mean_tps"]) for w, r in rows.items() if r.get("mean_tps")}
        lab_s = earlier.get("lab_s")
        if isinstance(lab_s, (int, float)) and lab_s > 0:
            # What those runs cost where they were taken prices the trials to come.
            self.costs.observe(setting, None, float(lab_s), self.screen_protocol, rates)
        self.serving = setting
        said = ", ".join(f"{w} {rows[w]['mean_tps'] or 0:.2f} tok/s (n = {rows[w]['n']})"
                         for w in self.workloads)
        self.log(f"trial {index} (screen) {setting.label}: {said}; the runs of "
                 f"{rows[self.workloads[0]]['measured_by']}, same protocol and configuration, "
                 "not measured again")
        return True

    def screen(self, setting: Setting, spec: Any) -> dict[str, float] | None:
        """The setting's mean rate per workload for the search: its confirmed means when it
        was confirmed first, else a screening trial's (None: the engine refused it)."""
        if setting in self.confirmed_rows:
            return _ranked(self.confirmed_rows[setting])
        if setting not in self.screened:
            self.screened[setting] = self.trial(setting, "screen", spec)
        rows = self.screened[setting]
        if rows is None:
            return None
        return _ranked(rows)

    def refused(self) -> set[Setting]:
        return {s for s, rows in self.screened.items() if rows is None}

    def model(self) -> RateModel:
        """The acceptance model (model.py) from every trial measured so far: no speculation's
        runs give each workload's intercept (confirmed runs where it was confirmed)."""
        read = self.runs_read()
        none_rates = {
            w: ranking_mean(v) for w, v in (read.get(NO_SPECULATION) or {}).items() if v
        }
        observations = []
        for row in self.trials:
            acceptance = row.get("acceptance") or {}
            if row.get("status") != "measured" or row["method"] == NONE or not row.get("samples"):
                continue
            observations.append(
                Observation(
                    method=str(row["method"]),
                    k=int(row["k"]),
                    workload=str(row["workload"]),
                    rate=ranking_mean(row["samples"]),
                    per_position=tuple(float(x) for x in acceptance.get("per_position") or ()),
                    drafts=float(acceptance.get("drafts") or 0.0),
                )
            )
        return fit(observations, none_rates)

    def predicted(self, k_max: int) -> dict[Setting, dict[str, float]]:
        """Every setting the model reaches, with its predicted rate per workload."""
        model = self.model()
        out: dict[Setting, dict[str, float]] = {}
        for method, w in model.positions:
            for k, rate in model.curve(method, w).items():
                if k <= k_max:
                    out.setdefault(Setting(method, k), {})[w] = rate
        return out

    def runs_read(self) -> dict[Setting, dict[str, list[float]]]:
        """The runs the search read per setting: a screening trial's, or the confirmation's
        of a setting confirmed before the search (refused settings absent)."""
        out: dict[Setting, dict[str, list[float]]] = {}
        for setting, rows in self.screened.items():
            if rows is not None:
                out[setting] = {w: list(r["samples"]) for w, r in rows.items() if r.get("samples")}
        for setting, samples in self.confirmed.items():
            out.setdefault(setting, {w: list(v) for w, v in samples.items()})
        return out

    def afford(self, setting: Setting, protocol: Protocol, reserve: float) -> bool:
        if not self.costs.known:
            return True
        cost = self.costs.trial_s(setting, self.workloads, protocol, restart=setting != self.serving)
        return self.spent() + cost + reserve <= self.budget

    def confirm(self, setting: Setting, spec: Any) -> bool:
        rows = self.trial(setting, "confirm", spec)
        if rows is None:
            self.screened[setting] = None  # refused at startup: neither searched nor confirmed again
            return False
        self.confirmed[setting] = {w: list(r["samples"]) for w, r in rows.items() if len(r["samples"]) >= 2}
        self.confirmed_rows[setting] = rows
        return True


def ruled_out_by_bound(run: _Run, setting: Setting, workloads: Sequence[str]) -> str | None:
    """Why `setting` need not be screened: on every workload the highest rate its method's
    own trials allow it (model.rate_bound, from each trial's mean accepted length, rate and
    the rate without speculation), raised by BOUND_MARGIN, is below the leader read so far.
    None when it may be a finalist, or when the evidence cannot say: no speculation or the
    method not measured yet, or the engine reports acceptance per position (the acceptance
    model searches those)."""
    if setting.method == NONE:
        return None
    rows = [t for t in run.trials
            if t.get("status") == "measured" and t["method"] == setting.method and t.get("samples")]
    if not rows or any((t.get("acceptance") or {}).get("per_position") for t in rows):
        return None
    read = run.runs_read()
    without = read.get(NO_SPECULATION) or {}
    said = []
    for w in workloads:
        if not without.get(w):
            return None
        rated = [(s, ranking_mean(v[w])) for s, v in read.items() if v.get(w)]
        leader, leader_rate = max(rated, key=lambda sr: sr[1])
        bounds = []
        for t in rows:
            accept = (t.get("acceptance") or {}).get("mean_acceptance_length")
            if t["workload"] != w or accept is None:
                continue
            bound = rate_bound(setting.k, k0=int(t["k"]), accept_len=float(accept),
                               rate=ranking_mean(t["samples"]), none_rate=ranking_mean(without[w]))
            if bound is not None:
                bounds.append((bound, int(t["k"])))
        if not bounds:
            return None
        bound, k0 = max(bounds)
        if bound * (1.0 + BOUND_MARGIN) >= leader_rate:
            return None
        said.append(f"{w} at most {bound:.1f} tok/s (from k = {k0}), {leader.label} {leader_rate:.1f}")
    return "its own acceptance and step time bound it below the leader: " + "; ".join(said)


@dataclass
class _Space:
    """What the search ranges over: the methods this lab can run for the model (with why
    each other is not tried), the draft for EAGLE-3, and every (method, k) setting."""

    methods: list[str]
    draft: str | None
    engine: str
    notes: dict[str, str]
    k_max: int
    settings: list[Setting]


def _search_space(session: LabSession, config: Mapping[str, Any], customer: Setting) -> _Space:
    """The space: none, n-gram, EAGLE-3 where a draft is named, MTP where the model has heads."""
    customer_spec = config.get("speculative")
    catalog = load_catalog()
    model_id = str(config["model"]["id"])
    draft = (
        customer_spec.get("draft_model")
        if customer_spec and customer_spec.get("method") == "eagle3"
        else None
    )
    catalog_drafts = catalog.drafts_for(model_id, "eagle3")
    draft_source = "the customer's configuration" if draft else None
    unheld: list[str] = []
    if not draft:
        # A public draft is tried only where the lab holds a copy, and named by its path
        # there (the nodes are offline: a hub id would not load).
        for candidate in catalog_drafts:
            path = lab_draft(session, str(config["model"].get("path") or model_id), candidate.id) \
                or lab_draft(session, model_id, candidate.id)
            if path is None:
                unheld.append(candidate.id)
                continue
            draft, draft_source = (
                path,
                f"draft catalog {catalog.version} ({candidate.source}), the lab's copy of {candidate.id}",
            )
            break
    mtp_heads = model_mtp_heads(session)
    # Searched in this order within each round: heads or a draft trained for the model
    # before n-gram, which needs neither and is rarely the fastest; a refused method costs
    # one restart.
    methods = ["eagle3"] if draft else []
    if (mtp_heads or 0) > 0 or customer.method == "mtp":
        methods.append("mtp")
    engine = str(config["engine"]["name"])
    no_ngram = ngram_note(engine, str(config["engine"].get("version") or ""))
    if no_ngram is None:
        methods.append("ngram")
    notes = {
        "eagle3": f"draft {draft} from {draft_source}"
        if draft
        else f"not tried: the draft catalog {catalog.version} names {', '.join(unheld)} for {model_id}, "
        "which this lab holds no copy of"
        if unheld
        else f"not tried: neither the configuration nor the draft catalog {catalog.version} "
        f"names a draft for {model_id}",
        "ngram": no_ngram
        or ("tried: SGLang's n-gram drafts a tree; its size (--speculative-num-draft-tokens, k + 1) is "
            "the parameter searched" if engine == "sglang" else "tried"),
        "mtp": (
            "tried: the model's config.json declares MTP heads"
            if (mtp_heads or 0) > 0
            else "tried: the customer's setting"
            if customer.method == "mtp"
            else "not tried: the model's config.json declares no MTP heads"
            if mtp_heads == 0
            else "not tried: the model's config.json could not be read"
        ),
    }
    k_max = MAX_SPEC_TOKENS
    settings = [NO_SPECULATION] + [Setting(m, k) for m in methods for k in range(1, k_max + 1)]
    return _Space(methods=methods, draft=draft, engine=engine, notes=notes, k_max=k_max, settings=settings)


class _Search:
    """One day's search over its space: what search_k asks of the run (screen a setting,
    may we afford it, is it below the leader, does a bound rule it out, what the model
    predicts), and the confirmations around it."""

    def __init__(self, run: _Run, space: _Space, customer: Setting, customer_spec: Any,
                 share: Mapping[str, float], *, log: Log, progress: Progress) -> None:
        self.run, self.space, self.customer, self.customer_spec = run, space, customer, customer_spec
        self.share, self.log, self.progress = share, log, progress
        self.workloads = run.workloads

    def spec_for(self, setting: Setting) -> Any:
        return speculative_block(setting, self.space.draft, self.customer_spec, engine=self.space.engine)

    def confirm_reserve(self) -> float:
        # The finalists (customer, each workload's best, the mix's best) as screened so far:
        # what the decision cannot do without. No speculation, when harm is open, was
        # confirmed in step 1 already.
        run = self.run
        if not run.costs.known:
            return 0.0
        must, _ = choose_finalists(run.runs_read(), self.customer, self.workloads, self.share,
                                   run.predicted(self.space.k_max), run.refused())
        # With a margin: a confirmation's runs take longer than the trials so far priced them
        # when the lab (or the machine simulating it) slows, and the finalists are confirmed
        # whatever the budget says, since the decision cannot do without them.
        return CONFIRM_MARGIN * sum(
            run.costs.trial_s(s, self.workloads, run.confirm_protocol) for s in must if s not in run.confirmed
        )

    def afford(self, setting: Setting) -> bool:
        if setting in self.run.screened or setting in self.run.confirmed_rows:
            return True  # measured already: asking again costs nothing
        return self.run.afford(setting, self.run.screen_protocol, self.confirm_reserve())

    def screen_one(self, setting: Setting) -> Mapping[str, float] | None:
        return self.run.screen(setting, self.spec_for(setting))

    def below_leader(self, setting: Setting, workload: str) -> bool:
        read = self.run.runs_read()
        rated = {s: v[workload] for s, v in read.items() if len(v.get(workload) or ()) >= 2}
        if setting not in rated or not rated:
            return False
        leader = max(rated, key=lambda s: ranking_mean(rated[s]))
        return leader != setting and below_p(rated[setting], rated[leader]) < PRUNE_ALPHA

    def bounded_out(self, setting: Setting) -> str | None:
        why = ruled_out_by_bound(self.run, setting, self.workloads)
        if why:
            self.log(f"specdec: {setting.label} not screened: {why}")
        return why

    def predict(self, method: str) -> dict[str, dict[int, float]]:
        model = self.run.model()
        return {w: model.curve(method, w) for w in self.workloads}

    def references(self, session: LabSession, none_runs: Mapping[str, Any] | None) -> None:
        """Step 1. The customer's setting is in every decision, so it is confirmed straight
        away (fresh n = 15, never screened) and the search reads its confirmed means where it
        would have screened it: a restart fewer. No speculation, the other reference, is
        screened next (first when the engine already serves it, as after an FP4 stage that
        measured speed without speculation): most days its short runs settle that the
        customer's setting is faster than it, which is all the decision asks of it unless it
        is a finalist."""
        run, customer, progress = self.run, self.customer, self.progress
        none_serving = customer != NO_SPECULATION and session.serves(run.config_for(None))
        if none_serving:
            if none_runs and run.adopt_screen(NO_SPECULATION, none_runs):
                progress(3.0, "no speculation: screened by an earlier stage's runs")
            else:
                progress(3.0, "screening no speculation (the engine serves it)")
                run.screen(NO_SPECULATION, None)
        progress(4.0, f"confirming {customer.label}")
        run.confirm(customer, self.customer_spec)
        if customer == NO_SPECULATION:
            return
        if not none_serving:
            progress(5.0, "screening no speculation")
            run.screen(NO_SPECULATION, None)
        open_first = none_open(run.runs_read(), customer, self.workloads)
        if open_first:
            # Harm is the question: confirm it now (on the engine that serves it, unless it
            # was screened before the customer's setting).
            self.log(f"specdec: no speculation confirmed: on {', '.join(open_first)} its screening runs "
                     f"leave open whether {customer.label} is slower than it")
            run.confirm(NO_SPECULATION, None)

    def screen_methods(self) -> list[KSearch]:
        """Step 2. Screening: the methods' k-searches, interleaved. Every method first screens
        its seed lengths; then each takes one refinement trial in turn, so that the method
        searched last is not the one the budget starves. A search resumed with one more trial
        allowed replays its measured lengths from the cache (no restart) and takes the next
        one; it is finished when it stops for any reason but that allowance."""
        methods, customer = self.space.methods, self.customer
        # Seeds: the customer's length for their method, the common default for EAGLE-3, and
        # the default as a first probe of a method the customer does not use. Where the
        # engine reports acceptance per position, one trial at a length gives the model every
        # shorter length (model.py), so short seeds would add nothing; where it does not,
        # lengths 1 and 2 are screened too and the search refines on measured rates.
        seeds: dict[str, set[int]] = {}
        for method in methods:
            seeds[method] = {customer.k} if method == customer.method else set()
            if method == "eagle3" or not seeds[method]:
                seeds[method].add(DEFAULT_K)
        found_by: dict[str, KSearch] = {}
        allowed = {m: len(seeds[m]) + len(FALLBACK_SEEDS) for m in methods}
        active = list(methods)
        while active:
            for method in list(active):
                found = search_k(
                    method,
                    self.workloads,
                    self.screen_one,
                    k_max=self.space.k_max,
                    seeds=seeds[method],
                    afford=self.afford,
                    below_leader=self.below_leader,
                    max_trials=min(allowed[method], MAX_TRIALS_PER_METHOD),
                    predict=self.predict,
                    fallback_seeds=FALLBACK_SEEDS,
                    ruled_out=self.bounded_out,
                )
                found_by[method] = found
                limited = found.stopped.startswith("trial limit")
                if limited and allowed[method] < MAX_TRIALS_PER_METHOD:
                    allowed[method] = len(found.order) + len(found.refused) + 1
                    continue
                active.remove(method)
                self.log(
                    f"specdec: {method} search: measured k = {found.order}, refused {found.refused}; "
                    f"{found.stopped}"
                )
        return [found_by[m] for m in methods]

    def confirm_finalists(self, budget: float) -> _Shortlist:
        """Step 3. Finalists: each workload's best screened setting (the customer's, and no
        speculation when harm was open, are confirmed already); then each workload's
        runner-up, while the budget allows."""
        run, customer, workloads = self.run, self.customer, self.workloads
        predicted = run.predicted(self.space.k_max)
        finalists, runner_ups = choose_finalists(
            run.runs_read(), customer, workloads, self.share, predicted, run.refused()
        )
        skipped: list[dict[str, Any]] = []
        todo = [
            s
            for s in finalists + runner_ups
            if s not in run.confirmed and not (s in run.screened and run.screened[s] is None)
        ]  # confirmed first, or refused: it will not start now either
        # The setting the engine still runs (the one screened last) first: confirmed without a restart.
        todo.sort(key=lambda s: s != run.serving)
        for setting in todo:
            if setting not in finalists:
                # Runner-ups only with the remaining finalists' confirmations paid for.
                reserve = sum(
                    run.costs.trial_s(s, workloads, run.confirm_protocol)
                    for s in todo
                    if s in finalists and s not in run.confirmed and s != setting
                )
                if not run.afford(setting, run.confirm_protocol, reserve):
                    skipped.append({**setting.as_dict(), "why": "lab-time budget"})
                    self.log(f"specdec: runner-up {setting.label} not confirmed: the budget would be "
                             "exceeded")
                    continue
            self.progress(min(95.0, 5.0 + 90.0 * run.spent() / budget), f"confirming {setting.label}")
            run.confirm(setting, self.spec_for(setting) if setting != customer else self.customer_spec)
        return _Shortlist(finalists, runner_ups, skipped, predicted)

    def confirm_length(self, budget: float) -> dict[str, Any]:
        """What the confirmations would have cost at the protocol's 512 tokens a run."""
        run = self.run
        confirmed_settings = list(run.confirmed)
        screening_s = sum(
            float(row["lab_s"])
            for row in {t["trial"]: t for t in run.trials if t["phase"] == "screen"}.values()
        )
        at_full = sum(run.costs.trial_s(s, self.workloads, FULL_PROTOCOL) for s in confirmed_settings)
        fits_full = screening_s + at_full <= budget
        return {
            "max_tokens": run.confirm_protocol.max_tokens,
            "protocol_max_tokens": FULL_PROTOCOL.max_tokens,
            "confirmed_settings": len(confirmed_settings),
            "screening_s": round(screening_s, 1),
            "estimate_at_protocol_s": round(at_full, 1),
            "fits_budget_at_protocol": fits_full,
            "why": (
                f"at the protocol's {FULL_PROTOCOL.max_tokens} tokens a run the {len(confirmed_settings)} "
                f"confirmations would have taken about {at_full:.0f} lab s, with {screening_s:.0f} of "
                f"screening {'within' if fits_full else 'over'} the {budget:.0f} lab s budget"
            ),
        }


def run_specdec(
    session: LabSession,
    config: Mapping[str, Any],
    *,
    log: Log,
    progress: Progress,
    check_cancelled: Callable[[], None],
    budget_lab_s: float | None = None,
    weights: Mapping[str, float] | None = None,
    measure: Measure | None = None,
    screen: Protocol = SCREEN,
    confirm: Protocol = CONFIRM,
    none_runs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Search, confirm and decide the speculative setting for `config` on the session's lab.

    `weights`: the customer's workload mix (shares of generated tokens); equal over the
    configuration's workloads by default. `measure`: the measurement (measure_on_session by
    default). `none_runs`: an earlier stage's runs of this configuration without
    speculation ({source, lab_s, protocol {n, warmup, max_tokens}, workloads {w: {samples,
    mean_tps, ci95}}}), taken as no speculation's screening trial when the engine still
    serves that configuration and they follow the screening protocol. Returns the stage result:
    `section` (findings.json `speculative`), `findings`, `config_changes` (the deployed
    setting, only when proved faster) and `lab_time_s`.
    """
    budget = float(budget_lab_s if budget_lab_s is not None else DEFAULT_BUDGET_LAB_S)
    run = _Run(
        session,
        config,
        log=log,
        progress=progress,
        check_cancelled=check_cancelled,
        budget_lab_s=budget,
        measure=measure or _default_measure,
        screen=screen,
        confirm=confirm,
    )
    workloads = run.workloads
    customer = setting_of(config)
    customer_spec = config.get("speculative")
    share = {w: float((weights or {}).get(w, 1.0 if weights is None else 0.0)) for w in workloads}
    space = _search_space(session, config, customer)
    log(
        f"specdec: space {', '.join(['none', *space.methods])} x k = 1..{space.k_max}; customer's setting "
        f"{customer.label}; budget {budget:.0f} lab s"
    )
    search = _Search(run, space, customer, customer_spec, share, log=log, progress=progress)
    search.references(session, none_runs)
    searches = search.screen_methods()
    shortlist = search.confirm_finalists(budget)
    confirm_length = search.confirm_length(budget)

    # 4. The decision. No speculation's screening runs stand in for its confirmation where
    #    it was not confirmed (none_open above says when that is enough).
    none_screen = {} if NO_SPECULATION in run.confirmed else dict(run.runs_read().get(NO_SPECULATION) or {})
    decisions: dict[str, WorkloadDecision] = {}
    for w in workloads:
        decision = decide_workload(w, run.confirmed, customer, none_runs=none_screen.get(w))
        if decision is not None:
            decisions[w] = decision
    deployment = choose_deployed(run.confirmed, customer, share)
    lab_time = round(run.spent(), 3)
    sweep = round(run.costs.sweep_s(space.settings, workloads), 1)
    section = _section(search, decisions, deployment, searches, shortlist,
                       _Spend(budget, lab_time, sweep, confirm_length))
    deployed = deployment.setting if deployment else customer
    findings, changes = _findings(
        run, customer, customer_spec, decisions, deployment, search.spec_for(deployed), section
    )
    if changes:
        tuned = apply_changes(config, changes)
        section["deployed"]["launch_syntax"] = launch_syntax(session, tuned)
        # The report shows a finding's change as the flags to launch with.
        added = speculative_flags(session, tuned)
        flags: Any = added if added else {"remove": speculative_flags(session, config)}
        for finding in findings:
            if "config" in (finding.get("change") or {}):
                finding["change"]["flags"] = flags
    section["customer_launch_syntax"] = launch_syntax(session, config)
    log(f"specdec: deployed {deployed.label}; {lab_time:.0f} lab s spent, a sweep would take {sweep:.0f}")
    progress(100.0, f"deployed {deployed.label}")
    return {"section": section, "findings": findings, "config_changes": changes, "lab_time_s": lab_time}


# -- the findings.json section and the findings ------------------------------------------------


def _block(run: _Run, setting: Setting, workload: str) -> dict[str, Any] | None:
    samples = run.confirmed.get(setting, {}).get(workload)
    if samples:
        return {**setting.as_dict(), **confirmed_summary(samples), "phase": "confirm"}
    if setting == NO_SPECULATION:  # screened only: its screening runs answered the tests
        screened = run.runs_read().get(setting, {}).get(workload)
        if screened and len(screened) >= 2:
            return {**setting.as_dict(), **confirmed_summary(screened), "phase": "screen"}
    return None


@dataclass
class _Shortlist:
    """Step 3's outcome: the finalists, the runner-ups, those not confirmed (with why), and
    what the rate model predicted for each setting when they were chosen."""

    finalists: list[Setting]
    runner_ups: list[Setting]
    skipped: list[dict[str, Any]]
    predicted: Mapping[Setting, Mapping[str, float]]


@dataclass
class _Spend:
    budget: float
    lab_time: float
    sweep: float
    confirm_length: Mapping[str, Any]


def _best_blocks(
    run: _Run, customer: Setting, decisions: Mapping[str, WorkloadDecision]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each workload's fastest setting with its tests, and its verdict."""
    best: dict[str, Any] = {}
    verdicts: dict[str, str] = {}
    for w in run.workloads:
        d = decisions.get(w)
        if d is None:
            continue
        # The workload's fastest setting: the fastest of those proved faster than the
        # customer's; when none is, the fastest confirmed, shown with its test against the
        # customer's setting (not significant: the customer's is kept, no finding).
        shown = d.best if d.best != customer else d.fastest
        block = _block(run, shown, w) or {}
        best[w] = {
            **block,
            "proved_faster": d.best != customer,
            "kept_customer": d.best == customer,
            "fastest_confirmed": d.fastest.as_dict(),
            "vs_customer": d.best_vs_customer if d.best != customer else None,
            "fastest_vs_customer": d.best_vs_customer,
            "vs_none": d.best_vs_none,
            "customer_vs_none": d.customer_vs_none,
            "alternatives_compared": d.alternatives,
        }
        verdicts[w] = d.verdict
    return best, verdicts


def _deployed_block(
    run: _Run, deployment: Deployment | None, customer: Setting, best: Mapping[str, Any],
    share: Mapping[str, float],
) -> dict[str, Any]:
    """The setting deployed for the mix, and what each workload gives up with it."""
    if deployment is None:
        return {}
    chosen = deployment.setting
    per_workload = {}
    for w in run.workloads:
        mine = run.confirmed.get(chosen, {}).get(w)
        top = best.get(w, {}).get("mean_tps")
        if not mine:
            continue
        mean = statistics.fmean(mine)
        gives_up = max(0.0, float(top) - mean) if top else 0.0
        per_workload[w] = {
            "mean_tps": round(mean, 4),
            "best_tps": top,
            "gives_up_tps": round(gives_up, 4),
            "gives_up_pct": round(100.0 * gives_up / float(top), 2) if top else 0.0,
        }
        if best.get(w) and (best[w]["method"], best[w]["k"]) != (chosen.method, chosen.k):
            per_workload[w]["vs_workload_best"] = comparison(
                run.confirmed[Setting(best[w]["method"], best[w]["k"])][w], mine, 0.05
            )
    return {
        **chosen.as_dict(),
        "changed": chosen != customer,
        "weights": dict(share),
        "mix_tps": deployment.mix_tps,
        "fastest_mix": deployment.fastest_mix.as_dict(),
        "vs_customer": deployment.vs_customer,
        "workloads": per_workload,
    }


def _protocol_block(run: _Run, confirm_length: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "screen": run.screen_protocol.describe(),
        "confirm": run.confirm_protocol.describe(),
        "restart": "warm: engine stopped and started again, page cache and JIT cache kept",
        "bound_margin": BOUND_MARGIN,
        "confirm_length": dict(confirm_length),
        "note": f"Screening asks for {run.screen_protocol.max_tokens} tokens a run after one warm-up "
        f"run; confirmation for {run.confirm_protocol.max_tokens}: {confirm_length['why']}. The decode "
        "rate is per token at batch 1 and does not depend on how many are asked for, the cost of a "
        "run does. Confirmation runs are fresh, never the screening samples.",
        "decision": "Welch's test on confirmation runs only, at 5 % divided by the number of "
        "alternatives compared with the customer's setting; the mix rate is "
        "1 / sum(share / rate) with a delta-method interval. No speculation, a fixed reference "
        "and not a selected maximum, is compared on its screening runs unless it is a finalist "
        "or those runs leave open whether the customer's setting is slower than it; then it is "
        "confirmed too",
    }


def _section(
    search: _Search,
    decisions: Mapping[str, WorkloadDecision],
    deployment: Deployment | None,
    searches: Sequence[KSearch],
    shortlist: _Shortlist,
    spend: _Spend,
) -> dict[str, Any]:
    run, customer, customer_spec, space = search.run, search.customer, search.customer_spec, search.space
    baseline: dict[str, Any] = {**customer.as_dict(), "draft_model": (customer_spec or {}).get("draft_model")}
    none: dict[str, Any] = {"method": None, "k": 0}
    for w in run.workloads:
        baseline[w] = _block(run, customer, w)
        none[w] = _block(run, NO_SPECULATION, w)
    best, verdicts = _best_blocks(run, customer, decisions)
    candidates = shortlist.finalists + shortlist.runner_ups
    return {
        "schema": SECTION_SCHEMA,
        "customer": {**customer.as_dict(), "speculative": customer_spec},
        "space": {
            "methods": ["none", *space.methods],
            "k_max": space.k_max,
            "settings": len(space.settings),
            "notes": dict(space.notes),
        },
        "protocol": _protocol_block(run, spend.confirm_length),
        "baseline": baseline,
        "none": none,
        "best": best,
        "verdicts": verdicts,
        "chosen": (deployment.setting if deployment else customer).as_dict(),
        "deployed": _deployed_block(run, deployment, customer, best, search.share),
        "finalists": [s.as_dict() for s in shortlist.finalists],
        "runner_ups": [s.as_dict() for s in shortlist.runner_ups],
        "not_confirmed": shortlist.skipped,
        "searches": [s.describe() for s in searches],
        "trials": run.trials,
        "trial_count": len({t["trial"] for t in run.trials}),
        "budget_lab_s": spend.budget,
        "lab_time_s": spend.lab_time,
        "sweep_estimate_s": spend.sweep,
        "sweep_basis": {
            "settings": len(space.settings),
            "protocol": SWEEP.describe(),
            "restart_s": round(run.costs.restart_s(), 2),
            "per_run_overhead_s": round(run.costs.fixed_s(), 3),
            "how": "every setting of the space restarted once and measured at the full protocol on every "
            "workload; measured settings at their own rate, the others at the workload's mean "
            "measured rate; restart and per-run overhead as measured here",
        },
        "lab_time_vs_sweep": round(spend.lab_time / spend.sweep, 4) if spend.sweep else None,
        # The acceptance model the search and the finalists followed, with what it predicted
        # for the settings confirmed (the decision read their fresh runs, not this).
        "rate_model": {
            **run.model().describe(),
            "predicted_at_finalists": {
                s.label: {w: round(v, 3) for w, v in (shortlist.predicted.get(s) or {}).items()}
                for s in candidates
            },
        },
    }


def _config_diff(before: Any, after: Any) -> dict[str, dict[str, Any]]:
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        keys = list(dict.fromkeys([*before, *after]))
        return {
            f"speculative.{k}": {"from": before.get(k), "to": after.get(k)}
            for k in keys
            if before.get(k) != after.get(k)
        }
    return {"speculative": {"from": before, "to": after}}


def _interval_words(ci: Sequence[float]) -> str:
    """An interval of a change as the report prints it: one decimal, each bound signed."""
    return f"[{ci[0]:+.1f}, {ci[1]:+.1f}] tok/s"


def _finding_words(
    w: str,
    verdict: str,
    customer: Setting,
    target: Setting,
    d: WorkloadDecision,
    base: Sequence[float],
    after: Sequence[float],
    impact: Mapping[str, Any],
    none_tps: Mapping[str, Any],
    confirmed: Mapping[Setting, Mapping[str, Sequence[float]]],
) -> tuple[str, str]:
    """A finding's title and summary, claiming only what its measurements show.

    The title speaks of the impact the finding carries (the setting the tuned configuration
    runs against the customer's, on this workload) and says "faster" only when the change's
    95 % interval is wholly above zero; a difference the interval does not show is worded
    so. Another setting's higher mean on this workload alone is named in the summary with
    its own interval, never in the title, since it is not what is deployed."""
    lo, hi = impact["ci95"]
    change = f"{impact['after'] - impact['before']:+.1f} tok/s, 95 % interval {_interval_words((lo, hi))}"
    if lo > 0:
        claim = f"On {w}, {target.label} is faster than {customer.label}"
    elif hi < 0:
        claim = f"On {w}, {target.label} is slower than {customer.label}"
    else:
        claim = f"On {w}, {target.label} is not shown to be faster than {customer.label}"
    summary = (f"On {w}, {target.label} delivers {statistics.fmean(after):.1f} tok/s against "
               f"{statistics.fmean(base):.1f} for {customer.label} ({change}).")
    if verdict == "harmful":
        vn = d.customer_vs_none or {"ci95": [0.0, 0.0], "p": 1.0}
        slower = vn["ci95"][1] < 0
        summary = (
            f"On {w}, {customer.label} delivers {statistics.fmean(base):.1f} tok/s against "
            f"{none_tps.get('mean_tps', 0):.1f} without speculation (difference "
            f"{_interval_words(vn['ci95'])}, p = {vn['p']:.2g}). " + summary
        )
        title = (f"On {w}, {customer.label} is slower than no speculation" if slower
                 else f"On {w}, {customer.label} is not shown to be faster than no speculation")
        return title, summary
    if d.best != target and d.best in confirmed:
        vs = d.best_vs_customer or {}
        ci = vs.get("ci95")
        summary += (
            f" On {w} alone the highest mean was {d.best.label}'s, "
            f"{statistics.fmean(confirmed[d.best][w]):.1f} tok/s"
            + (f" (against {customer.label}: {_interval_words(ci)})" if ci else "")
            + f"; one server runs one setting, and {target.label} is the one for the workload mix."
        )
    return claim, summary


def _findings(
    run: _Run,
    customer: Setting,
    customer_spec: Any,
    decisions: Mapping[str, WorkloadDecision],
    deployment: Deployment | None,
    deployed_spec: Any,
    section: Mapping[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    deployed = deployment.setting if deployment else customer
    changed = deployed != customer
    by_verdict: dict[str, list[str]] = {}
    for w, d in decisions.items():
        if d.verdict != "ok":
            by_verdict.setdefault(d.verdict, []).append(w)
    if not by_verdict:
        return [], []
    primary = "specdec.harmful" if "harmful" in by_verdict else "specdec.suboptimal"
    changes = (
        [
            change(
                "speculative",
                customer_spec,
                deployed_spec,
                finding=primary,
                why=f"{deployed.label} is faster than {customer.label} on the workload mix",
            )
        ]
        if changed
        else []
    )
    findings = []
    if changed:
        note = (
            f"Deploy {deployed.label} for the workload mix: "
            + "; ".join(
                f"{w} gives up {v['gives_up_tps']:.1f} tok/s ({v['gives_up_pct']:.1f} %) against its own best"
                for w, v in section["deployed"]["workloads"].items()
            )
            + "."
        )
    else:
        note = (
            f"One server runs one setting and no single setting beats {customer.label} on the mix; "
            "serve a workload from an engine tuned for it where traffic allows."
        )
    # One finding per workload and verdict, each with the one impact the findings schema holds.
    for verdict in ("harmful", "suboptimal"):
        for w in by_verdict.get(verdict, []):
            d = decisions[w]
            base = run.confirmed[customer][w]
            # What the tuned configuration gives this workload: the deployed setting when it
            # changes; otherwise the workload's own best (served by an engine of its own).
            target = deployed if changed else d.best
            after = run.confirmed[target][w]
            impact = {
                "metric": f"decode_tps_{w}",
                "unit": "tok/s",
                "better": "higher",
                "before": round(statistics.fmean(base), 4),
                "after": round(statistics.fmean(after), 4),
                "ci95": comparison(base, after, 0.05)["ci95"],
                "n": min(len(base), len(after)),
                "setting": target.as_dict(),
            }
            none_tps = section["none"].get(w, {}) or {}
            title, summary = _finding_words(w, verdict, customer, target, d, base, after, impact, none_tps,
                                            run.confirmed)
            findings.append(
                {
                    "code": f"specdec.{verdict}",
                    "title": title,
                    "evidence": {
                        "summary": summary,
                        "workload": w,
                        "customer": customer.as_dict(),
                        "best": d.best.as_dict(),
                        "best_vs_customer": d.best_vs_customer,
                        "customer_vs_none": d.customer_vs_none,
                        "deployed": deployed.as_dict(),
                    },
                    "change": {"config": _config_diff(customer_spec, deployed_spec), "note": note}
                    if changed
                    else {"note": note},
                    "impact": impact,
                    "blocking": False,
                }
            )
    return findings, changes
