"""Delta debugging on measured runs, without a lab: a fake measurement whose rate is the
sum of the costly candidates' effects, with noise. The search must find exactly the costly
ones with fewer measurements than one per candidate, and prove them."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from scipy import stats as scipy_stats

from diagnostic.pipelines.gap.search import OutOfBudget, delta_debug, improves, prove, trimmed_welch
from diagnostic.pipelines.stats import welch

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


def stalled(samples: list[float], at: int, factor: float) -> list[float]:
    """`samples` with run `at` slowed (factor < 1) or sped (> 1) the way a stall does."""
    return [x * factor if i == at else x for i, x in enumerate(samples)]


def test_a_stalled_run_does_not_hide_a_gain() -> None:
    # The benchmark's seed 18: eager mode off gains 17 %, and one run of the fifteen on each
    # workload was stalled to a third of its rate. Welch's test on all runs loses the gain;
    # the trimmed test keeps it, and the finding's interval is the one it was proved on.
    rng = random.Random(18)
    current = runs(BASE, rng, 15)
    after = runs(BASE * 1.17, rng, 15)
    after = {w: stalled(v, 4, 0.3) for w, v in after.items()}
    assert not any(welch(after[w], current[w])["p"] < 0.025 for w in after)
    verdict = prove(after, current, better="higher")
    assert verdict["proved"] and verdict["better_on"] == ["code", "prose"]
    assert all(verdict["tests"][w]["trimmed"] == [3, 3] for w in after)
    # An absurd rate (a client stall read as a burst) on the current side, and one in five
    # screening runs: still no cover for the gain.
    current = {w: stalled(v, 0, 40.0) for w, v in current.items()}
    assert improves(after, current, better="higher")
    assert improves({w: stalled(v[:5], 2, 0.3) for w, v in runs(BASE * 1.17, rng, 5).items()}, current,
                    better="higher")


def test_the_trimmed_test_is_yuens_and_welchs_without_trimming() -> None:
    rng = random.Random(1)
    a, b = [rng.gauss(20, 1) for _ in range(15)], [rng.gauss(21, 2) for _ in range(11)]
    mine = trimmed_welch(a, b)
    theirs = scipy_stats.ttest_ind(a, b, equal_var=False, trim=0.2)
    assert mine["p"] == pytest.approx(theirs.pvalue, rel=1e-9) and mine["trimmed"] == [3, 2]
    two = trimmed_welch(a[:4], b[:2])  # below five runs nothing is trimmed: Welch's test
    assert two["trimmed"] == [0, 0] and two["p"] == pytest.approx(welch(a[:4], b[:2])["p"], rel=1e-12)


def test_stalled_runs_do_not_make_false_findings() -> None:
    # A change that changes nothing, 2000 times, with a stalled run (slow or absurdly fast)
    # on either side a third of the time: proved no more often than the test's level allows
    # (5 % over two workloads, Bonferroni: 2.5 % each).
    rng = random.Random(7)
    proved = 0
    trials = 2000
    for _ in range(trials):
        before, after = runs(BASE, rng, 15), runs(BASE, rng, 15)
        for side in (before, after):
            if rng.random() < 1 / 3:
                w = rng.choice(["code", "prose"])
                side[w] = stalled(side[w], rng.randrange(15), rng.choice([0.3, 0.5, 40.0]))
        proved += prove(after, before, better="higher")["proved"]
    assert proved / trials <= 0.04
