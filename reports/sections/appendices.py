"""The report's appendices: how the figures were obtained, with this job's own protocol
parameters and the hardware's bound on each rate (methodology); the tuned configuration
with its changes, launch command, file and diff (`findings.tuned`); the lab time of each
stage (`job.stages[].lab_seconds` against `job.lab_time_s`); and every measured run, from
`findings.measurement`. `reports.content` letters them in order, leaving out any with
nothing to show.

A run is the findings schema's `run`: 0-based `index` and `prompt_index`, `tokens`
(delivered), `usage_completion_tokens`, `ttft_s`, `decode_tps`, `e2e_tps`, and `abandoned`
or `error` for a run without a rate; `{workload}.outliers` and `{workload}.ttft.outliers`
are positions among the runs that have a rate. The bound is `measurement.roofline`
{customer|tuned: {workload: {bound_tps, fraction, inputs, formula}}}. The raw samples end
with preflight's memory bandwidth probe, every repeat on every node
(`measurement.explain.memory_bandwidth`: {nodes {name: {gbs, median_gbs}}, repeats,
method}), the figure the step's split reads the weights at.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from lab.config import config_secrets, mask_config, mask_secret, mask_text
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
    blocks.extend(roofline_blocks(findings))
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
    blocks.extend(bandwidth_blocks(findings))
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


def bandwidth_blocks(findings: Mapping[str, Any]) -> list[Block]:
    """Every repeat of preflight's memory bandwidth probe, per node: the samples behind the
    bandwidth the weights' read uses in "Where the rest goes"."""
    explain = (findings.get("measurement") or {}).get("explain")
    bw = explain.get("memory_bandwidth") if isinstance(explain, Mapping) else None
    if not isinstance(bw, Mapping):
        return []
    nodes = bw.get("nodes")
    if not isinstance(nodes, Mapping) or not nodes:
        return []
    samples = {
        str(name): [float(g) for g in entry.get("gbs") or [] if as_number(g) is not None]
        for name, entry in sorted(nodes.items())
        if isinstance(entry, Mapping)
    }
    width = max((len(v) for v in samples.values()), default=0)
    if not width:
        return []
    rows = []
    for name, gbs in samples.items():
        median = as_number((nodes[name] or {}).get("median_gbs"))
        rows.append([name, *(f"{g:.1f}" for g in gbs), *([""] * (width - len(gbs))),
                     f"{median:.1f}" if median is not None else ""])
    text = (
        "Memory bandwidth, measured in preflight before any engine started: each node read a GPU buffer "
        "whole, repeatedly, and each read was timed; GB/s are 10^9 bytes per second. The median of the "
        "nodes' medians is the bandwidth the weights' read uses in the split of the step."
    )
    if bw.get("method"):
        text += f" What was timed: {bw['method']}."
    lab_s = as_number(bw.get("lab_s"))
    if lab_s is not None:
        text += f" The probe took {fig.seconds(lab_s)} of lab time."
    return [
        Block("heading", "Memory bandwidth probe"),
        Block("paragraph", text),
        Block(
            "table",
            caption="GB/s per repeat and node, with each node's median.",
            columns=["Node", *(f"Repeat {i}" for i in range(1, width + 1)), "Median"],
            numeric=[False, *([True] * (width + 1))],
            rows=rows,
            compact=True,
        ),
    ]


STAGE_NAMES = {
    "preflight": "Checks of our lab (preflight)",
    "reproduce": "Your configuration reproduced",
    "triage": "Cold start: triage and proof of each fix",
    "fp4": "FP4 correctness",
    "specdec": "Speculative decoding search",
    "measure": "Delivered throughput, yours and tuned",
    "report": "This report",
}


