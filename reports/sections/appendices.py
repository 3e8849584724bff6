"""The report's appendices: how the figures were obtained, with this job's own protocol
parameters (A), and every measured run (B), from `findings.measurement`.

A run is the findings schema's `run`: 0-based `index` and `prompt_index`, `tokens`
(delivered), `usage_completion_tokens`, `ttft_s`, `decode_tps`, `e2e_tps`, and `abandoned`
or `error` for a run without a rate; `{workload}.outliers` and `{workload}.ttft.outliers`
are positions among the runs that have a rate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reports import figures as fig
from reports.sections.configurations import configuration_label, measurement_after
from reports.structure import Block, Row, StageSection, as_number, value_text, workloads_in


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
    after = measurement_after(findings)
    blocks: list[Block] = []
    any_outlier = False
    failures: list[tuple[str, Mapping[str, Any]]] = []
    for workload in workloads_in(measurement, after):
        columns: list[tuple[str, list[Mapping[str, Any]], set[int], set[int]]] = []
        for before, section in ((True, measurement), (False, after)):
            block = section.get(workload) if isinstance(section, Mapping) else None
            runs = [r for r in (block or {}).get("runs") or [] if isinstance(r, Mapping)]
            if isinstance(block, Mapping) and runs:
                label = configuration_label(findings, before, section, block)
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
