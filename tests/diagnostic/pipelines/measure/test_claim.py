"""The server's claim and its reconciliation, on constructed evidence."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest

from diagnostic.pipelines.measure import claim as claims
from diagnostic.pipelines.measure.protocol import LabTimeline


def test_prometheus_text_is_read_per_engine_and_summed_over_other_labels() -> None:
    text = (
        "# HELP vllm:generation_tokens_total x\n"
        'vllm:generation_tokens_total{model_name="m",engine="0"} 120.0\n'
        'vllm:generation_tokens_total{model_name="m",engine="1"} 30.0\n'
        'vllm:num_requests_running{engine="0",model_name="a,b=\\"c\\""} 1\n'
        "sglang:prompt_tokens_total 7\n"
    )
    got = claims.parse_prometheus(text)
    assert got["generation_tokens_total"] == {"0": 120.0, "1": 30.0}
    assert got["num_requests_running"] == {"0": 1.0}
    assert got["prompt_tokens_total"] == {"0": 7.0}


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7])
def test_proposed_counting_predicts_the_claim_from_the_spec_decode_counters(k: int) -> None:
    """Derivation check: R requests, each a prefill token then steps emitting 1 + accepted."""
    rng = random.Random(k)
    requests, delivered, accepted, drafted, counted = 5, 0, 0, 0, 0
    for _ in range(requests):
        delivered += 1
        counted += 1  # the prefill step's token is counted once either way
        for _ in range(rng.randint(20, 60)):
            a = rng.randint(0, k)
            delivered += 1 + a
            accepted += a
            drafted += k
            counted += k + 1
    claim = {
        "source": "metrics",
        "delivered_tokens": delivered,
        "accepted": accepted,
        "drafted": drafted,
        "ratio": counted / delivered,
    }
    cause = claims.proposed_counting(claim)
    assert cause is not None
    assert cause["predicted_ratio"] == pytest.approx(counted / delivered, abs=1e-4)
    assert cause["present"] and cause["explains_ratio"]


def test_an_honest_speculative_server_is_not_accused_of_counting_proposed_tokens() -> None:
    claim = {"source": "metrics", "delivered_tokens": 1000, "accepted": 600, "drafted": 1600, "ratio": 1.0}
    cause = claims.proposed_counting(claim)
    assert cause is not None and not cause["present"]
    assert cause["predicted_ratio"] == pytest.approx(2.0)


def _span(sent: float, last: float, tokens: int, measured: bool = True) -> claims.RequestSpan:
    # Uniform delivery: one character per token, one content chunk per second.
    steps = int(last - sent)
    timeline = tuple((sent + 1 + i, int(tokens * (i + 1) / steps)) for i in range(steps))
    return claims.RequestSpan(
        sent=sent,
        first=sent + 1,
        last=last,
        tokens=tokens,
        chars=tokens,
        timeline=timeline,
        measured=measured,
    )


def _window(end: float, tps: float, line: int = 0) -> claims.StatsWindow:
    return claims.StatsWindow(end=end, interval=10.0, generation_tps=tps, running=1, engine="0", line=line)


def test_only_windows_wholly_inside_a_request_count_as_inner() -> None:
    spans = [_span(100.0, 140.0, 400)]
    windows = [_window(e, 10.0) for e in (105.0, 110.0, 120.0, 130.0, 139.0, 140.0, 150.0)]
    got = {c["window"].end: c["inner"] for c in claims.classify_windows(windows, spans)}
    # 110 covers [100, 110] and may end as late as 111: inside. 140 may end at 141: not.
    # 150 lies after the request altogether and is not considered.
    assert got == {105.0: False, 110.0: True, 120.0: True, 130.0: True, 139.0: True, 140.0: False}


def test_warmup_requests_make_windows_busy_but_never_inner() -> None:
    spans = [_span(0.0, 40.0, 400, measured=False), _span(41.0, 81.0, 400)]
    classified = {
        c["window"].end: c for c in claims.classify_windows([_window(e, 10.0) for e in (30, 60)], spans)
    }
    assert 30 not in classified  # before the first measured request
    assert classified[60]["inner"] and classified[60]["busy_fraction"] == pytest.approx(1.0)


def test_log_claim_compares_with_delivery_in_the_same_windows() -> None:
    spans = [_span(100.0, 160.0, 600)]  # 10 tok/s
    classified = claims.classify_windows([_window(e, 16.0) for e in (120.0, 130.0, 140.0)], spans)
    got = claims.log_claim(classified)
    assert got is not None
    assert got["windows"] == 3
    assert got["claimed_tps"] == pytest.approx(16.0)
    assert got["delivered_tps_same_windows"] == pytest.approx(10.0, rel=0.02)
    assert got["ratio"] == pytest.approx(1.6, rel=0.02)


def test_tokens_in_a_window_are_the_received_prefix_re_tokenized_not_characters_apportioned() -> None:
    # 20 tokens in 10 s: the first ten are one character each, the last ten nine each
    # (indentation, then words), one token a second. By characters the first half of the
    # request would hold 10 / 100 of the tokens; re-tokenizing the prefix gives 10 of 20.
    text = "x" * 10 + "word word" * 10
    ends = list(range(1, 11)) + [10 + 9 * i for i in range(1, 11)]
    timeline = tuple((float(i + 1), end) for i, end in enumerate(ends))

    def count(chars: int) -> int:
        return sum(1 for end in ends if end <= chars)

    exact = claims.RequestSpan(sent=0.0, first=1.0, last=20.0, tokens=20, chars=len(text),
                               timeline=timeline, prefix_tokens=count)
    apportioned = claims.RequestSpan(sent=0.0, first=1.0, last=20.0, tokens=20, chars=len(text),
                                     timeline=timeline)
    assert exact.tokens_between(0.5, 10.5) == 10
    assert exact.tokens_between(10.5, 20.5) == 10
    assert apportioned.tokens_between(0.5, 10.5) == pytest.approx(2.0)


def _partly_idle(busy_accounting: bool) -> list[dict[str, object]]:
    # Requests of 25 s at 10 tok/s with 15 s idle between them; windows every 10 s.
    spans = [_span(100.0 + 40 * i, 125.0 + 40 * i, 250) for i in range(4)]
    windows = []
    for end in range(110, 260, 10):
        a, b = end - 10 + 0.5, end + 0.5
        delivered = sum(s.tokens_between(a, b) for s in spans)
        busy = sum(s.busy_overlap(a, b) for s in spans) / 10
        if busy == 0:
            continue
        tps = delivered / (10 * busy) if busy_accounting else delivered / 10
        windows.append(_window(float(end), round(tps, 1), line=end))
    return claims.classify_windows(windows, spans)


def test_busy_time_accounting_is_recognised_in_partly_idle_windows() -> None:
    cause = claims.busy_time_accounting(_partly_idle(True), 1.0)
    assert cause is not None and cause["present"]
    assert cause["explains_ratio"]
    assert cause["observed_ratio"] > 1.1


def test_wall_time_accounting_is_not_mistaken_for_busy_time() -> None:
    cause = claims.busy_time_accounting(_partly_idle(False), 1.0)
    assert cause is not None and not cause["present"]


def test_usage_above_the_retokenized_count_makes_unseen_tokens_present() -> None:
    runs = [
        {"index": 0, "tokens": 500, "reasoning_tokens": 0, "usage_excess": 60, "usage_flag": True},
        {"index": 1, "tokens": 500, "reasoning_tokens": 0, "usage_excess": 60, "usage_flag": True},
    ]
    cause = claims.unseen_tokens(runs, 1.12)
    assert cause["present"] and cause["explains_ratio"]
    assert cause["evidence"]["runs_flagged"] == [0, 1]


def test_a_server_still_generating_after_the_client_finished_has_orphans() -> None:
    runs = [{"index": 0, "tokens": 100, "abandoned": True, "metrics": {"running_before": 0}}]
    after = {"running_after": 1.0, "generation_while_idle": 40.0, "idle_s": 2.0}
    assert claims.orphans(runs, after, [], None)["present"]
    quiet = {"running_after": 0.0, "generation_while_idle": 0.0, "idle_s": 2.0}
    assert not claims.orphans([{**runs[0], "abandoned": False}], quiet, [], None)["present"]
    trailing = [_window(500.0, 12.0, line=9)]
    assert claims.orphans([{**runs[0], "abandoned": False}], None, trailing, None)["present"]


def test_chunk_counting_is_named_when_chunks_carry_several_tokens() -> None:
    runs = [{"tokens": 512, "content_chunks": 160}]
    assert claims.chunk_counting(runs)["present"]
    assert not claims.chunk_counting([{"tokens": 512, "content_chunks": 512}])["present"]


def test_stats_windows_take_their_length_from_the_log_and_pair_spec_decode_lines() -> None:
    events = [
        {"kind": "stats", "ts": 100.0, "generation_tps": 40.0, "running": 1, "line": 1},
        {"kind": "specdec", "accepted": 270, "drafted": 400, "per_position": [0.8, 0.6, 0.4, 0.2], "line": 2},
        {"kind": "stats", "ts": 105.0, "generation_tps": 41.0, "running": 1, "line": 3},
        {"kind": "stats", "ts": 110.0, "generation_tps": 0.0, "running": 0, "line": 4},
    ]
    windows = claims.stats_windows(events)
    assert [w.interval for w in windows] == [5.0, 5.0, 5.0]
    assert (windows[0].accepted, windows[0].drafted) == (270, 400)
    assert windows[1].drafted is None


def test_the_timeline_stamps_instants_as_the_engine_log_does() -> None:
    from lab.engines import parse_log
    from lab.sim import logfmt

    lab_epoch = datetime(2025, 12, 2, 14, 53, 7, tzinfo=UTC).timestamp() + 0.25
    line = logfmt.vllm(
        "INFO",
        lab_epoch,
        "loggers.py:123",
        "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 1.0 tokens/s, "
        "Running: 1 reqs, Waiting: 0 reqs",
    )
    (event,) = [e for e in parse_log("vllm", [line]) if e["kind"] == "stats"]
    timeline = LabTimeline(lambda s: s * 30.0, lambda: lab_epoch, clock=lambda: 50.0)
    assert timeline.log_seconds(50.0) == pytest.approx(event["ts"] + 0.25)
    assert timeline.log_seconds(51.0) - timeline.log_seconds(50.0) == pytest.approx(30.0)


def _spec_window(end: float, drafted: int, accepted: int, per_position: list[float]) -> claims.StatsWindow:
    w = _window(end, 30.0)
    w.drafted, w.accepted, w.per_position = drafted, accepted, per_position
    return w


def test_draft_acceptance_pools_the_windows_wholly_within_the_workloads_requests() -> None:
    """Each window's drafts are accepted over the sum of its per-position rates (each rate is
    accepted-at-j over drafts), not drafted / k: n-gram drafts often propose fewer than k
    tokens, and drafted / k would undercount the drafts and inflate the acceptance."""
    # Two requests 100-130 and 131-160 (a warm-up and a measured run: the same workload).
    spans = [_span(100.0, 130.0, 300, measured=False), _span(131.0, 160.0, 300)]
    windows = [
        _spec_window(105.0, 400, 15, [0.1, 0.05, 0.0, 0.0]),  # starts before the workload: out
        _spec_window(115.0, 300, 200, [0.9, 0.6, 0.3, 0.2]),  # 100 drafts, some shorter than k = 4
        _spec_window(125.0, 600, 340, [0.8, 0.5, 0.25, 0.15]),  # 200 drafts
        _spec_window(160.0, 400, 0, [0.0, 0.0, 0.0, 0.0]),  # may end after the last byte: out
    ]
    got = claims.draft_acceptance(windows, spans)
    assert got is not None and got["windows"] == 2 and got["drafts"] == 300.0
    pooled = [(0.9 + 2 * 0.8) / 3, (0.6 + 1.0) / 3, 0.8 / 3, 0.5 / 3]  # weighted by drafts
    assert got["per_position"] == pytest.approx(pooled, abs=1e-4)
    assert got["mean_acceptance_length"] == pytest.approx(1.0 + 540 / 300, abs=1e-4)
    assert got["mean_acceptance_length"] < 1.0 + 540 / ((300 + 600) / 4)  # what drafted / k claimed
    # No spec-decode line in the workload's windows (no speculation): nothing to say.
    assert claims.draft_acceptance([_window(115.0, 30.0)], spans) is None
    assert claims.draft_acceptance(windows, []) is None
    # Counts without per-position rates (vLLM V0's line): no drafts count can be derived.
    assert claims.draft_acceptance([_spec_window(115.0, 400, 300, [])], spans) is None


def test_draft_acceptance_uses_the_drafts_counter_from_metrics() -> None:
    """vllm:spec_decode_num_drafts_total is the denominator: 1 + accepted / drafts."""
    runs = [{"metrics": {"drafts": 120.0, "accepted": 150.0, "drafted": 380.0}},
            {"metrics": {"drafts": 80.0, "accepted": 90.0, "drafted": 250.0}}]
    got = claims.draft_acceptance([], [], runs=runs)
    assert got is not None and got["source"] == "metrics"
    assert got["drafts"] == 200.0 and got["mean_acceptance_length"] == pytest.approx(1.0 + 240 / 200)
    # SGLang serves no draft counters: nothing from /metrics.
    assert claims.draft_acceptance([], [], runs=[{"metrics": {"drafts": None, "accepted": None}}]) is None


def test_metrics_read_vllm_and_sglang_names() -> None:
    vllm = claims.MetricsSnapshot(0.0, claims.parse_prometheus(
        'vllm:spec_decode_num_drafts_total{engine="0"} 10\nvllm:num_requests_running{engine="0"} 1\n'
        'vllm:generation_tokens_total{engine="0"} 500\n'))
    vllm_after = claims.MetricsSnapshot(1.0, claims.parse_prometheus(
        'vllm:spec_decode_num_drafts_total{engine="0"} 25\nvllm:num_requests_running{engine="0"} 0\n'
        'vllm:generation_tokens_total{engine="0"} 560\n'))
    deltas = claims.counter_deltas(vllm, vllm_after)
    assert deltas["drafts"] == 15.0 and deltas["generation"] == 60.0
    assert (deltas["running_before"], deltas["running_after"]) == (1.0, 0.0)
    sglang = claims.MetricsSnapshot(0.0, claims.parse_prometheus(
        'sglang:num_running_reqs{model_name="m"} 1\nsglang:generation_tokens_total{model_name="m"} 100\n'
        'sglang:spec_accept_length{model_name="m"} 2.75\n'))
    sglang_after = claims.MetricsSnapshot(1.0, claims.parse_prometheus(
        'sglang:num_running_reqs{model_name="m"} 0\nsglang:generation_tokens_total{model_name="m"} 180\n'
        'sglang:spec_accept_length{model_name="m"} 2.5\n'))
    got = claims.counter_deltas(sglang, sglang_after)
    assert got["generation"] == 80.0 and got["accepted"] is None and got["drafts"] is None
    assert (got["running_before"], got["running_after"]) == (1.0, 0.0)
    assert got["accept_length"] == 2.5


def test_sglang_windows_are_counted_in_steps_not_on_a_clock() -> None:
    """SGLang writes its Decode batch line every 40 decode steps: each window runs from the
    line before (spacing follows the step time), and the first line's start is unknown."""
    events: list[dict[str, Any]] = [
        {"kind": "stats", "ts": 100.0, "generation_tps": 40.0, "running": 1, "line": 1},
        {"kind": "specdec", "accepted": None, "drafted": None, "mean_acceptance_length": 2.5,
         "per_position": [], "line": 1},
        {"kind": "stats", "ts": 103.0, "generation_tps": 41.0, "running": 1, "line": 2},
        {"kind": "specdec", "accepted": None, "drafted": None, "mean_acceptance_length": 2.0,
         "per_position": [], "line": 2},
        {"kind": "stats", "ts": 111.0, "generation_tps": 12.0, "running": 1, "line": 3},
        {"kind": "specdec", "accepted": None, "drafted": None, "mean_acceptance_length": 3.0,
         "per_position": [], "line": 3},
    ]
    windows = claims.stats_windows(events, step_counted=True)
    assert [(w.start, w.end) for w in windows] == [(100.0, 103.0), (103.0, 111.0)]
    spans = [_span(99.0, 120.0, 600)]
    got = claims.draft_acceptance(windows, spans)
    assert got is not None and got["source"] == "log"
    assert got["mean_acceptance_length"] == pytest.approx((2.0 * 3 + 3.0 * 8) / 11, abs=1e-4)


