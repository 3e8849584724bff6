"""The speculative-decoding decision: per workload, the best confirmed setting and whether
it beats the customer's and no speculation; for the server, the one setting to deploy.

Every comparison uses the confirmation runs only (fresh n = 15 measurements, never the
screening samples), but for no speculation where it was not confirmed: a fixed reference,
its screening runs are unbiased. Picking the fastest of several confirmed settings and then
testing it on the same runs would favour noise, so each workload's test of "faster than the
customer's" is one-sided at 5 % divided by the number of alternatives compared with the
customer's setting (Bonferroni; at most 2.5 %, so a gain called significant also has a
two-sided 95 % interval excluding zero), and asks for a gain above MIN_GAIN (2 %) of the
customer's rate: drift between restarts moves a trial's runs together. The fastest
setting shown per workload is the fastest proved faster, else the fastest confirmed by its
ranking mean (not proved: the customer's setting is kept, no finding). Whether the
customer's setting is slower than no speculation (harmful) is a two-sided question at 5 %.
The deployed setting maximises the delivered rate of the customer's mix: with workload shares w_i of
the generated tokens, a mix runs at H = 1 / sum(w_i / rate_i) (time adds up, not rates);
its interval comes from the delta method, with Welch-Satterthwaite degrees of freedom.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats as scipy_stats

from diagnostic.pipelines.specdec.search import NO_SPECULATION, Setting
from diagnostic.pipelines.stats import CONFIDENCE, ranking_mean, summarize, welch

ALPHA = 0.05
# A setting is called faster than the customer's only when its gain is shown to exceed this
# share of the customer's rate. Each setting is measured after its own restart, at its own
# time of the lab day, and what drifts between restarts (the lab's load, and on the
# simulated lab the machine's) moves a whole trial's runs together, which the runs' own
# spread cannot show: bench-specdec saw the customer's first trial 1.5 to 3.4 % below
# LAB_MODEL's formula, and one length 1.5 % slower than the customer's called faster at
# n = 15. A gain under 2 % is also not worth a change to a serving configuration.
MIN_GAIN = 0.02

# workload -> decode-rate samples of one confirmed setting
Samples = Mapping[str, Sequence[float]]


def difference_interval(before: Sequence[float], after: Sequence[float]) -> list[float]:
    """Welch's 95 % interval of mean(after) - mean(before)."""
    test = welch(after, before)
    se = math.sqrt(statistics.variance(after) / len(after) + statistics.variance(before) / len(before))
    half = float(scipy_stats.t.ppf(0.5 + CONFIDENCE / 2.0, test["dof"])) * se if se > 0 else 0.0
    return [round(test["diff"] - half, 4), round(test["diff"] + half, 4)]


def comparison(
    before: Sequence[float],
    after: Sequence[float],
    alpha: float,
    *,
    one_sided: bool = False,
    margin: float = 0.0,
) -> dict[str, Any]:
    """Welch's test of `after` against `before` at `alpha`; `diff` is after - before.
    `one_sided`: the question is only whether `after` is faster (p of that direction);
    `margin` (tok/s, with one_sided): whether it is faster by more than that."""
    test = welch(after, before, alpha=alpha)
    if one_sided and margin:
        shifted = welch([x - margin for x in after], before, alpha=alpha)
        test = {**test, "p": shifted["p"], "diff_for_p": shifted["diff"]}
    p = float(test["p"])
    if one_sided:
        p = p / 2.0 if test.get("diff_for_p", test["diff"]) > 0 else 1.0 - p / 2.0
    significant = p < alpha
    return {
        "diff_tps": round(test["diff"], 4),
        "ci95": difference_interval(before, after),
        "p": round(p, 6),
        "alpha": round(alpha, 6),
        "test": ("one-sided (faster)" if one_sided else "two-sided")
        + (f" by more than {margin:.2f} tok/s" if one_sided and margin else ""),
        "significant": significant,
        "faster": bool(significant and test["diff"] > 0),
        "slower": bool(significant and test["diff"] < 0),
    }


def faster_alpha(alternatives: int) -> float:
    """The level of each one-sided "faster than the customer's" test: 5 % over the
    alternatives (Bonferroni), and never above 2.5 %, so that a setting called faster also
    has a two-sided 95 % interval of its gain that excludes zero."""
    return ALPHA / max(2, alternatives)


@dataclass(frozen=True)
class WorkloadDecision:
    workload: str
    best: Setting  # what to serve this workload with (the customer's unless proved faster)
    fastest: Setting  # the highest confirmed mean, proved or not
    best_vs_customer: dict[str, Any] | None
    best_vs_none: dict[str, Any] | None
    customer_vs_none: dict[str, Any] | None
    verdict: str  # "harmful" | "suboptimal" | "ok"
    alternatives: int


