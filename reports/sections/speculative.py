"""Section 3.3, speculative decoding, from `findings.speculative`: the decode rate per
workload without speculation, with the customer's setting and with the fastest one, the
rate against draft length k per method and workload, the finalists, the one setting
deployed for the customer's mix in their own launch syntax, the search's lab time against
an exhaustive sweep, and every trial.

Shapes read (the search's section): `baseline|none|best.{workload}`: {n, mean_tps, ci95},
a section's own `method` and `k` applying to its workloads; `verdicts` {workload: ok|
suboptimal|...}; `trials[]`: {workload, method, k, phase (and `stage`, the same):
screen|confirm, n, mean_tps, ci95}; `finalists[]`, `not_confirmed[]` ({method, k, why});
`customer`, `chosen`, `deployed` {method, k, changed, weights, mix_tps, vs_customer,
workloads {w: gives_up_tps, gives_up_pct}, launch_syntax}; `customer_launch_syntax`;
`protocol.screen|confirm` {n, max_tokens}; `space.notes`; `lab_time_s`,
`sweep_estimate_s`, `lab_time_vs_sweep`, `sweep_basis.settings`.
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
    comparison_text,
    present,
    setting_label,
    workloads_in,
)


def _stage(trial: Mapping[str, Any]) -> str:
    """A trial's stage: the search writes `phase` (and `stage` with the same value)."""
    return str(trial.get("phase") or trial.get("stage") or "screen")


def _setting_of(value: Any) -> tuple[str, int] | None:
    if isinstance(value, Mapping) and value.get("k") is not None:
        return (str(value.get("method") or "none"), int(value["k"]))
    return None


def _rate_cell(trial: Mapping[str, Any] | None) -> str:
    if not trial or as_number(trial.get("mean_tps")) is None:
        return ""
    ci = as_interval(trial.get("ci95"))
    return fig.tps(float(trial["mean_tps"])) + (f"\n{fig.interval(ci, fig.tps)}" if ci else "")


def model_curves(spec: Mapping[str, Any]) -> dict[tuple[str, str], dict[int, float]]:
    """The acceptance model's predicted rates per (method, workload), from the section."""
    out: dict[tuple[str, str], dict[int, float]] = {}
    predicted = (spec.get("rate_model") or {}).get("predicted_tps") or {}
    if not isinstance(predicted, Mapping):
        return out
    for key, curve in predicted.items():
        method, _, workload = str(key).partition("/")
        if not workload or not isinstance(curve, Mapping):
            continue
        points = {int(k): float(v) for k, v in curve.items() if as_number(v) is not None and str(k).isdigit()}
        if points:
            out[(method, workload)] = points
    return out


def search_paragraph(spec: Mapping[str, Any]) -> str:
    """How the search went: what it tried, its two protocols, and its lab time against a sweep."""
    protocol = spec.get("protocol") or {}
    screen, confirm = protocol.get("screen") or {}, protocol.get("confirm") or {}
    text = "We searched the draft length k for each method and workload: short screening runs first"
    if screen.get("n"):
        text += f" ({screen['n']} runs of {screen.get('max_tokens', '?')} tokens per workload)"
    text += ", then a confirmation of the promising settings"
    if confirm.get("n"):
        text += f" ({confirm['n']} fresh runs of {confirm.get('max_tokens', '?')} tokens)"
    text += "; only confirmation runs decide."
    if model_curves(spec):
        text += (
            " The engine's own spec-decode lines give the share of drafts accepted at each position, so"
            " one trial at a draft length gives the rate of every shorter one (dotted in the chart): the"
            " search measured few lengths and followed these curves to the settings it confirmed."
        )
    borrowed = sorted({str(t["measured_by"]) for t in spec.get("trials") or []
                       if isinstance(t, Mapping) and t.get("measured_by")})
    if borrowed:
        text += (" Without speculation, the screening runs are those of " + " and ".join(borrowed)
                 + ": the same configuration and protocol, so they were not taken twice.")
    margin = as_number(protocol.get("bound_margin"))
    for search in spec.get("searches") or []:
        if not isinstance(search, Mapping) or not search.get("ruled_out_k"):
            continue
        lengths = ", ".join(str(k) for k in search["ruled_out_k"])
        text += (f" {search.get('method')} at k = {lengths} was not measured: the mean accepted length and "
                 "the rate it showed at the lengths measured bound its rate there below the fastest setting "
                 "read so far on every workload"
                 + (f", by more than {fig.percent(margin)}." if margin is not None else "."))
    notes = (spec.get("space") or {}).get("notes") or {}
    skipped = [f"{m} was {why}" for m, why in notes.items() if str(why).startswith("not tried")]
    if skipped:
        text += " " + "; ".join(skipped) + "."
    lab_s, sweep_s = as_number(spec.get("lab_time_s")), as_number(spec.get("sweep_estimate_s"))
    share = as_number(spec.get("lab_time_vs_sweep"))
    if lab_s is not None:
        text += f" The search spent {fig.minutes(lab_s)} of lab time"
        if sweep_s is not None:
            settings = (spec.get("sweep_basis") or {}).get("settings") or (spec.get("space") or {}).get(
                "settings"
            )
            text += (
                f", {fig.percent(share if share is not None else lab_s / sweep_s)} of the "
                f"{fig.hours(sweep_s)} an exhaustive sweep"
                + (f" of all {settings} settings" if settings else "")
                + " at the full protocol would have taken"
            )
        text += "."
    return text


