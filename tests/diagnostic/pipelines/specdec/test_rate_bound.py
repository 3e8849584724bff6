"""The bound on a draft length's rate from one trial that reports only the mean accepted
length (SGLang's `accept len`): never below the rate LAB_MODEL.md's decode physics give at
that length, and tight enough to leave n-gram's short lengths unscreened on the reference
SGLang lab, where EAGLE-3 leads by far."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnostic.pipelines.specdec.model import rate_bound
from diagnostic.pipelines.specdec.pipeline import CONFIRM, SCREEN, _Run, ruled_out_by_bound
from diagnostic.pipelines.specdec.search import NO_SPECULATION, Setting, search_k

# LAB_MODEL.md section 3 on the reference lab: t_step 61.7 ms (no speculation 16.2 tok/s).
T_STEP_MS = 61.7
GROWTH = 0.2
EAGLE3 = {"code": [0.86, 0.76, 0.66, 0.45, 0.34, 0.26, 0.2],
          "prose": [0.75, 0.55, 0.40, 0.28, 0.2, 0.15, 0.1]}
NGRAM = {"code": [0.5, 0.35, 0.25, 0.18], "prose": [0.2, 0.1, 0.05, 0.03]}
DRAFT_MS = {"eagle3": 2.5, "ngram": 0.3}


def emitted(acceptance: list[float], k: int) -> float:
    total, run = 1.0, 1.0
    for j in range(k):
        run *= acceptance[j] if j < len(acceptance) else 0.0
        total += run
    return total


def rate(acceptance: list[float], k: int, draft_ms: float, t_step: float = T_STEP_MS,
         growth: float = GROWTH) -> float:
    return emitted(acceptance, k) / (t_step * (1 + growth * k) + k * draft_ms) * 1000.0


@settings(max_examples=300, deadline=None)
@given(
    acceptance=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8),
    t_step=st.floats(10.0, 200.0),
    growth=st.floats(0.0, 0.5),
    draft_ms=st.floats(0.0, 20.0),
    k0=st.integers(1, 8),
    k=st.integers(1, 12),
)
def test_the_bound_never_falls_below_the_physics(acceptance: list[float], t_step: float, growth: float,
                                                 draft_ms: float, k0: int, k: int) -> None:
    none_rate = 1000.0 / t_step
    measured = rate(acceptance, k0, draft_ms, t_step, growth)
    bound = rate_bound(k, k0=k0, accept_len=emitted(acceptance, k0), rate=measured, none_rate=none_rate)
    assert bound is not None
    assert bound >= rate(acceptance, k, draft_ms, t_step, growth) * (1 - 1e-9)


def test_ngrams_short_lengths_are_bounded_far_below_eagle3_on_the_reference_lab() -> None:
    none_rate = 1000.0 / T_STEP_MS
    for w in ("code", "prose"):
        leader = max(rate(EAGLE3[w], k, DRAFT_MS["eagle3"]) for k in range(1, 8))
        measured = rate(NGRAM[w], 4, DRAFT_MS["ngram"])
        for k in (1, 2, 8):
            bound = rate_bound(k, k0=4, accept_len=emitted(NGRAM[w], 4), rate=measured, none_rate=none_rate)
            assert bound is not None and bound * 1.1 < leader
    # EAGLE-3's own k = 1 is not: its bound from k = 4 reaches the customer's k = 4.
    bound = rate_bound(1, k0=4, accept_len=emitted(EAGLE3["code"], 4),
                       rate=rate(EAGLE3["code"], 4, DRAFT_MS["eagle3"]), none_rate=none_rate)
    assert bound is not None and bound * 1.1 > rate(EAGLE3["code"], 4, DRAFT_MS["eagle3"])


def test_inputs_that_cannot_bound_give_none() -> None:
    assert rate_bound(0, k0=4, accept_len=2.0, rate=20.0, none_rate=16.0) is None
    assert rate_bound(2, k0=4, accept_len=0.5, rate=20.0, none_rate=16.0) is None
    assert rate_bound(2, k0=4, accept_len=2.0, rate=0.0, none_rate=16.0) is None
    assert math.isfinite(rate_bound(2, k0=4, accept_len=2.0, rate=20.0, none_rate=16.0) or math.nan)


def test_the_search_skips_a_ruled_out_length_and_says_why() -> None:
    asked: list[int] = []

    def screen(setting: Setting) -> dict[str, float]:
        asked.append(setting.k)
        return {"code": 16.0}

    found = search_k("ngram", ["code"], screen, k_max=16, seeds={4}, fallback_seeds=(1, 2),
                     ruled_out=lambda s: "bounded" if s.k != 4 else None)
    assert asked == [4]
    assert sorted(found.ruled_out) == [1, 2, 8]
    assert found.describe()["ruled_out_k"] == {"1": "bounded", "2": "bounded", "8": "bounded"}
    assert "bounded below the leader" in found.stopped


def make_run() -> _Run:
    lab = SimpleNamespace(clock=SimpleNamespace(now=lambda: 0.0))
    config = {"engine": {"name": "sglang", "version": "0.5.23"}, "workloads": ["code", "prose"],
              "speculative": {"method": "eagle3", "num_speculative_tokens": 4}}
    return _Run(lab, config, log=lambda _m: None, progress=lambda _p, _m: None,  # type: ignore[arg-type]
                check_cancelled=lambda: None, budget_lab_s=4500.0, measure=lambda *a, **k: {},
                screen=SCREEN, confirm=CONFIRM)


def row(trial: int, method: str, k: int, w: str, mean: float, accept: float | None,
        per_position: list[float] | None = None) -> dict[str, Any]:
    samples = [mean * f for f in (0.98, 1.0, 1.02, 0.99, 1.01)]
    return {"trial": trial, "method": method, "k": k, "workload": w, "phase": "screen", "status": "measured",
            "samples": samples, "mean_tps": mean,
            "acceptance": None if accept is None else {"mean_acceptance_length": accept,
                                                       "per_position": per_position or []}}


def sglang_day(per_position: bool = False) -> _Run:
    """The reference SGLang day's trials as they were measured (2026-12-05): no speculation,
    EAGLE-3 k = 2, n-gram k = 4."""
    run = make_run()
    found = {
        NO_SPECULATION: {"code": (15.98, None), "prose": (16.33, None)},
        Setting("eagle3", 2): {"code": (28.02, 2.54), "prose": (22.93, 2.1474)},
        Setting("ngram", 4): {"code": (16.1, 1.7988), "prose": (11.05, 1.2466)},
    }
    for i, (setting, rates) in enumerate(found.items(), start=1):
        rows = {w: row(i, setting.method, setting.k, w, mean, accept,
                       [0.5, 0.2, 0.1, 0.0] if per_position and accept else None)
                for w, (mean, accept) in rates.items()}
        run.trials.extend(rows.values())
        run.screened[setting] = rows
    return run


def test_ngrams_short_lengths_are_not_screened_on_sglangs_evidence() -> None:
    run = sglang_day()
    for k in (1, 2, 8):
        why = ruled_out_by_bound(run, Setting("ngram", k), ["code", "prose"])
        assert why is not None and "eagle3" in why
    # EAGLE-3's other lengths may lead: screened as before.
    assert ruled_out_by_bound(run, Setting("eagle3", 3), ["code", "prose"]) is None
    assert ruled_out_by_bound(run, NO_SPECULATION, ["code", "prose"]) is None


def test_an_engine_with_acceptance_per_position_is_left_to_the_model() -> None:
    assert ruled_out_by_bound(sglang_day(per_position=True), Setting("ngram", 1), ["code", "prose"]) is None


@pytest.mark.parametrize("missing", ["none", "method"])
def test_without_the_evidence_nothing_is_ruled_out(missing: str) -> None:
    run = sglang_day()
    if missing == "none":
        run.screened.pop(NO_SPECULATION)
        run.trials = [t for t in run.trials if t["method"] != "none"]
    else:
        run.trials = [t for t in run.trials if t["method"] != "ngram"]
    assert ruled_out_by_bound(run, Setting("ngram", 1), ["code", "prose"]) is None
