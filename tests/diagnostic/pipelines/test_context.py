"""The fit computation of the native context (diagnostic.pipelines.native_context), from the
engine's figures and the node's memory, and the configuration's `requirements` field.

Figures as the reference lab's engine states them (LAB_MODEL.md sections 1-2, Kimi K2 on
eight nodes): 69.5 GiB of weights a node, 35,136 bytes a token of fp8 KV and 70,272 of bf16,
KV memory = fraction x 102 GiB - weights - 2.82 GiB of the engine's own reserves (which the
fit never sees), and a node that shows 121.7 GiB total, 118.1 free with no engine running.
"""

from __future__ import annotations

import pytest

from diagnostic.pipelines.native_context import (
    GIB,
    EngineKv,
    NodeMemory,
    capacity_lines,
    context_target,
    kv_from_log,
    kv_from_refusal,
    plan_fit,
    utilization_ceiling,
    would_fit_words,
)
from lab.catalog import KvBytes, ModelProfile
from lab.config import ConfigError
from lab.engines import load_config_text, normalize_config
from lab.engines.lines import fill, formats
from tests.diagnostic.conftest import REFERENCE_CONFIG

NATIVE = 262144
FP8, BF16 = 35136, 70272
PROFILE = ModelProfile(max_context=NATIVE, kv_bytes_per_token=KvBytes(fp8=FP8, bf16=BF16),
                       checkpoint_gb=597.0)
WEIGHTS = 597e9 / 8 / GIB  # 69.5 GiB a node
NODE = NodeMemory(total_gib=121.7, available_gib=118.1)
RESERVES = 2.82  # the engine's activations and graph pool: in its figures, not in the fit's


def engine_kv(fraction: float, dtype: str, *, weights: float = WEIGHTS, cap: float | None = None) -> EngineKv:
    """What the engine would say at `fraction` (its available KV memory, its bytes a token)."""
    available = 102.0 * fraction - weights - RESERVES
    if cap is not None:
        available = min(available, cap)
    return EngineKv(fraction, dtype, round(available, 2), float(FP8 if dtype == "fp8" else BF16), weights,
                    "refusal")


def true_available(fraction: float, weights: float = WEIGHTS) -> float:
    return 102.0 * fraction - weights - RESERVES


def needed(tokens: int, dtype: str) -> float:
    return tokens * (FP8 if dtype == "fp8" else BF16) / GIB


def plan(kv: EngineKv, target: int = NATIVE, memory: NodeMemory | None = NODE, nodes: int = 8) -> dict:
    return plan_fit(kv, target=target, memory=memory, profile=PROFILE, nodes=nodes, lab_nodes=8)


def test_a_configuration_that_holds_its_target_changes_nothing() -> None:
    fitted = plan(engine_kv(0.85, "fp8"))
    assert fitted["settings"] == {} and fitted["would_fit"] is None


def test_bf16_that_does_not_fit_needs_only_an_fp8_kv_cache() -> None:
    kv = engine_kv(0.85, "bf16")
    assert kv.available_gib < needed(NATIVE, "bf16")
    fitted = plan(kv)
    assert fitted["settings"] == {"kv_cache_dtype": "fp8"}
    # bf16 at a higher fraction fits too, and is offered as the alternative; the engine gives
    # at least what was predicted there.
    (alt,) = fitted["alternatives"]
    assert alt["kv_cache_dtype"] == "bf16" and alt["gpu_memory_utilization"] > 0.85
    assert true_available(alt["gpu_memory_utilization"]) >= needed(NATIVE, "bf16")


def test_fp8_that_does_not_fit_needs_the_lowest_fraction_that_holds_it() -> None:
    kv = engine_kv(0.78, "fp8")
    assert kv.available_gib < needed(NATIVE, "fp8")
    fitted = plan(kv)
    assert fitted["settings"] == {"gpu_memory_utilization": 0.8}
    # The inferred memory base leaves out the engine's reserves, so the prediction is a lower
    # bound on what the engine then gives: the fraction proposed truly fits ...
    assert true_available(0.8) >= needed(NATIVE, "fp8")
    assert fitted["chosen"]["predicted_kv_gib"] <= true_available(0.8)
    # ... and it is the lowest in hundredths whose prediction holds the target.
    assert kv.available_at(0.79) < needed(NATIVE, "fp8")


def test_the_fraction_stops_at_what_the_node_leaves_free() -> None:
    kv = engine_kv(0.78, "fp8")
    # A node that shows little memory free: the ceiling is what it leaves, less the system's share.
    tight = NodeMemory(total_gib=121.7, available_gib=82.0)
    ceiling, why = utilization_ceiling(kv, tight)
    assert ceiling == pytest.approx((82.0 - 0.05 * 121.7) / kv.base_gib, abs=0.01)
    assert ceiling < 0.8 and "free on the node" in why
    assert plan(kv, memory=tight)["settings"] is None
    # Without node facts, no higher fraction is proposed at all.
    assert utilization_ceiling(kv, None)[0] == 0.78
    bf16 = plan(engine_kv(0.85, "bf16"), memory=None)
    assert bf16["settings"] == {"kv_cache_dtype": "fp8"} and bf16["alternatives"] == []


def test_when_nothing_fits_it_says_how_many_nodes_or_how_much_weight_would() -> None:
    weights = 597e9 / 6 / GIB  # 92.7 GiB a node on six nodes
    kv = engine_kv(0.95, "fp8", weights=weights)
    fitted = plan(kv, nodes=6)
    assert fitted["settings"] is None and fitted["alternatives"] == []
    would = fitted["would_fit"]
    assert would["gpu_memory_utilization"] == 1.0
    assert would["nodes_needed"] == 7  # 597 GB over 7 nodes leaves room for 8.6 GiB of fp8 KV
    assert true_available(1.0, 597e9 / 7 / GIB) >= needed(NATIVE, "fp8")
    assert 0 < would["longest_context"] < NATIVE
    assert would["max_weights_per_node_gb"] < weights * GIB / 1e9
    words = would_fit_words(would, NATIVE)
    assert "7 nodes (this lab has them)" in words and "GB of weights a node" in words


