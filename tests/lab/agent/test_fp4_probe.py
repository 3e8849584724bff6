"""The FP4 probe's inputs. The GEMM itself needs torch with CUDA and cannot run here; what
can be checked is that the inputs are exact NVFP4 data, so any correct quantizer (the
engines' recipe is re-implemented below with numpy) recovers them bit for bit, and a
wrong result can only come from the backend."""

from __future__ import annotations

import numpy as np
import pytest

from lab.agent import validate_response
from lab.agent.agent import probe_inputs

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e4m3_round(x: np.ndarray) -> np.ndarray:
    """Round positive numbers to FP8 E4M3 (3 mantissa bits, subnormals below 2^-6)."""
    exp = np.maximum(np.floor(np.log2(x)), -6)
    step = 2.0 ** (exp - 3)
    return np.minimum(np.round(x / step) * step, 448.0)


def e2m1_round(x: np.ndarray) -> np.ndarray:
    idx = np.abs(np.abs(x)[..., None] - E2M1).argmin(-1)
    return np.sign(x) * E2M1[idx]


def nvfp4_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """The engines' NVFP4 recipe: per-tensor inverse scale 448*6/amax, E4M3 block scale
    amax_block/6 after it, E2M1 values. Returns values, block scales, global scale."""
    x32 = x.astype(np.float32)
    inv = np.float32(448.0 * 6.0) / np.abs(x32).max()
    blocks = x32.reshape(x.shape[0], -1, 16)
    scales = e4m3_round(np.abs(blocks).max(-1) * inv / 6.0).astype(np.float32)
    values = e2m1_round(blocks * inv / scales[..., None])
    return values.reshape(x.shape), scales, float(1.0 / inv)


@pytest.fixture(scope="module")
def inputs() -> dict:
    return probe_inputs(seed=7, size=128)


def test_a_quantizes_back_to_exactly_its_own_values_and_scales(inputs: dict) -> None:
    a = inputs["a_fp4"]
    values, scales, g = np.array(a["values"]), np.array(a["block_scales"]), a["global_scale"]
    dequant = values * np.repeat(scales, 16, axis=1) * g
    q_values, q_scales, q_g = nvfp4_quantize(dequant)
    assert q_g == g
    assert np.array_equal(q_scales, scales)
    assert np.array_equal(q_values, values)


def test_b_is_exact_in_bf16_and_in_nvfp4(inputs: dict) -> None:
    b = np.array(inputs["b"], dtype=np.float64)
    b32 = b.astype(np.float32)
    assert np.array_equal(b32.astype(np.float64), b)
    assert not (b32.view(np.uint32) & 0xFFFF).any()  # bf16 keeps the top 16 bits of fp32
    values, scales, g = nvfp4_quantize(b)
    assert np.array_equal(values * np.repeat(scales, 16, axis=1) * g, b)


def test_the_inputs_depend_only_on_the_seed(inputs: dict) -> None:
    assert probe_inputs(seed=7, size=128) == inputs
    assert probe_inputs(seed=8, size=128)["b"] != inputs["b"]


def test_the_answer_it_would_give_fits_the_schema(inputs: dict) -> None:
    a = inputs["a_fp4"]
    dequant = np.array(a["values"]) * np.repeat(np.array(a["block_scales"]), 16, axis=1) \
        * a["global_scale"]
    output = (dequant @ np.array(inputs["b"]).T).tolist()
    validate_response({"schema": "lab.agent/1", "verb": "fp4-probe", "ok": True,
                       "data": {"backend": "reference", "m": 128, "n": 128, "k": 128,
                                **inputs, "output": output}})
