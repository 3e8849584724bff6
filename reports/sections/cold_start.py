"""Section 3.1, cold start, from `findings.cold_start` (the triage's section, with
`after_s` and `after_first_boot_s` from the measure stage): the true cold starts before and
after the changes, the waterfall of proving runs as a chart and a table with each stall
signature seen or gone, the one-time compile of a kept JIT cache, the timeline per node,
and each stall with the telemetry that attributes it.

Shapes read (diagnostic/pipelines/triage/section.py documents them): `before_s`,
`after_s`, `before_ci95`, `after_ci95`, `root_causes`; `waterfall[]`: {step, mode:
baseline|alone|cumulative|all, fixes, changes [{path, from, to}], n, cold_start_s, ci95, delta_s,
delta_ci95, signatures, signature_gone}; `steps[]`: {step, warm_up_lab_s}; `notes[]`;
`phases[]`: {run, node, phase, start_s, end_s}; `stalls[]`: {run, node, cause, start_s,
end_s, silent_s, telemetry: {t_s: [...], series...}}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reports import figures as fig
from reports import plots
from reports.quantities import DayColdStart, day_cold_start
from reports.structure import (
    NOT_RUN,
    Block,
    FigureCounter,
    StageSection,
    as_interval,
    as_number,
    present,
    waterfall_proofs,
)

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
    day = day_cold_start(cold_findings(cold))
    b, a = (day.before_s, day.after_s) if day is not None else (None, None)
    if b is not None and day is not None:
        text = (
            "A true cold start of your configuration (engine stopped on every node, page cache dropped) "
            f"took {fig.seconds(b)}"
        )
        text += f" (95 % interval {fig.interval(day.before_ci95, fig.seconds)})" if day.before_ci95 else ""
        if a is not None:
            text += f"; with the changes in this report it took {fig.seconds(a)}"
            text += f" (95 % interval {fig.interval(day.after_ci95, fig.seconds)})" if day.after_ci95 else ""
            if day.n_after and day.n_after > 1:
                text += f", the mean of {day.n_after} true cold starts"
        causes = cold.get("root_causes") or []
        if causes:
            text += f". Root causes: {', '.join(str(c) for c in causes)}"
        blocks.append(Block("paragraph", text + "."))
    waterfall = [w for w in cold.get("waterfall") or [] if isinstance(w, Mapping)]
    if waterfall:
        blocks.extend(waterfall_blocks(cold, with_tuned(waterfall, day), figures))
    blocks.extend(starts_blocks(cold))
    phases = [p for p in cold.get("phases") or [] if isinstance(p, Mapping)]
    if phases:
        plot = figures.plot(
            plots.cold_start_timeline,
            "Cold-start timeline per node: your configuration's true cold start and the waterfall's last "
            "proved step. Each bar is one phase as the engine log marks it, counted from the first rank's "
            "first log line; every node waits for the slowest at distributed init.",
            phases=phases,
            titles=timeline_titles(waterfall),
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


TUNED_STEP = "with every change in this report"


def timeline_titles(waterfall: list[Mapping[str, Any]]) -> dict[str, str]:
    """The timeline panels' titles with the starts' recorded seconds (the table's figures):
    `before` is the customer's start, `after` the waterfall's last proved step."""
    titles = {}
    first = next((w for w in waterfall if w.get("mode") == "baseline"), None)
    if first is not None and as_number(first.get("cold_start_s")) is not None:
        titles["before"] = f"your configuration: true cold start {fig.seconds(float(first['cold_start_s']))}"
    proved = [w for w in waterfall if w.get("mode") != "baseline" and w.get("proved") is not False]
    if proved and as_number(proved[-1].get("cold_start_s")) is not None:
        titles["after"] = (
            f"{proved[-1].get('step')}, with the changes before it: true cold start "
            f"{fig.seconds(float(proved[-1]['cold_start_s']))}"
        )
    return titles


def cold_findings(cold: Mapping[str, Any]) -> dict[str, Any]:
    """The section as the findings document holds it, for the one reader of the day's figures."""
    return {"cold_start": cold}


def with_tuned(waterfall: list[Mapping[str, Any]], day: DayColdStart | None) -> list[Mapping[str, Any]]:
    """The waterfall with the day's after as its last bar, when the measure stage measured
    the tuned configuration's own true cold starts: the bar, the table and the summary then
    print one value for "with the changes in this report", the one the summary gives."""
    if day is None or not day.after_from_measure or day.after_s is None:
        return waterfall
    row: dict[str, Any] = {
        "step": TUNED_STEP,
        "mode": "tuned",
        "fixes": None,
        "changes": [],
        "n": day.n_after or "",
        "cold_start_s": day.after_s,
        "signatures": [],
        "delta_s": day.change_s,
    }
    if day.after_ci95:
        row["ci95"] = list(day.after_ci95)
    if day.change_ci95:
        row["delta_ci95"] = list(day.change_ci95)
    return [*waterfall, row]


START_NAMES = {"before": "your configuration", "reproduce": "your configuration (reproduce's start)"}
PHASE_COLUMNS = (
    ("distributed_init_s", "Distributed init"),
    ("weights_load_s", "Weights load"),
    ("kernel_jit_s", "Kernel JIT"),
)


def starts_blocks(cold: Mapping[str, Any]) -> list[Block]:
    """Every true cold start the triage took, with the seconds of the phase each change acts
    on: the raw samples behind each cold-start finding's interval."""
    starts = [s for s in cold.get("starts") or [] if isinstance(s, Mapping)]
    if not starts:
        return []
    rows = []
    for start in starts:
        phases = start.get("phases_s") or {}
        seconds = as_number(start.get("cold_start_s"))
        rows.append(
            [
                START_NAMES.get(str(start.get("start", "")), str(start.get("start", "")))
                + (" (added for the proof)" if start.get("extra") else ""),
                fig.seconds_bare(seconds) if seconds is not None else "",
                *(
                    fig.seconds_bare(float(phases[key]))
                    if as_number(phases.get(key)) is not None
                    else "not marked"
                    for key, _ in PHASE_COLUMNS
                ),
            ]
        )
    return [
        Block(
            "table",
            caption="Every true cold start of the triage, with the seconds of the phase each change acts on "
            "(its slowest node): each cold-start finding compares its phase on the starts without its change "
            "against those with it.",
            columns=["True cold start", "Cold start (s)", *(f"{label} (s)" for _, label in PHASE_COLUMNS)],
            numeric=[False, True, True, True, True],
            rows=rows,
            wrap=True,
        )
    ]


def _delta(step: Mapping[str, Any], baseline: float | None) -> float | None:
    """A step's change against the customer's start: as recorded, else its value less the
    customer's (one rule for the table and the chart)."""
    if step.get("mode") == "baseline":
        return None
    delta = as_number(step.get("delta_s"))
    value = as_number(step.get("cold_start_s"))
    if delta is None and value is not None and baseline is not None:
        delta = value - baseline
    return delta


def _signed_seconds(value: float | None) -> str:
    return fig.signed(value, fig.seconds) if value is not None else ""


def _change_text(changes: Any) -> str:
    parts = []
    for change in changes or []:
        if isinstance(change, Mapping) and change.get("path"):
            before = "not set" if change.get("from") is None else str(change.get("from"))
            after = "not set" if change.get("to") is None else str(change.get("to"))
            parts.append(f"{change['path']}: {before} {fig.ARROW} {after}")
    return "\n".join(parts)


def waterfall_blocks(
    cold: Mapping[str, Any], waterfall: list[Mapping[str, Any]], figures: FigureCounter
) -> list[Block]:
    """The waterfall of proving runs as a chart and a table, each a true cold start, with the
    stall signatures still seen in it and those gone. Two designs read alike: each fix added
    to the ones proved before it (one `alone` step at most), or each fix alone then all."""
    cumulative, proofs = waterfall_proofs(waterfall)
    causes = [str(c) for c in cold.get("root_causes") or []]
    for step in waterfall:
        causes += [str(c) for c in step.get("signatures") or [] if str(c) not in causes]
    baseline = next(
        (as_number(w.get("cold_start_s")) for w in waterfall if w.get("mode") == "baseline"), None
    )
    blocks: list[Block] = []
    plot = _waterfall_plot(waterfall, figures, cumulative, baseline)
    if plot:
        blocks.append(plot)
    any_ci = any(as_interval(step.get("ci95")) for step in waterfall)
    rows = [_waterfall_row(step, waterfall, cumulative, baseline, causes, any_ci) for step in waterfall]
    blocks.append(_waterfall_table(rows, causes, cumulative, any_ci))
    said = _signatures_gone([w for w in proofs if w.get("fixes")])
    if said:
        blocks.append(said)
    blocks.extend(compile_notes(cold))
    return blocks


def _waterfall_plot(
    waterfall: list[Mapping[str, Any]], figures: FigureCounter, cumulative: bool, baseline: float | None
) -> Block | None:
    bars = [
        plots.WaterfallStep(
            label=str(step.get("step", "")),
            seconds=float(step["cold_start_s"]),
            mode=str(step.get("mode") or ""),
            ci95=as_interval(step.get("ci95")),
            remaining=None if step.get("mode") == "tuned" else [str(c) for c in step.get("signatures") or []],
            value_text=fig.seconds(float(step["cold_start_s"])),
            delta_text=_signed_seconds(_delta(step, baseline)),
        )
        for step in waterfall
        if as_number(step.get("cold_start_s")) is not None
    ]
    if bars:
        plot = figures.plot(
            plots.cold_start_waterfall,
            (
                "True cold start of your configuration, then with each fix added to the ones before it; "
                "the last bar has every change together"
                + ("; the bar after it is the tuned configuration, every change in this report"
                   if any(w.get("mode") == "tuned" for w in waterfall) else "")
                if cumulative
                else "True cold start of your configuration, of each fix applied alone, and of all of them "
                "together"
            )
            + " (lab time). Beside each bar, the stall signatures still seen in that start.",
            steps=bars,
        )
        return plot
    return None


def _waterfall_row(
    step: Mapping[str, Any], waterfall: list[Mapping[str, Any]], cumulative: bool, baseline: float | None,
    causes: list[str], any_ci: bool,
) -> list[str]:
    """One proving start: its change, its cold start and what it still showed."""
    first = next((w for w in waterfall if w.get("mode") == "baseline"), waterfall[0])
    shown_first = {str(c) for c in first.get("signatures") or []}
    value = as_number(step.get("cold_start_s"))
    delta = _delta(step, baseline)
    delta_ci = as_interval(step.get("delta_ci95"))
    seen = {str(c) for c in step.get("signatures") or []}
    if step.get("mode") == "tuned":
        change = "the tuned configuration: every change of this report, its own true cold starts"
    elif step.get("mode") == "all" and cumulative and step.get("changes"):
        change = _change_text(step.get("changes")) + ", with every change above: all of them together"
    elif step.get("mode") == "all":
        change = "every change above, together"
    elif step.get("mode") == "cumulative":
        change = _change_text(step.get("changes")) + ", with the changes above"
    else:
        change = _change_text(step.get("changes")) or "none: your configuration"
    row = [
        str(step.get("step", "")),
        change,
        str(step.get("n", "")),
        fig.seconds_bare(value) if value is not None else "",
    ]
    if any_ci:
        ci = as_interval(step.get("ci95"))
        row.append(fig.interval(ci, fig.seconds_bare) if ci else "")
    row.append(
        (fig.signed(delta, fig.seconds_bare) if delta is not None else "")
        + (f"\n{fig.signed_interval(delta_ci, fig.seconds_bare)}" if delta_ci else "")
    )
    # "Gone" only for a signature your own start showed; one it never showed is "not seen".
    if step.get("mode") == "tuned":
        row += ["" for _ in causes]  # the measure stage times the start; the triage reads signatures
    else:
        row += ["seen" if c in seen else "gone" if c in shown_first else "not seen" for c in causes]
    return row


def _waterfall_table(rows: list[list[str]], causes: list[str], cumulative: bool, any_ci: bool) -> Block:
    columns = [
        "Step",
        "Change",
        "n",
        "Cold start (s)",
        *(["95 % interval"] if any_ci else []),
        "Against yours (s)",
    ]
    return Block(
        "table",
        caption=(
            "The waterfall: each fix added to the ones before it, the last row every change together, "
            if cumulative
            else "The waterfall: each fix applied alone to your configuration, then all together, "
        )
        + "each measured with true cold starts; for each stall signature, whether that start still "
        "showed it.",
        columns=[*columns, *(c.removeprefix("load.").replace("_", " ") for c in causes)],
        numeric=[False, False, True, True, *([True] if any_ci else []), True, *(False for _ in causes)],
        rows=rows,
        wrap=True,
    )


def _signatures_gone(fix_steps: list[Mapping[str, Any]]) -> Block | None:
    """Which fixes removed their own stall signature, and which did not."""
    gone = [str(step.get("fixes")) for step in fix_steps if step.get("signature_gone") is True]
    kept = [str(step.get("fixes")) for step in fix_steps if step.get("signature_gone") is False]
    text = ""
    if gone:
        text = (
            "Each fix removed its own signature: "
            + ", ".join(gone)
            + (
                " no longer appears in the start with its fix."
                if len(gone) == 1
                else " no longer appear in the starts with their fixes."
            )
        )
    if kept:
        text += (" " if text else "") + "Still seen after its fix: " + ", ".join(kept) + "."
    return Block("paragraph", text) if text else None


def compile_notes(cold: Mapping[str, Any]) -> list[Block]:
    """The one-time compile of a kept JIT cache: the warm-up start that filled it before a
    proving run, the tuned configuration's first start, and the triage's own notes."""
    texts = []
    for step in cold.get("steps") or []:
        warm = as_number(step.get("warm_up_lab_s")) if isinstance(step, Mapping) else None
        if warm:
            texts.append(
                f"For \u201c{step.get('step')}\u201d the engine was first started once to compile its "
                f"kernels into the kept cache ({fig.seconds(warm)} of lab time); the cold start measured is "
                "the one after it, as your users will see every start after the first."
            )
    first, after = as_number(cold.get("after_first_boot_s")), as_number(cold.get("after_s"))
    if first is not None:
        text = (
            "The first start of the tuned configuration compiled the kernels once into the kept cache "
            f"and took {fig.seconds(first)}"
        )
        texts.append(
            text + (f"; every start after it took {fig.seconds(after)}." if after is not None else ".")
        )
    texts += [str(n) for n in cold.get("notes") or [] if n]
    return [Block("paragraph", t[0].upper() + t[1:]) for t in texts]
