"""The acceptance model: rate against draft length from the engine's per-position
acceptance and the trials' step times, and the search and finalists it guides."""

from __future__ import annotations

import random

import pytest

from diagnostic.pipelines.specdec.model import Observation, fit
from diagnostic.pipelines.specdec.pipeline import choose_finalists
from diagnostic.pipelines.specdec.search import NO_SPECULATION, Setting, search_k

# LAB_MODEL.md section 3's physics with numbers unlike the reference's.
T_STEP_MS, GROWTH = 55.0, 0.15
DRAFT_MS = {"eagle3": 3.0, "ngram": 0.4}
ACCEPTANCE = {
    ("eagle3", "code"): [0.93, 0.9, 0.86, 0.8, 0.72, 0.6, 0.45, 0.3],
    ("eagle3", "prose"): [0.8, 0.62, 0.45, 0.3, 0.2],
    ("ngram", "code"): [0.7, 0.5, 0.3],
    ("ngram", "prose"): [0.3, 0.1],
}


def positions(method: str, workload: str, k: int) -> list[float]:
    """vLLM's per-position acceptance at length k: the share of drafts accepted up to j."""
    out, survive = [], 1.0
    acceptance = ACCEPTANCE[(method, workload)]
    for j in range(k):
        survive *= acceptance[j] if j < len(acceptance) else 0.0
        out.append(survive)
    return out


def rate(method: str, workload: str, k: int) -> float:
    if k == 0:
        return 1000.0 / T_STEP_MS
    emitted = 1.0 + sum(positions(method, workload, k))
    return emitted / (T_STEP_MS * (1.0 + GROWTH * k) + k * DRAFT_MS[method]) * 1000.0


def observe(
    method: str, workload: str, k: int, noise: float = 0.0, rng: random.Random | None = None
) -> Observation:
    measured = rate(method, workload, k) * (1.0 + (rng.gauss(0.0, noise) if rng else 0.0))
    return Observation(method, k, workload, measured, tuple(positions(method, workload, k)), drafts=300.0)


NONE_RATES = {"code": rate("eagle3", "code", 0), "prose": rate("eagle3", "prose", 0)}


def test_one_trial_gives_every_shorter_length_exactly() -> None:
    model = fit([observe("eagle3", w, 8) for w in ("code", "prose")], NONE_RATES)
    for w in ("code", "prose"):
        curve = model.curve("eagle3", w)
        assert sorted(curve) == list(range(1, 9))
        for k, predicted in curve.items():
            assert predicted == pytest.approx(rate("eagle3", w, k), rel=1e-9)
    assert model.predict("eagle3", "code", 9) is None  # beyond the acceptance the engine reported
    assert model.predict("ngram", "code", 1) is None  # a method never tried
    assert model.predict("none", "code", 0) == pytest.approx(NONE_RATES["code"])


def test_the_peak_of_a_noisy_trial_set_is_within_a_percent_of_the_formulas() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        obs = [observe("eagle3", w, k, noise=0.03, rng=rng) for k in (2, 4, 8) for w in ("code", "prose")]
        model = fit(obs, NONE_RATES)
        for w in ("code", "prose"):
            curve = model.curve("eagle3", w)
            chosen = max(curve, key=curve.__getitem__)
            best = max(range(1, 9), key=lambda k, w=w: rate("eagle3", w, k))
            assert rate("eagle3", w, chosen) >= 0.99 * rate("eagle3", w, best)


def test_pooled_acceptance_stays_monotone_and_without_acceptance_there_is_no_curve() -> None:
    noisy = Observation("ngram", 3, "code", 20.0, (0.7, 0.72, 0.3), drafts=100.0)
    model = fit([noisy], NONE_RATES)
    assert model.positions[("ngram", "code")] == [0.7, 0.7, 0.3]
    blind = fit([Observation("ngram", 3, "code", 20.0, (), drafts=0.0)], NONE_RATES)
    assert blind.curve("ngram", "code") == {}
    assert "ngram" not in blind.slope


def test_the_search_reads_the_curve_from_one_long_trial_and_lengthens_while_it_rises() -> None:
    calls: list[int] = []
    trials: list[Observation] = []

    def screen(setting: Setting) -> dict[str, float]:
        calls.append(setting.k)
        got = [observe(setting.method, w, setting.k) for w in ("code", "prose")]
        trials.extend(got)
        return {o.workload: o.rate for o in got}

    def predict(method: str) -> dict[str, dict[int, float]]:
        model = fit(trials, NONE_RATES)
        return {w: model.curve(method, w) for w in ("code", "prose")}

    found = search_k("eagle3", ["code", "prose"], screen, k_max=16, seeds=(4,), predict=predict,
                     fallback_seeds=(1, 2))
    # Code's curve still rises at k = 4: k = 8 is measured, and holds its peak.
    assert calls == [4, 8]
    peak_code = max(range(1, 17), key=lambda k: rate("eagle3", "code", k))
    assert found.predicted_best("code") == peak_code
    assert found.predicted_best("prose") == max(range(1, 9), key=lambda k: rate("eagle3", "prose", k))
    assert "acceptance model" in found.stopped


def test_without_acceptance_the_search_screens_the_short_seeds_and_refines_on_rates() -> None:
    calls: list[int] = []

    def screen(setting: Setting) -> dict[str, float]:
        calls.append(setting.k)
        return {"code": rate("eagle3", "code", setting.k)}

    found = search_k("eagle3", ["code"], screen, k_max=16, seeds=(4,), predict=lambda _m: {},
                     fallback_seeds=(1, 2))
    assert calls[:3] == [4, 1, 2]
    assert found.best("code") == max(range(1, 17), key=lambda k: rate("eagle3", "code", k))
    assert found.predicted == {}


def test_finalists_follow_the_model_to_a_length_never_screened() -> None:
    # Screened: the customer's k = 4 and k = 8; the model puts prose's peak at an unmeasured
    # length, which becomes a finalist; a length within 2 % of a leader is a runner-up.
    e4, e8 = Setting("eagle3", 4), Setting("eagle3", 8)
    runs = {s: {w: [rate(s.method, w, s.k)] * 5 for w in ("code", "prose")} for s in (e4, e8)}
    runs[NO_SPECULATION] = {w: [NONE_RATES[w]] * 5 for w in ("code", "prose")}
    model = fit([observe("eagle3", w, 8) for w in ("code", "prose")], NONE_RATES)
    predicted = {
        Setting("eagle3", k): {w: model.predict("eagle3", w, k) or 0.0 for w in ("code", "prose")}
        for k in range(1, 9)
    }
    finalists, runner_ups = choose_finalists(runs, e4, ["code", "prose"], None, predicted)
    best = {w: max(range(1, 9), key=lambda k, w=w: rate("eagle3", w, k)) for w in ("code", "prose")}
    assert Setting("eagle3", best["prose"]) in finalists and Setting("eagle3", best["code"]) in finalists
    assert best["prose"] not in (4, 8)
    for s in runner_ups:
        near = max(predicted[s][w] / max(p[w] for p in predicted.values()) for w in ("code", "prose"))
        assert near >= 0.98 and s not in finalists
    assert NO_SPECULATION not in finalists + runner_ups
    # A refused setting is never chosen.
    refused = Setting("eagle3", best["prose"])
    again, _ = choose_finalists(runs, e4, ["code", "prose"], None, predicted, refused={refused})
    assert refused not in again
