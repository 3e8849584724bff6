"""The simulated inference engine behind the HTTP endpoint: scheduling and accounting.

`EngineCore` turns an admitted request into a reply (lab/sim/text.py) and a step
schedule (lab/sim/physics.py), paces the steps on the wall clock at `dilation` times
lab speed on absolute deadlines, and keeps the server's own accounting the way
LAB_MODEL.md section 4 says the modelled releases count: the periodic stats log lines
and the Prometheus counters, both counting the tokens each step emits. lab/sim/http.py
puts the OpenAI-compatible API in front of it.

Nothing here reaches a client except through the API's ordinary fields, the log and
/metrics: the scenario's truth shapes behaviour, never shows up as data.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lab.clock import LabClock
from lab.sim.physics import (
    DecodePlan,
    RequestSchedule,
    Step,
    StepSampler,
    decode_plan,
    kv_capacity_tokens,
)
from lab.sim.release import Line, Release
from lab.sim.text import Reply, TextModel, Workload, encoded_corpora, stable_int
from lab.sim.tokenizer import load_tokenizer

BACKEND_STATES = ("ok", "broken", "degraded")
HISTORY_LIMIT = 1000
# SGLang writes its `Decode batch` line every this many decode steps (--decode-log-interval).
DECODE_LOG_INTERVAL = 40
# The versions a serving engine speaks when its configuration names one no table models.
DEFAULT_VERSIONS = {"vllm": "0.34.0", "sglang": "0.5.23"}


def release_for(config: Mapping[str, Any]) -> Release:
    """The release a configuration's engine runs (its engine.version when modelled)."""
    from lab.engines.tables import modelled_versions

    engine = str(config["engine"]["name"])
    version = str(config["engine"].get("version") or "")
    if version not in modelled_versions(engine):
        version = DEFAULT_VERSIONS[engine]
    return Release(engine, version)


class ScenarioLike(Protocol):
    """The parts of `lab.sim.scenario.Scenario` the serving side reads."""

    @property
    def seed(self) -> int: ...
    @property
    def nodes(self) -> int: ...
    @property
    def node(self) -> dict[str, Any]: ...
    @property
    def network(self) -> dict[str, Any]: ...
    @property
    def model(self) -> dict[str, Any]: ...
    @property
    def truth(self) -> dict[str, Any]: ...
    @property
    def serving(self) -> dict[str, Any]: ...


def served_model_name(config: Mapping[str, Any]) -> str:
    """The name the engine answers to: `--served-model-name` if given, else the model path
    the engine was started with (vLLM and SGLang both default to it)."""
    args = [str(a) for a in config.get("extra_args") or []]
    for i, arg in enumerate(args):
        if arg.startswith("--served-model-name="):
            return arg.split("=", 1)[1]
        if arg == "--served-model-name" and i + 1 < len(args):
            return args[i + 1]
    return str(config["model"]["path"])


@dataclass
class RequestRecord:
    """One admitted request as the engine planned and ran it; tests read these."""

    index: int
    request_id: str
    prompt_tokens: int
    workload: Workload
    reply: Reply
    sampler: StepSampler  # draws the steps as the run reaches them
    steps: list[Step] = field(default_factory=list)  # the steps run so far
    outcome: str = "pending"  # finished | aborted | orphaned | stopped
    generated: int = 0  # tokens generated so far (delivered or not)

    @property
    def schedule(self) -> RequestSchedule:
        """The steps drawn so far (all of them once the request has run)."""
        return RequestSchedule(self.sampler.run_factor, tuple(self.steps))

    @property
    def step_lab_ms(self) -> list[float]:
        return [s.lab_ms for s in self.steps]


@dataclass
class _Window:
    """Counts over one stats interval, reset at each log line."""

    prompt: int = 0
    generation: int = 0  # tokens the steps emitted
    decode_steps: int = 0  # steps after prefill
    drafts: int = 0  # verification steps that carried drafts
    drafted: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


@dataclass
class _DecodeWindow:
    """SGLang's counts since its last `Decode batch` line (logged by steps, not time)."""

    steps: int = 0
    generation: int = 0
    drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    since: float = 0.0  # monotonic seconds of the last line


