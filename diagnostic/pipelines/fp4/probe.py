"""The kernel probe: one NVFP4 GEMM through a backend, against a reference computed here.

The agent's `fp4-probe` runs `output = dequant(A) @ B^T` through the named backend on a
node and returns every input with the output (docs/lab-contracts.md). The platform
dequantizes A itself (E2M1 values x E4M3 scale per 16 values along K x FP32 global scale),
multiplies in float64 with numpy, and compares.

The tolerance is derived from what a correct kernel may round, element by element: A
arrives exactly representable, so a correct kernel is exact on A; it may quantize the
activation B to NVFP4 itself (block scale amax / 6 rounded to E4M3, at most half an E4M3
step = 2^-4 relative; each value rounded to the E2M1 grid, at most half a grid step at
that magnitude), accumulate in FP32 (k * 2^-24 of the sum of |a * b|) and write the output
in BF16 (2^-8 relative). Summing those bounds with worst-case signs gives each output
element's allowance; a kernel passes when no element's error exceeds it. A kernel that
reads block scales in the wrong layout misses by multiples of the allowance.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from lab.session import AgentError

BLOCK = 16
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E4M3_HALF_STEP = 2.0**-4  # 3 mantissa bits: half a unit in the last place, relative
FP32_UNIT = 2.0**-24
BF16_UNIT = 2.0**-8
DEFAULT_SEED = 1209
DEFAULT_SIZE = 128


class ProbeError(ValueError):
    """A probe answer that is not an NVFP4 GEMM as the contract describes it."""


@cache
def e4m3_values() -> frozenset[float]:
    """Every finite FP8 E4M3 (fn) value: bias 7, subnormals at exponent 0, no infinities,
    S.1111.111 is NaN."""
    out: set[float] = set()
    for exp in range(16):
        for man in range(8):
            if exp == 15 and man == 7:
                continue
            magnitude = (man / 8.0) * 2.0**-6 if exp == 0 else (1.0 + man / 8.0) * 2.0 ** (exp - 7)
            out.update((magnitude, -magnitude))
    return frozenset(out)


def dequantize(
    values: np.ndarray, block_scales: np.ndarray, global_scale: float, block: int = BLOCK
) -> np.ndarray:
    """E2M1 values times their block's E4M3 scale times the FP32 global scale."""
    return values * np.repeat(block_scales, block, axis=1) * global_scale


def _grid_half_step(x: np.ndarray) -> np.ndarray:
    """Half the E2M1 grid step at magnitude x (in units of the block scale)."""
    return np.where(x < 2.0, 0.25, np.where(x < 4.0, 0.5, 1.0))


def activation_rounding(b: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """Per element, the most a correct kernel's own NVFP4 quantization of B can move it."""
    n, k = b.shape
    blocks = np.abs(b).reshape(n, k // block, block)
    scale = blocks.max(axis=2, keepdims=True) / E2M1_MAX
    scaled_up = scale * (1.0 + E4M3_HALF_STEP)  # the scale after rounding, at worst
    safe = np.where(scaled_up > 0, scaled_up, 1.0)
    # Evaluated at the value's largest possible scaled magnitude, so a value near a grid
    # region's edge gets the coarser step.
    x = blocks / safe * (1.0 + E4M3_HALF_STEP) ** 2
    bound = scaled_up * _grid_half_step(x)
    return bound.reshape(n, k)


def tolerance(a: np.ndarray, b: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Each output element's allowance for a correct kernel (see the module text)."""
    k = a.shape[1]
    abs_a = np.abs(a)
    from_activation = abs_a @ (activation_rounding(b) + BF16_UNIT * np.abs(b)).T
    accumulation = k * FP32_UNIT * (abs_a @ np.abs(b).T)
    output = BF16_UNIT * np.abs(reference)
    return from_activation + accumulation + output + np.finfo(np.float64).tiny


def _array(value: Any, name: str, shape: tuple[int, int]) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ProbeError(f"{name}: not a matrix of numbers ({exc})") from exc
    if arr.shape != shape:
        raise ProbeError(f"{name}: shape {arr.shape}, expected {shape}")
    if not np.all(np.isfinite(arr)):
        raise ProbeError(f"{name}: holds NaN or infinity")
    return arr


def check_answer(data: dict[str, Any]) -> dict[str, Any]:
    """Compare one `fp4-probe` answer with the reference dequantize-then-multiply."""
    try:
        m, n, k = int(data["m"]), int(data["n"]), int(data["k"])
        a_fp4 = data["a_fp4"]
        block = int(a_fp4.get("block_size", BLOCK))
        global_scale = float(a_fp4["global_scale"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProbeError(f"probe answer: missing or malformed field ({exc})") from exc
    if block != BLOCK or k % block:
        raise ProbeError(f"NVFP4 uses blocks of {BLOCK} along K; got block {block} with k {k}")
    values = _array(a_fp4.get("values"), "a_fp4.values", (m, k))
    scales = _array(a_fp4.get("block_scales"), "a_fp4.block_scales", (m, k // block))
    b = _array(data.get("b"), "b", (n, k))
    output = _array(data.get("output"), "output", (m, n))
    if not set(np.unique(np.abs(values)).tolist()) <= set(E2M1_MAGNITUDES):
        raise ProbeError("a_fp4.values: not all E2M1 values")
    if not set(np.unique(scales).tolist()) <= e4m3_values():
        raise ProbeError("a_fp4.block_scales: not all E4M3 values")
    if not np.isfinite(global_scale) or global_scale == 0.0:
        raise ProbeError("a_fp4.global_scale: must be a finite non-zero FP32 number")
    a = dequantize(values, scales, global_scale)
    reference = a @ b.T
    error = np.abs(output - reference)
    allowed = tolerance(a, b, reference)
    ratio = error / allowed
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    peak = float(np.max(np.abs(reference))) or 1.0
    return {
        "m": m,
        "n": n,
        "k": k,
        "max_abs_error": float(error.max()),
        "max_rel_error": float(error.max() / peak),  # relative to the largest reference element
        "rms_rel_error": float(np.sqrt(np.mean(error**2)) / (np.sqrt(np.mean(reference**2)) or 1.0)),
        "tolerance_ratio": float(ratio.max()),  # worst element's error / its allowance
        "elements_over": int(np.count_nonzero(error > allowed)),
        "worst": {
            "row": int(worst[0]),
            "col": int(worst[1]),
            "error": float(error[worst]),
            "allowed": float(allowed[worst]),
            "reference": float(reference[worst]),
        },
        "passed": bool(np.all(error <= allowed)),
    }


def probe_backend(
    agent: Any, node: str, backend: str, *, seed: int = DEFAULT_SEED, size: int = DEFAULT_SIZE
) -> dict[str, Any]:
    """Run `fp4-probe` for `backend` on `node` through `agent(node, *args)` (the lab session's
    agent call) and judge it; an agent without a GPU answers `unsupported`, which is said."""
    try:
        data = agent(node, "fp4-probe", "--backend", backend, "--seed", str(seed), "--size", str(size))
    except AgentError as exc:
        return {
            "backend": backend,
            "available": False,
            "node": node,
            "reason": f"fp4-probe {exc.code}: {exc.message}",
        }
    try:
        result = check_answer(data)
    except ProbeError as exc:
        return {
            "backend": backend,
            "available": True,
            "node": node,
            "passed": False,
            "reason": f"malformed probe answer: {exc}",
        }
    return {"backend": backend, "available": True, "node": node, "seed": seed, **result}
