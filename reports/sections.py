"""The report's measurement sections and appendices, each built from its own part of
findings.json: cold start, FP4 correctness, speculative decoding, delivered throughput,
the methodology and the raw per-run samples.

A part that is missing or null becomes a section that says it was not run; nothing is
filled in. Plots come from `reports.plots` and are numbered in order of appearance.
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
    Row,
    StageSection,
    as_interval,
    as_number,
    cause_descriptions,
    describe_cause,
    humanize,
    present,
    setting_label,
    value_text,
    workloads_in,
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


def fp4_section(fp4: Any, number: str) -> StageSection:
    title = "FP4 correctness"
    if not present(fp4):
        return StageSection("fp4", number, title, False, [Block("paragraph", NOT_RUN)])
    blocks: list[Block] = []
    rates = fp4.get("canary_pass_rate") or {}
    text = f"With your configuration the FP4 check found the output {fp4.get('verdict', 'unchecked')}"
    if fp4.get("backend_before"):
        text += f"; the engine dispatched the {fp4['backend_before']} backend"
    if as_number(rates.get("before")) is not None:
        total = f" of {fp4['canaries']}" if fp4.get("canaries") else ""
        text += f", and {fig.percent(rates['before'])}{total} canary prompts were answered correctly"
    text += "."
    if fp4.get("backend_after"):
        # The verdict after the change is the FP4 pipeline's; without one, the pass rate alone.
        verdict_after = fp4.get("verdict_after")
        if not verdict_after and as_number(rates.get("after")) is not None:
            total = f" of {fp4['canaries']}" if fp4.get("canaries") else ""
            text += (
                f" With the {fp4['backend_after']} backend, {fig.percent(rates['after'])}{total} canary "
                "prompts were answered correctly"
            )
        else:
            text += f" With the {fp4['backend_after']} backend the output is {verdict_after or 'unchecked'}"
            if as_number(rates.get("after")) is not None:
                text += f" ({fig.percent(rates['after'])} of canaries)"
        text += "."
    blocks.append(Block("paragraph", text))
    backends = [b for b in fp4.get("backends") or [] if isinstance(b, Mapping)]
    if backends:
        rows = []
        for b in backends:
            rows.append(
                [
                    str(b.get("backend", "")),
                    str(b.get("dispatch", "")),
                    fig.percent(float(b["canary_pass_rate"]))
                    if as_number(b.get("canary_pass_rate")) is not None
                    else "",
                    fig.number(float(b["perplexity"])) if as_number(b.get("perplexity")) is not None else "",
                    fig.number(float(b["probe_max_rel_error"]))
                    if as_number(b.get("probe_max_rel_error")) is not None
                    else "",
                    fig.tps(float(b["decode_tps_code"]))
                    if as_number(b.get("decode_tps_code")) is not None
                    else "",
                    str(b.get("verdict", "")),
                ]
            )
        blocks.append(
            Block(
                "table",
                caption="Every backend through all four checks: dispatch table, canaries, prompt "
                "perplexity of a reference passage, and one NVFP4 GEMM against a reference "
                "dequantize-then-multiply.",
                columns=[
                    "Backend",
                    "Dispatch table",
                    "Canaries",
                    "Perplexity",
                    "Probe error",
                    "Code tok/s",
                    "Verdict",
                ],
                numeric=[False, False, True, True, True, True, False],
                rows=rows,
            )
        )
        chosen = next((b for b in backends if b.get("backend") == fp4.get("backend_after")), None)
        if chosen and as_number(chosen.get("decode_tps_code")) is not None:
            costs = []
            for b in backends:
                if (
                    b is chosen
                    or b.get("verdict") != "correct"
                    or as_number(b.get("decode_tps_code")) is None
                ):
                    continue
                loss = 1 - float(b["decode_tps_code"]) / float(chosen["decode_tps_code"])
                costs.append(
                    f"{b['backend']} would also be correct but {fig.percent(loss)} slower on code "
                    f"({fig.tps(float(b['decode_tps_code']))} tok/s)"
                )
            if costs:
                blocks.append(
                    Block(
                        "paragraph",
                        f"{fp4['backend_after']} is the fastest correct backend; " + "; ".join(costs) + ".",
                    )
                )
    return StageSection("fp4", number, title, True, blocks)


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


def _measurement_after(findings: Mapping[str, Any]) -> Mapping[str, Any]:
    """The recommended configuration's measurement: `measurement.after`, else `speculative.best`."""
    measured_after = (findings.get("measurement") or {}).get("after")
    if present(measured_after):
        return measured_after
    return (findings.get("speculative") or {}).get("best") or {}


