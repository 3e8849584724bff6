"""Wilson intervals, the three classes, and the rule that runs more canaries while the
interval straddles a threshold."""

from __future__ import annotations

import math

import pytest

from diagnostic.pipelines.fp4.canaries import Canary, CanarySet, run_suite
from diagnostic.pipelines.fp4.passrate import PassRate, classify, difference_interval, straddled, wilson


def test_wilson_by_hand() -> None:
    z2 = 1.959964**2
    # n/n: the lower end is n / (n + z^2); 0/n: the upper end is z^2 / (n + z^2).
    assert wilson(40, 40) == (pytest.approx(40 / (40 + z2), abs=1e-6), 1.0)
    assert wilson(0, 40) == (0.0, pytest.approx(z2 / (40 + z2), abs=1e-6))
    # 34/40 worked through the formula: centre 0.8193, half-width 0.1101.
    low, high = wilson(34, 40)
    p, n = 0.85, 40
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = math.sqrt(z2) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    assert (low, high) == (pytest.approx(centre - half, abs=1e-6), pytest.approx(centre + half, abs=1e-6))
    assert low == pytest.approx(0.7093, abs=1e-3) and high == pytest.approx(0.9294, abs=1e-3)


def test_classes_and_straddling() -> None:
    assert classify(0.95) == "healthy" and classify(0.949) == "degraded"
    assert classify(0.5) == "degraded" and classify(0.499) == "garbage"
    assert straddled(wilson(40, 40)) == [0.95]  # 40/40 cannot yet rule out 94 %
    assert straddled(wilson(80, 80)) == []  # 80/80 can
    assert straddled(wilson(20, 40)) == [0.5]
    assert PassRate(0, 40).label == "garbage" and not PassRate(0, 40).undecided


def test_difference_interval_holds_the_difference() -> None:
    low, high = difference_interval(PassRate(0, 40), PassRate(80, 80))
    assert 0.85 < low < 1.0 and high == 1.0
    low, high = difference_interval(PassRate(30, 40), PassRate(31, 40))
    assert low < 0 < high


def _set(n: int, base: int = 40, extend_by: int = 20) -> CanarySet:
    canaries = tuple(
        Canary(f"c{i}", "arithmetic", f"What is {i} + 1?", {"a": i, "op": "+", "b": 1}) for i in range(n)
    )
    return CanarySet("t", "0" * 64, base, extend_by, canaries)


def test_a_healthy_model_needs_more_than_the_base_set() -> None:
    suite = run_suite(lambda c: c.expected, _set(100))
    assert [r["n"] for r in suite.rounds] == [40, 60, 80]
    assert suite.decided and suite.rate.rate == 1.0
    assert "straddles 95 %" in suite.notes[0]


def test_garbage_is_decided_on_the_base_set() -> None:
    suite = run_suite(lambda c: "-1", _set(100))
    assert [r["n"] for r in suite.rounds] == [40] and suite.rate.passed == 0


def test_at_the_cap_the_point_estimate_decides_and_says_so() -> None:
    # 1 wrong in 20: 95 % exactly, and the interval straddles 95 % however many are run.
    suite = run_suite(lambda c: "0" if int(c.id[1:]) % 20 == 0 else c.expected, _set(100), cap=60)
    assert [r["n"] for r in suite.rounds] == [40, 60]
    assert not suite.decided and suite.rate.label == "healthy"
    assert "at the cap of 60" in suite.notes[-1] and "classified by the pass rate itself" in suite.notes[-1]
