"""What the server says it generated, and why that differs from what clients received.

Two sources, both reported beside the delivered figure and never instead of it:

* the engine's periodic stats log lines, using only windows that fall wholly inside a
  request (a stats line's timestamp marks the END of its window; edge windows are
  partly idle), compared with the tokens the client received in the same windows;
* `/metrics` counter deltas over each request's exact interval
  (`vllm:generation_tokens_total` and the speculative-decoding counters), per engine.

The cause tests below (`proposed_counting`, `busy_time_accounting`, ...) each take one
known cause of a claim above delivery and keep the evidence that decided it. Times here
are on the log's clock (seconds, as the engine prints them); `protocol.py` converts
client times to it.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# A claim within this fraction of the predicted ratio counts as explained by a cause.
EXPLAIN_TOLERANCE = 0.05
# More than this above delivered is a finding (metrics.server_overclaim).
OVERCLAIM_THRESHOLD = 0.10
# Fewer content chunks than this fraction of tokens: a chunk-counting client undercounts.
CHUNK_UNDERCOUNT = 0.95
# usage.completion_tokens above the re-tokenized count by more than this (tokens, or
# fraction of the count, whichever is larger) flags a run: BPE re-tokenization of a
# joined text may merge a token or two differently from the generated sequence.
USAGE_EXCESS_TOKENS = 2
USAGE_EXCESS_FRACTION = 0.01

# Counter names without the engine's prefix (lab/engines/releases/*.json `metrics`): vLLM
# serves all four and the drafts counter; SGLang serves the token counters only (no
# accepted/drafted counters), and only when launched with --enable-metrics.
COUNTERS = {
    "generation": "generation_tokens_total",
    "prompt": "prompt_tokens_total",
    "accepted": "spec_decode_num_accepted_tokens_total",
    "drafted": "spec_decode_num_draft_tokens_total",
    # vLLM counts drafts (speculative steps that proposed anything): the denominator of the
    # mean acceptance length, 1 + accepted / drafts. A draft may propose fewer than k
    # tokens (n-gram finds no match that long), so drafted / k is not the number of drafts.
    "drafts": "spec_decode_num_drafts_total",
    # SGLang 0.5.23 counts its verify calls (speculative steps) when a request ends, with its
    # generation tokens: their ratio is the request's mean acceptance length as SGLang itself
    # defines it (completion_tokens / spec_verify_ct, managers/tokenizer_manager.py).
    "verify_calls": "spec_verify_calls_total",
}
# Running requests: vLLM's vllm:num_requests_running, SGLang's sglang:num_running_reqs.
RUNNING_GAUGES = ("num_requests_running", "num_running_reqs")
RUNNING_GAUGE = RUNNING_GAUGES[0]
# SGLang's own acceptance gauge (sglang:spec_accept_length, the mean accepted length of
# its last logging window).
ACCEPT_LENGTH_GAUGE = "spec_accept_length"

# Every cause tested here, by the code it reports, in plain words: the measurement writes
# the ones it tested into findings (`cause_descriptions`), and the report prints them
# beside the evidence.
CAUSES = {
    "metrics.server_counts_proposed": (
        "The server counts every proposed position of a speculative step (k + 1 per step) as a generated "
        "token, accepted or not, while the client receives only the accepted prefix plus one."
    ),
    "metrics.server_busy_time": (
        "The server divides tokens by the time it was busy, leaving out the idle gaps between requests."
    ),
    "metrics.unseen_tokens": (
        "The server counts tokens the client never saw as content (reasoning text, or usage above the "
        "re-tokenized count)."
    ),
    "metrics.orphaned_requests": (
        "Requests kept generating after the client had finished with them, and the server counted them."
    ),
    "metrics.client_counts_chunks": (
        "A client counting stream chunks instead of tokens undercounts: with speculative decoding one "
        "chunk carries several tokens."
    ),
}


# -- /metrics -----------------------------------------------------------------------------


def parse_prometheus(text: str) -> dict[str, dict[str, float]]:
    """Metric name -> {engine label -> value}, summed over every other label.

    Names are kept without the `vllm:`/`sglang:` prefix so that both engines read the
    same; series without an `engine` label count as engine "0".
    """
    out: dict[str, dict[str, float]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, labels, rest = _split_sample(line)
        if name is None:
            continue
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        short = name.split(":", 1)[1] if ":" in name else name
        engine = labels.get("engine", "0")
        out.setdefault(short, {})
        out[short][engine] = out[short].get(engine, 0.0) + value
    return out


def _split_sample(line: str) -> tuple[str | None, dict[str, str], str]:
    brace = line.find("{")
    space = line.find(" ")
    if brace == -1 or (space != -1 and space < brace):
        name, _, rest = line.partition(" ")
        return name, {}, rest
    close = line.rfind("}")
    if close < brace:
        return None, {}, ""
    labels: dict[str, str] = {}
    body = line[brace + 1 : close]
    i = 0
    while i < len(body):
        eq = body.find("=", i)
        if eq == -1:
            break
        key = body[i:eq].strip().lstrip(",").strip()
        j = eq + 1
        if j >= len(body) or body[j] != '"':
            break
        j += 1
        value_chars: list[str] = []
        while j < len(body) and body[j] != '"':
            if body[j] == "\\" and j + 1 < len(body):
                j += 1
            value_chars.append(body[j])
            j += 1
        labels[key] = "".join(value_chars)
        i = j + 1
    return line[:brace], labels, line[close + 1 :]


@dataclass(frozen=True)
class MetricsSnapshot:
    at: float  # client monotonic seconds when the scrape returned
    values: dict[str, dict[str, float]]

    def total(self, name: str) -> float:
        return sum(self.values.get(name, {}).values())

    def engines(self) -> set[str]:
        found: set[str] = set()
        for key in COUNTERS.values():
            found |= set(self.values.get(key, {}))
        return found


def counter_deltas(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, Any]:
    """Counter increases between two scrapes, in total and per engine."""
    out: dict[str, Any] = {"per_engine": {}}
    for key, name in COUNTERS.items():
        b, a = before.values.get(name, {}), after.values.get(name, {})
        per = {engine: a.get(engine, 0.0) - b.get(engine, 0.0) for engine in set(a) | set(b)}
        out[key] = sum(per.values()) if (name in after.values) else None
        for engine, delta in per.items():
            out["per_engine"].setdefault(engine, {})[key] = delta
    out["running_before"] = running(before)
    out["running_after"] = running(after)
    if ACCEPT_LENGTH_GAUGE in after.values:
        gauge = after.values[ACCEPT_LENGTH_GAUGE]
        out["accept_length"] = sum(gauge.values()) / max(1, len(gauge))
    return out


def running(snapshot: MetricsSnapshot) -> float | None:
    """Requests the engine is running, from whichever running gauge it serves."""
    for name in RUNNING_GAUGES:
        if name in snapshot.values:
            return snapshot.total(name)
    return None


# -- log windows --------------------------------------------------------------------------


@dataclass
class StatsWindow:
    """One stats interval of the engine log; `end` is the line's timestamp."""

    end: float
    interval: float
    generation_tps: float
    running: int | None
    engine: str
    line: int | None = None
    accepted: int | None = None
    drafted: int | None = None
    per_position: list[float] = field(default_factory=list)
    mean_acceptance_length: float | None = None
    # SGLang's `accept rate` (accepted over drafted tokens in the window), beside its
    # `accept len` (mean_acceptance_length); vLLM logs its counts instead.
    acceptance_rate: float | None = None

    @property
    def start(self) -> float:
        return self.end - self.interval

    @property
    def claimed_tokens(self) -> float:
        return self.generation_tps * self.interval


