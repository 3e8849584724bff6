"""The report's figures: matplotlib drawings returned as SVG text for inline embedding.

Every function takes plain data from findings.json and returns one `<svg>` element as a
string. Figures are drawn with the object-oriented API (no pyplot state, safe in a
worker thread) and saved with a fixed hash salt and no date, so the same findings give
byte-identical SVG. Text is left as SVG text in DejaVu Sans, the report's own font:
WeasyPrint sets it faster than one glyph outline per character, and it can be searched.

Each SVG's ids are prefixed with a name of the caller's choosing: WeasyPrint resolves
`href="#id"` across the whole HTML document, and matplotlib names clip paths and
markers by per-figure counters, so two inline plots would otherwise borrow each other's
definitions. Margins are fixed in inches rather than computed by constrained layout,
which costs seconds per figure and is the larger part of a report's plotting time.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib

# A worker has no display: should anything in the process reach for pyplot, it must
# not look for a GUI backend.
matplotlib.use("Agg")

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

# Text width of the A4 page in the report's CSS (210 mm - 2 x 20 mm margins).
PAGE_WIDTH_IN = 6.69

BEFORE = "#8a8f98"
AFTER = "#1f5a85"
ACCENT = "#b5452b"
INK = "#222222"
GRID = "#e4e6ea"
METHOD_COLOURS = ("#1f5a85", "#d98c3f", "#4f9d8a", "#7b5ea7")

PHASE_COLOURS = {
    "process_start": "#c9ced6",
    "weights_load": "#d98c3f",
    "distributed_init": "#b5452b",
    "kernel_jit": "#7b5ea7",
    "kv_cache": "#4f9d8a",
    "graph_capture": "#1f5a85",
    "api_ready": "#2c2c2c",
}
PHASE_LABELS = {
    "process_start": "process start",
    "weights_load": "weights load",
    "distributed_init": "distributed init",
    "kernel_jit": "kernel JIT",
    "kv_cache": "KV cache",
    "graph_capture": "graph capture",
    "api_ready": "API ready",
}

# Telemetry rows of a stall plot: (label, [(series key, line style)]).
TELEMETRY_ROWS = (
    ("disk read\nMB/s", [("disk_read_mbps", "-")]),
    ("page cache\nGiB", [("page_cache_gib", "-")]),
    ("CPU %\n(user, system)", [("cpu_user_pct", "-"), ("cpu_system_pct", "--")]),
    ("compiler\nprocesses", [("compilers", "-")]),
    ("data NIC\nMbit/s", [("data_nic_mbps", "-")]),
)

# Typed loosely: matplotlib types rc_context() keys as a closed set of literals.
_RC: Any = {
    "svg.hashsalt": "diagnostic-report",
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 8.0,
    "axes.titlesize": 8.5,
    "axes.labelsize": 8.0,
    "axes.edgecolor": "#9aa0a8",
    "axes.linewidth": 0.6,
    "xtick.color": "#555555",
    "ytick.color": "#555555",
    "xtick.major.width": 0.5,
    "ytick.major.width": 0.5,
    "legend.fontsize": 7.5,
    "legend.frameon": False,
    "path.simplify": True,
}


@dataclass(frozen=True)
class RunSeries:
    """One configuration's per-run decode rates on one workload, with its interval."""

    label: str
    rates: Sequence[float]
    mean: float
    ci95: Sequence[float] | None


def _figure(
    height_in: float,
    *,
    left: float = 0.55,
    right: float = 0.12,
    top: float = 0.3,
    bottom: float = 0.45,
    wspace: float = 0.25,
    hspace: float = 0.4,
) -> Figure:
    """A page-wide figure with margins given in inches."""
    fig = Figure(figsize=(PAGE_WIDTH_IN, height_in))
    fig.patch.set_alpha(0.0)
    fig.subplots_adjust(
        left=left / PAGE_WIDTH_IN,
        right=1 - right / PAGE_WIDTH_IN,
        top=1 - top / height_in,
        bottom=bottom / height_in,
        wspace=wspace,
        hspace=hspace,
    )
    return fig


