"""Section 3.3, speculative decoding, from `findings.speculative`: the decode rate per
workload without speculation, with the customer's setting and with the recommended one,
and every trial of the search for the draft length.

Shapes read: `baseline|none|best.{workload}`: {n, mean_tps, ci95, runs?}, a section's own
`method` and `k` applying to its workloads; `trials[]`: {workload, method, k, stage:
screen|confirm, n, mean_tps, ci95}.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reports import figures as fig
from reports import plots
from reports.structure import (
    NOT_RUN,
    Block,
    FigureCounter,
    StageSection,
    as_interval,
    as_number,
    present,
    setting_label,
    workloads_in,
)


def speculative_section(
    spec: Any, config: Mapping[str, Any], figures: FigureCounter, number: str
) -> StageSection:
    title = "Speculative decoding"
    if not present(spec):
        return StageSection("speculative", number, title, False, [Block("paragraph", NOT_RUN)])
    blocks: list[Block] = []
    baseline = spec.get("baseline") or {}
    best = spec.get("best") or {}
    none = spec.get("none") or {}
    workloads = workloads_in(baseline, best, none)
    rows = []
    for workload in workloads:
        for label, section in (("no speculation", none), ("your setting", baseline), ("recommended", best)):
            block = section.get(workload) if isinstance(section, Mapping) else None
            if not isinstance(block, Mapping):
                continue
            method = block.get("method", section.get("method"))
            k = block.get("k", section.get("k"))
            ci = as_interval(block.get("ci95"))
            rows.append(
                [
                    workload,
                    label,
                    setting_label(method, k),
                    str(block.get("n", "")),
                    fig.tps(float(block["mean_tps"])) if as_number(block.get("mean_tps")) is not None else "",
                    fig.interval(ci, fig.tps) if ci else "",
                ]
            )
    lab_s = as_number(spec.get("lab_time_s"))
    intro = (
        "We searched the draft length k for each method and workload: short screening runs first, then a "
        "confirmation of the promising settings with the full protocol."
    )
    if lab_s is not None:
        intro += f" The search spent {fig.minutes(lab_s)} of lab time."
    blocks.append(Block("paragraph", intro))
    if rows:
        blocks.append(
            Block(
                "table",
                caption="Decode rate per workload: without speculation, with your setting, and with "
                "the recommended one.",
                columns=["Workload", "", "Setting", "n", "Decode tok/s", "95 % interval"],
                numeric=[False, False, False, True, True, True],
                rows=rows,
            )
        )
    trials = [t for t in spec.get("trials") or [] if isinstance(t, Mapping) and as_interval(t.get("ci95"))]
    if trials:
        customer_spec = config.get("speculative") or {}
        customer = None
        if customer_spec.get("method") and customer_spec.get("num_speculative_tokens"):
            customer = (str(customer_spec["method"]), int(customer_spec["num_speculative_tokens"]))
        chosen = {
            w: (str(best[w].get("method")), int(best[w]["k"]))
            for w in workloads
            if isinstance(best.get(w), Mapping) and best[w].get("k") is not None
        }
        plot = figures.plot(
            plots.specdec_sweep,
            "Decode rate against draft length k, per method and workload, with 95 % intervals. Screening "
            "runs are joined by lines; diamonds are confirmation runs; the dashed line is no speculation.",
            trials=trials,
            customer=customer,
            best=chosen,
        )
        if plot:
            blocks.append(plot)
        blocks.append(_trial_grid(trials))
    return StageSection("speculative", number, title, True, blocks)


def _trial_grid(trials: Sequence[Mapping[str, Any]]) -> Block:
    """Every trial in one grid: a row per workload, method and stage, a column per draft length."""
    ks = sorted({int(t.get("k") or 0) for t in trials})
    keys: list[tuple[str, str, str]] = []
    cells: dict[tuple[str, str, str], dict[int, str]] = {}
    for t in trials:
        method = str(t.get("method") or "none")
        key = (str(t.get("workload", "")), method, f"{t.get('stage', 'screen')}, n = {t.get('n', '?')}")
        if key not in cells:
            keys.append(key)
            cells[key] = {}
        ci = as_interval(t.get("ci95"))
        mean = as_number(t.get("mean_tps"))
        if mean is not None:
            cells[key][int(t.get("k") or 0)] = fig.tps(mean) + (
                f"\n{fig.interval(ci, fig.tps)}" if ci else ""
            )
    return Block(
        "table",
        caption="Every trial of the search: mean decode rate (tok/s) and its 95 % interval, by "
        "draft length k (k = 0 is no speculation).",
        columns=["Workload", "Method", "Stage", *(f"k = {k}" for k in ks)],
        numeric=[False, False, False, *(True for _ in ks)],
        rows=[[w, m, stage, *(cells[(w, m, stage)].get(k, "") for k in ks)] for (w, m, stage) in keys],
        compact=True,
    )
