"""Which differences cost, with few restarts: delta debugging on measured runs.

The caller has measured the current configuration (`current`) and the current
configuration with every candidate applied (`whole`), and `whole` was significantly
better. The set is split in halves; a half is measured (a restart and a few runs) and
searched further only when its runs are significantly better than the current
configuration's. The other half is searched without a measurement of its own when the
measured half gave nothing (the gain must then lie there), and skipped when the measured
half was not significantly short of the set it came from (it holds the whole gain). With
one costly difference among m candidates that is about log2(m) restarts instead of m; a
single candidate is measured with the proof's protocol at once, so its runs are also its
proof. Nothing here touches the lab: `measure` does.

Runs are {metric: samples}; `better` says which way a metric improves ("higher" for a
decode rate, "lower" for a cold start). Every decision is Welch's test at `alpha`, two-sided,
read in the better direction, on 20 % trimmed means (`trimmed_welch`, Yuen's form of it).

Why trimmed. A run the client or the lab stalled in (a process descheduled for a fraction
of a wall second is many lab seconds at a high dilation; on a real lab a client hiccup)
gives a rate far from the others: the measurement flags it (stats.outlier_flags) and keeps
it. In Welch's test on all runs one such run inflates the variance so much that a 17 %
gain on n = 15 a side is not significant: the benchmark's seed 18 lost eager mode that
way. Dropping the flagged runs and testing the rest is not the answer either: the rule
flags up to six legitimate runs of fifteen when speculation makes the rates cluster, and a
test on what a data-driven cut leaves understates the spread, so it would call more
changes significant than its 5 % (false findings). Trimming a fixed share of each side,
chosen before the data, and taking the spread from the winsorized variance (which accounts
for the trimming) keeps the test at its level while one stalled run in five, or three in
fifteen, no longer decides it. Below five runs nothing is trimmed and it is Welch's test
on the means (a cold-start comparison of two starts a side).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scipy import stats as scipy_stats

Runs = Mapping[str, Sequence[float]]
ALPHA = 0.05
# The share trimmed from each end of a side's runs (Wilcox's usual 20 %): robust to one
# stalled run in five and three in fifteen, at little cost in power on clean runs.
TRIM = 0.2
TEST_NAME = "Welch's test on 20 % trimmed means (Yuen)"


def trimmed(samples: Sequence[float], trim: float = TRIM) -> tuple[float, float, int, int]:
    """(trimmed mean, its squared standard error, runs kept, runs trimmed per end) of one side.

    g = floor(trim * n) runs leave each end; the squared standard error is
    (n - 1) * winsorized variance / (h * (h - 1)) with h = n - 2g runs kept (Yuen 1974):
    the winsorized variance, not the variance of what is kept, because the kept runs are
    the middle of the sample and their own spread understates the mean's."""
    xs = sorted(float(x) for x in samples)
    n = len(xs)
    g = math.floor(trim * n)
    h = n - 2 * g
    kept = xs[g:n - g]
    winsorized = [xs[g]] * g + kept + [xs[n - g - 1]] * g
    return statistics.fmean(kept), (n - 1) * statistics.variance(winsorized) / (h * (h - 1)), h, g


def trimmed_welch(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA,
                  trim: float = TRIM) -> dict[str, Any]:
    """Welch's test of trimmed_mean(a) - trimmed_mean(b) (Yuen's trimmed t): the statistic
    over the squared standard errors of `trimmed`, Welch-Satterthwaite degrees of freedom on
    h - 1 per side, two-sided p, and the (1 - alpha) interval of the difference. Without
    trimming (fewer than five runs a side) it is stats.welch. The keys are stats.welch's,
    with mean_a and mean_b the trimmed means, plus `trimmed` (runs left out per end, a and b)."""
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        raise ValueError(f"Welch's test needs at least 2 samples on each side, got {na} and {nb}")
    mean_a, va, ha, ga = trimmed(a, trim)
    mean_b, vb, hb, gb = trimmed(b, trim)
    diff = mean_a - mean_b
    base = {"alpha": alpha, "mean_a": mean_a, "mean_b": mean_b, "diff": diff, "trim": trim,
            "trimmed": [ga, gb]}
    if va + vb == 0.0:
        # Both sides constant once trimmed: identical means are not different, distinct ones are.
        same = diff == 0.0
        return {**base, "t": 0.0 if same else math.copysign(math.inf, diff), "dof": float(ha + hb - 2),
                "p": 1.0 if same else 0.0, "different": not same, "ci95": [diff, diff]}
    se = math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va**2 / (ha - 1) + vb**2 / (hb - 1))
    p = float(2.0 * scipy_stats.t.sf(abs(diff / se), dof))
    half = float(scipy_stats.t.ppf(1.0 - alpha / 2.0, dof)) * se
    return {**base, "t": diff / se, "dof": dof, "p": p, "different": p < alpha,
            "ci95": [diff - half, diff + half]}