def _style(ax: Axes, grid: bool = True) -> None:
    ax.spines[["top", "right"]].set_visible(False)
    if grid:
        ax.grid(True, axis="y", color=GRID, linewidth=0.6)
    ax.set_axisbelow(True)


_ID = re.compile(r'\bid="([^"]+)"')
_REF = re.compile(r'(href="#|url\(#)([^")]+)')


def _svg_text(fig: Figure, scope: str) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = _ID.sub(lambda m: f'id="{scope}-{m.group(1)}"', text)
    return _REF.sub(lambda m: f"{m.group(1)}{scope}-{m.group(2)}", text)


@dataclass(frozen=True)
class WaterfallStep:
    """One proving run of the cold-start waterfall: which fixes, how long, what was still seen."""

    label: str
    seconds: float
    mode: str  # baseline | alone | cumulative | all | tuned
    ci95: Sequence[float] | None
    remaining: Sequence[str] | None  # None: the start's signatures were not read
    # The bar's figures as the report's table prints them (reports.figures), so the chart
    # and the table give one value for each start and each change.
    value_text: str = ""
    delta_text: str = ""


def cold_start_waterfall(steps: Sequence[WaterfallStep], *, scope: str) -> str:
    """Horizontal bars, one per proving run, in minutes, each labelled with its seconds, its
    change against the first (the customer's start) and the signatures it still showed."""
    colours = {"baseline": BEFORE, "alone": "#7fa6c4", "cumulative": "#7fa6c4", "all": AFTER, "tuned": AFTER}
    with matplotlib.rc_context(_RC):
        fig = _figure(0.55 + 0.34 * len(steps), left=1.75, right=2.6, top=0.1, bottom=0.45)
        ax = fig.subplots()
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(True, axis="x", color=GRID, linewidth=0.6)
        ax.set_axisbelow(True)
        first = steps[0].seconds if steps else 0.0
        longest = max(s.seconds for s in steps) / 60
        for row, step in enumerate(steps):
            ax.barh(row, step.seconds / 60, height=0.62, color=colours.get(step.mode, AFTER), linewidth=0)
            if step.ci95 is not None:
                ax.errorbar(
                    [step.seconds / 60],
                    [row],
                    xerr=[[(step.seconds - step.ci95[0]) / 60], [(step.ci95[1] - step.seconds) / 60]],
                    color=INK,
                    capsize=2,
                    linewidth=0.8,
                )
            text = step.value_text or f"{step.seconds:.0f} s"
            if row:
                delta = step.seconds - first
                sign = "+" if delta > 0 else chr(0x2212)
                text += "  (" + (step.delta_text or f"{sign}{abs(delta):.0f} s") + ")"
            ax.text(step.seconds / 60 + longest * 0.015, row, text, va="center", fontsize=7, color=INK)
            if step.remaining is None:
                continue
            seen = ", ".join(r.removeprefix("load.").replace("_", " ") for r in step.remaining) or "none"
            ax.annotate(
                f"still seen: {seen}",
                (1.0, row),
                xycoords=("axes fraction", "data"),
                xytext=(8, 0),
                textcoords="offset points",
                va="center",
                fontsize=6.8,
                color="#555555" if step.remaining else AFTER,
                annotation_clip=False,
            )
        ax.set_yticks(range(len(steps)), [s.label for s in steps])
        ax.set_ylim(len(steps) - 0.5, -0.5)
        ax.tick_params(axis="y", length=0)
        ax.set_xlim(0, longest * 1.32)
        ax.set_xlabel("true cold start, minutes (lab time)")
        return _svg_text(fig, scope)


