"""The money-back rule (METHODOLOGY.md, "Money back"), decided from a job's findings.

The engagement is free when any of three conditions holds: the lab could not reproduce
the configuration for reasons on our side, no finding shows a measured improvement whose
95 % interval excludes zero, or the report is not sent within one business day of the
lab day. Staff may override the computed flag with a written reason; every override is
kept (who, when, why) and the latest one decides. This module is plain Python over the
findings dict; the override records themselves live in `reports.models`.

What the findings must carry for the rule to see an improvement: a finding's `impact`
(one object or a list of them) with `metric`, `before`, `after` and `ci95`, where
`ci95` is the 95 % interval of the change `after - before` in the metric's unit. Which
direction is better comes from `impact.better` ("higher" or "lower") when present,
otherwise from the metric's unit: durations and error measures improve downwards,
everything else upwards. A finding whose code starts with `lab.` records a failure of
our lab (`lab.node_unreachable`, `lab.engine_crash`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reports.figures import unit_for_key

LAB_SIDE_PREFIX = "lab."
_LOWER_IS_BETTER_UNITS = frozenset({"s", "ms"})
_LOWER_IS_BETTER_WORDS = ("error", "perplexity", "latency", "ttft", "stall", "cold_start")


@dataclass(frozen=True)
class OverrideEntry:
    """One staff decision on the flag, as the audit trail shows it."""

    eligible: bool
    reason: str
    by: str
    at: dt.datetime


@dataclass(frozen=True)
class Condition:
    """One clause of the rule. `holds` True makes the engagement free; None: not assessable."""

    key: str
    label: str
    holds: bool | None
    detail: str


@dataclass(frozen=True)
class Improvement:
    """Whether one measured impact of one finding is a demonstrated improvement."""

    code: str
    metric: str
    demonstrated: bool
    detail: str


@dataclass(frozen=True)
class MoneyBackDecision:
    """The rule's verdict, the clauses that led to it, and the staff overrides on top."""

    computed_eligible: bool
    conditions: tuple[Condition, ...]
    improvements: tuple[Improvement, ...]
    deadline: dt.datetime | None
    overrides: tuple[OverrideEntry, ...] = field(default=())

    @property
    def override(self) -> OverrideEntry | None:
        """The staff decision in force: the latest one."""
        return max(self.overrides, key=lambda o: o.at) if self.overrides else None

    @property
    def eligible(self) -> bool:
        """True when the engagement is free."""
        latest = self.override
        return latest.eligible if latest is not None else self.computed_eligible

    @property
    def reason(self) -> str:
        """One sentence saying why the engagement is or is not free."""
        latest = self.override
        if latest is not None:
            verdict = "free of charge" if latest.eligible else "charged"
            return f"Staff override by {latest.by}: {verdict}. {latest.reason}"
        held = [c for c in self.conditions if c.holds]
        if held:
            return " ".join(c.detail for c in held)
        shown = [i for i in self.improvements if i.demonstrated]
        # The deadline clause says what it could check; the reason repeats it, never more.
        late = next((c for c in self.conditions if c.key == "late_report"), None)
        timing = (
            " and reported on time"
            if late is not None and late.holds is False
            else "; whether it is reported on time could not be checked: the lab day is not recorded"
            if late is not None and late.holds is None
            else ""
        )
        return (
            f"{len(shown)} measured improvement{'s' if len(shown) != 1 else ''} with a 95 % interval "
            f"excluding zero, reproduced on our lab{timing}."
        )

    def as_findings(self) -> dict[str, Any]:
        """The `money_back` section of findings.json."""
        latest = self.override
        return {
            "eligible": self.eligible,
            "reason": self.reason,
            "computed_eligible": self.computed_eligible,
            "conditions": {c.key: c.holds for c in self.conditions},
            "override": None
            if latest is None
            else {
                "eligible": latest.eligible,
                "reason": latest.reason,
                "by": latest.by,
                "at": latest.at.isoformat(),
            },
        }


def better_direction(impact: Mapping[str, Any]) -> str:
    """ "higher" or "lower": which way the impact's metric improves."""
    stated = impact.get("better")
    if stated in ("higher", "lower"):
        return str(stated)
    metric = str(impact.get("metric", "")).lower()
    unit = str(impact.get("unit") or unit_for_key(metric))
    if unit in _LOWER_IS_BETTER_UNITS or any(word in metric for word in _LOWER_IS_BETTER_WORDS):
        return "lower"
    return "higher"


