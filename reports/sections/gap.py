"""Section 3.5, the gap to the lab's own best (`findings.gap`, the gap stage's
`diagnostic.gap/1` section), and section 3.6, where the rest goes
(`measurement.explain`, the measure stage's split of the tuned configuration's step).

The gap section says what the customer's configuration, with every change proved before
it, was compared with (the lab's baseline: its source, version, date and whether it is
stale), which differences were candidates and which were left alone as the customer's
requirements, the restarts that split them, what each proved difference gives, what was
checked and changed nothing, and whether the model's native context fits. The findings
themselves (`gap.*`, `context.native`) print in section 2 like any other.

The rest section answers "16 % of the bound: where does the other 84 % go?": the measured
step time, its parts each marked measured or estimate, and the distance to the baseline and
to the roofline bound, with every figure printed from the measure stage's values. The
weights' read is at the memory bandwidth preflight measured (`explain.memory_bandwidth`,
the agent's mem-bw-probe on every node; each repeat is in the raw-samples appendix) and
says so, with the specified peak beside it; without a measurement it is the estimate at
the peak.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reports import figures as fig
from reports.structure import NOT_RUN, Block, StageSection, as_interval, as_number, present, workloads_in

SOURCE_WORDS = {
    "calibrate": "the configuration we tuned on this lab",
    "best-known": "our best-known configuration for this model and node count, measured on the spot",
}


def _value(value: Any) -> str:
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _rate(block: Any) -> str:
    if not isinstance(block, Mapping) or as_number(block.get("mean_tps")) is None:
        return ""
    ci = as_interval(block.get("ci95"))
    text = fig.tps(float(block["mean_tps"]))
    return text + (f"\n({fig.interval(ci, fig.tps)})" if ci else "")


def _baseline_paragraph(baseline: Mapping[str, Any]) -> str:
    source = str(baseline.get("source") or "")
    text = "We compared your configuration, with every change proved above, against the lab's baseline: "
    text += SOURCE_WORDS.get(source, source or "a configuration of the lab's")
    version, made = baseline.get("version"), str(baseline.get("made_at") or "")[:10]
    if version is not None or made:
        text += " (" + ", ".join(p for p in (f"version {version}" if version is not None else "",
                                               f"made {made}" if made else "") if p) + ")"
    rates = baseline.get("rates") or {}
    said = []
    for workload in workloads_in(rates):
        block = rates[workload]
        if as_number(block.get("mean_tps")) is not None:
            ci = as_interval(block.get("ci95"))
            said.append(
                f"{workload} {fig.tps(float(block['mean_tps']))} tok/s"
                + (f" ({fig.interval(ci, fig.tps)}, n = {block.get('n')})" if ci else "")
            )
    if said:
        text += ", which delivers " + " and ".join(said)
    cold = baseline.get("cold_start") or {}
    if as_number(cold.get("mean_s")) is not None:
        text += f", with a true cold start of {fig.seconds(float(cold['mean_s']))}"
        if cold.get("n"):
            text += f" (n = {cold['n']})"
    text += "."
    if baseline.get("stale"):
        text += f" This baseline is stale: {baseline['stale']}."
    return text


def gap_section(gap: Any, number: str, stage_lab_s: float | None = None) -> StageSection:
    """The gap stage's section. `stage_lab_s`: the stage's lab seconds as the job recorded
    them (appendix C prints the same figure), which stand for the stage's time here."""
    title = "The gap to the lab's own best"
    if not present(gap):
        return StageSection("gap", number, title, False, [Block("paragraph", NOT_RUN)])
    blocks: list[Block] = []
    baseline = gap.get("baseline")
    if isinstance(baseline, Mapping) and baseline:
        blocks.append(Block("paragraph", _baseline_paragraph(baseline)))
    else:
        blocks.append(Block("paragraph", "No baseline of this lab was available for this model, node count "
                                         "and engine version, so nothing was compared."))
    candidates = [c for c in gap.get("candidates") or [] if isinstance(c, Mapping)]
    excluded = [e for e in gap.get("excluded") or [] if isinstance(e, Mapping)]
    lab_s = stage_lab_s if stage_lab_s is not None else as_number(gap.get("lab_time_s"))
    if not candidates:
        text = "Your configuration differs from the baseline in no field we may change"
        text += f", so the stage spent {fig.seconds(lab_s)} of lab time." if lab_s is not None else "."
        blocks.append(Block("paragraph", text))
    else:
        blocks.append(
            Block(
                "table",
                caption="Every field where the two configurations differ: each is a candidate change.",
                columns=["Setting", "Yours", "The baseline's"],
                rows=[[str(c.get("path", "")), _value(c.get("customer")), _value(c.get("baseline"))]
                      for c in candidates],
                wrap=True,
            )
        )
    if excluded:
        blocks.append(
            Block(
                "paragraph",
                "Left as you set them, being your requirements: "
                + "; ".join(f"{e.get('path')} ({e.get('why')})" for e in excluded)
                + ".",
            )
        )
    steps = [s for s in gap.get("steps") or [] if isinstance(s, Mapping)]
    if steps:
        workloads = workloads_in(*(s.get("rates") or {} for s in steps))
        rows = []
        for i, step in enumerate(steps, start=1):
            rates = step.get("rates") or {}
            rows.append(
                [
                    str(i),
                    "\n".join(str(p) for p in step.get("applied") or []) or "none",
                    *(_rate(rates.get(w)) for w in workloads),
                    fig.seconds_bare(float(step["lab_s"]))
                    if as_number(step.get("lab_s")) is not None
                    else "",
                    str(step.get("verdict") or ""),
                ]
            )
        blocks.append(
            Block(
                "table",
                caption="The restarts that found which differences cost speed: every candidate applied at "
                "once, then the set split (tok/s, 95 % interval in brackets).",
                columns=["Step", "Applied", *workloads, "Lab s", "Verdict"],
                numeric=[True, False, *(True for _ in workloads), True, False],
                rows=rows,
                wrap=True,
            )
        )
    proved = [p for p in gap.get("proved") or [] if isinstance(p, Mapping)]
    if proved:
        blocks.append(
            Block(
                "paragraph",
                "Proved alone with fresh runs, and added to the tuned configuration (each is a finding in "
                "section 2): "
                + "; ".join(f"{p.get('path')}: {_value(p.get('from'))} {fig.ARROW} {_value(p.get('to'))}"
                            for p in proved)
                + ".",
            )
        )
    checked = [c for c in gap.get("checked") or [] if isinstance(c, Mapping)]
    if checked:
        blocks.append(
            Block("paragraph", "Checked, and left as you set them: "
                  + "; ".join(f"{c.get('path')} ({c.get('why')})" for c in checked) + ".")
        )
    context = gap.get("context")
    if isinstance(context, Mapping) and context:
        blocks.append(Block("paragraph", context_sentence(context)))
    restarts, exhaustive = as_number(gap.get("restarts")), as_number(gap.get("exhaustive_restarts"))
    if candidates and restarts is not None:
        text = f"The stage restarted the engine {fig.number(int(restarts))} times"
        if exhaustive is not None:
            text += f", where testing each difference alone would have taken {fig.number(int(exhaustive))}"
        if lab_s is not None:
            text += f"; it spent {fig.minutes(lab_s)} of lab time"
        blocks.append(Block("paragraph", text + "."))
    return StageSection("gap", number, title, True, blocks)