def decode_runs(panels: Mapping[str, Sequence[RunSeries]], *, scope: str) -> str:
    """Per-run decode rates per workload, before and after, each with its mean and 95 % interval."""
    with matplotlib.rc_context(_RC):
        fig = _figure(2.7, bottom=0.75)
        axes = fig.subplots(1, max(1, len(panels)), squeeze=False)[0]
        handles: dict[str, Line2D] = {}
        colours = [BEFORE, AFTER, ACCENT]
        for ax, (workload, series_list) in zip(axes, panels.items(), strict=False):
            _style(ax)
            for idx, series in enumerate(series_list):
                colour = colours[idx % len(colours)]
                xs = list(range(1, len(series.rates) + 1))
                ax.plot(xs, series.rates, "o", color=colour, markersize=3.2)
                ax.axhline(series.mean, color=colour, linewidth=1.0)
                if series.ci95 is not None:
                    ax.axhspan(series.ci95[0], series.ci95[1], color=colour, alpha=0.15, linewidth=0)
                    ax.errorbar(
                        [len(series.rates) + 1.3 + 0.6 * idx],
                        [series.mean],
                        yerr=[[series.mean - series.ci95[0]], [series.ci95[1] - series.mean]],
                        color=colour,
                        capsize=2.5,
                        linewidth=1.0,
                    )
                key = series.label.split(" (")[0]
                handles.setdefault(key, Line2D([], [], color=colour, marker="o", markersize=3.2, label=key))
            ax.set_title(f"{workload} workload", loc="left", color=INK)
            ax.set_xlabel("run")
            runs = max(len(s.rates) for s in series_list)
            ax.set_xticks([1, *range(5, runs + 1, 5)] if runs >= 5 else list(range(1, runs + 1)))
            lo = min(min(s.rates) for s in series_list if s.rates)
            hi = max(max(s.rates) for s in series_list if s.rates)
            pad = (hi - lo) * 0.15 + 0.3
            ax.set_ylim(lo - pad, hi + pad)
        axes[0].set_ylabel("decode rate (tok/s)")
        fig.legend(handles=list(handles.values()), loc="lower center", ncols=len(handles))
        return _svg_text(fig, scope)


def cold_start_timeline(
    phases: Sequence[Mapping[str, Any]], *, scope: str, titles: Mapping[str, str] | None = None
) -> str:
    """Per-node cold-start phases, one panel per run (before, after), on one time axis.

    `titles`: each panel's title by run, as the report words and prints that start's
    recorded figure; a run without one is titled by the end of its last phase."""
    runs = sorted({str(p.get("run", "cold start")) for p in phases}, key=lambda r: (r != "before", r))
    nodes = sorted({str(p["node"]) for p in phases})
    end = max(float(p["end_s"]) for p in phases)
    panel_in = 0.16 * len(nodes) + 0.1
    with matplotlib.rc_context(_RC):
        fig = _figure(0.3 + 0.28 * len(runs) + panel_in * len(runs) + 0.9, bottom=0.9, left=0.7, hspace=0.45)
        axes = fig.subplots(len(runs), 1, squeeze=False, sharex=True)[:, 0]
        for ax, run in zip(axes, runs, strict=True):
            ax.spines[["top", "right"]].set_visible(False)
            ax.grid(True, axis="x", color=GRID, linewidth=0.6)
            ax.set_axisbelow(True)
            run_end = 0.0
            for row, node in enumerate(nodes):
                spans, colours = [], []
                for p in phases:
                    if str(p.get("run", "cold start")) == run and p["node"] == node:
                        start, stop = float(p["start_s"]) / 60, float(p["end_s"]) / 60
                        run_end = max(run_end, stop)
                        spans.append((start, stop - start))
                        colours.append(PHASE_COLOURS.get(str(p["phase"]), "#999999"))
                ax.broken_barh(spans, (row - 0.38, 0.76), facecolors=colours, linewidth=0)
            ax.set_yticks(range(len(nodes)), nodes)
            ax.set_ylim(len(nodes) - 0.5, -0.5)
            ax.tick_params(axis="y", length=0)
            title = (titles or {}).get(run) or f"{run}: API ready after {run_end:.1f} min"
            ax.set_title(title, loc="left", color=INK)
        axes[-1].set_xlabel("minutes since launch (lab time)")
        axes[-1].set_xlim(0, end / 60 * 1.02)
        seen = [name for name in PHASE_COLOURS if any(p["phase"] == name for p in phases)]
        fig.legend(
            handles=[Patch(color=PHASE_COLOURS[n], label=PHASE_LABELS[n]) for n in seen],
            loc="lower center",
            ncols=min(4, len(seen)),
        )
        return _svg_text(fig, scope)


