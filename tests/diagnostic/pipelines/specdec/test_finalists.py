"""What the specdec stage confirms after screening: the settings the decision needs, the
mix's best, and each workload's next best when its runs say it can still win, so that one
low screening draw does not decide between close lengths."""

from __future__ import annotations

import random

from diagnostic.pipelines.specdec.decide import decide_workload
from diagnostic.pipelines.specdec.pipeline import below_p, choose_finalists, none_open
from diagnostic.pipelines.specdec.search import NO_SPECULATION, Setting

E1, E2, E3, E4 = (Setting("eagle3", k) for k in (1, 2, 3, 4))
NG1, NG2 = Setting("ngram", 1), Setting("ngram", 2)


def runs(mean: float, seed: int, n: int = 5, sigma: float = 0.04) -> list[float]:
    rng = random.Random(seed)
    return [mean * (1.0 + rng.gauss(0.0, sigma)) for _ in range(n)]


def screened(means: dict[Setting, dict[str, float]]) -> dict[Setting, dict[str, list[float]]]:
    return {
        s: {w: runs(m, 31 * i + j) for j, (w, m) in enumerate(ws.items())}
        for i, (s, ws) in enumerate(means.items())
    }


# Screening means seen on the reference lab: k = 3's five code runs came out low (25.9 tok/s
# against 27.7 by the formula), below the customer's k = 4 (whose runs are its confirmation).
REFERENCE = {
    NO_SPECULATION: {"code": 16.2, "prose": 16.2},
    E4: {"code": 26.0, "prose": 20.3},
    E1: {"code": 23.8, "prose": 22.5},
    E2: {"code": 27.4, "prose": 24.3},
    E3: {"code": 25.9, "prose": 22.8},
    NG1: {"code": 19.7, "prose": 16.0},
    NG2: {"code": 19.6, "prose": 13.8},
}


def test_a_low_screening_draw_next_to_the_best_is_still_confirmed() -> None:
    finalists, runner_ups = choose_finalists(screened(REFERENCE), E4, ["code", "prose"])
    # No speculation is no finalist of its own (none_open says when it is confirmed too).
    assert finalists == [E4, E2]  # E2 is also the mix's best
    # Code's next best outside the finalists is k = 3, 5 % below on five runs: not
    # significantly below, so it can still win.
    assert runner_ups == [E3]


def test_a_runner_up_significantly_below_the_best_is_not_confirmed() -> None:
    means = {NO_SPECULATION: {"code": 16.0}, E2: {"code": 30.0}, E1: {"code": 25.0}}
    finalists, runner_ups = choose_finalists(screened(means), NO_SPECULATION, ["code"])
    assert finalists == [NO_SPECULATION, E2] and runner_ups == []
    means[E1] = {"code": 29.4}
    assert choose_finalists(screened(means), NO_SPECULATION, ["code"])[1] == [E1]


def test_the_mix_best_is_a_finalist_when_no_workload_has_it_best() -> None:
    # Code is best at k = 4, prose at k = 1; k = 2 is second on both and best for the mix.
    means = {
        NO_SPECULATION: {"code": 16.0, "prose": 16.0},
        E1: {"code": 22.0, "prose": 24.0},
        E2: {"code": 28.5, "prose": 23.5},
        E4: {"code": 29.0, "prose": 18.0},
    }
    finalists, _ = choose_finalists(screened(means), NO_SPECULATION, ["code", "prose"])
    assert finalists == [NO_SPECULATION, E4, E1, E2]
    # With code's tokens only, the mix is code: nothing more than its best.
    finalists, _ = choose_finalists(screened(means), NO_SPECULATION, ["code", "prose"], {"code": 1.0})
    assert finalists == [NO_SPECULATION, E4, E1]


def test_without_speculation_the_customers_setting_is_no_speculation_once() -> None:
    finalists, _ = choose_finalists(screened(REFERENCE), NO_SPECULATION, ["code", "prose"])
    assert finalists == [NO_SPECULATION, E2]


def test_below_p_is_one_sided() -> None:
    low, high = runs(20.0, 1), runs(24.0, 2)
    assert below_p(low, high) < 0.01 and below_p(high, low) > 0.99
    assert below_p([20.0], high) == 1.0


def test_no_speculation_is_confirmed_only_where_its_screen_leaves_harm_open() -> None:
    read = screened(REFERENCE)
    read[E4] = {"code": runs(26.0, 5, n=15), "prose": runs(20.3, 6, n=15)}  # its confirmation
    # k = 4 is far above no speculation's five runs on both workloads: nothing is open.
    assert none_open(read, E4, ["code", "prose"]) == []
    # A customer's n-gram k = 2 on prose (13.8) against no speculation (16.2) is the harmful
    # question itself; on code (19.6 against 16.2) it is settled.
    read[NG2] = {"code": runs(19.6, 7, n=15), "prose": runs(13.8, 8, n=15)}
    assert none_open(read, NG2, ["code", "prose"]) == ["prose"]
    # Within noise of no speculation: open too (it could be slower).
    read[E1] = {"code": runs(16.4, 9, n=15), "prose": runs(24.0, 10, n=15)}
    assert none_open(read, E1, ["code", "prose"]) == ["code"]
    # Never screened: open.
    del read[NO_SPECULATION]
    assert none_open(read, E4, ["code"]) == ["code"]
    assert none_open(read, NO_SPECULATION, ["code"]) == []


def test_an_unconfirmed_no_speculation_answers_the_tests_from_its_screening_runs() -> None:
    confirmed = {E4: {"code": runs(26.0, 11, n=15)}, E2: {"code": runs(28.0, 12, n=15)}}
    screen = runs(16.2, 13)
    decision = decide_workload("code", confirmed, E4, none_runs=screen)
    assert decision is not None and decision.verdict == "suboptimal" and decision.best == E2
    assert decision.customer_vs_none is not None and decision.customer_vs_none["faster"]
    # It is no candidate for the best: two alternatives are not three.
    assert decision.alternatives == 1
    without = decide_workload("code", confirmed, E4)
    assert without is not None and without.customer_vs_none is None
