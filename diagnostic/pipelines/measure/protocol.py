"""The delivered-throughput measurement: METHODOLOGY.md's "Measurement" protocol.

Per workload: two warm-up runs (discarded), then n runs, one request at a time, run i
using prompt i. Each run's delivered tokens are its received text re-tokenized once
with the model's tokenizer; TTFT, decode rate (N - 1) / (last - first) and end-to-end
rate N / (last - sent) are in lab seconds, through the caller's `to_lab` (wall seconds
to lab seconds; identity on a real lab). The server's claim (log windows wholly inside
requests, /metrics deltas over each request) is reported beside delivery, with the
causes that reconcile the two.

`measure_endpoint` returns the `measurement` section of findings.json; every figure in
it carries its raw per-run samples, and every cause of a claim above delivery that it
tested is described in plain words (`cause_descriptions`).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from diagnostic.pipelines.client import (
    EndpointError,
    StreamClient,
    StreamRun,
    normalize_endpoint,
    session_api_key,
)
from diagnostic.pipelines.measure import claim as claims
from diagnostic.pipelines.measure.summary import figure
from diagnostic.pipelines.stats import OUTLIER_RULE, summarize
from diagnostic.pipelines.tokens import TokenCounter, load_token_counter
from diagnostic.pipelines.workloads import Workload, load_workload

if TYPE_CHECKING:
    from lab.session import LabSession

MEASUREMENT_SCHEMA = "diagnostic.measurement/1"
LogSource = Callable[[], "str | Iterable[str]"]
# The wait after a workload's last run, on a lab session, in lab seconds: a single stream's
# server notices a disconnect at its next step (tens of milliseconds) and an orphan still
# generating shows dozens of tokens within it. On a simulated lab a fixed wall wait would be
# `dilation` times longer in lab time, which the lab day pays for; the wall floor keeps the
# wait long enough to be scheduled at all on a fast simulated lab.
SETTLE_LAB_S = 2.0
SETTLE_MIN_WALL_S = 0.05


class MeasurementError(RuntimeError):
    """The measurement cannot proceed; the message says what to change."""


def _identity(seconds: float) -> float:
    return seconds


@dataclass
class WorkloadRecord:
    """One workload's measurement as it is taken, then set beside the server's claim."""

    workload: Workload
    # The workload's summary and runs: its entry in the measurement section.
    section: dict[str, Any]
    # Warm-up and measured requests on the log's clock: what kept the server busy.
    spans: list[claims.RequestSpan]
    # What the server still ran or generated after the last run (None without /metrics).
    idle: dict[str, Any] | None
    # The log's clock when the workload was done: later stats windows are the next one's.
    log_end: float
    # The causes tested against the server's claim, filled in once the log is read.
    causes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.workload.name


class LabTimeline:
    """Client monotonic instants as lab epoch seconds and as the engine log's clock.

    One anchor pairs a monotonic reading with the lab's `now`; later instants are the
    anchor plus `to_lab` of the elapsed wall time, so the caller's conversion is the
    only place that knows how lab time relates to wall time.
    """

    def __init__(
        self,
        to_lab: Callable[[float], float],
        lab_now: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.to_lab = to_lab
        self.mono0 = clock()
        self.lab0 = lab_now()

    def lab_epoch(self, mono: float) -> float:
        return self.lab0 + self.to_lab(mono - self.mono0)

    def log_seconds(self, mono: float) -> float:
        """The instant as an engine log stamps it: UTC month-day time, no year.

        Same reckoning as lab.engines.logs (seconds since 1 January on a leap-year
        calendar), so differences within one log are exact.
        """
        t = self.lab_epoch(mono)
        dt = datetime.fromtimestamp(t, UTC)
        yday = datetime(2024, dt.month, dt.day, tzinfo=UTC).timetuple().tm_yday
        whole = (yday - 1) * 86400 + dt.hour * 3600 + dt.minute * 60 + dt.second
        return whole + (t - int(t))


def measure_endpoint(
    endpoint: str,
    *,
    model: str | None = None,
    tokenizer_path: str | Path | None = None,
    workloads: Sequence[str | Workload] = ("code", "prose"),
    n: int = 15,
    warmup: int = 2,
    metrics_url: str | None = None,
    log_source: LogSource | None = None,
    engine: str = "vllm",
    version: str | None = None,
    to_lab: Callable[[float], float] = _identity,
    lab_now: Callable[[], float] = time.time,
    max_tokens: int = 512,
    api: str = "chat",
    request_timeout_s: float | None = None,
    settle_s: float = 1.0,
    log_resolution_s: float = 1.0,
    progress: Callable[[str], None] | None = None,
    api_key: str | None = None,
) -> dict[str, Any]:
    """Run the measurement protocol against one OpenAI-compatible endpoint.

    `tokenizer_path`: the model's tokenizer.json or tiktoken.model; without it the
    server's usage.completion_tokens stands in for delivered tokens, and the result says
    so in `warnings` and `tokens.count_source`. `log_source`: a callable returning the
    engine log text (or lines) written since its previous call; it is called once before
    the first request to mark the start; `engine` and `version` name what wrote it (version
    None: lines of any modelled release are read). `lab_now`: the lab's epoch clock (the session
    clock's `now` on a lab), used with `to_lab` to place requests on the log's clock.
    `request_timeout_s`: wall seconds after which a run is abandoned (recorded, not
    counted). `settle_s`: wall seconds to wait after each workload before checking for
    requests the server still runs. `api_key`: sent as `Authorization: Bearer` on every
    request to the endpoint (a server started with --api-key refuses requests without it);
    it appears nowhere in the result.
    """
    if n < 2:
        raise MeasurementError(f"n: at least 2 runs are needed for an interval, got {n}")
    if max_tokens < 2:
        raise MeasurementError(
            f"max_tokens: at least 2 tokens are needed for a decode rate, got {max_tokens}"
        )
    say = progress or (lambda _msg: None)
    counter = load_token_counter(tokenizer_path) if tokenizer_path else None
    warnings: list[str] = []
    if counter is None:
        warnings.append(
            "NO TOKENIZER: delivered tokens are the server's usage.completion_tokens, not a re-tokenized "
            "count of the received text; pass the model's tokenizer to count delivered tokens independently"
        )
    chosen = [w if isinstance(w, Workload) else load_workload(w) for w in workloads]
    with StreamClient(endpoint, api=api, api_key=api_key) as client:
        if model is None:
            listed = client.models()
            if not listed:
                raise MeasurementError(f"{client.base}/v1/models lists no model; pass the model name")
            model = listed[0]
        scraper = _MetricsScraper(metrics_url) if metrics_url else None
        timeline = LabTimeline(to_lab, lab_now)
        log_text: list[str] = []
        if log_source is not None:
            _read_log(log_source)  # marks the start: what came before is not ours
        records: list[WorkloadRecord] = []
        try:
            for workload in chosen:
                if len(workload.prompts) < n:
                    warnings.append(
                        f"workload {workload.name}: {len(workload.prompts)} prompts for n = {n}; "
                        f"prompts are reused in order"
                    )
                records.append(
                    _measure_workload(
                        client, workload, model=model, n=n, warmup=warmup, max_tokens=max_tokens,
                        counter=counter, scraper=scraper, timeline=timeline, to_lab=to_lab,
                        settle_s=settle_s, request_timeout_s=request_timeout_s, say=say,
                    )
                )
                if log_source is not None:
                    log_text.extend(_read_log(log_source))
        finally:
            if scraper:
                scraper.close()
    if scraper is not None and scraper.unavailable:
        warnings.append(f"{scraper.unavailable}; no /metrics claim")
    windows = _log_windows(log_text, engine, version) if log_source is not None else []
    if log_source is not None and not windows:
        warnings.append("the engine log had no stats lines over the measurement; no log-based claim")
    result = _result(records, windows, chosen, log_resolution_s, header={
        "schema": MEASUREMENT_SCHEMA,
        "endpoint": normalize_endpoint(endpoint),
        "model": model,
        "api": api,
        "protocol": _protocol(n, warmup, max_tokens, counter, chosen, api, request_timeout_s),
    })
    result["warnings"] = warnings
    return result


def _result(
    records: list[WorkloadRecord], windows: list[Any], chosen: list[Workload], log_resolution_s: float, *,
    header: dict[str, Any],
) -> dict[str, Any]:
    """The measurement's section: each workload's record set beside the server's claim, the
    claims, their reconciliation and the findings."""
    result = dict(header)
    for record in records:
        _set_beside_the_claim(record, windows, log_resolution_s)
        result[record.name] = record.section
    headlines = {r.name: r.section["server_claim"]["log"] or r.section["server_claim"]["metrics"]
                 for r in records}
    result["server_claimed_tps"] = {name: h["claimed_tps"] if h else None for name, h in headlines.items()}
    result["server_claim_source"] = {name: h["source"] if h else None for name, h in headlines.items()}
    # The headline list names the causes that explain the server's ratio (METHODOLOGY.md);
    # causes that are present without explaining it (e.g. chunks carrying several tokens,
    # which only matters to a chunk-counting client) stay in the detail.
    result["reconciliation"] = sorted({c["code"] for r in records for c in r.causes if c["explains_ratio"]})
    result["reconciliation_detail"] = {r.name: r.causes for r in records}
    # Written with the evidence so that whoever presents it needs nothing of this package.
    tested = sorted({c["code"] for r in records for c in r.causes})
    result["cause_descriptions"] = {code: claims.CAUSES[code] for code in tested}
    result["findings"] = _findings(result, chosen)
    return result


def session_log_source(session: LabSession, node: str | None = None) -> LogSource:
    """A `log_source` over a lab session's engine log (the head node's by default).

    Each call returns what the log gained since the previous call; the first call starts
    at the log's current end.
    """
    offset: list[int | None] = [None]

    def read() -> str:
        if offset[0] is None:
            offset[0] = session.logs(node, tail_bytes=0).next_offset
            return ""
        chunk = session.logs(node, since=offset[0])
        offset[0] = chunk.next_offset
        return chunk.text

    return read


def measure_on_session(session: LabSession, *, engine: str = "vllm", version: str | None = None,
                       **options: Any) -> dict[str, Any]:
    """`measure_endpoint` against the engine a lab session launched: its endpoint, tokenizer,
    /metrics, head-node log, its API key (the session's own for the job: an engine started
    with authentication on asks for it), and its clock for lab time. `options` go to
    measure_endpoint; without `settle_s` the settle wait is SETTLE_LAB_S of the session's
    lab time."""
    endpoint = session.endpoint
    options.setdefault("api_key", session_api_key(session))
    options.setdefault("settle_s", max(SETTLE_MIN_WALL_S, session.clock.wall_seconds(SETTLE_LAB_S)))
    return measure_endpoint(
        endpoint,
        tokenizer_path=options.pop("tokenizer_path", None) or session.tokenizer_path(),
        metrics_url=options.pop("metrics_url", None) or f"{endpoint.rstrip('/')}/metrics",
        log_source=options.pop("log_source", None) or session_log_source(session),
        engine=engine,
        version=version,
        to_lab=session.clock.lab_seconds,
        lab_now=session.clock.now,
        **options,
    )


def _measure_workload(
    client: StreamClient,
    workload: Workload,
    *,
    model: str,
    n: int,
    warmup: int,
    max_tokens: int,
    counter: TokenCounter | None,
    scraper: _MetricsScraper | None,
    timeline: LabTimeline,
    to_lab: Callable[[float], float],
    settle_s: float,
    request_timeout_s: float | None,
    say: Callable[[str], None],
) -> WorkloadRecord:
    """The warm-up runs, then n runs one at a time, then a wait for what the server still runs."""
    params = {**workload.request, "max_tokens": max_tokens}
    warm = [
        client.stream(
            workload.warmup[i % len(workload.warmup)],
            model=model,
            params=params,
            deadline_s=request_timeout_s,
        )
        for i in range(warmup)
    ]
    runs: list[dict[str, Any]] = []
    spans: list[claims.RequestSpan] = []
    for streamed in warm:
        warm_span = _span(streamed, {"tokens": _count(streamed, counter)}, timeline, counter, measured=False)
        if warm_span is not None:
            spans.append(warm_span)
    for i in range(n):
        prompt = workload.prompts[i % len(workload.prompts)]
        before = scraper.snapshot() if scraper else None
        streamed = client.stream(prompt, model=model, params=params, deadline_s=request_timeout_s)
        if streamed.abandoned:
            # Give the server the time a disconnect takes to notice, so that a
            # request still running at the next run's start is a real orphan.
            time.sleep(settle_s)
        after = scraper.snapshot() if scraper else None
        row = _run_row(i, i % len(workload.prompts), streamed, counter, to_lab, before, after)
        runs.append(row)
        span = _span(streamed, row, timeline, counter)
        if span is not None:
            spans.append(span)
        say(f"{workload.name} run {i + 1}/{n}: {_brief(row)}")
    idle = _settle(scraper, settle_s, to_lab)
    return WorkloadRecord(
        workload=workload,
        section=_workload_section(workload, runs, warm, counter),
        spans=spans,
        idle=idle,
        log_end=timeline.log_seconds(time.monotonic()),
    )


def _set_beside_the_claim(
    record: WorkloadRecord, windows: Sequence[claims.StatsWindow], log_resolution_s: float
) -> None:
    """The server's claim over the workload's requests (log windows, /metrics deltas) into
    its section, and the causes tested against it into the record."""
    classified = claims.classify_windows(windows, record.spans, resolution_s=log_resolution_s)
    last_end = max((s.last for s in record.spans if s.measured), default=record.log_end)
    trailing = [w for w in windows if w.start >= last_end + log_resolution_s and w.end <= record.log_end]
    from_log = claims.log_claim(classified)
    from_metrics = claims.metrics_claim(record.section["runs"])
    record.section["server_claim"] = {"log": from_log, "metrics": from_metrics}
    # What the engine says of its drafts over these requests (speculative decoding only):
    # the specdec stage reads a draft length's acceptance from it.
    record.section["draft_acceptance"] = claims.draft_acceptance(
        windows, record.spans, resolution_s=log_resolution_s,
        runs=[r for r in record.section["runs"] if not r.get("abandoned")],
    )
    record.causes = _reconcile(record.section, from_log, from_metrics, classified, trailing, record.idle)


# -- one run ------------------------------------------------------------------------------


def _run_row(
    index: int,
    prompt_index: int,
    run: StreamRun,
    counter: TokenCounter | None,
    to_lab: Callable[[float], float],
    before: claims.MetricsSnapshot | None,
    after: claims.MetricsSnapshot | None,
) -> dict[str, Any]:
    usage = run.usage or {}
    usage_tokens = usage.get("completion_tokens")
    usage_tokens = int(usage_tokens) if isinstance(usage_tokens, int | float) else None
    if counter is not None:
        tokens = counter.count(run.text)
        reasoning_tokens = counter.count(run.reasoning_text)
    else:
        tokens = usage_tokens or 0
        reasoning_tokens = 0
    row: dict[str, Any] = {
        "index": index,
        "prompt_index": prompt_index,
        "tokens": tokens,
        "usage_completion_tokens": usage_tokens,
        "reasoning_tokens": reasoning_tokens,
        "content_chunks": run.content_chunks,
        "events": run.events,
        "keepalives": run.keepalives,
        "finish_reason": run.finish_reason,
        "abandoned": run.abandoned,
        "error": run.error,
        "ttft_s": None,
        "decode_tps": None,
        "e2e_tps": None,
        "chunk_tps": None,
        "duration_s": round(to_lab(run.done - run.sent), 6) if run.done is not None else None,
    }
    if counter is not None and usage_tokens is not None:
        excess = usage_tokens - tokens - reasoning_tokens
        row["usage_excess"] = excess
        limit = max(claims.USAGE_EXCESS_TOKENS, claims.USAGE_EXCESS_FRACTION * tokens)
        row["usage_flag"] = excess > limit
    else:
        row["usage_excess"] = None
        row["usage_flag"] = False
    if run.first_content is not None and run.last_content is not None and not run.abandoned:
        ttft = to_lab(run.first_content - run.sent)
        decode_s = to_lab(run.last_content - run.first_content)
        total_s = to_lab(run.last_content - run.sent)
        row["ttft_s"] = round(ttft, 6)
        row["decode_s"] = round(decode_s, 6)
        if tokens > 1 and decode_s > 0:
            row["decode_tps"] = round((tokens - 1) / decode_s, 6)
        if run.content_chunks > 1 and decode_s > 0:
            row["chunk_tps"] = round((run.content_chunks - 1) / decode_s, 6)
        if total_s > 0:
            row["e2e_tps"] = round(tokens / total_s, 6)
    if before is not None and after is not None:
        row["metrics"] = claims.counter_deltas(before, after)
        row["metrics_interval_s"] = round(to_lab(after.at - before.at), 6)
    return row


def _count(run: StreamRun, counter: TokenCounter | None) -> int:
    if counter is not None:
        return counter.count(run.text)
    tokens = (run.usage or {}).get("completion_tokens")
    return int(tokens) if isinstance(tokens, int | float) else 0


def _span(
    run: StreamRun, row: Mapping[str, Any], timeline: LabTimeline, counter: TokenCounter | None,
    measured: bool = True,
) -> claims.RequestSpan | None:
    if run.first_content is None or run.last_content is None or run.abandoned:
        return None
    text = run.text
    return claims.RequestSpan(
        sent=timeline.log_seconds(run.sent),
        first=timeline.log_seconds(run.first_content),
        last=timeline.log_seconds(run.last_content),
        tokens=int(row["tokens"]),
        chars=len(run.text),
        timeline=tuple((timeline.log_seconds(run.sent + dt), chars) for dt, chars in run.timeline),
        measured=measured,
        # The tokens of what had arrived by a window's edge: the received prefix re-tokenized
        # (exact up to the one token a cut can split), not the characters apportioned.
        prefix_tokens=functools.cache(lambda chars: counter.count(text[:chars])) if counter else None,
    )


def _brief(row: Mapping[str, Any]) -> str:
    if row["decode_tps"] is None:
        return "abandoned" if row["abandoned"] else f"no decode rate ({row['tokens']} tokens)"
    return f"{row['tokens']} tokens, decode {row['decode_tps']:.2f} tok/s, TTFT {row['ttft_s']:.3f} s"


# -- /metrics and the log -----------------------------------------------------------------


class _MetricsScraper:
    """Scrapes /metrics. An engine that serves none (SGLang without --enable-metrics answers
    404) is evidence, not a failure: the scraper records the engine's answer in
    `unavailable` and every snapshot is then None; the measurement goes on without the
    /metrics claim."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._http = httpx.Client(timeout=httpx.Timeout(10.0, connect=5.0), trust_env=False)
        self.unavailable: str | None = None

    def snapshot(self) -> claims.MetricsSnapshot | None:
        if self.unavailable is not None:
            return None
        try:
            response = self._http.get(self.url)
        except httpx.HTTPError as exc:
            raise EndpointError(f"cannot read metrics at {self.url}: {exc}") from exc
        if response.status_code == 404:
            self.unavailable = f"the engine serves no metrics (HTTP 404 at {self.url})"
            return None
        if response.status_code != 200:
            raise EndpointError(f"metrics at {self.url} answered HTTP {response.status_code}")
        return claims.MetricsSnapshot(at=time.monotonic(), values=claims.parse_prometheus(response.text))

    def close(self) -> None:
        self._http.close()