def stall_telemetry(stalls: Sequence[Mapping[str, Any]], titles: Sequence[str], *, scope: str) -> str:
    """Telemetry during each stall: one column per stall, one row per signal.

    Rows share their scale across stalls, so a signature stands out against the others
    (compilers at full CPU in one column, none in the rest).
    """
    traces = [s.get("telemetry") or {} for s in stalls]
    rows = [
        (label, series) for label, series in TELEMETRY_ROWS if any(k in t for t in traces for k, _ in series)
    ]
    row_max = [
        max([float(v) for t in traces for k, _ in series for v in (t.get(k) or [])] + [1e-9])
        for _, series in rows
    ]
    with matplotlib.rc_context(_RC):
        height = 0.75 + 0.55 * len(rows)
        fig = _figure(height, left=1.05, top=0.28, bottom=0.45, wspace=0.1, hspace=0.3)
        axes = fig.subplots(len(rows), len(stalls), squeeze=False, sharex="col")
        for col, (trace, title) in enumerate(zip(traces, titles, strict=True)):
            t = trace.get("t_s") or list(range(len(next(iter(trace.values()), []))))
            for row, (label, series) in enumerate(rows):
                ax = axes[row][col]
                _style(ax, grid=False)
                drawn = False
                for key, style in series:
                    values = trace.get(key)
                    if values:
                        ax.plot(t[: len(values)], values, style, color=AFTER, linewidth=0.9)
                        drawn = True
                if not drawn:
                    ax.text(
                        0.5,
                        0.5,
                        "not sampled",
                        transform=ax.transAxes,
                        ha="center",
                        va="center",
                        color="#888888",
                        fontsize=7,
                    )
                ax.set_ylim(0, row_max[row] * 1.15)
                ax.locator_params(axis="y", nbins=2)
                if col == 0:
                    ax.set_ylabel(label, rotation=0, ha="right", va="center", labelpad=4, fontsize=7)
                else:
                    ax.tick_params(axis="y", labelleft=False, length=0)
                if row < len(rows) - 1:
                    ax.tick_params(axis="x", bottom=False, labelbottom=False)
            axes[0][col].set_title(title, loc="left", color=INK, fontsize=7.5)
            axes[-1][col].set_xlabel("seconds into the stall", fontsize=7)
        return _svg_text(fig, scope)