def stats_windows(events: Iterable[Mapping[str, Any]], default_interval_s: float = 10.0, *,
                  step_counted: bool = False) -> list[StatsWindow]:
    """Stats windows from parsed log events, each with the spec-decode line that followed it.

    Clock windows (vLLM logs every `log_interval_s`): the window length is the median
    spacing of an engine's consecutive stats lines, or `default_interval_s` with fewer than
    two. Step-counted windows (`step_counted`: SGLang writes its Decode batch line every 40
    decode steps, its throughput over the time since its previous line): each window runs
    from the engine's line before; the first line, whose window has no known start, is
    dropped.
    """
    windows: list[StatsWindow] = []
    last: StatsWindow | None = None
    for event in events:
        kind = event.get("kind")
        if kind == "stats" and event.get("ts") is not None and event.get("generation_tps") is not None:
            running = event.get("running")
            last = StatsWindow(
                end=float(event["ts"]),
                interval=default_interval_s,
                generation_tps=float(event["generation_tps"]),
                running=int(running) if running is not None else None,
                engine=str(event.get("engine", 0)),
                line=event.get("line"),
            )
            windows.append(last)
        elif kind == "specdec" and last is not None and last.drafted is None \
                and last.mean_acceptance_length is None:
            last.accepted = event.get("accepted")
            last.drafted = event.get("drafted")
            last.per_position = list(event.get("per_position") or [])
            mean = event.get("mean_acceptance_length")
            last.mean_acceptance_length = float(mean) if mean is not None else None
            rate = event.get("acceptance_rate")
            last.acceptance_rate = float(rate) if rate is not None else None
    by_engine: dict[str, list[StatsWindow]] = {}
    for w in windows:
        by_engine.setdefault(w.engine, []).append(w)
    if step_counted:
        kept: list[StatsWindow] = []
        for group in by_engine.values():
            for a, b in itertools.pairwise(group):
                if b.end > a.end:
                    b.interval = b.end - a.end
                    kept.append(b)
        return sorted(kept, key=lambda w: (w.end, w.engine))
    for group in by_engine.values():
        gaps = [b.end - a.end for a, b in itertools.pairwise(group) if b.end > a.end]
        if gaps:
            interval = statistics.median(gaps)
            for w in group:
                w.interval = interval
    return windows


