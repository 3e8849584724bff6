"""The decision from confirmed samples: verdicts per workload, keeping the customer's
setting when nothing is proved faster, and the deployed setting for the mix."""

from __future__ import annotations

import random

from diagnostic.pipelines.specdec.catalog import load_catalog
from diagnostic.pipelines.specdec.decide import (
    MIN_GAIN,
    choose_deployed,
    decide_workload,
    difference_interval,
    mix_rate,
)
from diagnostic.pipelines.specdec.search import NO_SPECULATION, Setting
from diagnostic.pipelines.stats import welch


def runs(mean: float, seed: int, n: int = 15, sigma: float = 0.03) -> list[float]:
    rng = random.Random(seed)
    return [mean * (1.0 + rng.gauss(0.0, sigma)) for _ in range(n)]


E4, E3, E2 = Setting("eagle3", 4), Setting("eagle3", 3), Setting("eagle3", 2)
NG8 = Setting("ngram", 8)


def reference() -> dict[Setting, dict[str, list[float]]]:
    return {
        E4: {"code": runs(25.9, 1), "prose": runs(19.6, 2)},
        NO_SPECULATION: {"code": runs(16.2, 3), "prose": runs(16.2, 4)},
        E3: {"code": runs(27.7, 5), "prose": runs(21.9, 6)},
        E2: {"code": runs(27.5, 7), "prose": runs(23.7, 8)},
    }


def test_the_reference_customer_setting_is_suboptimal_on_both_workloads() -> None:
    confirmed = reference()
    code, prose = decide_workload("code", confirmed, E4), decide_workload("prose", confirmed, E4)
    assert code is not None and prose is not None
    assert code.verdict == prose.verdict == "suboptimal"
    assert code.best in (E3, E2) and prose.best == E2
    assert code.best_vs_customer and code.best_vs_customer["faster"]
    # Three alternatives to the customer's: one-sided at 5 % / 3.
    assert abs(code.best_vs_customer["alpha"] - 0.05 / 3) < 1e-6
    assert code.best_vs_customer["test"].startswith("one-sided (faster) by more than")
    deployed = choose_deployed(confirmed, E4, {"code": 1.0, "prose": 1.0})
    assert deployed is not None and deployed.setting == E2  # 25.5 tok/s on the mix against 24.4 for k = 3
    assert deployed.vs_customer and deployed.vs_customer["faster"]


def test_a_long_ngram_draft_is_harmful_against_no_speculation() -> None:
    confirmed = {
        NG8: {"code": runs(10.6, 1), "prose": runs(7.5, 2)},
        NO_SPECULATION: {"code": runs(16.2, 3), "prose": runs(16.2, 4)},
    }
    for w in ("code", "prose"):
        d = decide_workload(w, confirmed, NG8)
        assert d is not None and d.verdict == "harmful" and d.best == NO_SPECULATION
        assert d.customer_vs_none and d.customer_vs_none["slower"]


def test_nothing_proved_faster_keeps_the_customers_setting() -> None:
    # k = 2 is 0.7 % slower than the customer's k = 3 on code: within the noise either way.
    confirmed = {
        E3: {"code": runs(27.7, 11)},
        E2: {"code": runs(27.5, 12)},
        NO_SPECULATION: {"code": runs(16.2, 13)},
    }
    d = decide_workload("code", confirmed, E3)
    assert d is not None and d.verdict == "ok" and d.best == E3
    deployed = choose_deployed(confirmed, E3, {"code": 1.0})
    assert deployed is not None and deployed.setting == E3


def test_the_mix_rate_adds_time_not_rates() -> None:
    h, terms = mix_rate({"code": [30.0, 30.0], "prose": [10.0, 10.0]}, {"code": 0.5, "prose": 0.5})
    assert abs(h - 15.0) < 1e-9 and all(t[0] == 0.0 for t in terms)


def test_the_difference_interval_brackets_the_difference() -> None:
    lo, hi = difference_interval(runs(20.0, 1), runs(22.0, 2))
    assert lo < 2.0 < hi and lo > 0


def test_the_catalog_names_the_kimi_k2_draft_with_its_source() -> None:
    catalog = load_catalog()
    for model in (
        "moonshotai/Kimi-K2-Instruct-0905",
        "moonshotai/kimi-k2-instruct",
        "/models/Kimi-K2-Instruct-0905",
    ):
        drafts = catalog.drafts_for(model)
        assert [d.id for d in drafts] == ["AQ-MedAI/Kimi-K2-Instruct-eagle3"]
        assert drafts[0].source.startswith("https://")
    assert catalog.drafts_for("Qwen/Qwen3-8B") == []
    assert catalog.version


def test_a_gain_called_significant_has_an_interval_that_excludes_zero() -> None:
    # One alternative: the one-sided test runs at 2.5 %, the two-sided interval's level, and
    # asks for more than MIN_GAIN (2 %): a 5 % gain at 3 % run noise is found often, not always.
    called = 0
    for seed in range(40):
        confirmed = {E3: {"code": runs(27.0, seed)}, E2: {"code": runs(27.0 * 1.05, 100 + seed)}}
        d = decide_workload("code", confirmed, E3)
        assert d is not None and d.best_vs_customer is not None
        assert d.best_vs_customer["alpha"] == 0.025
        if d.best == E2:
            called += 1
            assert d.best_vs_customer["ci95"][0] > 0.0
    assert 10 <= called < 40


def test_a_gain_under_the_margin_is_not_a_finding() -> None:
    # A 1.5 % gain is within what drifts between restarts: never called faster, even where
    # its runs alone would make it significant; the section still shows it as the fastest.
    assert MIN_GAIN == 0.02
    kept = 0
    for seed in range(40):
        confirmed = {
            E3: {"code": runs(27.0, seed, sigma=0.005)},
            E2: {"code": runs(27.0 * 1.015, 100 + seed, sigma=0.005)},
        }
        d = decide_workload("code", confirmed, E3)
        assert d is not None and d.best == E3 and d.verdict == "ok"
        assert welch(confirmed[E2]["code"], confirmed[E3]["code"])["p"] < 0.05  # significant without it
        kept += d.fastest == E2
    assert kept == 40


def test_a_slower_alternative_is_never_called_faster() -> None:
    for seed in range(40):
        confirmed = {E3: {"code": runs(27.0, seed)}, E2: {"code": runs(27.0 * 0.97, 100 + seed)}}
        d = decide_workload("code", confirmed, E3)
        assert d is not None and d.best == E3 and d.verdict == "ok"


def test_one_absurd_run_does_not_hide_a_proved_gain() -> None:
    # A client stall made one of k = 2's runs read 2,877 tok/s: its mean is the highest and
    # its spread too wide to prove anything; no speculation is still proved faster than the
    # harmful n-gram k = 8, on the workload and on the mix.
    stalled = runs(15.9, 21)
    stalled[4] = 2877.0
    confirmed = {
        NG8: {"code": runs(10.6, 1)},
        NO_SPECULATION: {"code": runs(16.2, 3)},
        E2: {"code": stalled},
    }
    d = decide_workload("code", confirmed, NG8)
    # The outlier is left out of the ranking (kept in the tests): k = 2 is not the fastest.
    assert d is not None and d.fastest == NO_SPECULATION
    assert d.verdict == "harmful" and d.best == NO_SPECULATION
    assert d.best_vs_customer is not None and d.best_vs_customer["faster"]
    deployed = choose_deployed(confirmed, NG8, {"code": 1.0})
    assert deployed is not None and deployed.fastest_mix == E2 and deployed.setting == NO_SPECULATION