def specdec_sweep(
    trials: Sequence[Mapping[str, Any]],
    *,
    customer: tuple[str, int] | None,
    best: Mapping[str, tuple[str, int]],
    scope: str,
    predicted: Mapping[tuple[str, str], Mapping[int, float]] | None = None,
) -> str:
    """Decode rate against draft length k per method and workload, with 95 % intervals;
    `predicted` ((method, workload) -> k -> tok/s): the acceptance model's curves, dotted."""
    predicted = predicted or {}
    workloads = list(dict.fromkeys(str(t["workload"]) for t in trials))
    methods = sorted({str(t["method"]) for t in trials} - {"none"}, key=lambda m: (m != "eagle3", m))
    colours = dict(zip(methods, METHOD_COLOURS, strict=False))
    with matplotlib.rc_context(_RC):
        # A second legend row when the acceptance model's curves add their entries.
        fig = _figure(3.1, bottom=1.0) if predicted else _figure(2.9, bottom=0.8)
        axes = fig.subplots(1, max(1, len(workloads)), squeeze=False, sharey=True)[0]
        for ax, workload in zip(axes, workloads, strict=False):
            _style(ax)
            mine = [t for t in trials if t["workload"] == workload]
            for t in mine:
                if t["method"] == "none" and t.get("stage") != "confirm":
                    ax.axhline(float(t["mean_tps"]), color=BEFORE, linestyle="--", linewidth=0.9)
                    ax.annotate(
                        "no speculation",
                        (0.02, float(t["mean_tps"])),
                        xycoords=("axes fraction", "data"),
                        textcoords="offset points",
                        xytext=(0, -9),
                        color="#666666",
                        fontsize=7,
                    )
            for method in methods:
                curve = predicted.get((method, workload)) or {}
                if curve:
                    ks_model = sorted(curve)
                    ax.plot(ks_model, [curve[k] for k in ks_model], color=colours[method], linestyle=":",
                            linewidth=1.0, label=f"{method} (acceptance model)")
                pts = sorted(
                    (t for t in mine if t["method"] == method and t.get("stage", "screen") == "screen"),
                    key=lambda t: int(t["k"]),
                )
                if not pts:
                    continue
                means = [float(t["mean_tps"]) for t in pts]
                err = [
                    [m - float(t["ci95"][0]) for m, t in zip(means, pts, strict=True)],
                    [float(t["ci95"][1]) - m for m, t in zip(means, pts, strict=True)],
                ]
                ax.errorbar(
                    [int(t["k"]) for t in pts],
                    means,
                    yerr=err,
                    color=colours[method],
                    marker="o",
                    markersize=3.2,
                    linewidth=1.0,
                    capsize=2,
                    label=f"{method} (screen, n = {pts[0].get('n', '?')})",
                )
            for t in mine:
                if t.get("stage") == "confirm":
                    m = float(t["mean_tps"])
                    ax.errorbar(
                        [int(t["k"]) + 0.12],
                        [m],
                        yerr=[[m - float(t["ci95"][0])], [float(t["ci95"][1]) - m]],
                        color=INK,
                        marker="D",
                        markersize=3.5,
                        capsize=2,
                        linewidth=1.0,
                        linestyle="none",
                    )
            _mark(ax, mine, customer, "your setting", ACCENT, -16)
            _mark(ax, mine, best.get(workload), "deployed", AFTER, 14)
            ax.set_title(f"{workload} workload", loc="left", color=INK)
            ax.set_xlabel("draft length k")
            ks = sorted({int(t["k"]) for t in mine if t["method"] != "none"}
                        | {k for (_m, w), c in predicted.items() if w == workload for k in c})
            ax.set_xticks(ks)
            # Room at both ends for the k = 0 points and the labels of the outermost settings.
            ax.set_xlim(-0.5, (max(ks) if ks else 1) + 0.8)
        axes[0].set_ylabel("decode rate (tok/s)")
        handles, labels = axes[0].get_legend_handles_labels()
        confirm_n = sorted({str(t.get("n", "?")) for t in trials if t.get("stage") == "confirm"})
        if confirm_n:
            handles.append(Line2D([], [], color=INK, marker="D", markersize=3.5, linestyle="none"))
            labels.append(f"confirmation (n = {', '.join(confirm_n)})")
        fig.legend(handles, labels, loc="lower center", ncols=min(len(handles), 3 if predicted else 6))
        return _svg_text(fig, scope)


def _mark(
    ax: Axes,
    trials: Sequence[Mapping[str, Any]],
    setting: tuple[str, int] | None,
    text: str,
    colour: str,
    offset: float,
) -> None:
    """Label the confirmation point of one setting (method, k), when it was confirmed."""
    if setting is None:
        return
    for t in trials:
        if (t["method"], int(t["k"])) == setting and t.get("stage") == "confirm":
            ax.annotate(
                text,
                (int(setting[1]) + 0.12, float(t["mean_tps"])),
                textcoords="offset points",
                xytext=(0, offset),
                fontsize=7,
                color=colour,
                ha="center",
                arrowprops={"arrowstyle": "-", "color": colour, "linewidth": 0.6},
            )
            return
