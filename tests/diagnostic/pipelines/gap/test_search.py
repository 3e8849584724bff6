"""Delta debugging on measured runs, without a lab: a fake measurement whose rate is the
sum of the costly candidates' effects, with noise. The search must find exactly the costly
ones with fewer measurements than one per candidate, and prove them."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from diagnostic.pipelines.gap.search import OutOfBudget, delta_debug, improves, prove

BASE = 20.0


def runs(rate: float, rng: random.Random, n: int = 5) -> dict[str, list[float]]:
    return {"code": [rate * rng.lognormvariate(0, 0.03) for _ in range(n)],
            "prose": [0.8 * rate * rng.lognormvariate(0, 0.03) for _ in range(n)]}


@pytest.mark.parametrize("costly", [{"c3"}, {"c0"}, {"c1", "c6"}, {"c7"}, set()])
def test_the_costly_candidates_are_found_with_few_measurements(costly: set[str]) -> None:
    rng = random.Random(len(costly) * 7 + sum(map(ord, "".join(sorted(costly)))))
    paths = [f"c{i}" for i in range(8)]
    gain = {p: (4.0 if p in costly else 0.0) for p in paths}
    measured: list[tuple[str, ...]] = []

    def measure(group: Sequence[str], one: bool) -> dict[str, list[float]]:
        measured.append(tuple(group))
        return runs(BASE + sum(gain[p] for p in group), rng, 15 if one else 5)

    current = runs(BASE, rng, 15)
    whole = runs(BASE + sum(gain.values()), rng, 5)
    if not costly:
        assert not improves(whole, current, better="higher")
        return
    outcome = delta_debug(paths, whole, current, measure)
    assert {p for p, _ in outcome.costly} == costly
    assert len(measured) < len(paths)
    cleared = {p for group, _ in outcome.cleared for p in group}
    assert cleared == set(paths) - costly
    for path, alone in outcome.costly:
        if alone is None:
            alone = measure([path], True)
        assert prove(alone, current, better="higher")["proved"]


def test_cold_starts_improve_downwards_and_the_budget_stops_the_search() -> None:
    rng = random.Random(3)
    current = {"cold_start_s": [560.0 + rng.gauss(0, 2) for _ in range(2)]}
    whole = {"cold_start_s": [150.0 + rng.gauss(0, 2) for _ in range(2)]}
    assert improves(whole, current, better="lower")
    assert not improves(current, whole, better="lower")

    def measure(group: Sequence[str], one: bool) -> dict[str, list[float]]:
        raise OutOfBudget("no lab time left")

    outcome = delta_debug(["a", "b", "c"], whole, current, measure, better="lower")
    assert outcome.costly == [] and outcome.untried == ["a", "b", "c"]


def test_a_change_worse_on_one_workload_is_not_proved() -> None:
    rng = random.Random(5)
    current = runs(BASE, rng, 15)
    mixed = {"code": [x * 1.2 for x in current["code"]], "prose": [x * 0.8 for x in current["prose"]]}
    verdict = prove(mixed, current, better="higher")
    assert not verdict["proved"] and verdict["worse_on"] == ["prose"]