def finalists_block(
    spec: Mapping[str, Any], trials: Sequence[Mapping[str, Any]], workloads: Sequence[str]
) -> Block | None:
    """The confirmed settings side by side per workload, and those the budget left unconfirmed."""
    finalists = [f for f in (_setting_of(x) for x in spec.get("finalists") or []) if f]
    if not finalists:
        return None
    confirmed = {
        ((str(t.get("method") or "none")), int(t.get("k") or 0), str(t.get("workload"))): t
        for t in trials
        if _stage(t) == "confirm"
    }
    customer = _setting_of(spec.get("customer")) or _setting_of(spec.get("baseline"))
    deployed = _setting_of(spec.get("deployed")) or _setting_of(spec.get("chosen"))
    rows = []
    for method, k in finalists:
        role = []
        if (method, k) == customer:
            role.append("yours")
        if (method, k) == deployed:
            role.append("deployed")
        rows.append(
            [
                setting_label(None if method == "none" else method, k),
                ", ".join(role),
                *(_rate_cell(confirmed.get((method, k, w))) for w in workloads),
            ]
        )
    for item in spec.get("not_confirmed") or []:
        setting = _setting_of(item)
        if setting:
            rows.append(
                [
                    setting_label(setting[0], setting[1]),
                    f"not confirmed: {item.get('why', '')}",
                    *("" for _ in workloads),
                ]
            )
    return Block(
        "table",
        caption="The finalists: every setting confirmed with fresh runs, mean decode rate (tok/s) and its "
        "95 % interval per workload.",
        columns=["Setting", "", *workloads],
        numeric=[False, False, *(True for _ in workloads)],
        rows=rows,
    )


