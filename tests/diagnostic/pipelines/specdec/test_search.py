"""The k-search on synthetic rate curves: it must find a unimodal curve's peak with few
trials, with noise, plateaus, a peak at k = 1 or at the engine's maximum, and refusals."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from diagnostic.pipelines.specdec.search import NONE, KSearch, Setting, next_lengths, search_k

Curve = Callable[[int], float]


def peaked(peak: int, top: float = 30.0, slope: float = 0.08) -> Curve:
    return lambda k: top * (1.0 - slope * abs(k - peak))


def screen_for(
    curves: dict[str, Curve], noise: float = 0.0, seed: int = 1, calls: list[int] | None = None
) -> Callable[[Setting], dict[str, float]]:
    rng = random.Random(seed)

    def screen(setting: Setting) -> dict[str, float]:
        if calls is not None:
            calls.append(setting.k)
        return {w: c(setting.k) * (1.0 + rng.gauss(0.0, noise)) for w, c in curves.items()}

    return screen


@pytest.mark.parametrize("peak", [1, 2, 3, 5, 7, 11, 16])
def test_it_finds_the_peak_of_a_noiseless_unimodal_curve_in_few_trials(peak: int) -> None:
    calls: list[int] = []
    found = search_k("eagle3", ["code"], screen_for({"code": peaked(peak)}, calls=calls), k_max=16)
    assert found.best("code") == peak
    assert len(calls) <= 10 < 16  # a sweep would be 16
    assert len(set(calls)) == len(calls)  # no length twice


def test_two_workloads_with_different_peaks_share_the_trials() -> None:
    calls: list[int] = []
    screen = screen_for({"code": peaked(3), "prose": peaked(2)}, calls=calls)
    found = search_k("eagle3", ["code", "prose"], screen, k_max=16, seeds=(1, 2, 4))
    assert (found.best("code"), found.best("prose")) == (3, 2)
    assert sorted(calls) == [1, 2, 3, 4]


def test_a_peak_at_the_engines_maximum_is_reached_by_doubling() -> None:
    rising: Curve = lambda k: 10.0 + k  # noqa: E731
    found = search_k("ngram", ["code"], screen_for({"code": rising}), k_max=16)
    assert found.best("code") == 16
    assert 16 in found.rates and 15 in found.rates


def test_a_plateau_ends_on_a_length_whose_rate_is_the_plateaus() -> None:
    plateau: Curve = lambda k: 25.0 if 3 <= k <= 9 else 25.0 - 2.0 * min(abs(k - 3), abs(k - 9))  # noqa: E731
    found = search_k("eagle3", ["code"], screen_for({"code": plateau}), k_max=16)
    best = found.best("code")
    assert best is not None and 3 <= best <= 9
    assert found.best("code") == min(k for k, r in found.rates.items() if r["code"] == 25.0)


@pytest.mark.parametrize("seed", range(10))
def test_with_screening_noise_the_chosen_length_is_within_a_few_percent_of_the_peak(seed: int) -> None:
    curve = peaked(4, slope=0.1)
    found = search_k("eagle3", ["code"], screen_for({"code": curve}, noise=0.02, seed=seed), k_max=16)
    best = found.best("code")
    assert best is not None and curve(best) >= 0.9 * curve(4)


def test_a_method_the_engine_refuses_ends_at_its_first_trial() -> None:
    calls: list[int] = []

    def refuse(setting: Setting) -> None:
        calls.append(setting.k)
        return None

    found = search_k("mtp", ["code"], refuse, k_max=16, seeds=(1, 2, 4))
    assert calls == [1] and found.refused == [1] and not found.rates
    assert found.stopped == "refused by the engine"


def test_a_length_the_engine_refuses_caps_the_range() -> None:
    curve = peaked(12)

    def screen(setting: Setting) -> dict[str, float] | None:
        return None if setting.k > 6 else {"code": curve(setting.k)}

    found = search_k("eagle3", ["code"], screen, k_max=16)
    assert found.best("code") == 6 and found.k_max < 16 and found.refused


def test_the_budget_stops_the_search() -> None:
    calls: list[int] = []
    allowed = iter([True, True, False])
    found = search_k(
        "eagle3",
        ["code"],
        screen_for({"code": peaked(9)}, calls=calls),
        k_max=16,
        afford=lambda _s: next(allowed),
    )
    assert calls == [1, 2] and found.stopped == "lab-time budget"


def test_a_method_below_the_leader_and_past_its_peak_is_not_refined() -> None:
    calls: list[int] = []
    falling: Curve = lambda k: 20.0 - 2.0 * k  # noqa: E731
    asked: list[tuple[str, int, str]] = []

    def below(setting: Setting, workload: str) -> bool:
        asked.append((setting.method, setting.k, workload))
        return True

    found = search_k(
        "ngram", ["code"], screen_for({"code": falling}, calls=calls), k_max=16, below_leader=below
    )
    assert calls == [1, 2] and "significantly below the leader" in found.stopped
    assert asked == [("ngram", 1, "code")]  # the test is asked about the method's best length


def test_a_method_not_significantly_below_the_leader_is_refined() -> None:
    calls: list[int] = []
    found = search_k(
        "ngram",
        ["code"],
        screen_for({"code": peaked(3)}, calls=calls),
        k_max=16,
        below_leader=lambda _s, _w: False,
    )
    assert calls[:2] == [1, 2] and len(calls) > 2 and found.best("code") == 3


def test_a_method_still_rising_is_refined_however_far_below() -> None:
    calls: list[int] = []
    rising: Curve = lambda k: 10.0 + k  # noqa: E731
    search_k("ngram", ["code"], screen_for({"code": rising}, calls=calls), k_max=4,
             below_leader=lambda _s, _w: True)
    assert calls == [1, 2, 4, 3]


def test_next_lengths_asks_for_the_gaps_next_to_the_best() -> None:
    search = KSearch("eagle3", 16, rates={1: {"code": 20.0}, 4: {"code": 25.0}, 8: {"code": 21.0}})
    assert next_lengths(search, ["code"]) == [6]  # the wider gap first
    search.rates[6] = {"code": 24.0}
    assert next_lengths(search, ["code"]) == [3]
    assert Setting(NONE, 0).label == "no speculation"
