"""Which correct backend the FP4 stage proposes: the fastest; between tied ones (on every
workload the 95 % interval reaches zero, or any cost it shows stays below 5 %), the one the
version's own default rule considers first."""

from __future__ import annotations

import statistics
from typing import Any

from diagnostic.pipelines.fp4.pipeline import choose

ORDER = ["flashinfer_cutlass", "cutlass", "flashinfer_b12x", "b12x", "marlin"]


def rated(backend: str, code: list[float], prose: list[float]) -> dict[str, Any]:
    return {"backend": backend, "rate": {
        w: {"n": len(runs), "mean_tps": statistics.fmean(runs), "ci95": None, "runs": runs}
        for w, runs in (("code", code), ("prose", prose))}}


def test_equally_fast_backends_go_to_the_versions_own_preference() -> None:
    # b12x's mean is a little higher, within the noise: cutlass, which vLLM considers first.
    cutlass = rated("cutlass", [16.1, 16.3, 15.9, 16.2, 16.0], [16.0, 16.2, 16.1, 15.8, 16.3])
    b12x = rated("b12x", [16.3, 16.1, 16.4, 16.0, 16.2], [16.2, 16.4, 16.0, 16.1, 16.3])
    notes: list[str] = []
    chosen = choose([b12x, cutlass], ORDER, notes)
    assert chosen is cutlass
    assert "as fast as the fastest that does (b12x)" in chosen["_why"]
    assert any(n.startswith("cutlass ties with b12x") and "cutlass > flashinfer_b12x" in n for n in notes)


def test_a_noisy_lead_is_no_lead() -> None:
    # b12x's mean is 6 % higher, but one stalled run leaves the interval unable to show it.
    cutlass = rated("cutlass", [16.0, 16.1, 15.9, 16.0, 16.1], [16.0, 15.9, 16.1, 16.0, 16.0])
    b12x = rated("b12x", [17.0, 17.1, 16.9, 17.0, 12.0], [17.0, 16.9, 17.1, 17.0, 21.0])
    assert choose([b12x, cutlass], ORDER, []) is cutlass


def test_a_lead_shown_over_five_percent_decides() -> None:
    cutlass = rated("cutlass", [15.0, 15.1, 14.9, 15.0, 15.1], [15.0, 14.9, 15.1, 15.0, 15.0])
    b12x = rated("b12x", [16.2, 16.3, 16.1, 16.2, 16.3], [16.2, 16.1, 16.3, 16.2, 16.2])
    notes: list[str] = []
    assert choose([cutlass, b12x], ORDER, notes) is b12x
    assert any(n.startswith("b12x leads cutlass") for n in notes)


def test_a_significant_lead_under_five_percent_is_no_lead() -> None:
    # A steady 2 % lead is significant at n = 5 but no cost by the stage's measure.
    cutlass = rated("cutlass", [16.0, 16.01, 15.99, 16.0, 16.01], [16.0, 15.99, 16.01, 16.0, 16.0])
    b12x = rated("b12x", [16.32, 16.33, 16.31, 16.32, 16.33], [16.32, 16.31, 16.33, 16.32, 16.32])
    assert choose([cutlass, b12x], ORDER, []) is cutlass


def test_the_weight_only_path_is_chosen_only_when_it_is_the_fastest_correct_one() -> None:
    marlin = rated("marlin", [13.9, 14.0, 14.1, 13.8, 14.0], [13.9, 14.1, 14.0, 14.0, 13.8])
    flashinfer_b12x = rated("flashinfer_b12x", [16.0, 16.1, 15.9, 16.2, 16.0], [16.1, 16.0, 15.9, 16.0, 16.2])
    assert choose([marlin, flashinfer_b12x], ORDER, []) is flashinfer_b12x
    assert choose([marlin], ORDER, []) is marlin
    assert choose([], ORDER, []) is None


def test_a_backend_measurably_slower_by_more_than_five_percent_may_not_tie() -> None:
    # marlin is 10 % slower and the interval excludes zero: though it does not show a cost of
    # more than 5 % for certain, it is measurably slower, so the preference order may not
    # pick it over the faster kernel.
    marlin = rated("marlin", [14.5, 14.9, 14.3, 15.0, 14.6], [14.4, 14.8, 14.6, 14.9, 14.5])
    b12x = rated("flashinfer_b12x", [16.0, 16.3, 15.7, 16.4, 16.1], [16.2, 15.9, 16.3, 16.0, 16.1])
    order = ["flashinfer_cutlass", "cutlass", "marlin", "flashinfer_b12x"]  # vLLM 0.34.0 on SM121
    assert choose([marlin, b12x], order, []) is b12x
