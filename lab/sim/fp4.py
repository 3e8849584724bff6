"""One NVFP4 GEMM, computed for real, as a simulated node's `fp4-probe` verb returns it.

NVFP4 stores each value as E2M1 (4 bits), one E4M3 scale per 16 consecutive values
along K, and one FP32 global scale. A correct kernel multiplies the dequantized A by the
transpose of B (schema.json's `fp4_probe`: output = dequant(a_fp4) @ b^T). A broken
kernel -- a backend in the scenario's `truth.fp4.broken` -- reads the block scales in the
wrong layout (column-major, the swizzled order meant for another tile shape), so its
output differs from a reference dequantize-then-multiply; a degraded one misreads a
fraction of the blocks. The answer carries every input, so the platform computes its
own reference and judges the kernel from evidence, never from the scenario.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BLOCK = 16
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
GLOBAL_SCALE = 2.0**-9


def e4m3_value(code: int) -> float:
    """Decode one FP8 E4M3 (fn variant: no infinities, 0x7f/0xff are NaN) byte."""
    sign = -1.0 if code & 0x80 else 1.0
    exp = (code >> 3) & 0xF
    man = code & 0x7
    if exp == 0xF and man == 0x7:
        return float("nan")
    if exp == 0:
        return sign * (man / 8.0) * 2.0**-6
    return sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)


def e4m3_grid(low: float, high: float) -> np.ndarray:
    """Every positive E4M3 number in [low, high]."""
    values = {e4m3_value(c) for c in range(0x7F)}
    return np.array(sorted(v for v in values if low <= v <= high), dtype=np.float64)


def dequantize(values: np.ndarray, block_scales: np.ndarray, global_scale: float) -> np.ndarray:
    return values * np.repeat(block_scales, BLOCK, axis=1) * global_scale


def _operand(rng: np.random.Generator, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    magnitudes = rng.choice(E2M1_MAGNITUDES, size=(rows, k))
    signs = rng.choice((1.0, -1.0), size=(rows, k))
    values = np.where(magnitudes == 0.0, 0.0, magnitudes * signs)  # no negative zero
    scales = rng.choice(e4m3_grid(1.0, 448.0), size=(rows, k // BLOCK))
    return values, scales


def _scales_read_by(scales: np.ndarray, state: str, error_rate: float,
                    rng: np.random.Generator) -> np.ndarray:
    if state == "broken":
        # The scale bytes are read column-major: almost every block gets another block's scale.
        return scales.reshape(-1).reshape(scales.shape, order="F")
    if state == "degraded":
        wrong = scales.copy()
        hit = rng.random(scales.shape) < error_rate
        wrong[hit] = np.roll(scales, 1, axis=0)[hit]
        return wrong
    return scales


def probe(backend: str, seed: int, *, size: int = 128, state: str = "ok",
          error_rate: float = 0.0) -> dict[str, Any]:
    """A (size x size NVFP4) times B^T (size x size) through a backend whose correctness is
    `state` (ok, degraded or broken)."""
    rng = np.random.default_rng(seed)
    a_values, a_scales = _operand(rng, size, size)
    b_values, b_scales = _operand(rng, size, size)
    b = dequantize(b_values, b_scales, GLOBAL_SCALE)
    used = _scales_read_by(a_scales, state, error_rate, np.random.default_rng(seed + 1))
    output = dequantize(a_values, used, GLOBAL_SCALE) @ b.T
    return {
        "backend": backend,
        "m": size,
        "n": size,
        "k": size,
        "a_fp4": {
            "values": a_values.tolist(),
            "block_scales": a_scales.tolist(),
            "global_scale": GLOBAL_SCALE,
            "block_size": BLOCK,
        },
        "b": b.tolist(),
        "output": output.tolist(),
    }