@dataclass(frozen=True)
class RequestSpan:
    """One request as the client saw it, on the log's clock."""

    sent: float
    first: float
    last: float
    tokens: int  # delivered, re-tokenized
    chars: int
    timeline: tuple[tuple[float, int], ...]  # (log-clock seconds, cumulative content chars)
    measured: bool = True  # False for warm-up runs: they keep the server busy but are not measured
    # Tokens in the first n characters received (the prefix re-tokenized). Without it the
    # tokens are apportioned by characters, which errs by the text's local characters per
    # token: up to a tenth of a ten-second window on code.
    prefix_tokens: Callable[[int], int] | None = field(default=None, compare=False, repr=False)

    def tokens_between(self, a: float, b: float) -> float:
        """Delivered tokens that arrived in [a, b)."""
        if self.chars <= 0 or b <= a:
            return 0.0
        lo, hi = self._chars_by(a), self._chars_by(b)
        if self.prefix_tokens is not None:
            return float(self._tokens_by(hi) - self._tokens_by(lo))
        return self.tokens * (hi - lo) / self.chars

    def _tokens_by(self, chars: int) -> int:
        assert self.prefix_tokens is not None
        if chars <= 0:
            return 0
        if chars >= self.chars:
            return self.tokens
        return min(self.tokens, self.prefix_tokens(chars))

    def _chars_by(self, t: float) -> int:
        got = 0
        for when, chars in self.timeline:
            if when >= t:
                break
            got = chars
        return got

    def busy_overlap(self, a: float, b: float) -> float:
        return max(0.0, min(b, self.last) - max(a, self.sent))