def context_sentence(context: Mapping[str, Any]) -> str:
    """The native context, the one served, and whether it fits, in words."""
    native, target, customer = (as_number(context.get(k)) for k in ("native", "target", "customer"))
    parts = []
    if native is not None:
        parts.append(f"The model's native context is {fig.number(int(native))} tokens")
    if customer is not None:
        parts.append(f"your configuration asks for {fig.number(int(customer))}")
    text = ", ".join(parts) if parts else "Context length"
    if context.get("fits") is True and target is not None:
        text += (f"; {fig.number(int(target))} fits and was proved by the engine starting and serving a "
                 "request of that length")
    elif context.get("fits") is False:
        text += "; it does not fit on these nodes" + (f" ({context['why']})" if context.get("why") else "")
    return text + "."


PART_KIND = {"measured": "measured", "estimate": "estimate"}
# A part measured in one input and taken from a catalog in another says which.
BASIS_KIND = {"catalog bytes at the measured bandwidth": "measured bandwidth, catalog bytes"}


def rest_section(findings: Mapping[str, Any], number: str) -> StageSection:
    """Where the rest goes: the measured step split into parts, per workload."""
    title = "Where the rest goes"
    explain = (findings.get("measurement") or {}).get("explain")
    if not present(explain):
        return StageSection("rest", number, title, False, [Block("paragraph", NOT_RUN)])
    blocks: list[Block] = []
    whose = "with our changes" if explain.get("configuration") == "tuned" else "of your configuration"
    for workload in workloads_in_explain(explain):
        entry = explain[workload]
        blocks.append(Block("heading", workload.capitalize()))
        blocks.append(Block("paragraph", rest_sentence(workload, entry, whose)))
        rows = rest_rows(entry)
        if rows:
            blocks.append(
                Block(
                    "table",
                    caption=f"One decode step {whose} on {workload}, in milliseconds of lab time, by part.",
                    columns=["Part", "ms", "Share", "", "How it is known"],
                    numeric=[False, True, True, False, False],
                    rows=rows,
                    wrap=True,
                )
            )
        for note in entry.get("notes") or []:
            blocks.append(Block("paragraph", str(note)))
    bandwidth = bandwidth_paragraph(explain)
    if bandwidth:
        blocks.append(Block("paragraph", bandwidth))
    if explain.get("no_spec_source"):
        source = explain["no_spec_source"]
        blocks.append(Block("paragraph", f"The step without speculation is from {source}."))
    return StageSection("rest", number, title, True, blocks)