def test_a_cap_the_fraction_does_not_move_is_only_found_by_starting() -> None:
    # A fixed KV budget (the kv_budget fault) looks like any refusal: the plan predicts a
    # fraction, which the proof start then refutes.
    kv = engine_kv(0.85, "fp8", cap=3.43)
    assert plan(kv)["settings"] == {"gpu_memory_utilization": 0.92}


def test_the_target_is_native_unless_the_customer_asked_for_less() -> None:
    config = load_config_text(REFERENCE_CONFIG.read_text())
    config["serving"]["max_model_len"] = 131072
    target = context_target(config, PROFILE)
    assert (target.target, target.below, target.required) == (NATIVE, True, None)
    config["requirements"] = {"max_context": 131072}
    asked = context_target(config, PROFILE)
    assert (asked.target, asked.below) == (131072, False) and "requirement" in asked.reason
    config["requirements"] = {"max_context": 1 << 20}
    assert context_target(config, PROFILE).target == NATIVE  # no longer than the model has
    assert context_target(config, None).target == 1 << 20
    del config["requirements"]
    assert context_target(config, None).target == 131072


def test_the_engines_refusal_and_capacity_lines_give_the_figures() -> None:
    text = REFERENCE_CONFIG.read_text()
    config = load_config_text(text.replace("kv_cache_dtype: fp8", "kv_cache_dtype: auto"))
    refusal = {"max_model_len": NATIVE, "kv_needed_gib": 17.16, "kv_available_gib": 14.38,
               "estimated_max_model_len": 219736}
    kv = kv_from_refusal(refusal, config, weights_gib=WEIGHTS, profile=PROFILE)
    assert kv is not None and kv.dtype == "bf16" and kv.utilization == 0.85
    assert kv.bytes_per_token == pytest.approx(BF16, rel=1e-3)
    # vLLM 0.34.0's own lines after a start, from its release table's format strings.
    available = fill(formats("vllm", "0.34.0", "available_kv_memory")[0], (14.38,))
    size = fill(formats("vllm", "0.34.0", "kv_cache_size")[0], ("GPU", "439,448", "131,072", 3.35))
    log = "\n".join(f"INFO 12-05 09:48:26 [gpu_worker.py:796] {line}" for line in (available, size))
    fp8 = load_config_text(REFERENCE_CONFIG.read_text())
    said = kv_from_log(log, fp8, engine="vllm", weights_gib=WEIGHTS, profile=PROFILE)
    assert said is not None and said.tokens == 439448 and said.available_gib == 14.38
    assert said.bytes_per_token == pytest.approx(FP8, rel=1e-3)
    assert len(capacity_lines(log, "vllm")) == 2
    # SGLang 0.5.23's allocation line: the pool's own (mem_cache/memory_pool.py), which names
    # the cache in a field and, for MLA pools, gives one KV size.
    text = next(t for t in formats("sglang", "0.5.23", "kv_cache_allocated")
                if t.startswith("{cache_name} is allocated") and "KV size" in t)
    line = fill(text, fields={"cache_name": "KV Cache", "self.dtype": "torch.float8_e4m3fn",
                              "num_tokens": 439448, "kv_size_GB": 14.38})
    assert line.startswith("KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 439448")
    sglang = kv_from_log(f"[2026-12-05 09:48:26 TP0] {line}", fp8, engine="sglang", weights_gib=WEIGHTS,
                         profile=PROFILE)
    assert sglang is not None and sglang.tokens == 439448 and sglang.available_gib == 14.38


def test_a_requirement_is_an_optional_field_with_a_clear_error() -> None:
    text = REFERENCE_CONFIG.read_text()
    assert "requirements" not in load_config_text(text)
    assert load_config_text(text + "requirements: {max_context: 131072}\n")["requirements"] == \
        {"max_context": 131072}
    assert "requirements" not in load_config_text(text + "requirements: {}\n")
    for bad, field in (({"max_context": 0}, "requirements.max_context"),
                       ({"max_context": "256k"}, "requirements.max_context"),
                       ({"context": 1}, "requirements.context"),
                       ([131072], "requirements")):
        raw = load_config_text(text)
        raw["requirements"] = bad
        with pytest.raises(ConfigError) as error:
            normalize_config(raw)
        assert error.value.field == field
    raw = load_config_text(text)
    raw["requirements"] = {"max_context": 0}
    with pytest.raises(ConfigError, match=r"whole number 1\.\.16777216"):
        normalize_config(raw)


def test_the_gap_section_view_of_a_record() -> None:
    from diagnostic.pipelines.native_context import section_view

    target = {"native": NATIVE, "required": None, "configured": 131072, "target": NATIVE}
    proof = {"served": True, "max_model_len": NATIVE, "prompt_tokens": NATIVE - 16, "completion_tokens": 16,
             "total_tokens": NATIVE, "lab_s": 291.0, "engine_lines": []}
    view = section_view({"target": target, "proof": proof, "settings": {}, "lab_s": 700.0})
    assert (view["fits"], view["customer"], view["proof"]["total_tokens"]) == (True, 131072, NATIVE)
    assert section_view({"target": {**target, "configured": NATIVE}, "lab_s": 0.0})["fits"] is True
    assert section_view({"target": target, "shortened_to": 104857})["fits"] is False