def _flat_changes(path: str, before: Any, after: Any) -> list[tuple[str, Any, Any]]:
    """A change of a whole block (`speculative`: {...} to {...}) as the settings in it that differ."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        keys = list(dict.fromkeys([*before, *after]))
        return [
            change
            for k in keys
            if before.get(k) != after.get(k)
            for change in _flat_changes(f"{path}.{k}", before.get(k), after.get(k))
        ]
    return [(path, before, after)]


def _setting_value(value: Any) -> str:
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def change_rows(tuned: Mapping[str, Any], finding_numbers: Mapping[str, str]) -> list[list[str]]:
    """[setting, yours, ours, finding] for every setting the tuned configuration changes:
    the one list the summary and this appendix both print."""
    rows = []
    for change in tuned.get("changes") or []:
        if not isinstance(change, Mapping):
            continue
        code = str(change.get("finding") or "")
        for path, before, after in _flat_changes(
            str(change.get("path", "")), change.get("from"), change.get("to")
        ):
            rows.append(
                [path, _setting_value(before), _setting_value(after), finding_numbers.get(code, code)]
            )
    return rows


def summary_change_rows(findings: Mapping[str, Any], finding_numbers: Mapping[str, str]) -> list[list[str]]:
    """The changes as the summary lists them, secrets masked as in the appendix."""
    tuned = findings.get("tuned")
    if not isinstance(tuned, Mapping) or not tuned:
        return []
    return change_rows(_without_secrets(tuned, findings.get("config")), finding_numbers)


def tuned_configuration_appendix(
    findings: Mapping[str, Any], number: str, finding_numbers: Mapping[str, str]
) -> StageSection | None:
    """The tuned configuration: each change with the finding that proved it, the launch
    command, the configuration file and its difference from the customer's (`tuned`).
    `finding_numbers` maps a finding code to its section number(s) in this report."""
    tuned = findings.get("tuned")
    if not isinstance(tuned, Mapping) or not tuned:
        return None
    tuned = _without_secrets(tuned, findings.get("config"))
    blocks: list[Block] = [
        Block(
            "paragraph",
            "Your configuration with every change this report proves, and nothing unproven; section 3.4 "
            "measures it against yours with the same protocol.",
        )
    ]
    rows = change_rows(tuned, finding_numbers)
    if rows:
        blocks.append(
            Block(
                "table",
                caption="The changes, each with the finding that proved it.",
                columns=["Setting", "Yours", "Ours", "Finding"],
                rows=rows,
                wrap=True,
            )
        )
    command = tuned.get("command")
    if command:
        blocks.append(Block("heading", "Launch command"))
        blocks.append(Block("code", str(command).rstrip()))
        rendezvous = finding_numbers.get("load.rendezvous")
        if "NCCL_" in str(command) and rendezvous:
            blocks.append(
                Block(
                    "paragraph",
                    f"The NCCL interface names are our lab's; section {rendezvous} says how to find your "
                    "nodes' own.",
                )
            )
    config = tuned.get("config")
    if isinstance(config, Mapping) and config:
        blocks.append(Block("heading", "Configuration file"))
        blocks.append(
            Block(
                "code",
                yaml.safe_dump(
                    dict(config), sort_keys=False, default_flow_style=False, allow_unicode=True
                ).rstrip(),
                caption="tuned-config.yaml, in the format of the file you submitted.",
            )
        )
    diff = tuned.get("diff")
    if diff:
        lines = []
        for line in str(diff).rstrip().splitlines():
            sign = line[:1] if line[:1] in "+-" and not line.startswith(("+++", "---")) else ""
            lines.append((sign, line))
        blocks.append(Block("heading", "Difference from your file"))
        blocks.append(Block("diff", rows=lines))
    return StageSection("tuned-config", number, "The tuned configuration", True, blocks)


def _without_secrets(tuned: Mapping[str, Any], customer: Any) -> dict[str, Any]:
    """`findings.tuned` with every secret masked. The platform masks them where a
    configuration enters (lab.config, "secrets"), so this changes nothing in a document it
    wrote since; it keeps a document written before from printing a key in the report."""
    clear = config_secrets(tuned["config"]) if isinstance(tuned.get("config"), Mapping) else []
    if isinstance(customer, Mapping):
        clear += config_secrets(customer)

    def masked(text: str) -> str:
        for secret in sorted(set(clear), key=len, reverse=True):
            text = text.replace(secret, mask_secret(secret))
        return mask_text(text)

    out = dict(tuned)
    if isinstance(out.get("config"), Mapping):
        out["config"] = mask_config(out["config"])
    for key in ("command", "diff"):
        if isinstance(out.get(key), str):
            out[key] = masked(out[key])
    out["changes"] = [mask_config(c) if isinstance(c, Mapping) else c for c in out.get("changes") or []]
    return out


def lab_time_appendix(findings: Mapping[str, Any], number: str) -> StageSection | None:
    """The lab time each stage of the day spent, against the day's total (`job.stages`)."""
    job = findings.get("job") or {}
    stages = [
        s
        for s in job.get("stages") or []
        if isinstance(s, Mapping) and as_number(s.get("lab_seconds")) is not None
    ]
    if not stages:
        return None
    spent = sum(float(s["lab_seconds"]) for s in stages)
    total = as_number(job.get("lab_time_s")) or spent
    rows = [
        [
            STAGE_NAMES.get(str(s.get("name")), str(s.get("name"))),
            fig.minutes(float(s["lab_seconds"])),
            fig.seconds(float(s["lab_seconds"])),
            fig.percent(round(float(s["lab_seconds"]) / total, 3)) if total else "",
        ]
        for s in stages
    ]
    rows.append(["The whole day", fig.minutes(total), fig.seconds(total), "100 %" if total else ""])
    blocks = [
        Block(
            "paragraph",
            "Lab time is the time our lab spent on each stage of the day, restarts and waits included.",
        ),
        Block(
            "table",
            columns=["Stage", "Lab time", "", "Share of the day"],
            numeric=[False, True, True, True],
            rows=rows,
        ),
    ]
    if spent < total * 0.98:
        blocks.append(
            Block(
                "paragraph", f"The stages account for {fig.minutes(spent)}; the rest is time between stages."
            )
        )
    return StageSection("lab-time", number, "Lab time by stage", True, blocks)