def _peak(explain: Mapping[str, Any]) -> float | None:
    """The specified peak the weights' part names (the hardware catalog's), if any."""
    for workload in workloads_in_explain(explain):
        for part in explain[workload].get("parts") or []:
            if isinstance(part, Mapping) and part.get("part") == "weights_read":
                peak = as_number((part.get("inputs") or {}).get("peak_gbs"))
                if peak is not None:
                    return peak
    return None


def bandwidth_paragraph(explain: Mapping[str, Any]) -> str:
    """Where the weights' bandwidth comes from when preflight measured it: the probe's
    figure, nodes and repeats, beside the specified peak. Without a measurement the split's
    own note says the read is at the peak, and why; nothing is added here."""
    bw = explain.get("memory_bandwidth")
    if not isinstance(bw, Mapping):
        return ""
    peak = _peak(explain)
    median = as_number(bw.get("median_gbs"))
    nodes = bw.get("nodes") if isinstance(bw.get("nodes"), Mapping) else {}
    if bw.get("unavailable") or median is None or not nodes:
        return ""
    repeats = as_number(bw.get("repeats"))
    count = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    text = (f"The weights' read is at the memory bandwidth measured on this lab before any engine started: "
            f"{median:.0f} GB/s, the median over {count} of each node's median of "
            + (f"{int(repeats)} " if repeats is not None else "")
            + "streaming reads of a GPU buffer (our node agent's memory bandwidth probe")
    low = as_number(bw.get("min_gbs"))
    if low is not None and len(nodes) > 1:
        text += f"; the slowest node reached {low:.0f} GB/s"
    text += ")"
    if peak is not None:
        text += (f": reached {median:.0f} GB/s of the {fig.number(peak)} specified "
                 f"({fig.percent(round(median / peak, 3))}). "
                 "The hardware's bound stays on the specified peak")
    text += (". The bytes a token reads are the catalog's; every repeat is listed in the appendix of raw "
             "per-run samples.")
    failed = bw.get("failed")
    if isinstance(failed, Mapping) and failed:
        text += f" {len(failed)} node{'s' if len(failed) != 1 else ''} gave no figure: " + "; ".join(
            f"{name}: {why}" for name, why in sorted(failed.items())) + "."
    return text