def _settle(
    scraper: _MetricsScraper | None, settle_s: float, to_lab: Callable[[float], float]
) -> dict[str, Any] | None:
    """After a workload's last run: is the server still running or generating anything?

    The first `settle_s` is grace (a server notices a disconnect at its next write, and
    finishes its bookkeeping after the last byte); what is still running after it, or
    generated during the next `settle_s`, ran with no client waiting for it.
    """
    time.sleep(max(0.0, settle_s))
    if scraper is None:
        return None
    first = scraper.snapshot()
    if first is None:
        return None
    time.sleep(max(0.0, settle_s))
    second = scraper.snapshot()
    if second is None:
        return None
    generated = second.total(claims.COUNTERS["generation"]) - first.total(claims.COUNTERS["generation"])
    return {
        "running_after": max(claims.running(first) or 0.0, claims.running(second) or 0.0),
        "generation_while_idle": generated,
        "idle_s": round(to_lab(second.at - first.at), 6),
    }


def _read_log(source: LogSource) -> list[str]:
    got = source()
    if isinstance(got, str):
        return got.splitlines()
    return [str(line) for line in got]


def _log_windows(lines: Sequence[str], engine: str, version: str | None = None) -> list[claims.StatsWindow]:
    from lab.engines import parse_log  # the engine log parser lives with the engines

    # SGLang writes its Decode batch line every 40 decode steps, not on a clock: each
    # window runs from the line before.
    return claims.stats_windows(parse_log(engine, lines, version=version), step_counted=engine == "sglang")