def _sglang_events(accept_len: float, accept_rate: float, claimed_tps: float,
                   ends: list[float]) -> list[dict[str, Any]]:
    """SGLang Decode batch lines as parse_log gives them: stats, then `accept len`/`accept rate`."""
    events: list[dict[str, Any]] = []
    for i, end in enumerate(ends):
        events.append({"kind": "stats", "ts": end, "generation_tps": claimed_tps, "running": 1, "line": i})
        events.append({"kind": "specdec", "accepted": None, "drafted": None, "per_position": [],
                       "mean_acceptance_length": accept_len, "acceptance_rate": accept_rate, "line": i})
    return events


@pytest.mark.parametrize(("k", "accept_len", "proposed"), [(4, 3.0, True), (2, 2.2, True), (4, 3.0, False)])
def test_sglangs_accept_len_and_rate_reconcile_its_claim(k: int, accept_len: float, proposed: bool) -> None:
    """SGLang logs no accepted/drafted counts: its `accept len` E (tokens per verify step)
    and `accept rate` r (accepted over drafted) give them over the delivered tokens N of a
    window, and a server counting k + 1 per step claims (k + 1) / E of delivery."""
    delivered_tps = 24.0
    claimed_tps = delivered_tps * (k + 1) / accept_len if proposed else delivered_tps
    rate = (accept_len - 1) / k
    # Lines 4.2 s apart (40 steps), stamped to the second: widths of 4 and 5 s.
    ends = [100.0 + round(4.2 * i) for i in range(12)]
    windows = claims.stats_windows(_sglang_events(round(accept_len, 2), round(rate, 2), claimed_tps, ends),
                                   step_counted=True)
    assert {w.interval for w in windows} == {4.0, 5.0}
    assert all(w.acceptance_rate == round(rate, 2) for w in windows)
    spans = [_span(90.0, 160.0, int(delivered_tps * 70))]
    log = claims.log_claim(claims.classify_windows(windows, spans))
    assert log is not None and log["windows"] >= 8
    assert log["counts_from"] is not None and "accept len" in log["counts_from"]
    # Per window: accepted = N (E - 1) / E, drafted = accepted / r = N k / E.
    assert log["accepted"] == pytest.approx(log["delivered_tokens"] * (accept_len - 1) / accept_len, rel=0.01)
    assert log["drafted"] == pytest.approx(log["delivered_tokens"] * k / accept_len, rel=0.02)
    cause = claims.proposed_counting(log)
    assert cause is not None
    assert cause["predicted_ratio"] == pytest.approx((k + 1) / accept_len, rel=0.02)
    assert cause["present"] is proposed and cause["explains_ratio"] is proposed
    assert cause["evidence"]["counts_from"] == log["counts_from"]