def deployed_blocks(spec: Mapping[str, Any]) -> list[Block]:
    """The one setting a server runs for the customer's mix, in the customer's own launch syntax."""
    deployed = spec.get("deployed")
    if not isinstance(deployed, Mapping) or deployed.get("k") is None:
        return []
    setting = setting_label(deployed.get("method"), deployed.get("k"))
    weights = deployed.get("weights") or {}
    text = "One server runs one setting. For your workload mix"
    if weights:
        text += " (" + ", ".join(f"{w} {fig.number(v)}" for w, v in weights.items()) + " by weight)"
    text += f" we deploy {setting}"
    mix = as_number(deployed.get("mix_tps"))
    versus = deployed.get("vs_customer") or {}
    if mix is not None:
        text += f": {fig.tps(mix)} tok/s over the mix"
        before = as_number(versus.get("before_tps"))
        if before is not None:
            text += f" against {fig.tps(before)} with yours"
        if as_number(versus.get("diff_tps")) is not None:
            text += f" ({comparison_text(versus)})"
    text += "."
    if deployed.get("changed") is False:
        text += " Nothing tested was significantly faster than your setting, so it stays."
    given_up = [
        f"{w} gives up {fig.tps(float(v['gives_up_tps']))} tok/s "
        f"({fig.percent(float(v.get('gives_up_pct', 0)) / 100)})"
        for w, v in (deployed.get("workloads") or {}).items()
        if isinstance(v, Mapping) and (as_number(v.get("gives_up_tps")) or 0) > 0.05
    ]
    if given_up:
        text += " Against each workload's own fastest setting, " + "; ".join(given_up) + "."
    elif deployed.get("workloads"):
        text += " It is the fastest confirmed setting on every workload, so no workload gives anything up."
    blocks = [Block("heading", "The setting we deploy"), Block("paragraph", text)]
    mine, ours = spec.get("customer_launch_syntax"), deployed.get("launch_syntax")
    if ours and mine:
        blocks.append(Block("code", str(mine), caption="Your launch command has:"))
        blocks.append(Block("code", str(ours), caption="Replace it with:"))
    elif ours:
        blocks.append(Block("code", str(ours), caption="Add to your launch command:"))
    return blocks


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
    verdicts = spec.get("verdicts") or {}
    workloads = workloads_in(baseline, best, none)
    rows = []
    for workload in workloads:
        for label, section in (("no speculation", none), ("your setting", baseline), ("fastest", best)):
            block = section.get(workload) if isinstance(section, Mapping) else None
            if not isinstance(block, Mapping):
                continue
            method = block.get("method", section.get("method"))
            k = block.get("k", section.get("k"))
            ci = as_interval(block.get("ci95"))
            if block.get("phase") == "screen":  # not confirmed: its screening runs were enough
                label = "no speculation (screening runs)"
            rows.append(
                [
                    workload,
                    label,
                    setting_label(method, k),
                    str(block.get("n", "")),
                    fig.tps(float(block["mean_tps"])) if as_number(block.get("mean_tps")) is not None else "",
                    fig.interval(ci, fig.tps) if ci else "",
                    str(verdicts.get(workload, "")) if label == "your setting" else "",
                ]
            )
    blocks.append(Block("paragraph", search_paragraph(spec)))
    if rows:
        blocks.append(
            Block(
                "table",
                caption="Decode rate per workload from the confirmation runs: without speculation, with your "
                "setting, and with the fastest one; the verdict is the search's on your setting.",
                columns=["Workload", "", "Setting", "n", "Decode tok/s", "95 % interval", "Your setting"],
                numeric=[False, False, False, True, True, True, False],
                rows=rows,
            )
        )
    trials = [
        {**t, "stage": _stage(t)}
        for t in spec.get("trials") or []
        if isinstance(t, Mapping) and as_interval(t.get("ci95")) and t.get("workload") is not None
    ]
    if trials:
        customer_spec = config.get("speculative") or {}
        customer = None
        if customer_spec.get("method") and customer_spec.get("num_speculative_tokens"):
            customer = (str(customer_spec["method"]), int(customer_spec["num_speculative_tokens"]))
        deployed = _setting_of(spec.get("deployed")) or _setting_of(spec.get("chosen"))
        chosen = (
            {w: deployed for w in workloads}
            if deployed
            else {
                w: (str(best[w].get("method")), int(best[w]["k"]))
                for w in workloads
                if isinstance(best.get(w), Mapping) and best[w].get("k") is not None
            }
        )
        plot = figures.plot(
            plots.specdec_sweep,
            "Decode rate against draft length k, per method and workload, with 95 % intervals. Screening "
            "runs are joined by lines; diamonds are confirmation runs, which alone decide; the dashed line "
            "is no speculation"
            + ("; dotted lines are the acceptance model's predicted rates." if model_curves(spec) else "."),
            trials=trials,
            customer=customer,
            best=chosen,
            predicted=model_curves(spec),
        )
        if plot:
            blocks.append(plot)
        finalists = finalists_block(spec, trials, workloads)
        if finalists:
            blocks.append(finalists)
    blocks.extend(deployed_blocks(spec))
    if trials:
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
