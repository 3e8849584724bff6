"""Section 3.4, delivered throughput, from `findings.measurement`: single-stream decode
as the client received it, every run, the server's own figure beside it, and the measure
stage's reconciliation of the two.

`measurement` as the measure stage writes it (`diagnostic/pipelines/measure.py`; the
findings schema's `workload_measurement` and `run`): `{workload}` summaries with their
`runs[]`; `server_claimed_tps` and `server_claim_source` per workload; `reconciliation`,
the causes that explain the claim; `reconciliation_detail`: {workload: [tested cause:
{code, present, explains_ratio, observed_ratio, predicted_ratio, evidence}]};
`cause_descriptions`: {cause code: plain words}, printed as given. `measurement.tuned`
has the same shape for the tuned configuration measured by the same protocol, with
`difference` {workload: {diff, ci95, p, different}} and `roofline` (each rate's share of
the hardware's bound).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lab.engines.evidence import hidden_evidence
from reports import figures as fig
from reports import plots
from reports.sections.configurations import (
    after_of,
    configuration_label,
    measurement_after,
    roofline_fraction,
)
from reports.structure import (
    NOT_RUN,
    Block,
    FigureCounter,
    StageSection,
    as_interval,
    as_number,
    cause_descriptions,
    describe_cause,
    humanize,
    p_value,
    present,
    workloads_in,
)


def throughput_section(findings: Mapping[str, Any], figures: FigureCounter, number: str) -> StageSection:
    title = "Delivered throughput"
    measurement = findings.get("measurement")
    if not present(measurement):
        return StageSection("throughput", number, title, False, [Block("paragraph", NOT_RUN)])
    after = measurement_after(findings)
    workloads = workloads_in(measurement, after)
    rows = _rate_rows(findings, measurement, after, workloads)
    blocks = [Block("paragraph", _rates_text(measurement, rows, workloads))]
    if rows:
        blocks.append(_rate_table(rows))
    plot = _decode_plot(findings, figures, measurement, after, workloads)
    if plot:
        blocks.append(plot)
    blocks.extend(_claim_blocks(measurement, workloads))
    blocks.extend(_hidden_blocks(findings))
    return StageSection("throughput", number, title, True, blocks)


def _rate_rows(
    findings: Mapping[str, Any], measurement: Mapping[str, Any], after: Mapping[str, Any],
    workloads: list[str],
) -> list[list[str]]:
    """The rates table's rows: each workload, before and after, with its interval and bound."""
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
                    configuration_label(findings, before, section, block),
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
                    _bound_cell(
                        findings, before, workload, section is measurement or after_of(findings).measured
                    ),
                ]
            )
    return rows


def _rates_text(measurement: Mapping[str, Any], rows: list[list[str]], workloads: list[str]) -> str:
    text = (
        "Delivered tokens per second of a single stream, counted at the client by re-tokenizing the "
        "text it received (appendix A). The mean of per-run decode rates is given with its Student-t 95 "
        "% interval."
    )
    if any(row[-1] for row in rows):
        text += (
            " \u201cOf the bound\u201d is the share of what this hardware allows for that configuration: "
            "memory bandwidth over the weights read per token, times the tokens each speculative step yields "
            "(appendix A)."
        )
    differences = measurement.get("difference") or {}
    said = []
    for workload in workloads:
        d = differences.get(workload) if isinstance(differences, Mapping) else None
        if isinstance(d, Mapping) and as_number(d.get("diff")) is not None:
            ci = as_interval(d.get("ci95"))
            p = as_number(d.get("p"))
            different = d.get("different")
            verdict = (
                "not tested"
                if not isinstance(different, bool)
                else ("different" if different else "within noise")
            )
            said.append(
                f"{workload} {fig.signed(float(d['diff']), fig.tps)} tok/s"
                + (f" [{fig.signed(ci[0], fig.tps)}, {fig.signed(ci[1], fig.tps)}]" if ci else "")
                + (f", {p_value(p)}" if p is not None else "")
                + f", {verdict}"
            )
    if said:
        text += " With our changes against yours (Welch's test, 5 %): " + "; ".join(said) + "."
    return text


def _rate_table(rows: list[list[str]]) -> Block:
    return Block(
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
            "Of the bound",
        ],
        numeric=[False, False, True, True, True, True, True, True, True],
        rows=rows,
    )


def _decode_plot(
    findings: Mapping[str, Any], figures: FigureCounter, measurement: Mapping[str, Any],
    after: Mapping[str, Any], workloads: list[str],
) -> Block | None:
    """Every measured run's decode rate, per workload, before and after."""
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
                    label=configuration_label(findings, before, section, block),
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
            + (" and with our changes" if compared else "")
            + ". The line is the mean, the band and the bar at the right its 95 % interval.",
            panels=panels,
        )
        return plot
    return None


def _claim_blocks(measurement: Mapping[str, Any], workloads: list[str]) -> list[Block]:
    """The server's own throughput figure beside the delivered rate, and their reconciliation."""
    blocks: list[Block] = []
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
    return blocks


def _hidden_blocks(findings: Mapping[str, Any]) -> list[Block]:
    """What the customer's own settings hide of this evidence from them."""
    blocks: list[Block] = []
    hidden = hidden_evidence(findings.get("config") or {})
    if hidden:
        hides = "; ".join(f"{h['setting']} hides {h['hides']}" for h in hidden)
        blocks.append(Block("paragraph", (
            f"Your configuration hides part of this evidence from you: {hides}. We ran it with that "
            "evidence on to measure the figures here; with your settings your own logs and dashboards "
            "show none of it.")))
    return blocks


def _bound_cell(findings: Mapping[str, Any], before: bool, workload: str, measured: bool) -> str:
    fraction = roofline_fraction(findings, before, workload) if measured else None
    return fig.percent(fraction) if fraction is not None else ""


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
    # SGLang serves no draft counters: the counts are derived from its accept len / rate.
    "counts_from": "Draft counts from",
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


# A server figure within this fraction of the delivered rate agrees with it (the measure
# stage's tolerance for a cause's predicted ratio, diagnostic.pipelines.measure.claim).
AGREES_WITHIN = 0.05


def _claim_ratios(measurement: Mapping[str, Any], workloads: Sequence[str]) -> dict[str, float]:
    """Server claim / delivered per workload, where both were measured."""
    claimed = measurement.get("server_claimed_tps") or {}
    out: dict[str, float] = {}
    for w in workloads:
        claim = as_number(claimed.get(w)) if isinstance(claimed, Mapping) else None
        delivered = as_number((measurement.get(w) or {}).get("mean_tps"))
        if claim is not None and delivered:
            out[w] = claim / delivered
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
        ratios = _claim_ratios(measurement, workloads)
        if ratios and all(abs(r - 1.0) <= AGREES_WITHIN for r in ratios.values()):
            listed = ", ".join(f"{w} {fig.ratio(r)}" for w, r in ratios.items())
            blocks.append(Block("paragraph", (
                f"The server's figure agrees with what the client received (claimed / delivered: {listed}, "
                f"within {AGREES_WITHIN:.0%}): the engine counts the tokens each step delivers, and these "
                "requests ran one at a time. Read at a higher load, the same figure sums every running "
                "request, which no single user receives.")))
        else:
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