def classify_windows(
    windows: Sequence[StatsWindow], spans: Sequence[RequestSpan], *, resolution_s: float = 1.0
) -> list[dict[str, Any]]:
    """Each window that overlaps the requests, with what the client saw in it.

    A window is `inner` when it lies wholly inside one request even allowing for the
    timestamp's resolution: a line stamped `ts` ended somewhere in [ts, ts + resolution),
    so the window is [ts - interval, ts + resolution) at its widest. For apportioning
    delivered tokens the window is centred on that uncertainty. Warm-up spans count
    towards what was delivered and how busy the window was, never towards `inner`.
    """
    measured = [s for s in spans if s.measured]
    if not measured:
        return []
    lo = min(s.sent for s in measured)
    hi = max(s.last for s in measured)
    out = []
    for w in windows:
        a = w.start + resolution_s / 2.0
        b = w.end + resolution_s / 2.0
        if b <= lo or a >= hi:
            continue
        inner = any(s.sent <= w.start and w.end + resolution_s <= s.last for s in measured)
        delivered = sum(s.tokens_between(a, b) for s in spans)
        busy = sum(s.busy_overlap(a, b) for s in spans) / w.interval
        out.append(
            {
                "window": w,
                "inner": inner,
                "busy_fraction": min(1.0, busy),
                "delivered_tokens": delivered,
                "delivered_tps": delivered / w.interval,
            }
        )
    return out


def draft_acceptance(
    windows: Sequence[StatsWindow], spans: Sequence[RequestSpan], *, resolution_s: float = 1.0,
    runs: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any] | None:
    """What the engine says about one workload's drafts: the mean acceptance length, and
    the per-position acceptance rates where its log gives them.

    The denominator is the number of drafts, never k times it (a draft proposes fewer than
    k tokens when n-gram finds no match that long). From /metrics (`runs`: the workload's
    measured runs with their counter deltas): 1 + accepted / drafts over the requests, with
    vLLM's `spec_decode_num_drafts_total`. From the log, pooled over the windows that lie
    wholly within the workload's requests (warm-ups included: the same workload), weighted
    by each window's drafts (accepted over the sum of its per-position rates, each the
    share of drafts whose position j was accepted). SGLang
    logs only its mean `accept len` per window (and serves no draft counters): pooled by
    the window's length. None when neither says anything."""
    from_metrics = _metrics_acceptance(runs)
    if not spans:
        return from_metrics
    lo = min(s.sent for s in spans)
    hi = max(s.last for s in spans)
    inside = [w for w in windows if w.start >= lo and w.end + resolution_s <= hi]
    vllm = [w for w in inside if w.drafted and w.accepted is not None and w.per_position]
    if vllm:
        depth = min(len(w.per_position) for w in vllm)
        drafts = [_window_drafts(w) for w in vllm]
        total = sum(drafts)
        pairs = list(zip(drafts, vllm, strict=True))
        per_position = [sum(d * w.per_position[j] for d, w in pairs) / total for j in range(depth)]
        accepted = sum(float(w.accepted or 0) for w in vllm)
        out: dict[str, Any] = {
            "source": "log",
            "windows": len(vllm),
            "drafts": round(total, 1),
            "accepted": accepted,
            "drafted": sum(float(w.drafted or 0) for w in vllm),
            "mean_acceptance_length": round(1.0 + accepted / total, 4),
            "per_position": [round(p, 4) for p in per_position],
        }
        if from_metrics is not None:
            # The counters are exact over the requests; the log's figures are rounded.
            for key in ("drafts", "accepted", "drafted", "mean_acceptance_length"):
                out[key] = from_metrics[key]
            out["source"] = "metrics+log"
        return out
    if from_metrics is not None:
        return from_metrics
    sglang = [w for w in inside if w.mean_acceptance_length is not None and not w.per_position]
    if sglang:
        weight = sum(w.interval for w in sglang)
        mean = sum(float(w.mean_acceptance_length or 0) * w.interval for w in sglang) / weight
        return {"source": "log", "windows": len(sglang), "drafts": None, "accepted": None, "drafted": None,
                "mean_acceptance_length": round(mean, 4), "per_position": []}
    return None


def _window_drafts(w: StatsWindow) -> float:
    """A vLLM window's drafts from its own line: each per-position rate is accepted-at-j
    over drafts, so drafts = accepted / their sum. A window with nothing accepted says
    only that drafts >= drafted / k (each draft proposes at most k tokens)."""
    rates = sum(w.per_position)
    if w.accepted and rates > 0:
        return float(w.accepted) / rates
    return float(w.drafted or 0) / len(w.per_position)


