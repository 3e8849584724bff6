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
decode rate, "lower" for a cold start). Tests are Welch's at `alpha`, two-sided, read in
the better direction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diagnostic.pipelines.stats import welch

Runs = Mapping[str, Sequence[float]]
ALPHA = 0.05


class OutOfBudget(Exception):
    """The next measurement would not fit the stage's lab-time budget."""


def _signed(diff: float, better: str) -> float:
    return diff if better == "higher" else -diff


def improves(after: Runs, before: Runs, *, better: str, alpha: float = ALPHA) -> bool:
    """On some metric, `after` is significantly better than `before` (Welch, two-sided p)."""
    for metric, samples in after.items():
        base = before.get(metric) or ()
        if len(samples) < 2 or len(base) < 2:
            continue
        test = welch(list(samples), list(base), alpha=alpha)
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
    """Whether a change alone is proved: on some metric better at alpha / (metrics) (Welch,
    two-sided, Bonferroni over the metrics), and on none significantly worse at alpha.
    Returns {proved, tests: {metric: welch}}."""
    metrics = [m for m in after if len(after[m]) >= 2 and len(before.get(m) or ()) >= 2]
    tests = {m: welch(list(after[m]), list(before[m]), alpha=alpha) for m in metrics}
    corrected = alpha / max(1, len(metrics))
    better_on = [m for m, t in tests.items() if t["p"] < corrected and _signed(t["diff"], better) > 0]
    worse_on = [m for m, t in tests.items() if t["different"] and _signed(t["diff"], better) < 0]
    return {"proved": bool(better_on) and not worse_on, "better_on": better_on, "worse_on": worse_on,
            "alpha": alpha, "alpha_per_metric": corrected, "tests": tests}