def decide_workload(
    workload: str,
    confirmed: Mapping[Setting, Samples],
    customer: Setting,
    *,
    none_runs: Sequence[float] | None = None,
) -> WorkloadDecision | None:
    """The decision on one workload from confirmed samples (None when the customer's
    setting has no confirmed runs there: nothing to compare against). `none_runs`: no
    speculation's screening runs, compared against when it was not confirmed (a fixed
    reference, not a selected maximum, so its short runs are unbiased; it is then no
    candidate for the best)."""
    rated = {s: list(v[workload]) for s, v in confirmed.items() if len(v.get(workload) or ()) >= 2}
    if customer not in rated:
        return None
    alternatives = len(rated) - 1
    alpha = faster_alpha(alternatives)
    # The fastest by the ranking mean (an outlier run left out of the ranking, kept in every
    # figure and test): the setting the section shows as the workload's fastest.
    fastest = max(rated, key=lambda s: (ranking_mean(rated[s]), -s.k, s.method == customer.method))
    # Every alternative is tested (each at alpha, Bonferroni over them); the best is the
    # fastest of those proved faster, so that one run a client stall made absurdly fast,
    # which inflates its setting's mean and spread alike, does not hide another proved gain.
    margin = MIN_GAIN * statistics.fmean(rated[customer])
    tests = {
        s: comparison(rated[customer], rated[s], alpha, one_sided=True, margin=margin)
        for s in rated
        if s != customer
    }
    proved = [s for s, t in tests.items() if t["faster"]]
    best = (
        max(proved, key=lambda s: (statistics.fmean(rated[s]), -s.k, s.method == customer.method))
        if proved
        else customer
    )
    best_vs_customer = tests.get(best) if best != customer else tests.get(fastest)
    none = rated.get(NO_SPECULATION)
    if none is None and none_runs is not None and len(none_runs) >= 2:
        none = list(none_runs)
    customer_vs_none = (
        comparison(none, rated[customer], ALPHA) if none is not None and customer != NO_SPECULATION else None
    )
    best_vs_none = (
        comparison(none, rated[best], ALPHA) if none is not None and best != NO_SPECULATION else None
    )
    if customer_vs_none and customer_vs_none["slower"]:
        verdict = "harmful"
    elif best != customer:
        verdict = "suboptimal"
    else:
        verdict = "ok"
    return WorkloadDecision(
        workload,
        best,
        fastest,
        None if best == customer and fastest == customer else best_vs_customer,
        best_vs_none,
        customer_vs_none,
        verdict,
        alternatives,
    )


def mix_rate(samples: Samples, weights: Mapping[str, float]) -> tuple[float, list[tuple[float, float, int]]]:
    """H = 1 / sum(w_i / mean_i) and its delta-method terms (c_i^2 var_i of the mean, var_i
    of the mean, n_i) per workload."""
    means = {w: statistics.fmean(samples[w]) for w in weights}
    h = 1.0 / sum(wt / means[w] for w, wt in weights.items())
    terms = []
    for w, wt in weights.items():
        n = len(samples[w])
        var_mean = statistics.variance(samples[w]) / n
        gradient = h * h * wt / (means[w] ** 2)
        terms.append((gradient * gradient * var_mean, var_mean, n))
    return h, terms


def mix_comparison(
    before: Samples, after: Samples, weights: Mapping[str, float], alpha: float, *, margin: float = 0.0
) -> dict[str, Any]:
    """after's mix rate against before's: difference, 95 % interval, one-sided p (after
    faster by more than `margin` of before's mix rate, a share) at `alpha`."""
    h_before, t_before = mix_rate(before, weights)
    h_after, t_after = mix_rate(after, weights)
    terms = t_before + t_after
    var = sum(t[0] for t in terms)
    diff = h_after - h_before
    excess = diff - margin * h_before
    if var == 0.0:
        p = 0.0 if excess > 0.0 else 1.0
        half = 0.0
    else:
        dof = var**2 / sum(t[0] ** 2 / (t[2] - 1) for t in terms if t[0] > 0)
        # One-sided: the question is whether `after` serves the mix faster (by the margin).
        p = float(scipy_stats.t.sf(excess / math.sqrt(var), dof))
        half = float(scipy_stats.t.ppf(0.5 + CONFIDENCE / 2.0, dof)) * math.sqrt(var)
    return {
        "before_tps": round(h_before, 4),
        "after_tps": round(h_after, 4),
        "diff_tps": round(diff, 4),
        "ci95": [round(diff - half, 4), round(diff + half, 4)],
        "p": round(p, 6),
        "alpha": round(alpha, 6),
        "test": "one-sided (faster)" + (f" by more than {100 * margin:.0f} %" if margin else ""),
        "significant": p < alpha,
        "faster": p < alpha and excess > 0,
    }


@dataclass(frozen=True)
class Deployment:
    setting: Setting
    fastest_mix: Setting
    mix_tps: float
    vs_customer: dict[str, Any] | None
    weights: dict[str, float]


def choose_deployed(
    confirmed: Mapping[Setting, Samples], customer: Setting, weights: Mapping[str, float]
) -> Deployment | None:
    """The one setting a server runs for the mix: of the settings confirmed on every
    weighted workload and proved faster than the customer's on the mix, the one with the
    highest mix rate; the customer's when none is."""
    total = sum(w for w in weights.values() if w > 0)
    if total <= 0:
        return None
    share = {w: float(v) / total for w, v in weights.items() if v > 0}
    complete = {s: v for s, v in confirmed.items() if all(len(v.get(w) or ()) >= 2 for w in share)}
    if customer not in complete:
        return None
    rates = {s: mix_rate(v, share)[0] for s, v in complete.items()}
    fastest = max(rates, key=lambda s: (rates[s], -s.k))
    alpha = faster_alpha(len(complete) - 1)
    tests = {
        s: mix_comparison(complete[customer], complete[s], share, alpha, margin=MIN_GAIN)
        for s in complete
        if s != customer
    }
    proved = [s for s, t in tests.items() if t["faster"]]
    chosen = max(proved, key=lambda s: (rates[s], -s.k)) if proved else customer
    vs = tests.get(chosen) if chosen != customer else tests.get(fastest)
    return Deployment(chosen, fastest, round(rates[chosen], 4), vs, share)


def confirmed_summary(samples: Sequence[float]) -> dict[str, Any]:
    """n, mean and interval of one confirmed setting on one workload, as findings carry them."""
    s = summarize(samples)
    return {"n": s["n"], "mean_tps": s["mean"], "ci95": s["ci95"], "sd_tps": s["sd"], "samples": s["samples"]}