# -- summaries ----------------------------------------------------------------------------


def _workload_section(
    workload: Workload, runs: list[dict[str, Any]], warm: Sequence[StreamRun], counter: TokenCounter | None
) -> dict[str, Any]:
    valid = [r for r in runs if r["decode_tps"] is not None]
    decode = summarize([r["decode_tps"] for r in valid])
    ttft = summarize([r["ttft_s"] for r in valid])
    e2e = summarize([r["e2e_tps"] for r in valid])
    chunk_rates = [r["chunk_tps"] for r in valid if r["chunk_tps"] is not None]
    usage_rows = [r for r in runs if r["usage_excess"] is not None]
    tokens = [r["tokens"] for r in runs]
    chunks = sum(r["content_chunks"] for r in runs)
    return {
        "workload": workload.describe(),
        "n": decode["n"],
        "mean_tps": decode["mean"],
        "ci95": decode["ci95"],
        "median_tps": decode["median"],
        "min_tps": decode["min"],
        "max_tps": decode["max"],
        "sd_tps": decode["sd"],
        "outliers": decode["outliers"],
        "ttft_s": ttft["mean"],
        "ttft": ttft,
        "decode": decode,
        "e2e_tps": e2e["mean"],
        "e2e": e2e,
        "chunk_tps_mean": round(statistics.fmean(chunk_rates), 3) if chunk_rates else None,
        "tokens": {
            "count_source": "re-tokenized received text" if counter else "usage.completion_tokens (server)",
            "total": sum(tokens),
            "per_run_mean": round(statistics.fmean(tokens), 2) if tokens else None,
            "reasoning_total": sum(r["reasoning_tokens"] for r in runs),
            "chunks_total": chunks,
            "chunks_per_token": round(chunks / sum(tokens), 4) if sum(tokens) else None,
        },
        "usage_vs_retokenized": {
            "runs_compared": len(usage_rows),
            "runs_differing": sum(1 for r in usage_rows if r["usage_excess"] != 0),
            "runs_flagged": [r["index"] for r in usage_rows if r["usage_flag"]],
            "max_abs_difference": max((abs(r["usage_excess"]) for r in usage_rows), default=None),
        },
        "runs_abandoned": [r["index"] for r in runs if r["abandoned"]],
        "runs_without_rate": [r["index"] for r in runs if r["decode_tps"] is None],
        "warmup": [{"tokens_chars": len(w.text), "abandoned": w.abandoned} for w in warm],
        "runs": runs,
    }


