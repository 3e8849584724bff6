"""The two configurations the measured sections set side by side, the customer's and the
tuned one: where the tuned one's measurement is read from, the label that says whose runs
a row holds, and how close each delivered rate comes to the hardware's bound.

The tuned configuration is measured by the measure stage with the customer's protocol
(`measurement.tuned`, with `measurement.difference` per workload). When it was not, the
only "after" figures are the speculative search's own confirmation runs
(`speculative.best`), shorter runs of one change alone; the report then says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reports import figures as fig
from reports.structure import as_number, present, setting_label

MEASURED = "measured"  # measurement.tuned: the whole tuned configuration, same protocol
SEARCH = "search"  # speculative.best: the search's confirmation runs of its best setting
SEARCH_NOTE = (
    "The tuned configuration as a whole was not measured; these figures are the speculative "
    "search's own confirmation runs of its best setting, shorter runs of that change alone."
)


@dataclass(frozen=True)
class After:
    """The figures the report sets against the customer's: per workload, and their origin."""

    workloads: Mapping[str, Any]
    source: str  # MEASURED, SEARCH or "" (nothing after)

    @property
    def measured(self) -> bool:
        return self.source == MEASURED


def after_of(findings: Mapping[str, Any]) -> After:
    """`measurement.tuned` when the tuned configuration was measured, else `speculative.best`."""
    measurement = findings.get("measurement") or {}
    tuned = measurement.get("tuned") if isinstance(measurement, Mapping) else None
    if present(tuned):
        return After(tuned, MEASURED)
    spec = findings.get("speculative") or {}
    best = spec.get("best")
    if present(best):
        # A workload whose fastest setting was not proved faster keeps the customer's
        # setting: its "after" is the customer's own confirmation, not the unproved one's.
        baseline = spec.get("baseline") or {}
        kept = {
            w: baseline.get(w) if isinstance(b, Mapping) and b.get("kept_customer") and baseline.get(w) else b
            for w, b in best.items()
        }
        return After(kept, SEARCH)
    return After({}, "")


def measurement_after(findings: Mapping[str, Any]) -> Mapping[str, Any]:
    """The after side's per-workload summaries (empty when there is none)."""
    return after_of(findings).workloads


def tuned_setting(findings: Mapping[str, Any]) -> tuple[Any, Any] | None:
    """(method, k) of the tuned configuration's speculative decoding, when it says."""
    config = (findings.get("tuned") or {}).get("config")
    if isinstance(config, Mapping) and "speculative" in config:
        spec = config.get("speculative") or {}
        return spec.get("method"), spec.get("num_speculative_tokens") or 0
    return None


def configuration_label(
    findings: Mapping[str, Any], before: bool, section: Mapping[str, Any], block: Mapping[str, Any]
) -> str:
    """`your configuration (eagle3, k = 4)` or `with our changes (eagle3, k = 2)`: whose runs these are."""
    source = after_of(findings).source
    base = (
        "your configuration" if before else ("with our changes" if source == MEASURED else "best of search")
    )
    method, k = block.get("method", section.get("method")), block.get("k", section.get("k"))
    config = findings.get("config") or {}
    if k is None and before and "speculative" in config:
        spec = config.get("speculative") or {}
        method, k = spec.get("method"), spec.get("num_speculative_tokens") or 0
    if k is None and not before:
        setting = tuned_setting(findings)
        if setting is not None:
            method, k = setting
    return f"{base} ({setting_label(method, k)})" if k is not None else base


def roofline_fraction(findings: Mapping[str, Any], before: bool, workload: str) -> float | None:
    """The measure stage's delivered rate over the hardware's bound (`measurement.roofline`)."""
    roofline = (findings.get("measurement") or {}).get("roofline") or {}
    side = roofline.get("customer" if before else "tuned") if isinstance(roofline, Mapping) else None
    entry = side.get(workload) if isinstance(side, Mapping) else None
    return as_number(entry.get("fraction")) if isinstance(entry, Mapping) else None


def of_bound(fraction: float | None) -> str:
    """`11.9 % of what this hardware allows`, or "" without a bound."""
    if fraction is None:
        return ""
    return f"{fig.percent(fraction)} of what this hardware allows"
