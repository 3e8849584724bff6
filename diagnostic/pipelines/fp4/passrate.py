"""Canary pass rates: the Wilson 95 % interval and the healthy / degraded / garbage classes.

METHODOLOGY.md: healthy at >= 95 % of canaries passed, garbage below 50 %, degraded in
between. A pass rate whose Wilson interval straddles a threshold is not yet decided; the
caller runs more canaries, up to a cap, and says so. The Wilson score interval is used
because it stays inside [0, 1] and keeps its coverage at the extremes (0/40, 40/40) where
the normal approximation collapses to a point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats as scipy_stats

HEALTHY = 0.95
GARBAGE = 0.50
CONFIDENCE = 0.95
THRESHOLDS = (GARBAGE, HEALTHY)


def wilson(passed: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion passed / n."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= passed <= n:
        raise ValueError(f"passed must be in 0..{n}, got {passed}")
    z = float(scipy_stats.norm.ppf(0.5 + confidence / 2.0))
    p = passed / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # Rounding can leave the ends a hair outside [0, 1] or off the exact 0 / 1.
    low = 0.0 if passed == 0 else max(0.0, centre - half)
    high = 1.0 if passed == n else min(1.0, centre + half)
    return (low, high)


def classify(rate: float) -> str:
    """healthy | degraded | garbage, by the point estimate."""
    if rate >= HEALTHY:
        return "healthy"
    if rate < GARBAGE:
        return "garbage"
    return "degraded"


def straddled(interval: tuple[float, float]) -> list[float]:
    """The thresholds strictly inside the interval (a bound exactly on one decides it)."""
    low, high = interval
    return [t for t in THRESHOLDS if low < t < high]


@dataclass(frozen=True)
class PassRate:
    passed: int
    n: int

    @property
    def rate(self) -> float:
        return self.passed / self.n if self.n else 0.0

    @property
    def ci95(self) -> tuple[float, float]:
        return wilson(self.passed, self.n)

    @property
    def undecided(self) -> list[float]:
        return straddled(self.ci95)

    @property
    def label(self) -> str:
        return classify(self.rate)

    def as_dict(self) -> dict[str, object]:
        low, high = self.ci95
        return {
            "passed": self.passed,
            "n": self.n,
            "rate": round(self.rate, 4),
            "ci95": [round(low, 4), round(high, 4)],
            "class": self.label,
            "straddles": self.undecided,
        }


def difference_interval(before: PassRate, after: PassRate) -> tuple[float, float]:
    """95 % interval of after.rate - before.rate: Newcombe's hybrid score interval, which
    combines the two Wilson intervals and, like them, behaves at 0 % and 100 %."""
    p1, p2 = before.rate, after.rate
    l1, u1 = before.ci95
    l2, u2 = after.ci95
    diff = p2 - p1
    low = diff - ((p2 - l2) ** 2 + (u1 - p1) ** 2) ** 0.5
    high = diff + ((u2 - p2) ** 2 + (p1 - l1) ** 2) ** 0.5
    return (max(-1.0, low), min(1.0, high))