def test_sglang_windows_without_acceptance_give_no_counts() -> None:
    """No `accept rate` (nothing to derive the drafts from), or no speculation: no counts,
    so no proposed-counting test from the log."""
    spans = [_span(90.0, 160.0, 1680)]
    for rate in (None, 0.0):
        events = _sglang_events(2.5, 0.5, 40.0, [100.0 + 5 * i for i in range(10)])
        for e in events:
            if e["kind"] == "specdec":
                e["acceptance_rate"] = rate
        windows = claims.stats_windows(events, step_counted=True)
        log = claims.log_claim(claims.classify_windows(windows, spans))
        assert log is not None and log["accepted"] is None and log["drafted"] is None
        assert claims.proposed_counting(log) is None
    ends = [100.0 + 5 * i for i in range(10)]
    plain = [e for e in _sglang_events(1.0, 0.0, 24.0, ends) if e["kind"] == "stats"]
    log = claims.log_claim(claims.classify_windows(claims.stats_windows(plain, step_counted=True), spans))
    assert log is not None and log["counts_from"] is None and claims.proposed_counting(log) is None


def test_step_counted_windows_weigh_rates_by_their_length() -> None:
    """A claim over windows of different lengths is tokens over seconds, not a mean of rates."""
    windows = [claims.StatsWindow(end=110.0, interval=10.0, generation_tps=30.0, running=1, engine="0"),
               claims.StatsWindow(end=112.0, interval=2.0, generation_tps=60.0, running=1, engine="0")]
    spans = [_span(90.0, 160.0, 1400)]
    log = claims.log_claim(claims.classify_windows(windows, spans))
    assert log is not None
    assert log["claimed_tps"] == pytest.approx((30.0 * 10 + 60.0 * 2) / 12)
    assert log["window_widths_s"] == [10.0, 2.0]
