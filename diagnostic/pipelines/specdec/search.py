"""The search over draft length k: where a speculative method's rate peaks, per workload.

For a fixed method the delivered rate rises with k while drafted tokens are accepted and
falls once verification and drafting cost more than they return (METHODOLOGY.md), so
rate(k) is unimodal and a sweep wastes restarts. The search measures a few seed lengths
(1, 2, the customer's k, the common default), then, for every workload, looks at the best
length measured so far: while its right-hand neighbourhood is unmeasured it doubles k
(the peak may lie far out), and while a gap next to it is wider than one it measures the
gap's middle. It ends when every workload's best length has both neighbours measured (or
is at the end of the range). One trial (one engine restart) measures every workload, so
the workloads share the lengths they ask for.

Where the engine reports its acceptance per draft position, a `predict` callable (the
acceptance model, model.py) gives the method's whole curve up to the longest length
measured; the search then needs no bisection: it lengthens the draft (doubling) only while
the predicted peak sits at the longest length measured, since only a longer trial reports
the acceptance of the positions beyond it.

The search is plain Python over a `screen` callable, so that its behaviour on synthetic
curves (noise, plateaus, a peak at k = 1 or at the engine's maximum) is testable alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NONE = "none"
# Every method a configuration can name; which of them a search tries depends on the
# model (MTP heads) and on a draft existing (EAGLE-3).
METHODS = ("ngram", "eagle3", "mtp")
# Enough for a range of 16 (seeds, three doublings, four bisections) with noise moving
# the best length once or twice; a method that needs more is not unimodal.
MAX_TRIALS_PER_METHOD = 10


@dataclass(frozen=True, order=True)
class Setting:
    """One speculative setting: a method and its draft length (none is k = 0)."""

    method: str
    k: int

    @property
    def label(self) -> str:
        return "no speculation" if self.method == NONE else f"{self.method} k = {self.k}"

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "k": self.k}


NO_SPECULATION = Setting(NONE, 0)

# A screening trial: workload -> mean decode rate, or None when the engine refused the setting.
Screen = Callable[[Setting], "Mapping[str, float] | None"]
# Whether the lab-time budget still allows screening this setting.
Afford = Callable[[Setting], bool]
# Whether a setting's runs on a workload are significantly below the best setting's there.
Below = Callable[[Setting, str], bool]
# The method's predicted rate per workload and length from the evidence so far (model.py);
# a workload without one is searched on its measured rates alone.
Predict = Callable[[str], "Mapping[str, Mapping[int, float]]"]
# Why a setting need not be screened (its rate bounded below the leader everywhere), or None.
RuledOut = Callable[[Setting], "str | None"]


@dataclass
class KSearch:
    """What the search of one method measured, and why it stopped."""

    method: str
    k_max: int
    rates: dict[int, dict[str, float]] = field(default_factory=dict)
    refused: list[int] = field(default_factory=list)
    order: list[int] = field(default_factory=list)  # lengths in the order they were measured
    stopped: str = ""
    # workload -> length -> rate the acceptance model predicts (every length up to the
    # longest whose acceptance the engine reported), when the engine reports acceptance.
    predicted: dict[str, dict[int, float]] = field(default_factory=dict)
    # length -> why it was not measured: the method's own evidence bounds its rate there
    # below the leader on every workload.
    ruled_out: dict[int, str] = field(default_factory=dict)

    def best(self, workload: str) -> int | None:
        """The measured length with the highest rate on `workload` (the shorter on a tie:
        fewer drafted tokens for the same rate)."""
        measured = [(rates[workload], -k) for k, rates in self.rates.items() if workload in rates]
        if not measured:
            return None
        return -max(measured)[1]

    def describe(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "k_max": self.k_max,
            "measured_k": self.order,
            "refused_k": self.refused,
            "best_k": {w: self.best(w) for w in sorted({w for r in self.rates.values() for w in r})},
            "predicted_best_k": {w: self.predicted_best(w) for w in sorted(self.predicted)},
            "ruled_out_k": {str(k): why for k, why in sorted(self.ruled_out.items())},
            "stopped": self.stopped,
        }

    def predicted_best(self, workload: str) -> int | None:
        curve = self.predicted.get(workload) or {}
        return max(curve, key=lambda k: (curve[k], -k)) if curve else None


def next_lengths(search: KSearch, workloads: Sequence[str]) -> list[int]:
    """The lengths the workloads ask for next (ascending); empty when the search is done."""
    measured = sorted(search.rates)
    ceiling = search.k_max
    wanted: set[int] = set()
    for workload in workloads:
        curve = search.predicted.get(workload)
        if curve:
            # The model covers every length up to the longest measured: the peak is found
            # once it lies inside that range; at its end the curve may still rise beyond
            # it, and only a longer trial's acceptance can say.
            peak, deepest = search.predicted_best(workload), max(curve)
            if peak == deepest and deepest < ceiling:
                wanted.add(min(2 * deepest, ceiling))
            continue
        best = search.best(workload)
        if best is None:
            continue
        below = [k for k in measured if k < best]
        above = [k for k in measured if k > best]
        left = below[-1] if below else 0
        if not above and best < ceiling:
            # Still rising: look further out first; the gap on the left waits until the
            # peak is bracketed (it may hide the peak only when the right side falls).
            wanted.add(min(2 * best, ceiling) if best > 1 else 2)
            continue
        # Bracketed (or at the end of the range): split the wider gap next to the best,
        # as a golden-section search narrows the wider side of its bracket.
        right_gap = above[0] - best if above else 0
        left_gap = best - left
        if right_gap > 1 and right_gap >= left_gap:
            wanted.add((best + above[0]) // 2)
        elif left_gap > 1:
            wanted.add((left + best + 1) // 2 if left else max(1, best // 2))
    done = set(search.rates) | set(search.refused) | set(search.ruled_out)
    return sorted(k for k in wanted if k not in done and 1 <= k <= ceiling)


def search_k(
    method: str,
    workloads: Sequence[str],
    screen: Screen,
    *,
    k_max: int,
    seeds: Iterable[int] = (1, 2),
    afford: Afford | None = None,
    max_trials: int = MAX_TRIALS_PER_METHOD,
    below_leader: Below | None = None,
    predict: Predict | None = None,
    fallback_seeds: Iterable[int] = (),
    ruled_out: RuledOut | None = None,
) -> KSearch:
    """Search k in 1..k_max for `method`: seed lengths first, then the unimodal refinement.

    A refused length ends the range there (the engine does not take that many draft
    tokens, or the method at all when the first length is refused); the budget
    (`afford`) or `max_trials` may end the search early, which `stopped` says.
    `below_leader`: whether a setting is significantly below the best setting read so far on
    a workload (a statistical test on the runs, the caller's); once this method's rate has
    fallen past its best length on every workload and that best is below the leader
    everywhere, refining it (which moves a unimodal peak by one length) cannot make it a
    finalist, so the search stops there.
    `predict`: the acceptance model's curves for the method (model.py); where it gives one
    for a workload, the search only lengthens the draft while the predicted peak is at the
    longest length measured, and refines nothing by bisection. `fallback_seeds`: lengths
    screened too when the seeds leave the model without a curve (the engine reports no
    acceptance per position), before the refinement on measured rates. `ruled_out`: why a
    length cannot be a finalist by the method's own evidence (None when it may be); such a
    length is not screened, and the search goes on as if it had been measured slower.
    """
    search = KSearch(method, k_max)
    pending = sorted({k for k in seeds if 1 <= k <= k_max})
    fallback = sorted({k for k in fallback_seeds if 1 <= k <= k_max} - set(pending))
    trials = 0
    while True:
        if predict is not None and search.rates:
            search.predicted = {w: dict(c) for w, c in predict(method).items() if c and w in workloads}
        if not pending and fallback and not search.predicted:
            pending, fallback = [k for k in fallback if k <= search.k_max], []
        if not pending:
            if search.rates and below_leader and _outclassed(search, workloads, below_leader):
                search.stopped = "past its peak and significantly below the leader on every workload"
                return search
            pending = next_lengths(search, workloads)
            if not pending:
                break
        k = pending.pop(0)
        if k > search.k_max or k in search.rates or k in search.refused or k in search.ruled_out:
            continue
        why = ruled_out(Setting(method, k)) if ruled_out is not None and search.rates else None
        if why:
            search.ruled_out[k] = why
            continue
        if trials >= max_trials:
            search.stopped = f"trial limit ({max_trials}) reached"
            return search
        setting = Setting(method, k)
        if afford is not None and not afford(setting):
            search.stopped = "lab-time budget"
            return search
        trials += 1
        rates = screen(setting)
        if rates is None:
            search.refused.append(k)
            if not search.rates:
                # Its shortest length refused: the engine refuses the method itself.
                search.stopped = "refused by the engine"
                return search
            search.k_max = min(search.k_max, k - 1)
            continue
        search.rates[k] = {w: float(v) for w, v in rates.items() if v is not None}
        search.order.append(k)
    search.stopped = search.stopped or (
        "converged: the acceptance model's peak lies inside the lengths measured on every workload"
        if search.predicted and all(search.predicted.get(w) for w in workloads)
        else "converged: the lengths left are bounded below the leader by its own evidence (k = "
        + ", ".join(str(k) for k in sorted(search.ruled_out)) + ")"
        if search.ruled_out
        else "converged: every workload's best length has measured neighbours"
    )
    return search


def _outclassed(search: KSearch, workloads: Sequence[str], below_leader: Below) -> bool:
    for workload in workloads:
        best = search.best(workload)
        if best is None:
            return False
        above = [k for k in search.rates if k > best and workload in search.rates[k]]
        if not above:
            return False  # still rising, or at the end of what was measured
        if not below_leader(Setting(search.method, best), workload):
            return False
    return True