def _protocol(
    n: int,
    warmup: int,
    max_tokens: int,
    counter: TokenCounter | None,
    workloads: Sequence[Workload],
    api: str,
    request_timeout_s: float | None,
) -> dict[str, Any]:
    return {
        "single_stream": True,
        "n": n,
        "warmup_discarded": warmup,
        "max_tokens": max_tokens,
        "request": {w.name: {**w.request, "max_tokens": max_tokens} for w in workloads},
        "workloads": {w.name: w.describe() for w in workloads},
        "api": api,
        "tokens": (
            {"method": "re-tokenize the whole received text once, no special tokens", **counter.describe()}
            if counter
            else {"method": "usage.completion_tokens as reported by the server (no tokenizer)"}
        ),
        "figures": {
            "ttft_s": "first content byte - request sent",
            "decode_tps": "(N - 1) / (last content byte - first content byte)",
            "e2e_tps": "N / (last content byte - request sent)",
            "clock": "monotonic wall clock, converted to lab seconds by the caller's to_lab",
        },
        "summary": "mean of per-run decode rates, Student-t 95 % interval with n - 1 degrees of freedom",
        "outlier_rule": OUTLIER_RULE + "; flagged, never dropped",
        "comparison": "Welch's t-test, different when p < 0.05",
        "request_timeout_s": request_timeout_s,
        "server_claim": {
            "log": "generation throughput of stats windows wholly inside a request, over their summed length",
            "log_windows": "vLLM: one stats line every log interval; SGLang: one Decode batch line every "
            "40 decode steps, its window running from the line before",
            "metrics": "generation counter delta / request interval, per run, summed",
            "explain_tolerance": claims.EXPLAIN_TOLERANCE,
            "overclaim_threshold": claims.OVERCLAIM_THRESHOLD,
        },
    }