ROOFLINE_INPUTS = (
    ("tp", "Tensor-parallel group", fig.number),
    ("mem_bw_gbs", "Memory bandwidth per GPU", lambda v: f"{fig.number(v)} GB/s"),
    ("decode_bytes_per_token_gb", "Weights read per token", lambda v: f"{fig.number(v)} GB"),
    ("mean_acceptance_length", "Tokens per step (acceptance length)", lambda v: f"{v:.2f}"),
)


def roofline_blocks(findings: Mapping[str, Any]) -> list[Block]:
    """The hardware's bound on each delivered rate, with its inputs and their sources
    (`measurement.roofline`: {customer|tuned: {workload: {bound_tps, fraction, inputs, formula}}})."""
    roofline = (findings.get("measurement") or {}).get("roofline")
    if not isinstance(roofline, Mapping) or not roofline:
        return []
    entries = [
        (side, workload, entry)
        for side in ("customer", "tuned")
        for workload, entry in (roofline.get(side) or {}).items()
        if isinstance(entry, Mapping) and as_number(entry.get("bound_tps")) is not None
    ]
    if not entries:
        return []
    names = {"customer": "yours", "tuned": "with our changes"}
    keys = [k for k in ROOFLINE_INPUTS if any(k[0] in (e.get("inputs") or {}) for _, _, e in entries)]
    rows = []
    for side, workload, entry in entries:
        inputs = entry.get("inputs") or {}
        fraction = as_number(entry.get("fraction"))
        measured = (
            findings["measurement"] if side == "customer" else findings["measurement"].get("tuned") or {}
        )
        delivered = as_number((measured.get(workload) or {}).get("mean_tps"))
        rows.append(
            [
                workload,
                names[side],
                *(fmt(inputs[key]) if as_number(inputs.get(key)) is not None else "" for key, _, fmt in keys),
                fig.tps(float(entry["bound_tps"])),
                fig.tps(delivered) if delivered is not None else "",
                fig.percent(fraction) if fraction is not None else "",
            ]
        )
    formulas = {str(e.get("formula")) for _, _, e in entries if e.get("formula")}
    text = (
        "Decoding one token at batch 1 reads the active weights once from memory, so memory bandwidth "
        "bounds the rate: the tensor-parallel group reads in parallel, and with speculative decoding each "
        "step yields its acceptance length in tokens. The bound is what this hardware allows; the "
        "delivered rate is shown as a share of it."
    )
    if len(formulas) == 1:
        # The measure stage writes the formula in its input names; it is printed in words.
        formula = formulas.pop()
        for key, label, _ in ROOFLINE_INPUTS:
            words = label.split(" (")[0]
            formula = re.sub(rf"\b{re.escape(key)}\b", words[:1].lower() + words[1:], formula)
        text += f" Formula: {formula}."
    blocks = [
        Block("heading", "The hardware's bound"),
        Block("paragraph", text),
        Block(
            "table",
            caption="The bound per workload and configuration, with its inputs.",
            columns=[
                "Workload",
                "Configuration",
                *(label for _, label, _ in keys),
                "Bound tok/s",
                "Delivered tok/s",
                "Share of the bound",
            ],
            numeric=[False, False, *(True for _ in keys), True, True, True],
            rows=rows,
        ),
    ]
    sources = []
    for _, _, entry in entries:
        inputs = entry.get("inputs") or {}
        for key in ("model_source", "accelerator_source"):
            if inputs.get(key) and str(inputs[key]) not in sources:
                sources.append(str(inputs[key]))
    if sources:
        blocks.append(Block("paragraph", "Sources: " + "; ".join(sources) + "."))
    return blocks
