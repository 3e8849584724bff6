"""What the specdec stage confirms after screening: the settings the decision needs, and each
workload's next best so that one low screening draw does not decide between close lengths."""

from __future__ import annotations

from diagnostic.pipelines.specdec.pipeline import RUNNER_UP_MARGIN, choose_finalists
from diagnostic.pipelines.specdec.search import NO_SPECULATION, Setting

E1, E2, E3, E4 = (Setting("eagle3", k) for k in (1, 2, 3, 4))
NG1, NG2 = Setting("ngram", 1), Setting("ngram", 2)

# Screening means seen on the reference lab at dilation 30: k = 3's five code runs came out
# low (25.9 tok/s against 27.7 by the formula), below the customer's k = 4.
SCREENED = {
    NO_SPECULATION: {"code": 16.2, "prose": 16.2},
    E4: {"code": 26.0, "prose": 20.3},
    E1: {"code": 23.8, "prose": 22.5},
    E2: {"code": 27.4, "prose": 24.3},
    E3: {"code": 25.9, "prose": 22.8},
    NG1: {"code": 19.7, "prose": 16.0},
    NG2: {"code": 19.6, "prose": 13.8},
}


def test_a_low_screening_draw_next_to_the_best_is_still_confirmed() -> None:
    finalists, runner_ups = choose_finalists(SCREENED, E4, ["code", "prose"])
    assert finalists == [E4, NO_SPECULATION, E2]
    # Code's next best outside the finalists is k = 3 (the customer's k = 4 is confirmed
    # anyway); prose's is k = 3 too: one extra confirmation serves both.
    assert runner_ups == [E3]


def test_each_workload_brings_its_own_runner_up_closest_first() -> None:
    screened = {
        NO_SPECULATION: {"code": 16.0, "prose": 16.0},
        E4: {"code": 24.0, "prose": 18.0},
        E3: {"code": 28.0, "prose": 20.0},
        E2: {"code": 27.0, "prose": 23.0},
        E1: {"code": 23.0, "prose": 22.5},
    }
    finalists, runner_ups = choose_finalists(screened, E4, ["code", "prose"])
    assert finalists == [E4, NO_SPECULATION, E3, E2]
    # code: E2 is a finalist (prose's best), so its next is E1 at 18 % below: too far.
    # prose: E3 is a finalist (code's best); E1 at 2 % below is its runner-up.
    assert runner_ups == [E1]


def test_a_runner_up_far_below_the_best_is_not_worth_a_confirmation() -> None:
    top = 30.0
    screened = {
        NO_SPECULATION: {"code": 16.0},
        E2: {"code": top},
        E1: {"code": top * (1.0 - RUNNER_UP_MARGIN) - 0.5},
    }
    finalists, runner_ups = choose_finalists(screened, NO_SPECULATION, ["code"])
    assert finalists == [NO_SPECULATION, E2] and runner_ups == []
    screened[E1] = {"code": top * (1.0 - RUNNER_UP_MARGIN) + 0.5}
    assert choose_finalists(screened, NO_SPECULATION, ["code"])[1] == [E1]


def test_without_speculation_the_customers_setting_is_no_speculation_once() -> None:
    finalists, _ = choose_finalists(SCREENED, NO_SPECULATION, ["code", "prose"])
    assert finalists == [NO_SPECULATION, E2]
