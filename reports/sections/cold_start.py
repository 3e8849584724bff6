"""Section 3.1, cold start, from `findings.cold_start`: the true cold starts before and
after the changes, the waterfall of fixes, the timeline per node, and each stall with the
telemetry that attributes it.

Shapes read beyond DESIGN.md's schema (all optional): `phases[]`: {run: before|after,
node, phase, start_s, end_s}; `waterfall[]`: {step, fixes, n, cold_start_s, ci95,
delta_ci95}; `stalls[]`: {run, node, cause, start_s, end_s, silent_s, telemetry: {t_s:
[...], series...}}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reports import figures as fig
from reports import plots
from reports.structure import NOT_RUN, Block, FigureCounter, StageSection, as_interval, as_number, present

STALL_SIGNATURES = {
    "load.weights_io": (
        "weights I/O shows low, bursty disk reads with a climbing page cache and high system CPU"
    ),
    "load.jit_compile": "the JIT stall shows compiler processes at full CPU with the disk idle",
    "load.rendezvous": "the rendezvous stall shows an idle node and a silent data NIC",
}


def cold_start_section(cold: Any, figures: FigureCounter, number: str) -> StageSection:
    title = "Cold start"
    if not present(cold):
        return StageSection("cold-start", number, title, False, [Block("paragraph", NOT_RUN)])
    blocks: list[Block] = []
    b, a = as_number(cold.get("before_s")), as_number(cold.get("after_s"))
    if b is not None:
        text = (
            "A true cold start of your configuration (engine stopped on every node, page cache dropped) "
            f"took {fig.seconds(b)}"
        )
        ci = as_interval(cold.get("before_ci95"))
        text += f" (95 % interval {fig.interval(ci, fig.seconds)})" if ci else ""
        if a is not None:
            text += f"; with the changes in this report it took {fig.seconds(a)}"
            ci = as_interval(cold.get("after_ci95"))
            text += f" (95 % interval {fig.interval(ci, fig.seconds)})" if ci else ""
        causes = cold.get("root_causes") or []
        if causes:
            text += f". Root causes: {', '.join(str(c) for c in causes)}"
        blocks.append(Block("paragraph", text + "."))
    waterfall = cold.get("waterfall") or []
    if waterfall:
        rows = []
        for step in waterfall:
            value = as_number(step.get("cold_start_s"))
            ci = as_interval(step.get("ci95"))
            delta = as_interval(step.get("delta_ci95"))
            rows.append(
                [
                    str(step.get("step", "")),
                    str(step.get("fixes") or "\u2014"),
                    str(step.get("n", "")),
                    fig.seconds_bare(value) if value is not None else "",
                    fig.interval(ci, fig.seconds_bare) if ci else "",
                    fig.signed_interval(delta, fig.seconds_bare) if delta else "",
                ]
            )
        blocks.append(
            Block(
                "table",
                caption="Waterfall: each change applied on top of the previous ones, measured with "
                "true cold starts.",
                columns=[
                    "Step",
                    "Removes",
                    "n",
                    "Cold start (s)",
                    "95 % interval (s)",
                    "Change, 95 % interval (s)",
                ],
                numeric=[False, False, True, True, True, True],
                rows=rows,
            )
        )
    phases = [p for p in cold.get("phases") or [] if isinstance(p, Mapping)]
    if phases:
        plot = figures.plot(
            plots.cold_start_timeline,
            "Cold-start timeline per node, before and after the changes. Each bar is one phase as the engine "
            "log marks it; every node waits for the slowest at distributed init.",
            phases=phases,
        )
        if plot:
            blocks.append(plot)
    stalls = [s for s in cold.get("stalls") or [] if isinstance(s, Mapping)]
    if stalls:
        rows = [
            [
                str(s.get("node", "")),
                str(s.get("cause", "")),
                fig.seconds_bare(float(s["start_s"])) if as_number(s.get("start_s")) is not None else "",
                fig.seconds_bare(float(s["end_s"])) if as_number(s.get("end_s")) is not None else "",
                fig.seconds_bare(float(s["silent_s"])) if as_number(s.get("silent_s")) is not None else "",
            ]
            for s in stalls
        ]
        blocks.append(
            Block(
                "table",
                caption="Stalls: 60 s or more without a new log line, matched to their telemetry signature.",
                columns=["Node", "Attributed to", "From (s)", "To (s)", "Log silent (s)"],
                numeric=[False, False, True, True, True],
                rows=rows,
            )
        )
        traced = [s for s in stalls if s.get("telemetry")]
        if traced:
            titles = [f"{s.get('cause', '?')} on {s.get('node', '?')}" for s in traced]
            signatures = [
                STALL_SIGNATURES[c]
                for c in dict.fromkeys(str(s.get("cause")) for s in traced)
                if c in STALL_SIGNATURES
            ]
            caption = (
                "Telemetry during each stall, sampled at 1 Hz of lab time: the signature that attributes it."
            )
            if signatures:
                text = "; ".join(signatures)
                caption += " " + text[0].upper() + text[1:] + "."
            plot = figures.plot(
                plots.stall_telemetry,
                caption,
                stalls=traced,
                titles=titles,
            )
            if plot:
                blocks.append(plot)
    return StageSection("cold-start", number, title, True, blocks)