def _sglang_metrics_acceptance(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """SGLang 0.5.23: generation tokens over verify calls, both counted when a request ends
    (a delta that ends while the request runs reads 0 for both)."""
    calls = [m.get("verify_calls") for m in rows]
    generated = [m.get("generation") for m in rows]
    if not rows or any(c is None for c in calls) or any(g is None for g in generated):
        return None
    total_calls = float(sum(c for c in calls if c is not None))
    if total_calls <= 0:
        return None
    tokens = float(sum(g for g in generated if g is not None))
    return {"source": "metrics", "windows": 0, "drafts": total_calls, "accepted": None, "drafted": None,
            "mean_acceptance_length": round(tokens / total_calls, 4), "per_position": [],
            "counts_from": "sglang:generation_tokens_total / sglang:spec_verify_calls_total"}


def _metrics_acceptance(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    rows = [r["metrics"] for r in runs if isinstance(r.get("metrics"), Mapping)]
    drafts = [m.get("drafts") for m in rows]
    accepted = [m.get("accepted") for m in rows]
    if not rows or any(d is None for d in drafts) or any(a is None for a in accepted):
        return _sglang_metrics_acceptance(rows)
    total = float(sum(d for d in drafts if d is not None))
    if total <= 0:
        return None
    acc = float(sum(a for a in accepted if a is not None))
    drafted = [m.get("drafted") for m in rows]
    return {
        "source": "metrics",
        "windows": 0,
        "drafts": total,
        "accepted": acc,
        "drafted": (float(sum(d for d in drafted if d is not None))
                    if all(d is not None for d in drafted) else None),
        "mean_acceptance_length": round(1.0 + acc / total, 4),
        "per_position": [],
    }


def log_claim(classified: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The server's rate from inner windows, per engine, beside delivery in the same windows.

    Rates are over the windows' summed length (tokens over seconds): for clock windows, all
    one length, that is the mean of their rates; for step-counted windows (SGLang) it
    weighs each by its length, and the log's one-second stamps err only at the ends of a
    run of consecutive windows instead of at each window's two ends."""
    inner = [c for c in classified if c["inner"]]
    if not inner:
        return None
    per_engine: dict[str, dict[str, Any]] = {}
    for c in inner:
        w: StatsWindow = c["window"]
        entry = per_engine.setdefault(w.engine, {"windows": 0, "claimed": 0.0, "delivered": 0.0,
                                                 "seconds": 0.0})
        entry["windows"] += 1
        entry["claimed"] += w.claimed_tokens
        entry["delivered"] += c["delivered_tokens"]
        entry["seconds"] += w.interval
    engines = {
        engine: {
            "windows": e["windows"],
            "claimed_tps": round(e["claimed"] / e["seconds"], 3),
            "delivered_tps_same_windows": round(e["delivered"] / e["seconds"], 3),
        }
        for engine, e in sorted(per_engine.items())
    }
    # Single stream: engines that served nothing report ~0, so the sum is the busy engine's rate.
    claimed = sum(e["claimed_tps"] for e in engines.values())
    delivered = sum(c["delivered_tokens"] for c in inner) / sum(c["window"].interval for c in inner)
    accepted, drafted, counts_from = _log_spec_counts(inner)
    return {
        "source": "log",
        "windows": len(inner),
        "window_s": inner[0]["window"].interval,
        # Clock windows (vLLM) are all one length; step-counted ones (SGLang) each their own.
        "window_widths_s": [round(c["window"].interval, 4) for c in inner],
        "claimed_tps": round(claimed, 3),
        "delivered_tps_same_windows": round(delivered, 3),
        "ratio": round(claimed / delivered, 4) if delivered > 0 else None,
        "claimed_tokens": round(sum(c["window"].claimed_tokens for c in inner), 1),
        "delivered_tokens": round(sum(c["delivered_tokens"] for c in inner), 1),
        "accepted": accepted,
        "drafted": drafted,
        "counts_from": counts_from,
        "per_engine": engines,
        "lines": [c["window"].line for c in inner],
    }


SGLANG_COUNTS = ("SGLang's accept len and accept rate of each window: steps = delivered tokens / accept len, "
                 "accepted = steps x (accept len - 1), drafted = accepted / accept rate")


def _log_spec_counts(inner: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None, str | None]:
    """Accepted and drafted tokens over the inner windows, and where they come from.

    vLLM's SpecDecoding lines count them. SGLang logs no counts, only its mean `accept len`
    (tokens emitted per verify step) and `accept rate` (accepted over drafted): over the
    tokens delivered in a window they give its steps, its accepted and its drafted tokens.
    None when a speculative window says neither (or nothing was accepted, so the rate
    cannot give the drafts)."""
    windows = [c["window"] for c in inner]
    if any(w.drafted is not None for w in windows):
        counted = [w for w in windows if w.drafted is not None]
        return (float(sum(w.accepted or 0 for w in counted)), float(sum(w.drafted or 0 for w in counted)),
                "the engine's spec-decode lines")
    if not windows or any(w.mean_acceptance_length is None for w in windows):
        return None, None, None
    accepted = drafted = 0.0
    for c, w in zip(inner, windows, strict=True):
        length, rate = float(w.mean_acceptance_length or 0.0), w.acceptance_rate
        if length < 1.0 or rate is None or (rate <= 0 and length > 1.0):
            return None, None, None
        window_accepted = float(c["delivered_tokens"]) * (length - 1.0) / length
        accepted += window_accepted
        drafted += window_accepted / rate if rate > 0 else 0.0
    if drafted <= 0:
        return None, None, None
    return round(accepted, 1), round(drafted, 1), SGLANG_COUNTS


def metrics_claim(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The server's rate from /metrics deltas over each request's interval (lab seconds)."""
    # Abandoned runs are left out: their delivery stopped while the server may have gone on.
    rows = [
        r
        for r in runs
        if r.get("metrics") and r["metrics"].get("generation") is not None and not r.get("abandoned")
    ]
    if not rows:
        return None
    generated = sum(r["metrics"]["generation"] for r in rows)
    delivered = sum(r["tokens"] for r in rows)
    seconds = sum(r["metrics_interval_s"] for r in rows)
    per_engine: dict[str, float] = {}
    for r in rows:
        for engine, d in r["metrics"]["per_engine"].items():
            per_engine[engine] = per_engine.get(engine, 0.0) + float(d.get("generation") or 0.0)
    acc = [r["metrics"].get("accepted") for r in rows]
    dra = [r["metrics"].get("drafted") for r in rows]
    drafts = [r["metrics"].get("drafts") for r in rows]
    return {
        "source": "metrics",
        "runs": len(rows),
        "interval_s": round(seconds, 4),
        "claimed_tps": round(generated / seconds, 3) if seconds > 0 else None,
        "delivered_tps_same_interval": round(delivered / seconds, 3) if seconds > 0 else None,
        "ratio": round(generated / delivered, 4) if delivered > 0 else None,
        "generation_tokens": generated,
        "delivered_tokens": delivered,
        "accepted": sum(a for a in acc if a is not None) if any(a is not None for a in acc) else None,
        "drafted": sum(d for d in dra if d is not None) if any(d is not None for d in dra) else None,
        # vLLM's spec_decode_num_drafts_total: speculative steps, the acceptance denominator.
        "drafts": sum(d for d in drafts if d is not None) if any(d is not None for d in drafts) else None,
        "requests": len(rows),
        "per_engine_tps": {e: round(g / seconds, 3) for e, g in sorted(per_engine.items())},
    }


# -- reconciliation -----------------------------------------------------------------------


def _explains(observed: float | None, predicted: float | None) -> bool:
    if observed is None or predicted is None or observed <= 0:
        return False
    return abs(observed - predicted) / observed <= EXPLAIN_TOLERANCE


def proposed_counting(claim: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Does the server count every verified position (k + 1 per step) as generated?

    Over an interval with R prefill steps (one token each, no drafts), S speculative
    steps, A accepted and D drafted tokens, the client receives N = R + S + A tokens
    (less accepted tokens cut off at max_tokens). An honest server counts N. A server
    counting proposed positions counts R + S(k + 1) = R + S + D, since D = S k: that is
    N + (D - A), every rejected draft counted as generated. The predicted ratio
    claimed/delivered is therefore (N + D - A) / N, whatever k and R.
    """
    if not claim or claim.get("drafted") is None or claim.get("accepted") is None:
        return None
    delivered = float(claim["delivered_tokens"])
    if delivered <= 0:
        return None
    drafted, accepted = float(claim["drafted"]), float(claim["accepted"])
    predicted = (delivered + drafted - accepted) / delivered
    observed = claim.get("ratio")
    honest = _explains(observed, 1.0)
    explains = _explains(observed, predicted) and predicted > 1.0 + EXPLAIN_TOLERANCE
    return {
        "code": "metrics.server_counts_proposed",
        "present": explains and not honest,
        "explains_ratio": explains and not honest,
        "observed_ratio": observed,
        "predicted_ratio": round(predicted, 4),
        "evidence": {
            "source": claim["source"],
            "counts_from": claim.get("counts_from") or "the engine's spec-decode counters",
            "accepted": accepted,
            "drafted": drafted,
            "rejected_drafts": drafted - accepted,
            "delivered_tokens": delivered,
            "rule": "claimed/delivered = (N + D - A) / N when proposed positions are counted",
        },
    }


def busy_time_accounting(
    classified: Sequence[Mapping[str, Any]], inner_ratio: float | None
) -> dict[str, Any] | None:
    """Does the server divide by busy time instead of wall time?

    In windows that were partly idle (busy fraction < 0.9 as the client saw it), a
    wall-time server reports rho * delivered/window, a busy-time server
    rho * delivered/(busy fraction * window), with rho the ratio of the inner windows.
    The hypothesis with the smaller median log error wins.
    """
    rho = inner_ratio or 1.0
    partial = [
        c
        for c in classified
        if 0.05 < c["busy_fraction"] < 0.9 and c["delivered_tokens"] > 0 and c["window"].generation_tps > 0
    ]
    if len(partial) < 2:
        return {
            "code": "metrics.server_busy_time",
            "present": False,
            "explains_ratio": False,
            "observed_ratio": None,
            "predicted_ratio": None,
            "evidence": {
                "partial_windows": len(partial),
                "note": "fewer than two partly idle windows: busy-time accounting not testable",
            },
        }
    wall_err, busy_err = [], []
    for c in partial:
        claimed = c["window"].generation_tps
        wall = rho * c["delivered_tps"]
        busy = wall / c["busy_fraction"]
        wall_err.append(abs(math.log(claimed / wall)))
        busy_err.append(abs(math.log(claimed / busy)))
    present = statistics.median(busy_err) < statistics.median(wall_err)
    everything = [c for c in classified if c["delivered_tokens"] > 0]
    claimed_all = sum(c["window"].claimed_tokens for c in everything)
    delivered_all = sum(c["delivered_tokens"] for c in everything)
    predicted_all = sum(rho * c["delivered_tokens"] / max(c["busy_fraction"], 1e-9) for c in everything)
    observed = claimed_all / delivered_all if delivered_all else None
    predicted = predicted_all / delivered_all if delivered_all else None
    return {
        "code": "metrics.server_busy_time",
        "present": present,
        "explains_ratio": present and _explains(observed, predicted),
        "observed_ratio": round(observed, 4) if observed else None,
        "predicted_ratio": round(predicted, 4) if predicted else None,
        "evidence": {
            "partial_windows": len(partial),
            "busy_fractions": [round(c["busy_fraction"], 3) for c in partial],
            "median_log_error_wall": round(statistics.median(wall_err), 4),
            "median_log_error_busy": round(statistics.median(busy_err), 4),
            "note": "ratio over every window that saw delivery, idle edges included",
        },
    }


def unseen_tokens(runs: Sequence[Mapping[str, Any]], observed_ratio: float | None) -> dict[str, Any]:
    """Tokens the client never saw: reasoning text, and usage above the re-tokenized count."""
    delivered = sum(r["tokens"] for r in runs)
    reasoning = sum(r.get("reasoning_tokens") or 0 for r in runs)
    excess = sum(max(0, r.get("usage_excess") or 0) for r in runs)
    flagged = [r["index"] for r in runs if r.get("usage_flag")]
    present = reasoning > 0 or bool(flagged)
    predicted = (delivered + reasoning + excess) / delivered if delivered else None
    return {
        "code": "metrics.unseen_tokens",
        "present": present,
        "explains_ratio": present and _explains(observed_ratio, predicted),
        "observed_ratio": observed_ratio,
        "predicted_ratio": round(predicted, 4) if predicted else None,
        "evidence": {
            "delivered_tokens": delivered,
            "reasoning_tokens": reasoning,
            "usage_above_retokenized": excess,
            "runs_flagged": flagged,
        },
    }


def orphans(
    runs: Sequence[Mapping[str, Any]],
    after: Mapping[str, Any] | None,
    trailing_windows: Sequence[StatsWindow],
    observed_ratio: float | None,
) -> dict[str, Any]:
    """Requests still running on the server when the client was not waiting for any.

    Evidence: the running gauge above 0 before a run was sent or after the last one
    ended; the generation counter still rising while no client was connected; log
    windows wholly after the last request that still report generation or running.
    """
    busy_before = [r["index"] for r in runs if (r.get("metrics") or {}).get("running_before")]
    abandoned = [r["index"] for r in runs if r.get("abandoned")]
    evidence: dict[str, Any] = {"running_before_runs": busy_before, "abandoned_runs": abandoned}
    present = bool(busy_before)
    orphan_rate = None
    if after:
        evidence.update(after)
        if (after.get("running_after") or 0) > 0 or (after.get("generation_while_idle") or 0) > 0:
            present = True
        if after.get("idle_s"):
            orphan_rate = (after.get("generation_while_idle") or 0.0) / after["idle_s"]
    busy_windows = [w.line for w in trailing_windows if (w.running or 0) > 0 or w.generation_tps > 0]
    evidence["log_windows_after_last_request"] = len(trailing_windows)
    evidence["log_windows_still_generating"] = busy_windows
    present = present or bool(busy_windows)
    predicted = None
    delivered = sum(r["tokens"] for r in runs)
    seconds = sum(r.get("metrics_interval_s") or 0.0 for r in runs)
    if orphan_rate is not None and delivered and seconds:
        predicted = (delivered + orphan_rate * seconds) / delivered
        evidence["orphan_generation_tps"] = round(orphan_rate, 3)
    return {
        "code": "metrics.orphaned_requests",
        "present": present,
        "explains_ratio": present and _explains(observed_ratio, predicted),
        "observed_ratio": observed_ratio,
        "predicted_ratio": round(predicted, 4) if predicted else None,
        "evidence": evidence,
    }


def chunk_counting(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Would a client that counts SSE chunks as tokens get the delivered count wrong?"""
    tokens = sum(r["tokens"] for r in runs)
    chunks = sum(r["content_chunks"] for r in runs)
    ratio = chunks / tokens if tokens else None
    return {
        "code": "metrics.client_counts_chunks",
        "present": ratio is not None and ratio < CHUNK_UNDERCOUNT,
        # This cause lowers a client's figure; it never raises the server's claim.
        "explains_ratio": False,
        "observed_ratio": None,
        "predicted_ratio": None,
        "evidence": {
            "content_chunks": chunks,
            "delivered_tokens": tokens,
            "chunks_per_token": round(ratio, 4) if ratio is not None else None,
            "note": "a chunk-counting client would report delivered x chunks_per_token",
        },
    }