@dataclass
class _Totals:
    """Lifetime counters for /metrics."""

    prompt: int = 0
    generation: int = 0
    drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})
    # SGLang adds a request's tokens and verify calls to its counters when the request ends
    # (its tokenizer manager collects them with the finished request's meta info): a delta
    # taken while a request runs reads 0.
    ended_prompt: int = 0
    ended_generation: int = 0
    verify_calls: int = 0


StepSink = Callable[[int, Step, Sequence[int]], bool]


class EngineCore:
    """Plans, paces and accounts requests for one simulated engine."""

    def __init__(
        self,
        *,
        scenario: ScenarioLike,
        config: Mapping[str, Any],
        backend: str,
        backend_state: str,
        error_rate: float,
        clock: LabClock,
        log: Callable[[str], None],
        tokenizer_path: Path,
        seed: int,
        kv_capacity: int | None = None,
        release: Release | None = None,
        argv: Sequence[str] = (),
        log_line: Callable[[Line, str], None] | None = None,
    ) -> None:
        if backend_state not in BACKEND_STATES:
            raise ValueError(f"backend_state: got {backend_state!r}; accepted: ok, broken, degraded")
        self.config = config
        self.clock = clock
        self.seed = seed
        self.backend_state = backend_state
        self.error_rate = error_rate
        self.engine = str(config["engine"]["name"])
        # The release it runs (its lines and metric names), and the flags it was started with.
        self.release = release or release_for(config)
        self.argv = list(argv)
        interval = self.release.option(self.argv, "--decode-log-interval")[1]
        self.decode_log_interval = max(1, int(interval)) if interval else DECODE_LOG_INTERVAL
        self.metrics_enabled = self.engine == "vllm" or self.release.flag_on(self.argv, "--enable-metrics")
        self.model_name = served_model_name(config)
        self.max_model_len = int(config["serving"]["max_model_len"])
        # `log_line` receives each line with the format string it fills (an engine's log
        # prefix names the string's origin); `log` the message alone.
        self._log: Callable[[Line, str], None] = log_line or (lambda _line, message: log(message))
        self._log_lock = threading.Lock()

        truth = scenario.truth
        self.decode = truth["decode"]
        self.log_interval_s = float(scenario.serving["log_interval_s"])
        self.abort_on_disconnect = bool(scenario.serving["abort_on_disconnect"])
        tp, pp = int(config["parallel"]["tp"]), int(config["parallel"]["pp"])
        spec = config.get("speculative") or None
        method = str(spec["method"]) if spec else None
        k = int(spec["num_speculative_tokens"]) if spec else 0
        if method is not None and method not in truth["specdec"]["draft_ms"]:
            raise ValueError(f"speculative.method: the engine cannot serve {method!r}")
        # Backends the scenario gives no speed factor for run at native FP4 speed.
        fp4_speed = float(truth["fp4"]["speed"].get(backend, 1.0))
        self.plans: dict[str, DecodePlan] = {
            workload: decode_plan(
                scenario.model,
                scenario.node,
                scenario.network,
                self.decode,
                truth["specdec"],
                fp4_speed,
                tp,
                pp,
                bool(config["serving"]["enforce_eager"]),
                method,
                k,
                workload,
            )
            for workload in ("code", "prose")
        }
        self.k = self.plans["code"].k
        self.kv_capacity = kv_capacity or kv_capacity_tokens(
            scenario.model,
            scenario.node,
            nodes_used=tp * pp,
            pp=pp,
            gpu_memory_utilization=float(config["serving"]["gpu_memory_utilization"]),
            kv_cache_dtype=str(config["serving"]["kv_cache_dtype"]),
        )
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.text = TextModel(
            self.tokenizer,
            seed=seed,
            model_vocab=int(scenario.model["vocab"]),
            corpora=encoded_corpora(tokenizer_path),
        )

        self._lock = threading.Lock()
        self._counter = 0
        self._history: deque[RequestRecord] = deque(maxlen=HISTORY_LIMIT)
        self._active: dict[int, RequestRecord] = {}
        self._window = _Window(accepted_per_pos=[0] * self.k)
        self._totals = _Totals(accepted_per_pos=[0] * self.k)
        self._decode = _DecodeWindow(since=time.monotonic())
        # SGLang's scheduler gauges, set when it logs a decode batch.
        self._gauges = {"gen_throughput": 0.0, "spec_accept_length": 0.0, "spec_accept_rate": 0.0}
        self._stop = threading.Event()
        self._stats_thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self.engine == "sglang":
            return  # SGLang logs by decode steps (_account), not on a clock
        self._stats_thread = threading.Thread(target=self._stats_loop, name="labsim-stats", daemon=True)
        self._stats_thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._stats_thread is not None:
            self._stats_thread.join(timeout=5)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    # -- requests ----------------------------------------------------------------------

    def admit(
        self,
        *,
        question: str,
        prompt_text: str,
        workload: Workload,
        prompt_tokens: int,
        max_tokens: int,
        ignore_eos: bool,
        sampled: bool,
        prefix: str,
    ) -> RequestRecord:
        """Plan one request: its reply and its step schedule, both fixed from here on.

        The timing draw is seeded by (seed, request counter, prompt hash), so the same
        seed and the same sequence of requests give the same schedule.
        """
        with self._lock:
            index = self._counter
            self._counter += 1
        prompt_hash = hashlib.sha256(prompt_text.encode()).hexdigest()
        request_id = f"{prefix}-{hashlib.sha256(f'{self.seed}:{index}'.encode()).hexdigest()[:32]}"
        reply = self.text.reply(
            question,
            workload=workload,
            max_tokens=max_tokens,
            ignore_eos=ignore_eos,
            backend_state=self.backend_state,
            error_rate=self.error_rate,
            salt=index if sampled else None,
        )
        rng = random.Random(stable_int(self.seed, "timing", index, prompt_hash))
        sampler = StepSampler(
            self.plans[workload],
            tokens=len(reply.token_ids),
            prompt_tokens=prompt_tokens,
            prefill_tps=float(self.decode["prefill_tps"]),
            run_sigma=float(self.decode["run_sigma"]),
            step_sigma=float(self.decode["step_sigma"]),
            rng=rng,
        )
        record = RequestRecord(index, request_id, prompt_tokens, workload, reply, sampler)
        with self._lock:
            self._history.append(record)
        return record

    def run(
        self,
        record: RequestRecord,
        emit: StepSink,
        peer_gone: Callable[[], bool],
        arrival: float | None = None,
    ) -> str:
        """Pace the request's steps and hand each step's tokens to `emit`.

        Step i ends at start + (sum of lab durations up to i) / dilation on the wall
        clock, so sleep error never accumulates. The start is the request's `arrival`
        (monotonic seconds) so that parsing and planning count inside the first step;
        when they took longer than it, the whole schedule shifts so that the first token
        leaves now and every later interval keeps its exact length; the decode steps are
        paced from the first token as it actually left. A client that goes
        away (`peer_gone`, or `emit` returning False) aborts the request when the engine
        sees disconnects; otherwise it runs on unseen to its end, an orphan still counted
        and logged.
        Returns the outcome: finished, aborted, orphaned or stopped.
        """
        dilation = self.clock.dilation
        self._enter(record)
        outcome = "finished"
        listening = True
        try:
            steps = iter(record.sampler)
            first = next(steps)
            now = time.monotonic()
            first_wall = first.lab_ms / 1000.0 / dilation
            start = now if arrival is None else min(arrival, now)
            if now > start + first_wall:
                start = now - first_wall
            elapsed_lab_ms = 0.0
            cursor = 0
            ids = record.reply.token_ids
            for i, step in enumerate(itertools.chain([first], steps)):
                record.steps.append(step)
                elapsed_lab_ms += step.lab_ms
                deadline = start + elapsed_lab_ms / 1000.0 / dilation
                if self._stop.wait(max(0.0, deadline - time.monotonic())):
                    outcome = "stopped"
                    break
                if i == 0:
                    # The decode is paced from the first token as it actually leaves: a stall
                    # of the simulating machine before it (a busy host; `dilation` lab seconds
                    # per wall second of it) shows as a later first token only, instead of a
                    # burst that catches the schedule up and reads as an impossible rate.
                    start += max(0.0, time.monotonic() - deadline)
                if listening and peer_gone():
                    listening, outcome = self._client_left(record)
                    if outcome == "aborted":
                        break
                chunk = ids[cursor : cursor + step.emitted]
                cursor += step.emitted
                self._account(record, i, step)
                if listening and not emit(i, step, chunk):
                    listening, outcome = self._client_left(record)
                    if outcome == "aborted":
                        break
        finally:
            self._leave(record, outcome)
        return outcome

    def _client_left(self, record: RequestRecord) -> tuple[bool, str]:
        if self.abort_on_disconnect:
            return False, "aborted"
        return False, "orphaned"

    def history(self) -> list[RequestRecord]:
        """The last HISTORY_LIMIT requests admitted, in admission order (for tests and the
        benchmark; a long-running lab would otherwise keep every reply forever)."""
        with self._lock:
            return list(self._history)

    # -- accounting --------------------------------------------------------------------

    def _enter(self, record: RequestRecord) -> None:
        with self._lock:
            self._active[record.index] = record

    def _leave(self, record: RequestRecord, outcome: str) -> None:
        with self._lock:
            self._active.pop(record.index, None)
            record.outcome = outcome
            if outcome in ("finished", "orphaned"):
                self._totals.finished[record.reply.finish_reason] += 1
            elif outcome == "aborted":
                self._totals.finished["abort"] += 1
            if outcome in ("finished", "orphaned", "aborted"):
                self._totals.ended_prompt += record.prompt_tokens if record.steps else 0
                self._totals.ended_generation += record.generated
                # Each decode step verifies the drafts (spec_verify_ct); the prefill does not.
                self._totals.verify_calls += sum(1 for step in record.steps[1:] if step.drafted)

    def _account(self, record: RequestRecord, index: int, step: Step) -> None:
        # Counted as the modelled releases count: the tokens the step emitted (the accepted
        # drafts and the bonus token), never the positions it proposed.
        counted = step.emitted
        prompt = record.prompt_tokens if index == 0 else 0
        decode_line = False
        with self._lock:
            record.generated += step.emitted
            if index > 0:
                self._window.decode_steps += 1
                window = self._decode
                window.steps += 1
                window.generation += counted
                if step.drafted:
                    window.drafts += 1
                    window.drafted += step.drafted
                    window.accepted += step.accepted
                decode_line = window.steps >= self.decode_log_interval
            for bucket in (self._window, self._totals):
                bucket.prompt += prompt
                bucket.generation += counted
                if step.drafted:
                    bucket.drafts += 1
                    bucket.drafted += step.drafted
                    bucket.accepted += step.accepted
                    for pos in range(step.accepted):
                        bucket.accepted_per_pos[pos] += 1
        if self.engine != "sglang":
            return
        if index == 0:
            self._log_prefill(record)
        elif decode_line:
            self._log_decode()

    def running(self) -> int:
        with self._lock:
            return len(self._active)

    def _kv_tokens(self) -> int:
        with self._lock:
            return sum(r.prompt_tokens + r.generated for r in self._active.values())

    def _kv_fraction(self) -> float:
        return self._kv_tokens() / self.kv_capacity if self.kv_capacity else 0.0

    def write_log(self, line: Line, message: str) -> None:
        with self._log_lock:
            self._log(line, message)

    def _stats_loop(self) -> None:
        interval_wall = self.log_interval_s / self.clock.dilation
        start = time.monotonic()
        last = start
        n = 0
        while True:
            n += 1
            deadline = start + n * interval_wall
            if self._stop.wait(max(0.0, deadline - time.monotonic())):
                return
            now = time.monotonic()
            self._log_interval((now - last) * self.clock.dilation)
            last = now

    def _log_interval(self, elapsed_lab_s: float) -> None:
        """vLLM's periodic stats line and, with speculation, its SpecDecoding line, in the
        release's format strings (vllm/v1/metrics/loggers.py, spec_decode/metrics.py)."""
        with self._lock:
            window = self._window
            self._window = _Window(accepted_per_pos=[0] * self.k)
            running = len(self._active)
        # The releases divide by the interval's wall time, busy or not.
        gen_tps = window.generation / elapsed_lab_s if elapsed_lab_s > 0 else 0.0
        prompt_tps = window.prompt / elapsed_lab_s if elapsed_lab_s > 0 else 0.0
        kv_fraction = self._kv_fraction()
        rel = self.release
        prompt_line, gen_line = rel.line("stats_throughput", startswith="Avg prompt"), \
            rel.line("stats_throughput", startswith="Avg generation")
        kv_line = next(x for x in rel.lines("stats_kv_usage") if "Iteration" not in x.text)
        kv_args: tuple[Any, ...] = (kv_fraction * 100,)
        if kv_line.text.startswith("%s"):
            kv_args = ("GPU", *kv_args)  # loggers.py: kv_cache_device is "GPU" on CUDA
        parts = [
            prompt_line.pct(prompt_tps),
            gen_line.pct(gen_tps),
            rel.line("stats_requests", startswith="Running").pct(running),
            rel.line("stats_requests", startswith="Waiting").pct(0),
            kv_line.pct(*kv_args),
            rel.line("stats_prefix_cache").pct(0.0),
        ]
        prefix = rel.line("stats_engine_prefix").fmt({"": 0, "self.engine_index": 0, "engine_idx": 0})
        self.write_log(prompt_line, prefix + ", ".join(parts))
        if window.drafts:
            per_pos = ", ".join(f"{a / window.drafts:.3f}" for a in window.accepted_per_pos)
            line = rel.line("specdec_header")
            self.write_log(line, line.pct(
                1 + window.accepted / window.drafts,
                window.accepted / elapsed_lab_s,
                window.drafted / elapsed_lab_s,
                window.accepted,
                window.drafted,
                per_pos,
                window.accepted / window.drafted * 100,
            ))

    def _token_usage_msg(self) -> str:
        """SGLang's `{token_usage_msg}` part of a batch line (pool_stats_observer.py)."""
        usage = self._kv_fraction()
        found = [x for x in self.release.lines("batch_fields") if x.text.startswith("#token: ")]
        if found:
            values = {"self.full_num_used": self._kv_tokens(), "self.full_token_usage": usage}
            return found[0].fmt(values) + ", "
        return f"token usage: {usage:.2f}, "

    def _log_prefill(self, record: RequestRecord) -> None:
        line = self.release.line("prefill_batch")
        message = line.fmt({
            "iter_msg": "", "prefill_stats.num_new_seqs": 1,
            "prefill_stats.log_input_tokens": record.prompt_tokens, "prefill_stats.log_hit_tokens": 0,
            "token_usage_msg": self._token_usage_msg(),
            "prefill_stats.num_running_reqs.total": self.running(),
            "len(self.waiting_queue)": 0, "len(self.scheduler.waiting_queue)": 0,
            "prefill_stats.num_pending_tokens": 0,
        })
        # The format string ends where the scheduler appends its optional fields.
        self.write_log(line, message.rstrip(", "))

    def _log_decode(self) -> None:
        """SGLang's `Decode batch` line, every decode_log_interval decode steps, with its
        throughput over those steps and, under speculation, its acceptance."""
        now = time.monotonic()
        with self._lock:
            window = self._decode
            self._decode = _DecodeWindow(since=now)
            running = len(self._active)
        lab_s = (now - window.since) * self.clock.dilation
        gen_tps = window.generation / lab_s if lab_s > 0 else 0.0
        rel = self.release
        line = rel.line("decode_batch")
        fields = rel.lines("batch_fields")
        message = line.fmt(iter_msg="", num_running_reqs=running, token_usage_msg=self._token_usage_msg())
        accept_len = accept_rate = 0.0
        if window.drafts:
            accept_len = 1 + window.accepted / window.drafts
            accept_rate = window.accepted / window.drafted if window.drafted else 0.0
            accept = next(x for x in fields if x.text.startswith("accept len: "))
            message += accept.fmt(spec_accept_length=accept_len, spec_accept_rate=accept_rate)
        tail = next(x for x in fields if "gen throughput (token/s)" in x.text)
        message += tail.fmt({"self._graph_backend_label": "cuda graph", "can_run_cuda_graph": True,
                             "self.last_gen_throughput": gen_tps, "len(self.waiting_queue)": 0,
                             "len(self.scheduler.waiting_queue)": 0})
        with self._lock:
            self._gauges = {"gen_throughput": gen_tps, "spec_accept_length": accept_len,
                            "spec_accept_rate": accept_rate}
        self.write_log(line, message)

    # -- /metrics ----------------------------------------------------------------------

    def metrics_text(self) -> str:
        """Prometheus exposition under the release's metric names, counted like the log:
        vLLM's counters and gauges, or SGLang's (`sglang:` gauges set when it logs a decode
        batch, its token counters; no accepted/drafted counters)."""
        with self._lock:
            totals = self._totals
            running = len(self._active)
            prompt, generation = totals.prompt, totals.generation
            ended_prompt, ended_generation = totals.ended_prompt, totals.ended_generation
            verify_calls = totals.verify_calls
            drafts, drafted, accepted = totals.drafts, totals.drafted, totals.accepted
            per_pos, finished = list(totals.accepted_per_pos), dict(totals.finished)
            gauges = dict(self._gauges)
        rel = self.release
        out: list[str] = []

        def metric(name: str, kind: str, help_text: str, labels: str,
                   rows: list[tuple[str, float]]) -> None:
            exposed = rel.metric(name)
            if exposed is None:
                return  # a metric this release does not have
            out.append(f"# HELP {exposed} {help_text}")
            out.append(f"# TYPE {exposed} {kind}")
            for extra, value in rows:
                out.append(f"{exposed}{{{labels}{extra}}} {float(value)!r}")

        name = _escape(self.model_name)
        if self.engine == "sglang":
            # Scheduler gauges carry the scheduler's labels, token counters the tokenizer
            # manager's (0.5.23 adds is_streaming to them, as its table says).
            sched = f'model_name="{name}",engine_type="unified",tp_rank="0",pp_rank="0"'
            counter_labels = f'model_name="{name}"'
            entry = (rel.table.get("metrics") or {}).get("sglang:prompt_tokens_total") or {}
            if "is_streaming" in str(entry.get("labelnames_source", "")):
                counter_labels += ',is_streaming="true"'
            metric("sglang:num_running_reqs", "gauge", "The number of running requests.", sched,
                   [("", running)])
            metric("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
                   sched, [("", 0)])
            metric("sglang:token_usage", "gauge", "The token usage.", sched, [("", self._kv_fraction())])
            metric("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", sched,
                   [("", gauges["gen_throughput"])])
            if self.k:
                metric("sglang:spec_accept_length", "gauge", "The average acceptance length of "
                       "speculative decoding.", sched, [("", gauges["spec_accept_length"])])
                metric("sglang:spec_accept_rate", "gauge", "The average acceptance rate of "
                       "speculative decoding.", sched, [("", gauges["spec_accept_rate"])])
            metric("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                   counter_labels, [("", ended_prompt)])
            metric("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
                   counter_labels, [("", ended_generation)])
            if self.k:
                # 0.5.23's count of verify calls (speculative steps) of the ended requests:
                # generation tokens over it is the exact mean acceptance length.
                metric("sglang:spec_verify_calls_total", "counter", "Number of speculative decoding "
                       "verification calls.", f'model_name="{name}"', [("", verify_calls)])
            metric("sglang:num_requests_total", "counter", "Number of requests processed.",
                   counter_labels, [("", sum(finished.values()))])
            return "\n".join(out) + "\n"

        labels = f'model_name="{name}",engine="0"'
        metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
               labels, [("", running)])
        metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
               labels, [("", 0)])
        metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
               labels, [("", self._kv_fraction())])
        metric("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.", labels,
               [("", prompt)])
        metric("vllm:generation_tokens", "counter", "Number of generation tokens processed.", labels,
               [("", generation)])
        metric("vllm:request_success", "counter", "Count of successfully processed requests.", labels,
               [(f',finished_reason="{reason}"', n) for reason, n in sorted(finished.items())])
        if self.k:
            # One draft per step that drafted: the denominator of acceptance per draft.
            metric("vllm:spec_decode_num_drafts", "counter", "Number of spec decoding drafts.", labels,
                   [("", drafts)])
            metric("vllm:spec_decode_num_draft_tokens", "counter", "Number of draft tokens.", labels,
                   [("", drafted)])
            metric("vllm:spec_decode_num_accepted_tokens", "counter", "Number of accepted tokens.",
                   labels, [("", accepted)])
            metric("vllm:spec_decode_num_accepted_tokens_per_pos", "counter",
                   "Accepted tokens per draft position.", labels,
                   [(f',position="{pos}"', n) for pos, n in enumerate(per_pos)])
        return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
