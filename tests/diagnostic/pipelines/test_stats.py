"""Summary statistics: intervals and Welch's test agree with scipy; outliers are flagged, not dropped."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from diagnostic.pipelines.stats import OUTLIER_Z, compare, outlier_flags, summarize, t_interval, welch

SAMPLES = [25.1, 26.3, 27.0, 25.8, 26.6, 24.9, 27.4, 26.1, 25.5, 26.8, 26.0, 25.2, 27.1, 26.4, 25.9]


def test_t_interval_matches_scipy_on_fixed_samples() -> None:
    got = t_interval(SAMPLES)
    n = len(SAMPLES)
    mean = sum(SAMPLES) / n
    expected = scipy_stats.t.interval(0.95, n - 1, loc=mean, scale=scipy_stats.sem(SAMPLES))
    assert got is not None
    assert got[0] == pytest.approx(expected[0], rel=1e-12)
    assert got[1] == pytest.approx(expected[1], rel=1e-12)


@given(st.lists(st.floats(min_value=1.0, max_value=100.0), min_size=2, max_size=30))
def test_t_interval_matches_scipy_for_any_samples(samples: list[float]) -> None:
    got = t_interval(samples)
    n = len(samples)
    sem = scipy_stats.sem(samples)
    assert got is not None
    if sem == 0:
        assert got[0] == pytest.approx(got[1])
        return
    expected = scipy_stats.t.interval(0.95, n - 1, loc=sum(samples) / n, scale=sem)
    assert got[0] == pytest.approx(expected[0], rel=1e-9, abs=1e-9)
    assert got[1] == pytest.approx(expected[1], rel=1e-9, abs=1e-9)


def test_a_single_sample_has_no_interval() -> None:
    assert t_interval([3.0]) is None
    assert summarize([3.0])["ci95"] is None


def test_welch_matches_scipy_unequal_variance_t_test() -> None:
    a = [25.9, 26.2, 25.1, 26.8, 25.5, 26.0, 25.7, 26.4]
    b = [27.7, 28.9, 26.5, 27.9, 29.4, 27.1, 28.2, 27.0, 28.8, 26.9]
    got = welch(a, b)
    expected = scipy_stats.ttest_ind(a, b, equal_var=False)
    assert got["t"] == pytest.approx(expected.statistic, rel=1e-10)
    assert got["p"] == pytest.approx(expected.pvalue, rel=1e-9)
    assert got["dof"] == pytest.approx(expected.df, rel=1e-10)
    assert got["different"] is True


def test_welch_does_not_call_overlapping_samples_different() -> None:
    a = [25.9, 26.2, 25.1, 26.8, 25.5]
    b = [26.0, 25.4, 26.6, 25.8, 26.1]
    assert welch(a, b)["different"] is False


def test_welch_refuses_fewer_than_two_samples() -> None:
    with pytest.raises(ValueError, match="at least 2 samples"):
        welch([1.0], [1.0, 2.0])


def test_an_outlier_is_flagged_and_kept() -> None:
    samples = [*SAMPLES[:-1], 12.0]
    summary = summarize(samples)
    assert summary["outliers"] == [len(samples) - 1]
    assert summary["n"] == len(samples)
    assert summary["min"] == 12.0
    assert summary["mean"] == pytest.approx(sum(samples) / len(samples), abs=1e-3)
    assert summary["samples"][-1] == 12.0


def test_no_outliers_in_well_behaved_samples() -> None:
    assert summarize(SAMPLES)["outliers"] == []


def test_outliers_are_judged_when_most_samples_are_equal() -> None:
    flags = outlier_flags([10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 50.0])
    assert [f["outlier"] for f in flags] == [False] * 6 + [True]
    assert flags[-1]["robust_z"] > OUTLIER_Z


def test_summary_reports_median_min_max_and_raw_samples() -> None:
    s = summarize([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["samples"]) == (2.0, 1.0, 3.0, [3.0, 1.0, 2.0])
    assert s["sd"] == pytest.approx(1.0)
    assert not math.isnan(s["mean"])


def test_compare_tests_after_against_before_on_the_workload_summaries_decode_samples() -> None:
    before = summarize(SAMPLES)
    after = summarize([x + 1.5 for x in SAMPLES])
    verdict = compare(
        {"decode": before, "mean_tps": before["mean"]}, {"decode": after, "mean_tps": after["mean"]}
    )
    expected = scipy_stats.ttest_ind([x + 1.5 for x in SAMPLES], SAMPLES, equal_var=False)
    assert verdict["p"] == pytest.approx(expected.pvalue, rel=1e-9)
    assert verdict["diff"] == pytest.approx(1.5) and verdict["different"]
    assert (verdict["metric"], verdict["before_mean"], verdict["after_mean"]) == (
        "decode tok/s", before["mean"], after["mean"]
    )


def test_welch_interval_of_the_difference_matches_scipy() -> None:
    import scipy.stats

    a = [27.1, 27.9, 27.4, 28.2, 27.6, 27.3]
    b = [25.8, 26.3, 25.9, 26.4, 26.1]
    got = welch(a, b)
    want = scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert got["ci95"][0] == pytest.approx(want.low)
    assert got["ci95"][1] == pytest.approx(want.high)
    assert got["ci95"][0] > 0  # a is faster: the whole interval of a - b is above zero
