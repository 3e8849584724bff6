"""Summary statistics of per-run measurements, as METHODOLOGY.md prescribes.

Mean with a Student-t 95 % interval (n - 1 degrees of freedom), median, min, max, and
outliers flagged by the median absolute deviation (flagged, never dropped); Welch's test
to decide whether two configurations differ (`compare`, over two workload summaries). Raw
samples stay with every summary.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from scipy import stats as scipy_stats

CONFIDENCE = 0.95
# Modified z-score threshold of Iglewicz and Hoaglin: |x - median| / (1.4826 * MAD) > 3.5.
# 1.4826 makes the MAD a consistent estimator of the standard deviation for normal data.
MAD_SCALE = 1.4826
OUTLIER_Z = 3.5
# When more than half the samples are equal the MAD is 0; the usual fallback scales the
# mean absolute deviation from the median instead (1.2533 = sqrt(pi / 2)).
MEAN_AD_SCALE = 1.2533
OUTLIER_RULE = (
    f"|x - median| / ({MAD_SCALE} * MAD) > {OUTLIER_Z} (modified z-score); when MAD = 0, "
    f"{MEAN_AD_SCALE} * mean absolute deviation from the median stands for the scale"
)


def t_interval(samples: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Student-t interval of the mean with n - 1 degrees of freedom; None below two samples."""
    n = len(samples)
    if n < 2:
        return None
    mean = statistics.fmean(samples)
    sd = statistics.stdev(samples)
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2.0, n - 1)) * sd / math.sqrt(n)
    return (mean - half, mean + half)


def outlier_flags(samples: Sequence[float]) -> list[dict[str, Any]]:
    """Each sample's robust z-score and whether it is flagged as an outlier."""
    if not samples:
        return []
    median = statistics.median(samples)
    deviations = [abs(x - median) for x in samples]
    scale = MAD_SCALE * statistics.median(deviations)
    if scale == 0.0:
        scale = MEAN_AD_SCALE * statistics.fmean(deviations)
    flags = []
    for i, dev in enumerate(deviations):
        z = dev / scale if scale > 0.0 else 0.0
        flags.append({"index": i, "robust_z": round(z, 3), "outlier": z > OUTLIER_Z})
    return flags


def ranking_mean(samples: Sequence[float]) -> float:
    """The mean of the samples not flagged as outliers: what ranks settings against each
    other when a search picks which to measure further. One run a client stall made
    absurd (a burst of tokens read as thousands a second) must not make a setting the
    leader; the outlier stays in every reported mean and test."""
    if not samples:
        raise ValueError("no samples")
    kept = [x for x, f in zip(samples, outlier_flags(samples), strict=True) if not f["outlier"]]
    return statistics.fmean(kept or samples)


def summarize(samples: Sequence[float], *, digits: int = 6) -> dict[str, Any]:
    """Mean, 95 % t-interval, sd, median, min, max, flagged outliers and the raw samples.

    Figures keep `digits` decimals (the samples' own precision by default): whoever prints
    them rounds once; a stored 19.65 for a mean of 19.6505 would print as 19.6.
    """
    values = [float(x) for x in samples]
    if not values:
        return {
            "n": 0,
            "mean": None,
            "ci95": None,
            "sd": None,
            "median": None,
            "min": None,
            "max": None,
            "outliers": [],
            "samples": [],
        }
    interval = t_interval(values)
    flags = outlier_flags(values)
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), digits),
        "ci95": [round(interval[0], digits), round(interval[1], digits)] if interval else None,
        "sd": round(statistics.stdev(values), digits) if len(values) > 1 else None,
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "outliers": [f["index"] for f in flags if f["outlier"]],
        "robust_z": [f["robust_z"] for f in flags],
        "samples": [round(x, 6) for x in values],
    }


def welch(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> dict[str, Any]:
    """Welch's unequal-variance t-test of mean(a) against mean(b).

    t = (mean_a - mean_b) / sqrt(va/na + vb/nb); degrees of freedom by Welch-Satterthwaite;
    two-sided p. The two are called different only when p < alpha.
    """
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        raise ValueError(f"Welch's test needs at least 2 samples on each side, got {na} and {nb}")
    mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
    va, vb = statistics.variance(a) / na, statistics.variance(b) / nb
    diff = mean_a - mean_b
    if va + vb == 0.0:
        # Both sides constant: identical means are not different, distinct ones certainly are.
        same = diff == 0.0
        return {
            "t": 0.0 if same else math.copysign(math.inf, diff),
            "dof": float(na + nb - 2),
            "p": 1.0 if same else 0.0,
            "different": not same,
            "alpha": alpha,
            "mean_a": mean_a,
            "mean_b": mean_b,
            "diff": diff,
            "ci95": [diff, diff],
        }
    se = math.sqrt(va + vb)
    t = diff / se
    dof = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
    p = float(2.0 * scipy_stats.t.sf(abs(t), dof))
    # The (1 - alpha) interval of mean_a - mean_b on the same Welch-Satterthwaite t.
    half = float(scipy_stats.t.ppf(1.0 - alpha / 2.0, dof)) * se
    return {
        "t": t,
        "dof": dof,
        "p": p,
        "different": p < alpha,
        "alpha": alpha,
        "mean_a": mean_a,
        "mean_b": mean_b,
        "diff": diff,
        "ci95": [diff - half, diff + half],
    }


def compare(before: Mapping[str, Any], after: Mapping[str, Any], alpha: float = 0.05) -> dict[str, Any]:
    """Welch's test between two measured configurations of one workload.

    `before` and `after` are workload summaries as a measurement section holds them (their
    `decode.samples` and `mean_tps`); `diff` is after minus before, so a faster `after`
    gives a positive one.
    """
    a = before["decode"]["samples"]
    b = after["decode"]["samples"]
    result = welch(b, a, alpha=alpha)
    result["metric"] = "decode tok/s"
    result["before_mean"], result["after_mean"] = before["mean_tps"], after["mean_tps"]
    return result
