"""The day's headline quantities, each read from one recorded value in one place.

A report that prints the same quantity in the summary, a section, a figure and the email
must print it from the same field with the same rounding, or a careful reader finds two
values for one thing and trusts neither. Every part of the report that prints the day's
cold start before and after, or its change, takes it from `day_cold_start`, and prints
it with `reports.figures` (seconds to the second, minutes to 0.1 min, from that value).

The rule for the day's cold-start change: the measure stage's Welch difference of the
customer's true cold starts against the tuned configuration's (`cold_start.difference`)
when it exists, since it carries the interval; otherwise the after value less the before
value, both as recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reports.structure import as_interval, as_number, present


@dataclass(frozen=True)
class DayColdStart:
    """The customer's true cold start, the tuned configuration's, and the change."""

    before_s: float | None
    after_s: float | None
    before_ci95: tuple[float, float] | None
    after_ci95: tuple[float, float] | None
    change_s: float | None
    change_ci95: tuple[float, float] | None
    different: bool | None
    n_before: int | None
    n_after: int | None
    after_from_measure: bool  # the after is the measure stage's tuned starts, not the triage's last step


def day_cold_start(findings: Mapping[str, Any]) -> DayColdStart | None:
    """The day's cold start, or None when no cold start was measured."""
    cold = findings.get("cold_start")
    if not present(cold):
        return None
    before, after = as_number(cold.get("before_s")), as_number(cold.get("after_s"))
    difference = cold.get("difference")
    change = change_ci = different = None
    if isinstance(difference, Mapping) and as_number(difference.get("diff")) is not None:
        change = float(difference["diff"])
        change_ci = as_interval(difference.get("ci95"))
        different = difference.get("different") if isinstance(difference.get("different"), bool) else None
    elif before is not None and after is not None:
        change = after - before
    after_samples = cold.get("after_samples_s")
    steps = [w for w in cold.get("waterfall") or [] if isinstance(w, Mapping)]
    baseline = next((w for w in steps if w.get("mode") == "baseline"), None)
    n_before = baseline.get("n") if isinstance(baseline, Mapping) else None
    return DayColdStart(
        before_s=before,
        after_s=after,
        before_ci95=as_interval(cold.get("before_ci95")),
        after_ci95=as_interval(cold.get("after_ci95")),
        change_s=change,
        change_ci95=change_ci,
        different=different,
        n_before=int(n_before) if isinstance(n_before, int) else None,
        n_after=len(after_samples) if isinstance(after_samples, list) and after_samples else None,
        after_from_measure=bool(str(cold.get("after_source") or "").startswith("measure")),
    )
