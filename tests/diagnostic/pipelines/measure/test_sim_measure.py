"""The measurement against the simulated lab's own serving endpoint (lab.sim.http)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from diagnostic.pipelines.measure.protocol import measure_endpoint
from tests.diagnostic.pipelines import simlab


def _measure(sim: Any, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "n": 3,
        "warmup": 1,
        "max_tokens": 512,
        "metrics_url": sim.url + "/metrics",
        "log_source": sim.log_source,
        "to_lab": sim.clock.lab_seconds,
        "lab_now": sim.clock.now,
        "settle_s": 0.3,
    }
    args.update(kw)
    return measure_endpoint(sim.url, tokenizer_path=sim.tokenizer, **args)


@pytest.fixture(scope="module")
def speculative() -> Iterator[tuple[dict[str, Any], Any]]:
    """EAGLE-3 k = 4, dilation 30: the reference lab's speculation, counted as the modelled
    releases count (the tokens each step emits)."""
    with simlab.sim_endpoint(dilation=30, k=4) as sim:
        yield _measure(sim), sim


def test_chunk_counting_would_undercount_under_speculation_and_we_do_not(
    speculative: tuple[dict[str, Any], Any],
) -> None:
    result, _ = speculative
    for workload in ("code", "prose"):
        section = result[workload]
        for run in section["runs"]:
            assert run["tokens"] == 512 == run["usage_completion_tokens"]
            assert run["content_chunks"] < 0.7 * run["tokens"]
        assert section["chunk_tps_mean"] < 0.7 * section["mean_tps"]
    detail = result["reconciliation_detail"]["code"]
    chunks = [c for c in detail if c["code"] == "metrics.client_counts_chunks"]
    assert chunks[0]["present"] and not chunks[0]["explains_ratio"]
    assert "metrics.client_counts_chunks" not in result["reconciliation"]


def test_the_delivered_rate_follows_the_lab_formula(speculative: tuple[dict[str, Any], Any]) -> None:
    result, sim = speculative
    for workload in ("code", "prose"):
        # n = 3 with 3 % run noise: a loose check here; benchmarks/bench_measure.py holds the tight one.
        assert result[workload]["mean_tps"] == pytest.approx(sim.expected(workload), rel=0.08)


def test_a_modelled_release_counts_honestly_and_its_claim_agrees_with_delivery(
    speculative: tuple[dict[str, Any], Any],
) -> None:
    # vLLM counts each step's new tokens (v1/metrics/stats.py): at one request at a time the
    # log's generation throughput is what the client receives, and no cause is accused.
    result, _ = speculative
    for workload in ("code", "prose"):
        log = result[workload]["server_claim"]["log"]
        assert log is not None and log["windows"] >= 2
        assert log["claimed_tps"] == pytest.approx(result[workload]["mean_tps"], rel=0.1)
        assert result["server_claim_source"][workload] == "log"
        cause = next(
            c
            for c in result["reconciliation_detail"][workload]
            if c["code"] == "metrics.server_counts_proposed"
        )
        assert not cause["present"]
    assert "metrics.server_overclaim" not in [f["code"] for f in result["findings"]]


def test_an_abandoned_request_on_the_simulated_lab_is_an_orphan() -> None:
    with simlab.sim_endpoint(dilation=30, k=0, abort_on_disconnect=False) as sim:
        result = _measure(sim, workloads=["prose"], n=2, warmup=0, request_timeout_s=0.1)
    cause = next(
        c for c in result["reconciliation_detail"]["prose"] if c["code"] == "metrics.orphaned_requests"
    )
    assert result["prose"]["runs_abandoned"] == [0, 1]
    assert cause["present"]
    assert cause["evidence"]["running_before_runs"] == [1]


def test_the_acceptance_is_per_draft_from_vllms_drafts_counter(
    speculative: tuple[dict[str, Any], Any],
) -> None:
    """vllm:spec_decode_num_drafts_total is the denominator of the acceptance length."""
    result, sim = speculative
    accepts = sim.scenario.truth["specdec"]["acceptance"]["eagle3"]
    for workload in ("code", "prose"):
        metrics = result[workload]["server_claim"]["metrics"]
        acceptance = result[workload]["draft_acceptance"]
        assert acceptance["source"] == "metrics+log"
        assert acceptance["drafts"] == metrics["drafts"] > 0
        assert acceptance["mean_acceptance_length"] == pytest.approx(
            1.0 + metrics["accepted"] / metrics["drafts"], abs=1e-3)
        emitted, chain = 1.0, 1.0
        for a in accepts[workload][:4]:
            chain *= a
            emitted += chain
        assert acceptance["mean_acceptance_length"] == pytest.approx(emitted, rel=0.05)
