"""The measurement as one plain-text page (what `manage.py measure` prints and writes as
summary.txt): the delivered table, the server's claim, the reconciliation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def summary_text(measurement: Mapping[str, Any]) -> str:
    """A plain-text page: the delivered table, the server's claim, the reconciliation."""
    lines = [
        f"Delivered throughput, single stream: {measurement['model']} at {measurement['endpoint']}",
        f"API {measurement['api']}; {measurement['protocol']['tokens']['method']}",
        "",
    ]
    for warning in measurement.get("warnings", []):
        lines.append(f"WARNING: {warning}")
    if measurement.get("warnings"):
        lines.append("")
    header = (
        f"{'workload':<9}{'n':>4}{'mean tok/s':>12}{'95% CI':>20}{'median':>9}{'min':>8}{'max':>8}"
        f"{'TTFT s':>9}{'e2e':>8}{'claimed':>9}{'outliers':>10}"
    )
    lines += [header, "-" * len(header)]
    for name, section in measurement.items():
        if not isinstance(section, dict) or "mean_tps" not in section:
            continue
        ci = section["ci95"]
        ci_text = f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "-"
        claimed = measurement["server_claimed_tps"].get(name)
        lines.append(
            f"{name:<9}{section['n']:>4}{figure(section['mean_tps']):>12}{ci_text:>20}{figure(section['median_tps']):>9}"
            f"{figure(section['min_tps']):>8}{figure(section['max_tps']):>8}{figure(section['ttft_s'], 3):>9}"
            f"{figure(section['e2e_tps']):>8}{figure(claimed):>9}{len(section['outliers']):>10}"
        )
    lines.append("")
    lines.append(
        "Server claim source per workload: "
        + ", ".join(f"{k}: {v or 'none'}" for k, v in measurement["server_claim_source"].items())
    )
    causes = ", ".join(measurement["reconciliation"]) or "none"
    lines.append(f"Reconciliation (causes that explain the claim): {causes}")
    for name, causes in measurement["reconciliation_detail"].items():
        for c in causes:
            if c["present"]:
                lines.append(
                    f"  {name}: {c['code']}: observed {c['observed_ratio']}, predicted "
                    f"{c['predicted_ratio']}, explains: {'yes' if c['explains_ratio'] else 'no'}"
                )
                counts_from = (c.get("evidence") or {}).get("counts_from")
                if counts_from:
                    lines.append(f"    draft counts from {counts_from}")
    for f in measurement.get("findings", []):
        lines.append(f"FINDING {f['code']}: {f['title']}")
    return "\n".join(lines) + "\n"


def figure(value: Any, digits: int = 2) -> str:
    """A figure with `digits` decimals, or "-" for one that was not measured."""
    return "-" if value is None else f"{value:.{digits}f}"