class OutOfBudget(Exception):
    """The next measurement would not fit the stage's lab-time budget."""


def _signed(diff: float, better: str) -> float:
    return diff if better == "higher" else -diff


def improves(after: Runs, before: Runs, *, better: str, alpha: float = ALPHA) -> bool:
    """On some metric, `after` is significantly better than `before` (trimmed_welch, two-sided p)."""
    for metric, samples in after.items():
        base = before.get(metric) or ()
        if len(samples) < 2 or len(base) < 2:
            continue
        test = trimmed_welch(samples, base, alpha=alpha)
        if test["different"] and _signed(test["diff"], better) > 0:
            return True
    return False


def short_of(part: Runs, whole: Runs, *, better: str, alpha: float = ALPHA) -> bool:
    """On some metric, `part` is significantly worse than `whole`: the rest of the set
    holds some of its gain."""
    return improves(whole, part, better=better, alpha=alpha)


@dataclass
class Outcome:
    """What the search found: `costly` candidates (each with its runs alone when measured with
    the proof's protocol, else None), `cleared` groups (candidates shown to hold none of the
    gain, with why) and `untried` (the budget ran out before them)."""

    costly: list[tuple[str, Runs | None]] = field(default_factory=list)
    cleared: list[tuple[list[str], str]] = field(default_factory=list)
    untried: list[str] = field(default_factory=list)


Measure = Callable[[Sequence[str], bool], "Runs | None"]


def delta_debug(candidates: Sequence[str], whole: Runs, current: Runs, measure: Measure, *,
                better: str = "higher", alpha: float = ALPHA,
                describe: Callable[[Runs, Runs], str] | None = None) -> Outcome:
    """Find the candidates whose change makes the gain `whole` shows over `current`.

    `measure(subset, single)` restarts with `subset` applied and returns its runs (None: the
    engine did not run it); `single` is True for a one-candidate subset, measured with the
    proof's protocol. It raises OutOfBudget when the measurement would not fit; what was not
    searched then is `untried`. `describe(part, current)` words a measured change for the
    cleared groups.
    """
    outcome = Outcome()
    say = describe or (lambda _a, _b: "")

    def search(group: list[str], runs: Runs | None) -> None:
        if len(group) == 1:
            outcome.costly.append((group[0], runs))
            return
        half = (len(group) + 1) // 2
        first, second = group[:half], group[half:]
        try:
            part = measure(first, len(first) == 1)
        except OutOfBudget:
            outcome.untried.extend(group)
            return
        gains = part is not None and improves(part, current, better=better, alpha=alpha)
        if not gains:
            outcome.cleared.append((first, _why(part)))
            # The set gained and this half did not: the gain lies in the other half.
            search(second, None)
            return
        assert part is not None
        search(first, part)
        if runs is not None and not short_of(part, runs, better=better, alpha=alpha):
            words = say(runs, part)
            outcome.cleared.append(
                (second, "no share of the gain: without it the set was not significantly worse"
                 + (f" (the set with it against without: {words})" if words else "")))
            return
        search_measured(second)

    def _why(runs: Runs | None) -> str:
        if runs is None:
            return "the engine did not start with it applied"
        words = say(runs, current)
        return "measured without a significant change" + (f" ({words})" if words else "")

    def search_measured(group: list[str]) -> None:
        """A group whose share of the gain is open: measure it first."""
        try:
            runs = measure(group, len(group) == 1)
        except OutOfBudget:
            outcome.untried.extend(group)
            return
        if runs is None or not improves(runs, current, better=better, alpha=alpha):
            outcome.cleared.append((group, _why(runs)))
            return
        search(group, runs)

    search(list(candidates), whole)
    return outcome


def prove(after: Runs, before: Runs, *, better: str, alpha: float = ALPHA) -> dict[str, Any]:
    """Whether a change alone is proved: on some metric better at alpha / (metrics)
    (trimmed_welch, two-sided, Bonferroni over the metrics), and on none significantly worse
    at alpha. Returns {proved, tests: {metric: trimmed_welch}}."""
    metrics = [m for m in after if len(after[m]) >= 2 and len(before.get(m) or ()) >= 2]
    tests = {m: trimmed_welch(after[m], before[m], alpha=alpha) for m in metrics}
    corrected = alpha / max(1, len(metrics))
    better_on = [m for m, t in tests.items() if t["p"] < corrected and _signed(t["diff"], better) > 0]
    worse_on = [m for m, t in tests.items() if t["different"] and _signed(t["diff"], better) < 0]
    return {"proved": bool(better_on) and not worse_on, "better_on": better_on, "worse_on": worse_on,
            "alpha": alpha, "alpha_per_metric": corrected, "tests": tests}
