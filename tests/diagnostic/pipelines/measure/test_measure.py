"""The measurement protocol end to end against a small streaming server on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from diagnostic.jobs.findings_document import findings_schema
from diagnostic.pipelines.client import EndpointError, StreamClient
from diagnostic.pipelines.measure import protocol
from diagnostic.pipelines.measure.claim import CAUSES
from diagnostic.pipelines.measure.protocol import MeasurementError, measure_endpoint, measure_on_session
from diagnostic.pipelines.stats import compare
from lab.session import LogChunk
from tests.diagnostic.pipelines.sse_server import ServerPlan, StreamServer, serving


def _measure(server: StreamServer, tokenizer: Path | None, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "workloads": ["code"],
        "n": 3,
        "warmup": 1,
        "max_tokens": 40,
        "metrics_url": server.url + "/metrics",
        "settle_s": 0.2,
        "to_lab": server.to_lab,
        "lab_now": server.clock.now,
    }
    args.update(kw)
    return measure_endpoint(server.url, tokenizer_path=tokenizer, **args)


def test_the_measured_decode_rate_is_the_rate_the_server_paces(
    tokenizer_path: Path, pieces: list[str]
) -> None:
    # One token every 10 ms: 100 tok/s.
    with serving(ServerPlan(pieces=pieces, step_s=0.01, ttft_s=0.05)) as server:
        result = _measure(server, tokenizer_path, max_tokens=60)
    code = result["code"]
    assert code["n"] == 3
    assert code["mean_tps"] == pytest.approx(100.0, rel=0.02)
    assert code["ttft_s"] == pytest.approx(0.05, abs=0.02)
    run = code["runs"][0]
    assert run["tokens"] == 60 == run["usage_completion_tokens"]
    assert run["usage_excess"] == 0
    assert len(code["decode"]["samples"]) == 3
    assert code["ci95"][0] <= code["mean_tps"] <= code["ci95"][1]
    # What the report reads of every run is in the findings schema; the output keeps to it.
    defs = findings_schema()["$defs"]
    jsonschema.Draft202012Validator({"$defs": defs, "$ref": "#/$defs/measurement"}).validate(result)
    assert {"index": 0, "prompt_index": 0}.items() <= run.items()


def test_lab_time_comes_from_the_callers_conversion(tokenizer_path: Path, pieces: list[str]) -> None:
    # Steps of 0.3 lab s at dilation 30 are 10 ms on the wall: 3.33 tok/s in lab time.
    with serving(ServerPlan(pieces=pieces, step_s=0.3, ttft_s=3.0, dilation=30)) as server:
        result = _measure(server, tokenizer_path)
    # The stub paces in wall time, which a busy machine stretches (it once read 3 % slow):
    # the rate is at most the pace and well above a double conversion's (1/30 of it); without
    # the conversion it would read 30 times faster. The same for the first token's wait.
    assert 0.5 / 0.3 <= result["code"]["mean_tps"] <= 1.03 / 0.3
    assert 3.0 - 0.6 <= result["code"]["ttft_s"] <= 3 * 3.0


@pytest.mark.parametrize("style", ["nospace", "crlf", "split", "nodone"])
def test_stream_variants_deliver_the_same_tokens(tokenizer_path: Path, pieces: list[str], style: str) -> None:
    with serving(ServerPlan(pieces=pieces, step_s=0.005, style=style, keepalive=True)) as server:
        result = _measure(server, tokenizer_path, n=2, warmup=0, metrics_url=None)
    run = result["code"]["runs"][0]
    assert run["tokens"] == 40
    assert run["keepalives"] >= 40


def test_chunks_carrying_several_tokens_are_not_counted_as_tokens(
    tokenizer_path: Path, pieces: list[str]
) -> None:
    plan = ServerPlan(pieces=pieces, step_s=0.02, tokens_per_step=(3, 2, 4, 1), k=4)
    with serving(plan) as server:
        result = _measure(server, tokenizer_path, max_tokens=101)
    code = result["code"]
    run = code["runs"][0]
    assert run["tokens"] == 101
    assert run["content_chunks"] == 1 + 40  # the first token alone, then 100 tokens in 40 steps
    # The stub server paces steps in wall time, which a busy machine stretches: the rate is
    # at most the pace, and the tokens-to-chunks ratio (one run, one clock) is exact.
    assert code["mean_tps"] <= 2.5 / 0.02 * 1.03
    assert code["chunk_tps_mean"] == pytest.approx(code["mean_tps"] / 2.5, rel=0.03)
    detail = result["reconciliation_detail"]["code"]
    chunks = [c for c in detail if c["code"] == "metrics.client_counts_chunks"]
    assert chunks[0]["present"] and not chunks[0]["explains_ratio"]
    assert "metrics.client_counts_chunks" not in result["reconciliation"]


def test_a_server_counting_proposed_tokens_is_caught_and_explained(
    tokenizer_path: Path, pieces: list[str]
) -> None:
    plan = ServerPlan(pieces=pieces, step_s=0.01, tokens_per_step=(3, 2, 4, 1), k=4, counts="proposed")
    with serving(plan) as server:
        result = _measure(server, tokenizer_path, max_tokens=101)
    metrics = result["code"]["server_claim"]["metrics"]
    # Per run: 1 + 40 steps * 5 counted; 101 delivered.
    assert metrics["ratio"] == pytest.approx(201 / 101, rel=1e-3)
    assert result["server_claim_source"]["code"] == "metrics"
    assert "metrics.server_counts_proposed" in result["reconciliation"]
    (finding,) = result["findings"]
    assert finding["code"] == "metrics.server_overclaim"
    assert set(finding) >= {"code", "title", "evidence", "change", "impact"}
    assert finding["evidence"]["explained_by"] == ["metrics.server_counts_proposed"]
    # A corrected reading, not a change to the serving: no before/after impact to judge.
    assert finding["impact"] is None
    assert f"received {result['code']['mean_tps']:.1f} tok/s" in finding["evidence"]["summary"]
    assert result["cause_descriptions"]["metrics.server_counts_proposed"] == CAUSES[
        "metrics.server_counts_proposed"
    ]


def test_it_describes_in_plain_words_each_cause_it_tested_and_no_other(
    tokenizer_path: Path, pieces: list[str]
) -> None:
    # Without /metrics or the log there are no draft counts and no stats windows: proposed
    # counting and busy-time accounting cannot be tested, so they are not described.
    with serving(ServerPlan(pieces=pieces, step_s=0.005)) as server:
        result = _measure(server, tokenizer_path, metrics_url=None)
    tested = {c["code"] for c in result["reconciliation_detail"]["code"]}
    assert tested == {"metrics.unseen_tokens", "metrics.orphaned_requests", "metrics.client_counts_chunks"}
    assert result["cause_descriptions"] == {code: CAUSES[code] for code in sorted(tested)}


def test_an_honest_server_raises_no_finding(tokenizer_path: Path, pieces: list[str]) -> None:
    plan = ServerPlan(pieces=pieces, step_s=0.01, tokens_per_step=(3, 2), k=4, counts="emitted")
    with serving(plan) as server:
        result = _measure(server, tokenizer_path)
    assert result["code"]["server_claim"]["metrics"]["ratio"] == pytest.approx(1.0)
    assert result["findings"] == []
    assert "metrics.server_counts_proposed" not in result["reconciliation"]


def test_usage_above_the_retokenized_count_is_flagged(tokenizer_path: Path, pieces: list[str]) -> None:
    with serving(ServerPlan(pieces=pieces, step_s=0.005, usage_extra=9)) as server:
        result = _measure(server, tokenizer_path)
    code = result["code"]
    assert code["usage_vs_retokenized"]["runs_flagged"] == [0, 1, 2]
    assert code["runs"][0]["usage_excess"] == 9
    unseen = next(c for c in result["reconciliation_detail"]["code"] if c["code"] == "metrics.unseen_tokens")
    assert unseen["present"]
    assert unseen["evidence"]["usage_above_retokenized"] > 0


def test_reasoning_text_is_kept_apart_and_counted_separately(tokenizer_path: Path, pieces: list[str]) -> None:
    with serving(ServerPlan(pieces=pieces, step_s=0.005, reasoning_tokens=10)) as server:
        result = _measure(server, tokenizer_path)
    run = result["code"]["runs"][0]
    assert run["tokens"] + run["reasoning_tokens"] == 40
    assert run["reasoning_tokens"] >= 9  # joined reasoning may re-tokenize a token shorter
    assert not run["usage_flag"]
    assert "metrics.unseen_tokens" in result["reconciliation"]


def test_a_request_the_client_abandons_is_seen_as_an_orphan(tokenizer_path: Path, pieces: list[str]) -> None:
    plan = ServerPlan(pieces=pieces, step_s=0.01, abort_on_disconnect=False)
    with serving(plan) as server:
        result = _measure(
            server, tokenizer_path, n=2, warmup=0, max_tokens=200, request_timeout_s=0.3, settle_s=0.3
        )
    code = result["code"]
    assert code["runs_abandoned"] == [0, 1]
    orphan = next(
        c for c in result["reconciliation_detail"]["code"] if c["code"] == "metrics.orphaned_requests"
    )
    assert orphan["present"]
    assert orphan["evidence"]["running_before_runs"] == [1]  # the first abandoned run still ran
    assert orphan["evidence"]["running_after"] >= 1


def test_a_request_the_server_aborts_leaves_no_orphan(tokenizer_path: Path, pieces: list[str]) -> None:
    plan = ServerPlan(pieces=pieces, step_s=0.01, abort_on_disconnect=True)
    with serving(plan) as server:
        result = _measure(
            server, tokenizer_path, n=2, warmup=0, max_tokens=200, request_timeout_s=0.3, settle_s=0.3
        )
    assert "metrics.orphaned_requests" not in result["reconciliation"]


def test_without_a_tokenizer_usage_stands_in_and_says_so(pieces: list[str]) -> None:
    with serving(ServerPlan(pieces=pieces, step_s=0.005)) as server:
        result = _measure(server, None, metrics_url=None)
    assert result["code"]["tokens"]["count_source"] == "usage.completion_tokens (server)"
    assert any("NO TOKENIZER" in w for w in result["warnings"])
    assert result["code"]["runs"][0]["tokens"] == 40


def test_the_model_defaults_to_the_first_listed(tokenizer_path: Path, pieces: list[str]) -> None:
    with serving(ServerPlan(pieces=pieces, step_s=0.005, api_model="listed-first")) as server:
        result = _measure(server, tokenizer_path, n=2, warmup=0)
    assert result["model"] == "listed-first"


def test_the_completions_api_is_measured_too(tokenizer_path: Path, pieces: list[str]) -> None:
    with serving(ServerPlan(pieces=pieces, step_s=0.005)) as server:
        result = _measure(server, tokenizer_path, api="completions", n=2, warmup=0)
    assert result["api"] == "completions"
    assert result["code"]["runs"][0]["tokens"] == 40


def test_an_unreachable_endpoint_is_one_clear_error(tokenizer_path: Path) -> None:
    with pytest.raises(EndpointError, match=r"cannot reach http://127\.0\.0\.1:9/v1/models"):
        measure_endpoint("http://127.0.0.1:9", tokenizer_path=tokenizer_path, n=2)
    with pytest.raises(EndpointError, match="expected a URL"):
        StreamClient("localhost:8000")


def test_an_unknown_model_is_the_servers_error_verbatim(tokenizer_path: Path, pieces: list[str]) -> None:
    with serving(ServerPlan(pieces=pieces)) as server, pytest.raises(EndpointError, match=r"HTTP 404.*nope"):
        _measure(server, tokenizer_path, model="nope")


def test_fewer_than_two_runs_is_refused(tokenizer_path: Path) -> None:
    with pytest.raises(MeasurementError, match="n: at least 2"):
        measure_endpoint("http://127.0.0.1:9", tokenizer_path=tokenizer_path, n=1)


def test_two_configurations_are_compared_with_welch(tokenizer_path: Path, pieces: list[str]) -> None:
    with serving(ServerPlan(pieces=pieces, step_s=0.01)) as slow:
        before = _measure(slow, tokenizer_path, metrics_url=None)["code"]
    with serving(ServerPlan(pieces=pieces, step_s=0.008)) as fast:
        after = _measure(fast, tokenizer_path, metrics_url=None)["code"]
    verdict = compare(before, after)
    assert verdict["different"] and verdict["diff"] > 0


class _Session:
    """What measure_on_session uses of a LabSession, over the test server (log as bytes)."""

    def __init__(self, server: StreamServer, tokenizer: Path) -> None:
        self.server, self.tokenizer = server, tokenizer
        self.endpoint = server.url
        self.clock = server.clock
        self.calls: list[tuple[int, int]] = []

    def tokenizer_path(self) -> Path:
        return self.tokenizer

    def logs(self, node: str | None = None, since: int = 0, *, tail_bytes: int | None = None) -> LogChunk:
        text = "".join(line + "\n" for line in self.server.state.log)
        size = len(text.encode())
        if tail_bytes is not None:
            since = max(0, size - tail_bytes)
        self.calls.append((since, size))
        part = text.encode()[since:].decode()
        return LogChunk("spark-01", "engine.log", since, size, size, part)


def test_a_lab_session_supplies_endpoint_tokenizer_metrics_log_and_clock(
    tokenizer_path: Path, pieces: list[str]
) -> None:
    plan = ServerPlan(
        pieces=pieces, step_s=0.3, ttft_s=0.5, tokens_per_step=(3, 2), k=4, counts="proposed", dilation=30
    )
    with serving(plan) as server:
        session = _Session(server, tokenizer_path)
        result = measure_on_session(
            session,
            workloads=["code"],
            n=3,
            warmup=1,
            # 300 tokens take 36 lab s: every request holds at least two whole 10 s log
            # windows whatever their alignment (120 tokens, 14 lab s, often held none).
            max_tokens=300,
            settle_s=0.4,
        )
    assert session.calls[0][0] == session.calls[0][1]  # the first read starts at the log's end
    assert result["code"]["mean_tps"] == pytest.approx(2.5 / 0.3, rel=0.03)
    assert result["code"]["server_claim"]["log"]["windows"] >= 1
    assert result["code"]["server_claim"]["metrics"]["ratio"] > 1.5


def test_on_a_lab_session_the_settle_wait_is_lab_time(
    tokenizer_path: Path, pieces: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without settle_s the wait after each workload is SETTLE_LAB_S of the session's lab
    time (a wall second would be `dilation` lab seconds on a simulated lab), never below
    the wall floor."""
    seen: list[float] = []

    def fake_endpoint(endpoint: str, **options: Any) -> dict[str, Any]:
        seen.append(options["settle_s"])
        return {}

    monkeypatch.setattr(protocol, "measure_endpoint", fake_endpoint)
    plan = ServerPlan(pieces=pieces, step_s=0.3, ttft_s=0.5, tokens_per_step=(1,), k=0, dilation=30)
    with serving(plan) as server:
        session = _Session(server, tokenizer_path)
        protocol.measure_on_session(session, workloads=["code"])
        protocol.measure_on_session(session, workloads=["code"], settle_s=0.7)
    assert seen[0] == pytest.approx(max(protocol.SETTLE_MIN_WALL_S, protocol.SETTLE_LAB_S / 30))
    assert seen[0] < 0.1 and seen[1] == 0.7