def _reconcile(
    section: Mapping[str, Any],
    from_log: Mapping[str, Any] | None,
    from_metrics: Mapping[str, Any] | None,
    classified: Sequence[Mapping[str, Any]],
    trailing: Sequence[claims.StatsWindow],
    idle: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    runs = [r for r in section["runs"] if not r["abandoned"]]
    headline = from_log or from_metrics
    observed = headline["ratio"] if headline else None
    causes: list[dict[str, Any]] = []
    # /metrics counters over the exact request intervals test the hypothesis exactly; log
    # windows only approximately (their delivered tokens are apportioned), so they are
    # the fallback for servers whose /metrics is out of reach.
    for source in (from_metrics, from_log):
        proposed = claims.proposed_counting(source)
        if proposed is not None:
            causes.append(proposed)
            break
    if from_log is not None:
        busy = claims.busy_time_accounting(classified, from_log.get("ratio"))
        if busy is not None:
            causes.append(busy)
    metrics_ratio = from_metrics["ratio"] if from_metrics else observed
    causes.append(claims.unseen_tokens(runs, metrics_ratio))
    causes.append(claims.orphans(section["runs"], idle, trailing, metrics_ratio))
    causes.append(claims.chunk_counting(runs))
    return causes


def _findings(result: Mapping[str, Any], workloads: Sequence[Workload]) -> list[dict[str, Any]]:
    """`metrics.server_overclaim` when a claim is more than 10 % above delivery."""
    over: dict[str, Any] = {}
    for w in workloads:
        measured = {s: c for s, c in result[w.name]["server_claim"].items() if c and c.get("ratio")}
        if any(c["ratio"] > 1.0 + claims.OVERCLAIM_THRESHOLD for c in measured.values()):
            # Both sources are kept as evidence once either overclaims.
            over[w.name] = {
                source: {k: c[k] for k in ("claimed_tps", "ratio", "windows", "runs") if k in c}
                for source, c in measured.items()
            }
    if not over:
        return []
    causes = sorted(
        {
            c["code"]
            for name in over
            for c in result["reconciliation_detail"][name]
            if c["present"] and c["explains_ratio"]
        }
    )
    first = next(iter(over))
    section = result[first]
    return [
        {
            "code": "metrics.server_overclaim",
            "title": (
                f"The server reports {figure(result['server_claimed_tps'][first], 1)} tok/s on {first}; "
                f"clients receive {figure(section['mean_tps'], 1)}"
            ),
            "evidence": {
                "summary": _overclaim_summary(result, over),
                "claims": over,
                "explained_by": causes,
                "delivered": {
                    name: {"mean_tps": result[name]["mean_tps"], "ci95": result[name]["ci95"]}
                    for name in over
                },
            },
            "change": {
                "note": "Quote and plan with the delivered rate, measured at the client by re-tokenizing "
                "what it received, not with the engine's generation throughput.",
            },
            # Nothing about the serving changes, so there is no before/after to measure: the
            # finding corrects a reading. An impact here would read as a 15 tok/s regression.
            "impact": None,
        }
    ]


def _overclaim_summary(result: Mapping[str, Any], over: Mapping[str, Any]) -> str:
    """One sentence per overclaimed workload: what each server source claims, what arrived."""
    parts = []
    for name, sources in over.items():
        said = " and ".join(
            f"{'its log' if source == 'log' else 'its /metrics counters'} {figure(c['claimed_tps'], 1)} tok/s"
            for source, c in sources.items()
        )
        mean, ci = result[name]["mean_tps"], result[name]["ci95"]
        if not mean:
            parts.append(f"On {name} the engine claims {said}; no run gave the client a decode rate.")
            continue
        # Over the mean printed beside it; the per-source `ratio` is over the same windows.
        ratio = max(c["claimed_tps"] for c in sources.values()) / mean
        interval = f" (95 % interval {figure(ci[0], 1)} to {figure(ci[1], 1)})" if ci else ""
        parts.append(
            f"On {name} the engine claims {said}; the client received {figure(mean, 1)} tok/s{interval}: "
            f"the claim is {ratio:.2f} times what was delivered."
        )
    return " ".join(parts)