def impacts_of(finding: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A finding's impacts as a list: `impact` may be one object, a list, or null."""
    impact = finding.get("impact")
    if impact is None:
        return []
    if isinstance(impact, Mapping):
        return [impact]
    return [i for i in impact if isinstance(i, Mapping)]


def interval_of(impact: Mapping[str, Any]) -> tuple[float, float] | None:
    """The impact's ci95 as (low, high), or None when it has no usable interval."""
    ci = impact.get("ci95")
    if not isinstance(ci, Sequence) or isinstance(ci, str) or len(ci) != 2:
        return None
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in ci):
        return None
    lo, hi = float(ci[0]), float(ci[1])
    return (min(lo, hi), max(lo, hi))


def measured_differences(findings: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The tuned-minus-customer differences the measure stage wrote: delivered rate per
    workload and the cold start, the day's before/after, each with its Welch 95 % interval."""
    out: list[tuple[str, Mapping[str, Any]]] = []
    measurement = findings.get("measurement")
    difference = measurement.get("difference") if isinstance(measurement, Mapping) else None
    if isinstance(difference, Mapping):
        out += [(str(w), d) for w, d in sorted(difference.items()) if isinstance(d, Mapping)]
    # The day's cold start, customer's true cold starts against the tuned configuration's.
    cold = findings.get("cold_start")
    cold_diff = cold.get("difference") if isinstance(cold, Mapping) else None
    if isinstance(cold_diff, Mapping):
        out.append(("cold_start", cold_diff))
    return out


def judge_improvement(code: str, impact: Mapping[str, Any]) -> Improvement:
    """Does this impact show an improvement whose 95 % interval excludes zero?"""
    metric = str(impact.get("metric") or "unnamed metric")
    ci = interval_of(impact)
    if ci is None:
        return Improvement(code, metric, False, f"{metric}: no 95 % interval was measured")
    direction = better_direction(impact)
    lo, hi = ci
    if direction == "higher":
        shown = lo > 0
    else:
        shown = hi < 0
    if shown:
        detail = f"{metric}: the whole 95 % interval of the change is an improvement"
    elif lo <= 0 <= hi:
        detail = f"{metric}: the 95 % interval of the change includes zero"
    else:
        detail = f"{metric}: the change is measured, but it is a regression"
    return Improvement(code, metric, shown, detail)


def next_business_day(day: dt.date, holidays: Collection[dt.date] = ()) -> dt.date:
    """The first weekday after `day` that is not a listed holiday."""
    nxt = day + dt.timedelta(days=1)
    while nxt.weekday() >= 5 or nxt in holidays:
        nxt += dt.timedelta(days=1)
    return nxt


def report_deadline(
    lab_day: dt.date, *, holidays: Collection[dt.date] = (), tz: dt.tzinfo = dt.UTC
) -> dt.datetime:
    """The moment the report is late: the end of the first business day after the lab day."""
    last_day = next_business_day(lab_day, holidays)
    return dt.datetime.combine(last_day + dt.timedelta(days=1), dt.time(0, 0), tzinfo=tz)


def lab_day_of(findings: Mapping[str, Any]) -> dt.date | None:
    """The lab day recorded in findings `job.lab_day` (ISO date), if any."""
    raw = (findings.get("job") or {}).get("lab_day")
    if not raw:
        return None
    try:
        return dt.date.fromisoformat(str(raw)[:10])
    except ValueError:
        raise ValueError(f"job.lab_day: expected an ISO date such as 2025-12-01, got {raw!r}") from None


# A day a lab fault stopped is re-run at no cost; it is free only when it cannot be re-run
# within this many business days of the fault (METHODOLOGY.md "Money back").
RERUN_BUSINESS_DAYS = 5


def add_business_days(day: dt.date, count: int, holidays: Collection[dt.date] = ()) -> dt.date:
    """The `count`-th business day after `day`."""
    for _ in range(count):
        day = next_business_day(day, holidays)
    return day


def rerun_deadline(fault_day: dt.date, holidays: Collection[dt.date] = ()) -> dt.date:
    """The last day a re-run of a day stopped by a lab fault keeps the engagement charged."""
    return add_business_days(fault_day, RERUN_BUSINESS_DAYS, holidays)


def held_decision(fault_day: dt.date, today: dt.date, *,
                  holidays: Collection[dt.date] = ()) -> dict[str, Any]:
    """The `money_back` section of a day held for a lab fault, before its re-run: a re-run
    is due at no cost; the engagement becomes free once the five business days have passed
    without one."""
    deadline = rerun_deadline(fault_day, holidays)
    late = today > deadline
    reason = (
        f"A fault of our lab stopped the diagnostic on {fault_day:%Y-%m-%d}, and it was not re-run "
        f"within {RERUN_BUSINESS_DAYS} business days (by {deadline:%Y-%m-%d}): "
        "the engagement is free of charge."
        if late else
        f"A fault of our lab stopped the diagnostic on {fault_day:%Y-%m-%d}. It will be re-run at no cost; "
        f"if it cannot be re-run by {deadline:%Y-%m-%d} ({RERUN_BUSINESS_DAYS} business days), the "
        "engagement is free of charge."
    )
    return {"eligible": late, "reason": reason, "rerun_due": not late,
            "rerun_by": deadline.isoformat(), "computed_eligible": late}


def _lab_fault_condition(faults: Sequence[Mapping[str, Any]], holidays: Collection[dt.date]) -> Condition:
    """Whether every lab fault that stopped the day was re-run within five business days."""
    late: list[str] = []
    told: list[str] = []
    for fault in faults:
        try:
            at = dt.date.fromisoformat(str(fault.get("at"))[:10])
        except ValueError:
            continue
        rerun = fault.get("rerun_on")
        deadline = rerun_deadline(at, holidays)
        try:
            rerun_day = dt.date.fromisoformat(str(rerun)[:10]) if rerun else None
        except ValueError:
            rerun_day = None
        if rerun_day is None or rerun_day > deadline:
            late.append(f"the fault of {at:%Y-%m-%d} was "
                        + (f"re-run on {rerun_day:%Y-%m-%d}" if rerun_day else "not re-run")
                        + f", after {deadline:%Y-%m-%d}")
        else:
            told.append(f"the fault of {at:%Y-%m-%d} was re-run on {rerun_day:%Y-%m-%d}, "
                        f"by {deadline:%Y-%m-%d}")
    label = f"A lab fault's day not re-run within {RERUN_BUSINESS_DAYS} business days"
    if late:
        return Condition("lab_fault_not_rerun", label, True,
                         "A fault of our lab stopped the day and " + "; ".join(late) + ".")
    return Condition("lab_fault_not_rerun", label, False,
                     "A fault of our lab stopped the day; " + "; ".join(told) + ", at no cost.")


TUNED_DIFFERENCE = "measurement.difference."
COLD_START_DIFFERENCE = "cold_start.difference"


def _improvement_names(shown: Sequence[Improvement]) -> str:
    """The findings that show an improvement, by code, and the tuned configuration's measured
    rates in words (their codes are the findings.json path they come from)."""
    codes = sorted({i.code for i in shown
                    if not i.code.startswith(TUNED_DIFFERENCE) and i.code != COLD_START_DIFFERENCE})
    workloads = sorted(
        {i.code.removeprefix(TUNED_DIFFERENCE) for i in shown if i.code.startswith(TUNED_DIFFERENCE)}
    )
    if workloads:
        rates = " and ".join(workloads)
        codes.append(f"the tuned configuration's {rates} decode rate{'s' if len(workloads) > 1 else ''}")
    if any(i.code == COLD_START_DIFFERENCE for i in shown):
        codes.append("the tuned configuration's cold start")
    return ", ".join(codes)


def assess(
    findings: Mapping[str, Any],
    *,
    lab_day: dt.date | None = None,
    sent_at: dt.datetime | None = None,
    as_of: dt.datetime | None = None,
    overrides: Iterable[OverrideEntry] = (),
    holidays: Collection[dt.date] = (),
    tz: dt.tzinfo = dt.UTC,
) -> MoneyBackDecision:
    """Apply the money-back rule to a findings document.

    `sent_at` is when the report was first sent; while it is unsent, `as_of` (default:
    now) stands in, i.e. the verdict is "if it were sent now". `lab_day` defaults to
    `job.lab_day` in the findings.
    """
    now = as_of or dt.datetime.now(dt.UTC)
    day = lab_day or lab_day_of(findings)
    found = [f for f in findings.get("findings") or [] if isinstance(f, Mapping)]

    lab_condition = _lab_side_condition(found)

    improvements = tuple(
        judge_improvement(str(f.get("code", "")), impact) for f in found for impact in impacts_of(f)
    ) + tuple(
        judge_improvement(COLD_START_DIFFERENCE if key == "cold_start" else f"{TUNED_DIFFERENCE}{key}",
                          {"better": "higher", **diff})
        for key, diff in measured_differences(findings)
    )
    improvement_condition = _improvement_condition(improvements)

    deadline = report_deadline(day, holidays=holidays, tz=tz) if day else None
    late_condition = _late_condition(deadline, day, sent_at or now, sent=sent_at is not None, tz=tz)

    conditions: tuple[Condition, ...] = (lab_condition, improvement_condition, late_condition)
    faults = [f for f in findings.get("lab_faults") or [] if isinstance(f, Mapping)]
    if faults:
        conditions += (_lab_fault_condition(faults, holidays),)
    return MoneyBackDecision(
        computed_eligible=any(c.holds for c in conditions),
        conditions=conditions,
        improvements=improvements,
        deadline=deadline,
        overrides=tuple(sorted(overrides, key=lambda o: o.at)),
    )


def _lab_side_condition(found: list[Mapping[str, Any]]) -> Condition:
    # Only a lab finding that stopped the job means the lab could not reproduce the
    # configuration; preflight also records lab warnings (a slow link, clock skew, an
    # unused node down) that change nothing about the engagement.
    lab_side = [
        str(f.get("code"))
        for f in found
        if str(f.get("code", "")).startswith(LAB_SIDE_PREFIX) and f.get("blocking") is True
    ]
    if lab_side:
        return Condition(
            "lab_side_failure",
            "Lab could not reproduce the configuration for reasons on our side",
            True,
            f"Our lab could not reproduce the configuration ({', '.join(lab_side)}).",
        )
    return Condition(
        "lab_side_failure",
        "Lab could not reproduce the configuration for reasons on our side",
        False,
        "The configuration was reproduced; no lab-side failure was recorded.",
    )


def _improvement_condition(improvements: tuple[Improvement, ...]) -> Condition:
    shown = [i for i in improvements if i.demonstrated]
    if shown:
        return Condition(
            "no_demonstrated_improvement",
            "No finding shows a measured improvement whose 95 % interval excludes zero",
            False,
            f"{len(shown)} measured improvement{'s' if len(shown) != 1 else ''} with the 95 % interval "
            f"excluding zero ({_improvement_names(shown)}).",
        )
    return Condition(
        "no_demonstrated_improvement",
        "No finding shows a measured improvement whose 95 % interval excludes zero",
        True,
        "No finding shows a measured improvement whose 95 % interval excludes zero.",
    )


def _late_condition(
    deadline: dt.datetime | None, day: dt.date | None, moment: dt.datetime, *, sent: bool, tz: dt.tzinfo
) -> Condition:
    if deadline is None:
        return Condition(
            "late_report",
            "Report not sent within one business day of the lab day",
            None,
            "The lab day is not recorded, so the one-business-day rule could not be checked.",
        )
    verb = "was sent" if sent else "is being issued"
    late = moment >= deadline
    shown_deadline = deadline.astimezone(tz) - dt.timedelta(microseconds=1)
    return Condition(
        "late_report",
        "Report not sent within one business day of the lab day",
        late,
        f"The report {verb} on {moment.astimezone(tz):%Y-%m-%d %H:%M %Z}; the deadline was the end of "
        f"{shown_deadline:%A %Y-%m-%d} (lab day {day:%Y-%m-%d})."
        if late
        else f"The report {verb} on {moment.astimezone(tz):%Y-%m-%d %H:%M %Z}, before the end of "
        f"{shown_deadline:%A %Y-%m-%d} (lab day {day:%Y-%m-%d}).",
    )
