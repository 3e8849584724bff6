"""Rate against draft length from the engine's own answers: acceptance per position and the
step time, so that the search reads a method's whole curve from a few trials.

A delivered decode rate is tokens per step over the time of a step. vLLM's spec-decode
lines give both parts' evidence apart from the client's clock:

- per-position acceptance p_j, the share of drafts whose j-th token was accepted; the
  tokens a step emits at draft length k are E(k) = 1 + p_1 + ... + p_k. A trial at length
  K gives p_1..p_K, so E at every shorter length, from the same drafts (position j's
  acceptance does not depend on how many positions follow it);
- the step time T = E / rate of each trial (seconds a verification step takes as the
  client sees it, drafting included). Verifying and drafting k tokens cost about linearly
  in k (METHODOLOGY.md: more experts touched, k draft passes), so per method
  T(k) = T_w(0) + b k: the intercept each workload's no-speculation rate gives (1 / rate),
  one slope per method fitted over its trials and workloads.

The prediction rate(k) = E(k) / T(k) then covers every length up to the longest measured.
It only guides which settings are measured further and confirmed: every decision still
rests on fresh delivered runs. A rate a trial measures differs from the curve by its runs'
noise; where the curves of two lengths differ by a percent, the acceptance counts (hundreds
of drafts a trial) tell them apart long before five runs' means do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diagnostic.pipelines.specdec.search import NONE


@dataclass(frozen=True)
class Observation:
    """One trial's evidence on one workload."""

    method: str
    k: int
    workload: str
    rate: float  # delivered decode tok/s (the ranking mean of the trial's runs)
    per_position: tuple[float, ...] = ()  # p_1..p_k from the engine log
    drafts: float = 0.0  # drafts (steps) the acceptance pools


@dataclass
class RateModel:
    """The fitted curves: per method a step-time slope, per workload its intercept and the
    acceptance per position pooled over the method's trials."""

    intercept: dict[str, float] = field(default_factory=dict)  # workload -> T(0), s
    slope: dict[str, float] = field(default_factory=dict)  # method -> s per draft token
    positions: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (method, w) -> p_j
    points: dict[str, list[tuple[int, str, float]]] = field(default_factory=dict)  # method -> (k, w, T)

    def depth(self, method: str, workload: str) -> int:
        return len(self.positions.get((method, workload), ()))

    def predict(self, method: str, workload: str, k: int) -> float | None:
        """Predicted delivered rate at length k; None where the evidence does not reach."""
        if method == NONE or k == 0:
            t0 = self.intercept.get(workload)
            return 1.0 / t0 if t0 else None
        p = self.positions.get((method, workload))
        t0, b = self.intercept.get(workload), self.slope.get(method)
        if not p or t0 is None or b is None or k > len(p):
            return None
        step = t0 + b * k
        return (1.0 + sum(p[:k])) / step if step > 0 else None

    def curve(self, method: str, workload: str) -> dict[int, float]:
        out = {}
        for k in range(1, self.depth(method, workload) + 1):
            rate = self.predict(method, workload, k)
            if rate is not None:
                out[k] = rate
        return out

    def describe(self) -> dict[str, Any]:
        methods = sorted({m for m, _ in self.positions} | set(self.slope))
        workloads = sorted({w for _, w in self.positions} | set(self.intercept))
        return {
            "how": "rate(k) = (1 + p_1 + ... + p_k) / (T0 + b k): p_j the engine's per-position "
            "acceptance pooled over the method's trials, T0 = 1 / the workload's rate without "
            "speculation, b fitted per method over its trials' step times (E / rate)",
            "step_time_s": {
                "intercept": {w: round(v, 6) for w, v in self.intercept.items()},
                "slope_per_token": {m: round(v, 6) for m, v in self.slope.items()},
                "points": {m: [[k, w, round(t, 6)] for k, w, t in pts] for m, pts in self.points.items()},
            },
            "per_position": {
                f"{m}/{w}": [round(x, 4) for x in self.positions[(m, w)]]
                for m in methods for w in workloads if (m, w) in self.positions
            },
            "predicted_tps": {
                f"{m}/{w}": {str(k): round(v, 3) for k, v in self.curve(m, w).items()}
                for m in methods for w in workloads if (m, w) in self.positions
            },
        }


def fit(observations: Sequence[Observation], none_rates: Mapping[str, float]) -> RateModel:
    """The model from the trials so far: `none_rates` the workloads' rates without
    speculation (the intercepts), `observations` the speculative trials with their
    acceptance. A method gets a slope from at least one trial with acceptance; a workload
    its positions from the trials that reached them, each position weighted by drafts."""
    model = RateModel()
    for w, rate in none_rates.items():
        if rate and rate > 0:
            model.intercept[w] = 1.0 / rate
    usable = [
        o for o in observations
        if o.method != NONE and o.k >= 1 and o.rate > 0 and len(o.per_position) >= o.k and o.drafts > 0
    ]
    for method in sorted({o.method for o in usable}):
        mine = [o for o in usable if o.method == method]
        # Step time through each workload's intercept: b = sum(k (T - T0)) / sum(k^2).
        num = den = 0.0
        points = []
        for o in mine:
            t0 = model.intercept.get(o.workload)
            if t0 is None:
                continue
            step = (1.0 + sum(o.per_position[: o.k])) / o.rate
            points.append((o.k, o.workload, step))
            num += o.k * (step - t0)
            den += o.k * o.k
        if den > 0:
            model.slope[method] = max(0.0, num / den)
            model.points[method] = points
        for w in sorted({o.workload for o in mine}):
            theirs = [o for o in mine if o.workload == w]
            depth = max(o.k for o in theirs)
            pooled = []
            for j in range(depth):
                reach = [o for o in theirs if o.k > j]
                weight = sum(o.drafts for o in reach)
                pooled.append(sum(o.drafts * o.per_position[j] for o in reach) / weight)
            # The share accepted at position j cannot exceed position j - 1's (a token is
            # only accepted after every token before it): keep the pooled list monotone.
            for j in range(1, len(pooled)):
                pooled[j] = min(pooled[j], pooled[j - 1])
            model.positions[(method, w)] = pooled
    return model



def rate_bound(k: int, *, k0: int, accept_len: float, rate: float, none_rate: float) -> float | None:
    """The highest delivered rate length `k` can reach, from one trial at length `k0` whose
    engine reported only the mean accepted length (SGLang's `accept len`, E(k0) tokens a
    step), its delivered `rate`, and the workload's rate without speculation.

    Two facts bound it. The share of drafts accepted at position j cannot exceed position
    j - 1's, and no more than every draft token is accepted: E(k) <= 1 + min(k, E(k0) - 1)
    below k0 and E(k) <= 1 + k (E(k0) - 1) / k0 above it. A step does not get cheaper with
    more draft tokens, and drafting and verifying cost about linearly in k (the premise of
    the acceptance model above, with the same intercept): below k0 the step takes at least
    T0 + b k, T0 = 1 / none_rate and b = (E(k0) / rate - T0) / k0, the line through what
    was measured (a step time that grows less than linearly lies above it); above k0 at
    least the step measured at k0. None where the inputs cannot give a bound."""
    if k < 1 or k0 < 1 or rate <= 0 or none_rate <= 0 or accept_len < 1.0:
        return None
    accepted = accept_len - 1.0
    t0 = 1.0 / none_rate
    t_k0 = accept_len / rate
    if k <= k0:
        slope = max(0.0, (t_k0 - t0) / k0)
        return (1.0 + min(float(k), accepted)) / (t0 + slope * k)
    return (1.0 + min(float(k), k * accepted / k0)) / max(t_k0, t0)