def workloads_in_explain(explain: Mapping[str, Any]) -> list[str]:
    return [w for w in workloads_in({k: {"mean_tps": 0} for k, v in explain.items()
                                     if isinstance(v, Mapping) and "parts" in v})]


def _ms(value: float) -> str:
    """Milliseconds of a step's part, always to 0.1 ms (the parts must add up as printed)."""
    return f"{value:.1f}".replace("-", fig.MINUS) + " ms"


def printed_parts(entry: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], float]]:
    """Each part with the milliseconds printed for it, to 0.1 ms; the measured remainder
    takes what rounding leaves, so the printed parts add up to the printed step."""
    parts = [p for p in entry.get("parts") or []
             if isinstance(p, Mapping) and as_number(p.get("ms")) is not None]
    step = round(float(entry.get("step_ms") or 0.0), 1)
    shown = [round(float(p["ms"]), 1) for p in parts]
    rest = next((i for i, p in enumerate(parts) if p.get("part") == "communication_and_overhead"), None)
    if rest is not None:
        shown[rest] = round(step - sum(v for i, v in enumerate(shown) if i != rest), 1)
    return list(zip(parts, shown, strict=True))


def rest_rows(entry: Mapping[str, Any]) -> list[list[str]]:
    step = round(float(entry.get("step_ms") or 0.0), 1)
    rows = [
        [str(p.get("label") or p.get("part")), _ms(ms), fig.percent(ms / step) if step else "",
         BASIS_KIND.get(str(p.get("basis")))
         or PART_KIND.get(str(p.get("kind")), str(p.get("kind") or "")), str(p.get("how") or "")]
        for p, ms in printed_parts(entry)
    ]
    if rows:
        rows.append(["The step, measured", _ms(step), "100 %", "measured",
                     _tokens_words(entry)])
    return rows


def _tokens_words(entry: Mapping[str, Any]) -> str:
    tokens = as_number(entry.get("tokens_per_step"))
    tps = as_number(entry.get("measured_tps"))
    text = f"the delivered mean, {fig.tps(tps)} tok/s" if tps is not None else "the delivered mean"
    if tokens is not None and tokens > 1:
        text += f", times the {tokens:.2f} tokens a step emits (the engine's acceptance counters)"
    return text


def rest_sentence(workload: str, entry: Mapping[str, Any], whose: str) -> str:
    """The distances to the bound and the baseline, and the largest part, in one sentence."""
    tps = as_number(entry.get("measured_tps"))
    text = f"On {workload}, {whose}, one stream receives {fig.tps(tps)} tok/s" if tps is not None else \
        f"On {workload}"
    bound = entry.get("to_bound")
    if isinstance(bound, Mapping) and as_number(bound.get("share")) is not None:
        text += (f": {fig.percent(float(bound['share']))} of what this hardware allows "
                 f"({fig.tps(float(bound['other_tps']))} tok/s)")
    baseline = entry.get("to_baseline")
    if isinstance(baseline, Mapping) and as_number(baseline.get("share")) is not None:
        text += (f", and {fig.percent(float(baseline['share']))} of the lab's baseline "
                 f"({fig.tps(float(baseline['other_tps']))} tok/s)")
    text += "."
    parts = printed_parts(entry)
    if parts:
        largest = max(parts, key=lambda item: item[1])
        step = round(float(entry.get("step_ms") or 0.0), 1)
        text += (
            f" Of each {_ms(step)} step, the largest part is {str(largest[0].get('label', '')).lower()}: "
            f"{_ms(largest[1])} ({BASIS_KIND.get(str(largest[0].get('basis'))) or largest[0].get('kind')})."
        )
    return text


def summary_changes(rows: Sequence[Sequence[str]]) -> list[str]:
    """The summary's list of changes, one `setting: yours → ours` line each."""
    return [f"{path}: {before} {fig.ARROW} {after}" + (f" (finding {number})" if number else "")
            for path, before, after, number in rows]
