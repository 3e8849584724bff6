"""The kernel probe's reference and tolerance, against values worked out by hand and
against kernels that round the way a correct NVFP4 kernel may."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from diagnostic.pipelines.fp4.probe import (
    ProbeError,
    activation_rounding,
    check_answer,
    dequantize,
    e4m3_values,
)

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def answer(
    values: np.ndarray, scales: np.ndarray, global_scale: float, b: np.ndarray, output: np.ndarray
) -> dict[str, Any]:
    m, k = values.shape
    return {
        "backend": "x",
        "m": m,
        "n": b.shape[0],
        "k": k,
        "a_fp4": {
            "values": values.tolist(),
            "block_scales": scales.tolist(),
            "global_scale": global_scale,
            "block_size": 16,
        },
        "b": b.tolist(),
        "output": output.tolist(),
    }


def test_e4m3_has_its_known_extremes_and_no_more() -> None:
    values = e4m3_values()
    assert 448.0 in values and 2.0**-9 in values and 2.0**-6 in values and 1.125 in values
    assert 480.0 not in values and 1.0625 not in values  # beyond the top; between 1 and 1.125
    assert max(values) == 448.0
    # 2 * 127 non-NaN codes, with +0 and -0 the same number.
    assert len(values) == 253


def test_dequantize_by_hand() -> None:
    # One row of 32: two blocks, scales 2 and 0.5, global scale 0.25.
    values = np.array([[1.0, -0.5, 6.0] + [0.0] * 13 + [4.0, 1.5] + [0.0] * 14])
    scales = np.array([[2.0, 0.5]])
    a = dequantize(values, scales, 0.25)
    assert a[0, 0] == 0.5 and a[0, 1] == -0.25 and a[0, 2] == 3.0
    assert a[0, 16] == 0.5 and a[0, 17] == 0.1875
    b = np.zeros((1, 32))
    b[0, 0], b[0, 2], b[0, 16] = 2.0, 1.0, -4.0
    # 0.5 * 2 + 3 * 1 + 0.5 * -4 = 2
    ref = answer(values, scales, 0.25, b, np.array([[2.0]]))
    assert check_answer(ref)["passed"] and check_answer(ref)["max_abs_error"] == 0.0
    # A kernel that swapped the two block scales: 0.125 * 2 + 0.75 * 1 + 2 * -4 = -7
    swapped = answer(values, scales, 0.25, b, np.array([[-7.0]]))
    got = check_answer(swapped)
    assert not got["passed"] and got["max_abs_error"] == pytest.approx(9.0)
    assert got["max_rel_error"] == pytest.approx(4.5)


def _operand(rng: np.random.Generator, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    grid = np.array(sorted(v for v in e4m3_values() if 1.0 <= v <= 448.0))
    values = rng.choice(E2M1, size=(rows, k)) * rng.choice((1.0, -1.0), size=(rows, k))
    return values + 0.0, rng.choice(grid, size=(rows, k // 16))


def _round_e4m3(x: np.ndarray) -> np.ndarray:
    grid = np.array(sorted(v for v in e4m3_values() if v > 0))
    idx = np.clip(np.searchsorted(grid, x), 1, len(grid) - 1)
    lower, upper = grid[idx - 1], grid[idx]
    return np.where(x - lower <= upper - x, lower, upper)


def _quantize_nvfp4(b: np.ndarray) -> np.ndarray:
    """What a W4A4 kernel does to its activation: amax/6 scales rounded to E4M3, values
    rounded to the nearest E2M1 (clipped at 6)."""
    n, k = b.shape
    blocks = b.reshape(n, k // 16, 16)
    scale = _round_e4m3(np.abs(blocks).max(axis=2, keepdims=True) / 6.0)
    x = np.clip(np.abs(blocks) / scale, 0, 6)
    grid = np.array(E2M1)
    nearest = grid[np.abs(x[..., None] - grid).argmin(axis=-1)]
    return (np.sign(blocks) * nearest * scale).reshape(n, k)


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round to bfloat16 (8 significant bits), nearest-even through float32 bits."""
    f = x.astype(np.float32).view(np.uint32)
    rounded = ((f + 0x7FFF + ((f >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return rounded.view(np.float32).astype(np.float64)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_kernel_that_rounds_like_nvfp4_passes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values, scales = _operand(rng, 64, 64)
    a = dequantize(values, scales, 2.0**-9)
    # Activations that are not on any NVFP4 grid: the kernel must round them itself.
    b = rng.normal(0.0, 0.05, size=(64, 64))
    out = _bf16(a @ _quantize_nvfp4(b).T)
    got = check_answer(answer(values, scales, 2.0**-9, b, out))
    assert got["passed"], got
    assert got["max_abs_error"] > 0  # it did round
    assert np.all(activation_rounding(b) >= np.abs(_quantize_nvfp4(b) - b))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_kernel_that_reads_scales_in_the_wrong_layout_fails(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values, scales = _operand(rng, 64, 64)
    b_values, b_scales = _operand(rng, 64, 64)
    b = dequantize(b_values, b_scales, 2.0**-9)
    wrong = scales.reshape(-1).reshape(scales.shape, order="F")
    out = dequantize(values, wrong, 2.0**-9) @ b.T
    got = check_answer(answer(values, scales, 2.0**-9, b, out))
    assert not got["passed"] and got["tolerance_ratio"] > 10 and got["elements_over"] > 1000


def test_a_few_misread_blocks_fail() -> None:
    rng = np.random.default_rng(5)
    values, scales = _operand(rng, 64, 64)
    b = dequantize(*_operand(rng, 64, 64), 2.0**-9)
    wrong = scales.copy()
    wrong[3, 1] = scales[4, 1] if scales[4, 1] != scales[3, 1] else scales[3, 1] * 2
    out = dequantize(values, wrong, 2.0**-9) @ b.T
    got = check_answer(answer(values, scales, 2.0**-9, b, out))
    assert not got["passed"] and got["worst"]["row"] == 3


def test_malformed_answers_are_refused() -> None:
    values = np.zeros((1, 16))
    good = answer(values, np.array([[1.0]]), 1.0, np.zeros((1, 16)), np.zeros((1, 1)))
    bad_value = answer(values + 0.7, np.array([[1.0]]), 1.0, np.zeros((1, 16)), np.zeros((1, 1)))
    bad_scale = answer(values, np.array([[1.0625]]), 1.0, np.zeros((1, 16)), np.zeros((1, 1)))
    bad_shape = dict(good, output=[[0.0, 0.0]])
    assert check_answer(good)["passed"]
    for broken in (bad_value, bad_scale, bad_shape, {"m": 1}):
        with pytest.raises(ProbeError):
            check_answer(broken)