def _config_label(
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


def throughput_section(findings: Mapping[str, Any], figures: FigureCounter, number: str) -> StageSection:
    title = "Delivered throughput"
    measurement = findings.get("measurement")
    if not present(measurement):
        return StageSection("throughput", number, title, False, [Block("paragraph", NOT_RUN)])
    blocks: list[Block] = []
    after = _measurement_after(findings)
    workloads = workloads_in(measurement, after)
    rows = []
    for workload in workloads:
        for before, section in ((True, measurement), (False, after)):
            block = section.get(workload)
            if not isinstance(block, Mapping) or as_number(block.get("mean_tps")) is None:
                continue
            ci = as_interval(block.get("ci95"))
            lo, hi = as_number(block.get("min_tps")), as_number(block.get("max_tps"))
            rows.append(
                [
                    workload,
                    _config_label(findings, before, section, block),
                    str(block.get("n", "")),
                    fig.tps(float(block["mean_tps"])),
                    fig.interval(ci, fig.tps) if ci else "",
                    fig.tps(float(block["median_tps"]))
                    if as_number(block.get("median_tps")) is not None
                    else "",
                    f"{fig.tps(lo)}{fig.DASH}{fig.tps(hi)}" if lo is not None and hi is not None else "",
                    fig.milliseconds(float(block["ttft_s"]))
                    if as_number(block.get("ttft_s")) is not None
                    else "",
                ]
            )
    blocks.append(
        Block(
            "paragraph",
            "Delivered tokens per second of a single stream, counted at the client by re-tokenizing the "
            "text it received (appendix A). The mean of per-run decode rates is given with its Student-t 95 "
            "% interval.",
        )
    )
    if rows:
        blocks.append(
            Block(
                "table",
                caption="Single-stream decode, delivered at the client.",
                columns=[
                    "Workload",
                    "Configuration",
                    "n",
                    "Mean tok/s",
                    "95 % interval",
                    "Median",
                    "Range",
                    "TTFT",
                ],
                numeric=[False, False, True, True, True, True, True, True],
                rows=rows,
            )
        )
    panels: dict[str, list[plots.RunSeries]] = {}
    for workload in workloads:
        series = []
        for before, section in ((True, measurement), (False, after)):
            block = section.get(workload)
            if not isinstance(block, Mapping):
                continue
            runs = [r for r in block.get("runs") or [] if as_number(r.get("decode_tps")) is not None]
            if not runs or as_number(block.get("mean_tps")) is None:
                continue
            series.append(
                plots.RunSeries(
                    label=_config_label(findings, before, section, block),
                    rates=[float(r["decode_tps"]) for r in runs],
                    mean=float(block["mean_tps"]),
                    ci95=as_interval(block.get("ci95")),
                )
            )
        if series:
            panels[workload] = series
    if panels:
        compared = any(len(series) > 1 for series in panels.values())
        plot = figures.plot(
            plots.decode_runs,
            "Decode rate of every measured run, per workload, for your configuration"
            + (" and the recommended one" if compared else "")
            + ". The line is the mean, the band and the bar at the right its 95 % interval.",
            panels=panels,
        )
        if plot:
            blocks.append(plot)
    claimed = measurement.get("server_claimed_tps") or {}
    if isinstance(claimed, Mapping) and claimed:
        claim_rows = []
        source_names = {"log": "engine log", "metrics": "/metrics"}
        sources = measurement.get("server_claim_source") or {}
        for workload in workloads:
            delivered = as_number((measurement.get(workload) or {}).get("mean_tps"))
            server = as_number(claimed.get(workload))
            if server is None:
                continue
            source = sources.get(workload) if isinstance(sources, Mapping) else None
            claim_rows.append(
                [
                    workload,
                    fig.tps(delivered) if delivered is not None else "",
                    fig.tps(server),
                    source_names.get(str(source), str(source or "")),
                    fig.ratio(server / delivered) if delivered else "",
                ]
            )
        if claim_rows:
            blocks.append(Block("heading", "What the server says"))
            blocks.append(
                Block(
                    "paragraph",
                    "The engine's log and its /metrics counters report their own generation throughput. We "
                    "measured it over the same requests and report it beside the delivered rate, never "
                    "instead of it.",
                )
            )
            blocks.append(
                Block(
                    "table",
                    caption="Your configuration: delivered at the client against the server's own figure.",
                    columns=CLAIM_COLUMNS,
                    numeric=[False, True, True, False, True],
                    rows=claim_rows,
                )
            )
            blocks.extend(_reconciliation_blocks(measurement, workloads))
    return StageSection("throughput", number, title, True, blocks)


CLAIM_COLUMNS = ["Workload", "Delivered tok/s", "Server claims tok/s", "Read from", "Claimed / delivered"]
CAUSE_EVIDENCE_LABELS = {
    "accepted": "Draft tokens accepted",
    "drafted": "Draft tokens proposed",
    "rejected_drafts": "Draft tokens rejected",
    "delivered_tokens": "Tokens delivered",
    "reasoning_tokens": "Reasoning tokens",
    "usage_above_retokenized": "Usage above re-tokenized count",
    "content_chunks": "Stream chunks",
    "chunks_per_token": "Chunks per token",
}


def _cause_records(measurement: Mapping[str, Any], workloads: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`reconciliation_detail` as {workload: {cause code: record}} (the measure stage writes a
    list of tested causes per workload)."""
    details = measurement.get("reconciliation_detail") or {}
    out: dict[str, dict[str, Any]] = {}
    for w in workloads:
        records = details.get(w) if isinstance(details, Mapping) else None
        out[w] = {str(r["code"]): r for r in records or [] if isinstance(r, Mapping) and r.get("code")}
    return out


def _ratio_cell(value: Any) -> str:
    number = as_number(value)
    return fig.ratio(number) if number is not None else ""


def _reconciliation_blocks(measurement: Mapping[str, Any], workloads: Sequence[str]) -> list[Block]:
    """Each cause that explains the claim, with the figures that decided it per workload,
    then the causes that were tested and ruled out."""
    causes = [str(c) for c in measurement.get("reconciliation") or []]
    records = _cause_records(measurement, workloads)
    described = cause_descriptions(measurement)
    blocks = []
    if not causes:
        blocks.append(Block("paragraph", "No known cause was found to explain the difference."))
    for cause in causes:
        blocks.append(Block("paragraph", f"{cause}: {describe_cause(described, cause)}"))
        shown = [w for w in workloads if (records[w].get(cause) or {}).get("explains_ratio")]
        if not shown:
            continue
        tested = [records[w][cause] for w in shown]
        rows = [
            ["Server count / delivered, observed", *(_ratio_cell(r.get("observed_ratio")) for r in tested)],
            ["Server count / delivered, predicted", *(_ratio_cell(r.get("predicted_ratio")) for r in tested)],
        ]
        evidence = [r.get("evidence") or {} for r in tested]
        keys = list(dict.fromkeys(k for e in evidence for k, v in e.items() if as_number(v) is not None))
        for key in keys:
            values = [as_number(e.get(key)) for e in evidence]
            cells = ["" if v is None else fig.number(v) for v in values]
            rows.append([CAUSE_EVIDENCE_LABELS.get(key) or humanize(key), *cells])
        sources = {str(e["source"]) for e in evidence if e.get("source")}
        named = {"metrics": "the server's /metrics counters", "log": "the engine's log lines"}
        counted = f", counted from {named.get(sources.pop(), 'the server')}" if len(sources) == 1 else ""
        blocks.append(
            Block(
                "table",
                caption=f"How {cause} accounts for the difference, per workload{counted}.",
                columns=["", *shown],
                numeric=[False, *(True for _ in shown)],
                rows=rows,
            )
        )
    ruled_out = []
    for code in dict.fromkeys(c for w in workloads for c in records[w]):
        if code in causes:
            continue
        verdicts = []
        for w in workloads:
            record = records[w].get(code)
            if record is None:
                continue
            note = (record.get("evidence") or {}).get("note")
            if record.get("present"):
                verdict = "present, but does not explain the ratio"
            elif note and "not testable" in str(note):
                verdict = "not testable here"
            else:
                verdict = "not present"
            verdicts.append((w, verdict))
        if len({v for _, v in verdicts}) == 1:
            ruled_out.append(f"{code} ({verdicts[0][1]})")
        elif verdicts:
            ruled_out.append(f"{code} (" + "; ".join(f"{w}: {v}" for w, v in verdicts) + ")")
    if ruled_out:
        blocks.append(Block("paragraph", "Also tested: " + ", ".join(ruled_out) + "."))
    return blocks


# --------------------------------------------------------------------------- appendices


def methodology_appendix(findings: Mapping[str, Any], number: str) -> StageSection:
    """How the figures were obtained, with this job's own protocol parameters."""
    measurement = findings.get("measurement") or {}
    protocol = measurement.get("protocol") or {}
    blocks: list[Block] = [Block("heading", "Measurement protocol")]
    ns = sorted({str(v.get("n")) for v in measurement.values() if isinstance(v, Mapping) and v.get("n")})
    text = (
        "Two fixed, versioned prompt sets, code and prose, served one request at a time with streaming, "
        "temperature 0, a fixed output length and end-of-sequence ignored, so that every run asks for the "
        "same amount of work."
    )
    blocks.append(Block("paragraph", text))
    pairs = []
    if protocol:
        for key, label in (
            ("warmup_discarded", "Warm-up runs, discarded"),
            ("n", "Measured runs per workload"),
            ("max_tokens", "Output tokens per run"),
        ):
            if key in protocol:
                pairs.append(Row(label, value_text(key, protocol[key])))
        requests = protocol.get("request") or {}
        sets = protocol.get("workloads") or {}
        for key, label in (("temperature", "Temperature"), ("ignore_eos", "End of sequence ignored")):
            values = {value_text(key, r[key]) for r in requests.values() if key in (r or {})}
            if len(values) == 1:
                pairs.append(Row(label, values.pop()))
        versions = [
            f"{name} v{w['version']} (sha256 {str(w.get('sha256', ''))[:12]})"
            for name, w in sets.items()
            if isinstance(w, Mapping) and "version" in w
        ]
        if versions:
            pairs.append(Row("Prompt sets", ", ".join(versions)))
    elif ns:
        pairs.append(Row("Measured runs per workload", ", ".join(ns)))
    if pairs:
        blocks.append(Block("rows", pairs=pairs, compact=True))
    blocks.append(Block("heading", "What counts as delivered"))
    blocks.append(
        Block(
            "paragraph",
            "Delivered tokens are the tokens of the text the client received, counted by re-tokenizing the "
            "whole joined text once with the model's own tokenizer. The server's usage count is recorded "
            "and compared; stream chunks are never counted as tokens, because with speculative decoding one "
            "chunk carries several. Per run: time to first token is first content byte minus request sent; "
            "decode rate is (N \u2212 1) divided by the time from first to last byte.",
        )
    )
    blocks.append(Block("heading", "Statistics"))
    blocks.append(
        Block(
            "paragraph",
            "Each summary is the mean of per-run decode rates with a Student-t 95 % interval "
            "(n \u2212 1 degrees of freedom), with "
            "median, minimum and maximum; outliers are flagged by median absolute "
            "deviation, never dropped. Two configurations are called different only when Welch's test says "
            "so at 5 %, and an improvement counts only when the 95 % interval of the change excludes zero.",
        )
    )
    blocks.append(Block("heading", "The server's claim and its reconciliation"))
    claimed = measurement.get("server_claimed_tps") or {}
    if claimed:
        text = (
            "The server's figure is read from engine log lines whose windows fall wholly inside a request, "
            "and from /metrics counter deltas over the exact request interval."
        )
        claims = [(measurement.get(w) or {}).get("server_claim") or {} for w in workloads_in(measurement)]
        log_claims = [c.get("log") for c in claims]
        windows = [as_number(c.get("windows")) if isinstance(c, Mapping) else None for c in log_claims]
        if any(v is not None for v in windows):
            text += f" {fig.number(sum(v for v in windows if v is not None))} log windows qualified."
        text += (
            " When the server claims more than the client received, each known cause is tested and the ones "
            "that explain the ratio are named: "
        )
        causes = [str(c) for c in measurement.get("reconciliation") or []]
        text += ", ".join(causes) + "." if causes else "none did."
        blocks.append(Block("paragraph", text))
    else:
        blocks.append(Block("paragraph", "The server's own figure was not measured in this engagement."))
    blocks.append(Block("heading", "Cold starts, FP4 and speculative decoding"))
    blocks.append(
        Block(
            "paragraph",
            "A cold start stops the engine on every node and drops the page cache before launch; a restart "
            "without that is a warm start and is labelled as one. Stalls are attributed by their telemetry "
            "signature, and each fix is proven with a new true cold start. FP4 output is judged by four "
            "checks together (dispatch table, canary prompts, prompt likelihood, a kernel probe), because "
            "garbage from a mis-dispatched kernel is fluent and raises no error. Speculative settings are "
            "screened with short runs and the promising ones confirmed with the full protocol.",
        )
    )
    return StageSection("methodology", number, "Methodology", True, blocks)


def _run_cells(run: Mapping[str, Any] | None, flags: tuple[bool, bool]) -> list[str]:
    """Delivered and usage tokens, TTFT, decode and end-to-end rates of one run (schema `run`);
    `flags`: whether its TTFT and its decode rate are flagged as outliers."""
    if run is None:
        return ["", "", "", "", ""]
    delivered = fig.number(run["tokens"]) if as_number(run.get("tokens")) is not None else ""
    ttft, decode = as_number(run.get("ttft_s")), as_number(run.get("decode_tps"))
    if _unrated(run):
        return [delivered, "", "abandoned" if run.get("abandoned") else "failed", "", ""]
    mark = [" *" if flagged else "" for flagged in flags]
    return [
        delivered,
        fig.number(run["usage_completion_tokens"])
        if as_number(run.get("usage_completion_tokens")) is not None
        else "",
        (fig.milliseconds(ttft) + mark[0]) if ttft is not None else "",
        (fig.tps(decode) + mark[1]) if decode is not None else "",
        fig.tps(float(run["e2e_tps"])) if as_number(run.get("e2e_tps")) is not None else "",
    ]


def _unrated(run: Mapping[str, Any]) -> bool:
    """An abandoned or failed run without a decode rate: left out of every summary."""
    return as_number(run.get("decode_tps")) is None and bool(run.get("abandoned") or run.get("error"))


def _flagged_runs(outliers: Any, runs: Sequence[Mapping[str, Any]]) -> set[int]:
    """Positions in `runs` of the runs flagged as outliers. The measure stage lists them as
    positions among the runs that have a decode rate (every summary is over those), so map
    them back."""
    rated = [i for i, r in enumerate(runs) if as_number(r.get("decode_tps")) is not None]
    if not isinstance(outliers, Sequence):
        return set()
    return {rated[k] for k in outliers if isinstance(k, int) and 0 <= k < len(rated)}


def _one_based(value: Any) -> str:
    return str(value + 1) if isinstance(value, int) and not isinstance(value, bool) else ""


def raw_runs_appendix(findings: Mapping[str, Any], number: str) -> StageSection:
    """Every measured run, per workload: your configuration beside the recommended one."""
    measurement = findings.get("measurement") or {}
    after = _measurement_after(findings)
    blocks: list[Block] = []
    any_outlier = False
    failures: list[tuple[str, Mapping[str, Any]]] = []
    for workload in workloads_in(measurement, after):
        columns: list[tuple[str, list[Mapping[str, Any]], set[int], set[int]]] = []
        for before, section in ((True, measurement), (False, after)):
            block = section.get(workload) if isinstance(section, Mapping) else None
            runs = [r for r in (block or {}).get("runs") or [] if isinstance(r, Mapping)]
            if isinstance(block, Mapping) and runs:
                label = _config_label(findings, before, section, block)
                slow = _flagged_runs((block.get("ttft") or {}).get("outliers"), runs)
                odd = _flagged_runs(block.get("outliers"), runs)
                columns.append((label[0].upper() + label[1:], runs, slow, odd))
        if not columns:
            continue
        any_outlier = any_outlier or any(ttft or decode for _, _, ttft, decode in columns)
        failures += [(workload, r) for c in columns for r in c[1] if _unrated(r)]
        rows = []
        for idx in range(max(len(c[1]) for c in columns)):
            first = columns[0][1][idx] if idx < len(columns[0][1]) else {}
            row = [_one_based(first.get("index", idx)), _one_based(first.get("prompt_index"))]
            for _, runs, ttft, decode in columns:
                row += _run_cells(runs[idx] if idx < len(runs) else None, (idx in ttft, idx in decode))
            rows.append(row)
        heads = ["Delivered", "Usage", "TTFT", "Decode", "E2E"]
        blocks.append(
            Block(
                "table",
                caption=f"{workload.capitalize()} workload.",
                columns=["Run", "Prompt", *(heads * len(columns))],
                numeric=[True] * (2 + 5 * len(columns)),
                rows=rows,
                compact=True,
                groups=[("", 2), *((c[0], 5) for c in columns)],
            )
        )
    if not blocks:
        blocks.append(Block("paragraph", "No per-run samples were recorded in this engagement."))
    else:
        note = (
            "Prompt: its number in the workload's versioned prompt set; Delivered: tokens the client "
            "received, re-tokenized; Usage: the server's completion_tokens; TTFT: time to first token; "
            "Decode and E2E (end-to-end): tok/s."
        )
        if any_outlier:
            note += (
                " * marks a figure flagged as an outlier by median absolute deviation; it is kept in every "
                "summary."
            )
        if failures:
            note += " An abandoned or failed run has no rates and is left out of every summary."
        blocks.insert(0, Block("paragraph", note))
    notes = [
        f"{workload} run {_one_based(run.get('index'))}: "
        + (str(run["error"]) if run.get("error") else "abandoned: no complete answer within the time limit")
        for workload, run in failures
    ]
    notes += [str(w) for w in measurement.get("warnings") or []]
    if notes:
        blocks.append(Block("heading", "Notes from the measurement"))
        blocks.extend(Block("paragraph", note[0].upper() + note[1:]) for note in notes)
    return StageSection("raw-runs", number, "Raw per-run samples", True, blocks)
