"""The two configurations the measured sections set side by side, the customer's and the
recommended one: where the recommended one's measurement is read from, and the label that
says whose runs a row holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reports.structure import present, setting_label


def measurement_after(findings: Mapping[str, Any]) -> Mapping[str, Any]:
    """The recommended configuration's measurement: `measurement.after`, else `speculative.best`."""
    measured_after = (findings.get("measurement") or {}).get("after")
    if present(measured_after):
        return measured_after
    return (findings.get("speculative") or {}).get("best") or {}


def configuration_label(
    findings: Mapping[str, Any], before: bool, section: Mapping[str, Any], block: Mapping[str, Any]
) -> str:
    """`your configuration (eagle3, k = 4)` or `recommended (eagle3, k = 3)`: whose runs these are."""
    base = "your configuration" if before else "recommended"
    method, k = block.get("method", section.get("method")), block.get("k", section.get("k"))
    config = findings.get("config") or {}
    if k is None and before and "speculative" in config:
        spec = config.get("speculative") or {}
        method, k = spec.get("method"), spec.get("num_speculative_tokens") or 0
    return f"{base} ({setting_label(method, k)})" if k is not None else base
