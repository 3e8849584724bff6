"""Decode physics against LAB_MODEL.md section 3 and the figures section 8 prints.

The inputs are written out here from the document's tables (not taken from the scenario
loader), so these tests check the formulas against the spec itself.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from lab.sim.physics import (
    DecodePlan,
    decode_plan,
    expected_emitted,
    kv_capacity_tokens,
    sample_request,
    ttft_ms,
)

MODEL: dict[str, Any] = {
    "layers": 61,
    "vocab": 163840,
    "kv_bytes_per_token": {"fp8": 35136, "bf16": 70272},
    "checkpoint_gb": 597.0,
    "decode_bytes_per_token_gb": 32.0,
}
NODE: dict[str, Any] = {"mem_gib": 121.7, "mem_bw_gbs": 273.0, "mem_bw_efficiency": 0.75}
NETWORK: dict[str, Any] = {"collective_latency_us": 120.0, "hop_latency_us": 30.0}
DECODE: dict[str, Any] = {
    "ep_imbalance": 2.0,
    "collectives_per_layer": 2,
    "step_overhead_ms": 8.0,
    "eager_penalty_ms": 12.0,
    "verify_growth": 0.2,
    "run_sigma": 0.03,
    "step_sigma": 0.05,
    "prefill_tps": 900.0,
}
SPECDEC: dict[str, Any] = {
    "draft_ms": {"eagle3": 2.5, "ngram": 0.3},
    "acceptance": {
        "eagle3": {
            "code": [0.86, 0.76, 0.66, 0.45, 0.34, 0.26, 0.2],
            "prose": [0.75, 0.55, 0.40, 0.28, 0.2, 0.15, 0.1],
        },
        "ngram": {"code": [0.5, 0.35, 0.25, 0.18], "prose": [0.2, 0.1, 0.05, 0.03]},
    },
}


def plan(
    method: str | None = None,
    k: int = 0,
    workload: str = "code",
    *,
    speed: float = 1.0,
    tp: int = 8,
    pp: int = 1,
    eager: bool = False,
) -> DecodePlan:
    return decode_plan(MODEL, NODE, NETWORK, DECODE, SPECDEC, speed, tp, pp, eager, method, k, workload)


def test_reference_layout_without_speculation_decodes_at_16_2_tok_s() -> None:
    p = plan()
    assert p.t_mem == pytest.approx(32.0 * 2.0 / (8 * 273 * 0.75) * 1000)
    assert p.t_comm == pytest.approx(61 * 2 * 120 / 1000)
    assert p.t_step == pytest.approx(p.t_mem + p.t_comm + 8.0)
    assert round(p.rate, 1) == 16.2


@pytest.mark.parametrize(
    ("k", "workload", "printed"),
    [(4, "code", 25.9), (4, "prose", 19.6), (3, "code", 27.7), (2, "prose", 23.7)],
)
def test_eagle3_delivers_section_8_rates(k: int, workload: str, printed: float) -> None:
    assert round(plan("eagle3", k, workload).rate, 1) == printed


def test_marlin_backend_costs_about_8_percent_on_code_k3() -> None:
    marlin = plan("eagle3", 3, "code", speed=1.15)
    native = plan("eagle3", 3, "code")
    assert round(marlin.rate, 1) == 25.5
    assert round(1 - marlin.rate / native.rate, 2) == 0.08


def test_server_counting_proposed_tokens_claims_about_41_at_k4() -> None:
    assert round(plan("eagle3", 4, "code").proposed_rate) == 41
    # Proposed counting does not depend on acceptance, so prose claims the same.
    assert round(plan("eagle3", 4, "prose").proposed_rate) == 41


def test_expected_emitted_is_one_plus_accepted_prefix_probabilities() -> None:
    assert expected_emitted([]) == 1.0
    assert expected_emitted([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert plan("eagle3", 4, "code").expected_emitted == pytest.approx(
        1 + 0.86 + 0.86 * 0.76 + 0.86 * 0.76 * 0.66 + 0.86 * 0.76 * 0.66 * 0.45
    )


def test_draft_positions_beyond_the_acceptance_list_accept_nothing() -> None:
    long = plan("ngram", 6, "code")
    assert long.acceptance[4:] == (0.0, 0.0)
    assert long.expected_emitted == pytest.approx(plan("ngram", 4, "code").expected_emitted)
    # ...but they still cost verification and drafting time.
    assert long.step_ms > plan("ngram", 4, "code").step_ms


def test_speculation_step_is_verification_plus_drafting() -> None:
    p = plan("eagle3", 4, "prose")
    assert p.t_verify == pytest.approx(p.t_step * (1 + 0.2 * 4))
    assert p.t_draft == pytest.approx(4 * 2.5)
    assert p.rate == pytest.approx(p.expected_emitted / (p.t_verify + p.t_draft) * 1000)


def test_single_rank_has_no_expert_imbalance_and_no_collectives() -> None:
    p = plan(tp=1)
    assert p.t_mem == pytest.approx(32.0 / (273 * 0.75) * 1000)
    assert p.t_comm == 0.0


def test_pipeline_stages_add_one_hop_each() -> None:
    assert plan(tp=4, pp=2).t_comm == pytest.approx(61 * 2 * 0.120 + 1 * 0.030)


def test_enforce_eager_adds_its_penalty_to_every_step() -> None:
    assert plan(eager=True).t_step == pytest.approx(plan().t_step + 12.0)


def test_fp4_speed_factor_multiplies_only_weight_streaming() -> None:
    slow, fast = plan(speed=1.15), plan()
    assert slow.t_mem == pytest.approx(fast.t_mem * 1.15)
    assert slow.t_comm == fast.t_comm


def test_unknown_speculative_method_is_refused() -> None:
    with pytest.raises(ValueError, match="mtp"):
        plan("mtp", 2)


def test_ttft_is_prefill_plus_one_step() -> None:
    assert ttft_ms(90, 900.0, 61.712) == pytest.approx(100.0 + 61.712)


def test_schedule_without_noise_follows_the_formula_exactly() -> None:
    p = plan("eagle3", 4, "code")
    schedule = sample_request(
        p,
        tokens=200,
        prompt_tokens=45,
        prefill_tps=900.0,
        run_sigma=0.0,
        step_sigma=0.0,
        rng=random.Random(1),
    )
    first, *rest = schedule.steps
    assert first.emitted == 1
    assert first.lab_ms == pytest.approx(ttft_ms(45, 900.0, p.t_step))
    assert all(s.lab_ms == pytest.approx(p.step_ms) for s in rest)
    assert sum(s.emitted for s in schedule.steps) == 200
    assert all(s.drafted == 4 and 1 <= s.emitted <= 5 for s in rest)


def test_last_step_is_cut_at_the_token_budget_but_takes_full_time() -> None:
    p = plan("eagle3", 4, "code")
    for seed in range(50):
        schedule = sample_request(
            p,
            tokens=7,
            prompt_tokens=1,
            prefill_tps=900.0,
            run_sigma=0.0,
            step_sigma=0.0,
            rng=random.Random(seed),
        )
        assert sum(s.emitted for s in schedule.steps) == 7
        assert schedule.steps[-1].emitted <= schedule.steps[-1].accepted + 1
        assert schedule.steps[-1].lab_ms == pytest.approx(p.step_ms)


def test_tokens_per_step_average_to_expected_emitted() -> None:
    p = plan("eagle3", 4, "code")
    schedule = sample_request(
        p,
        tokens=60_000,
        prompt_tokens=1,
        prefill_tps=900.0,
        run_sigma=0.0,
        step_sigma=0.0,
        rng=random.Random(3),
    )
    decode_steps = schedule.steps[1:]
    mean = sum(s.accepted + 1 for s in decode_steps) / len(decode_steps)
    # About 19000 steps with sd 1.33 each: the mean is within 0.03 at 3 sigma.
    assert mean == pytest.approx(p.expected_emitted, abs=0.03)
    per_position = [sum(1 for s in decode_steps if s.accepted >= j) / len(decode_steps) for j in range(1, 5)]
    cumulative = [math.prod(p.acceptance[:j]) for j in range(1, 5)]
    assert per_position == pytest.approx(cumulative, abs=0.015)


def test_run_factor_scales_every_decode_step_the_same_way() -> None:
    p = plan("eagle3", 2, "prose")
    schedule = sample_request(
        p,
        tokens=100,
        prompt_tokens=1,
        prefill_tps=900.0,
        run_sigma=0.5,
        step_sigma=0.0,
        rng=random.Random(11),
    )
    assert schedule.run_factor != 1.0
    assert all(s.lab_ms == pytest.approx(p.step_ms / schedule.run_factor) for s in schedule.steps[1:])


def test_same_seed_gives_the_same_schedule() -> None:
    p = plan("eagle3", 4, "prose")

    def draw(seed: int) -> list[tuple[float, int]]:
        schedule = sample_request(
            p,
            tokens=300,
            prompt_tokens=20,
            prefill_tps=900.0,
            run_sigma=0.03,
            step_sigma=0.05,
            rng=random.Random(seed),
        )
        return [(s.lab_ms, s.emitted) for s in schedule.steps]

    assert draw(5) == draw(5)
    assert draw(5) != draw(6)


def test_prompt_only_request_is_a_prefill_without_tokens() -> None:
    schedule = sample_request(
        plan(),
        tokens=0,
        prompt_tokens=90,
        prefill_tps=900.0,
        run_sigma=0.03,
        step_sigma=0.05,
        rng=random.Random(0),
    )
    assert [(s.lab_ms, s.emitted) for s in schedule.steps] == [(pytest.approx(100.0), 0)]


def test_kv_capacity_halves_with_bf16_cache_and_doubles_across_two_stages() -> None:
    def capacity(dtype: str, pp: int = 1) -> int:
        return kv_capacity_tokens(
            MODEL, NODE, nodes_used=8, pp=pp, gpu_memory_utilization=0.85, kv_cache_dtype=dtype
        )

    fp8 = capacity("fp8")
    assert fp8 > 100_000
    assert capacity("bf16") == pytest.approx(fp8 / 2, abs=1)
    assert capacity("fp8", pp=2) == pytest.approx(fp8 * 2, abs=2)
