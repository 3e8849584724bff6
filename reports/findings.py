"""Section 2 of the report: one section per finding, whatever its code, built from the
finding alone: what we saw, why it matters, the exact change, and the change's measured
effect. A finding code this module has no words for renders through the same generic
section as every other.

Shapes read beyond DESIGN.md's schema (all optional, documented for the pipelines):

- `finding.change`: `config` ({dotted path: {"from", "to"}} or {path: value}), `flags`
  (list of launch arguments, or {"add": [...], "remove": [...]}), `env` ({NAME: value,
  null to unset}), `note` (text); other keys print as labelled values.
- `finding.impact`: one object (a list is read too); `ci95` is the 95 % interval of the
  change `after - before`; optional `n`, `unit`, `better` ("higher"|"lower").
- `finding.evidence.claims` / `.delivered` (the measure stage's overclaim evidence) print
  as one table; `explained_by` prints each cause with the measurement's own description
  of it (`measurement.cause_descriptions`, passed in by the caller).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from reports import figures as fig
from reports.moneyback import impacts_of, judge_improvement
from reports.structure import (
    Block,
    Change,
    DiffLine,
    FindingSection,
    Impact,
    Row,
    as_interval,
    as_number,
    describe_cause,
    humanize,
    value_text,
    workloads_in,
)

WHY: dict[str, str] = {
    "load.weights_io": (
        "The default loader maps the checkpoint into memory and lets page faults pull it in a few "
        "pages at a time. On GB10 that reads at a small fraction of the NVMe drive's sequential speed "
        "and fills the page cache with a second copy of the weights, memory the model then competes "
        "for. Every restart (a crash, an upgrade, a new node) pays this time again."
    ),
    "load.jit_compile": (
        "FlashInfer and torch.compile build kernels for sm_121 on first use and keep them in an on-disk "
        "cache. When that cache lives in a throw-away container layer, every start compiles again: "
        "minutes of full CPU on every node with nothing in the log, which from the outside cannot be "
        "told apart from a hang."
    ),
    "load.rendezvous": (
        "Without the data-path interface names, NCCL bootstraps over the first interface it finds, here "
        "the 10 Gbps management port, and retries until every node answers. The start waits for its "
        "slowest node, and the same misrouting can carry collective traffic far below the data link's "
        "speed."
    ),
    "load.kv_budget": (
        "The engine refuses to start when the memory left after the weights cannot hold the KV cache for "
        "the configured context length. The failure comes after the weights have loaded, so each attempt "
        "costs a full load before it fails."
    ),
    "fp4.kernel_dispatch": (
        "A mis-dispatched FP4 kernel raises no error. The model keeps writing fluent, confident text that "
        "has nothing to do with the prompt, so health checks and throughput dashboards stay green while "
        "every answer is wrong; the fault surfaces only as complaints from users."
    ),
    "specdec.suboptimal": (
        "Each drafted token costs verification time whether it is accepted or not. Past the point where "
        "acceptance falls off, a longer draft slows every step, and that point differs between code and "
        "prose because their acceptance differs."
    ),
    "specdec.harmful": (
        "Speculation that is accepted too rarely makes decoding slower than no speculation at all, while "
        "the server's own throughput figure may still rise."
    ),
    "metrics.server_overclaim": (
        "Capacity plans and service levels built on the server's throughput line overstate what users "
        "receive. The delivered rate is what a client sees; the server's figure belongs beside it, never "
        "in its place."
    ),
    "lab.node_unreachable": (
        "A node of our lab could not be reached, so the configuration could not be reproduced in full on "
        "our side. Under the money-back rule the engagement is free."
    ),
    "lab.engine_crash": (
        "The engine exited on our lab before the measurements could complete, so the configuration could "
        "not be reproduced in full on our side. Under the money-back rule the engagement is free."
    ),
}


# A lab finding that did not stop the job (preflight's warnings: a slow link, clock skew, a
# node the configuration does not use) changes nothing about the engagement.
LAB_WARNING_WHY = (
    "Our checks of the lab before the run found this. It did not stop your configuration from being "
    "reproduced; it is listed so that the figures in this report can be read with it in mind."
)


LAB_BLOCKING_WHY = (
    "Our lab could not run the configuration because of this, so it could not be reproduced in full on "
    "our side. Under the money-back rule the engagement is free."
)


GENERIC_WHY = (
    "This finding is reported as the pipeline recorded it: the evidence that decided it, the change, and "
    "the change's measured effect."
)


STAGE_OF_PREFIX = {"load.": "cold-start", "fp4.": "fp4", "specdec.": "speculative", "metrics.": "throughput"}


EVIDENCE_LABELS = {
    "weights_load_s": "Weights load, per node",
    "weights_per_node_gb": "Weights per node",
    "nvme_sequential_read_mbps": "NVMe sequential read",
    "page_cache_peak_gib": "Page cache, peak",
    "silent_s": "Log silent for",
    "stall_s": "Stall",
    "late_node": "Last node to join",
    "nccl_socket_ifname": "NCCL_SOCKET_IFNAME",
    "jit_cache": "JIT cache",
    "backend": "FP4 backend chosen",
    "known_bad_source": "Known-bad source",
    "canaries_passed": "Canary prompts passed",
    "probe_max_rel_error": "Kernel probe, max relative error",
    "customer_k": "Your draft length k",
    "search_lab_time_s": "Lab time spent searching",
    "server_claimed_tps": "Server-claimed rate",
    "cause": "Cause",
    "max_model_len": "Context length configured (max_model_len)",
    "kv_needed_gib": "KV cache needed for one request",
    "kv_available_gib": "KV cache memory available",
    "estimated_max_model_len": "Longest context that fits (the engine's estimate)",
}


METRIC_LABELS = {
    "cold_start_s": "Cold start",
    "canary_pass_rate": "Canary prompts answered correctly",
    "decode_tps": "Decode rate",
    "ttft_s": "Time to first token",
}


def _config_value(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def metric_label(metric: str) -> str:
    """`decode_tps.code` -> `Decode rate, code`; unknown metrics are humanized."""
    base, _, qualifier = metric.partition(".")
    label = METRIC_LABELS.get(base) or humanize(base)
    return f"{label}, {qualifier}" if qualifier else label


def impact_formatters(unit: str) -> tuple[fig.Formatter, fig.Formatter, str]:
    """How an impact table prints a metric's values and its change, and the unit its label
    carries: rates go bare with `(tok/s)` in the label, fraction changes in percentage points."""
    if unit == "tok/s":
        return fig.tps, fig.tps, " (tok/s)"
    if unit == "fraction":
        return fig.percent, lambda v: f"{v * 100:.1f} pp".replace("-", fig.MINUS), ""
    return fig.formatter_for(unit), fig.formatter_for(unit), ""


def build_change(change: Any) -> Change:
    """A finding's `change` as a diff of configuration and environment, flags and notes."""
    diff: list[DiffLine] = []
    flags_add = flags_remove = ""
    notes: list[str] = []
    other: list[Row] = []
    if not isinstance(change, Mapping):
        return Change(diff, flags_add, flags_remove, [str(change)] if change else [], other)
    for path, value in (change.get("config") or {}).items():
        if isinstance(value, Mapping) and ("from" in value or "to" in value):
            if "from" in value:
                diff.append(DiffLine("-", f"{path}: {_config_value(value['from'])}"))
            if value.get("to") is not None:
                diff.append(DiffLine("+", f"{path}: {_config_value(value['to'])}"))
        else:
            diff.append(DiffLine("+", f"{path}: {_config_value(value)}"))
    for name, value in (change.get("env") or {}).items():
        if isinstance(value, Mapping):
            if value.get("from") is not None:
                diff.append(DiffLine("-", f"{name}={value['from']}"))
            if value.get("to") is not None:
                diff.append(DiffLine("+", f"{name}={value['to']}"))
        elif value is None:
            diff.append(DiffLine("-", f"{name}  (unset it)"))
        else:
            diff.append(DiffLine("+", f"{name}={value}"))
    flags = change.get("flags")
    if isinstance(flags, Mapping):
        flags_add = shlex.join(str(f) for f in flags.get("add") or [])
        flags_remove = shlex.join(str(f) for f in flags.get("remove") or [])
    elif isinstance(flags, Sequence) and not isinstance(flags, str):
        flags_add = shlex.join(str(f) for f in flags)
    elif isinstance(flags, str):
        flags_add = flags
    note = change.get("note")
    if note:
        notes.append(str(note))
    for key, value in change.items():
        if key not in {"config", "env", "flags", "note"}:
            other.append(Row(humanize(str(key)), value_text(str(key), value)))
    return Change(diff, flags_add, flags_remove, notes, other)


def build_impact(code: str, impact: Mapping[str, Any]) -> Impact:
    """One measured impact: before, after, the change and its 95 % interval, judged."""
    metric = str(impact.get("metric") or "")
    unit = str(impact.get("unit") or fig.unit_for_key(metric))
    fmt, change_fmt, label_unit = impact_formatters(unit)
    before, after = as_number(impact.get("before")), as_number(impact.get("after"))
    ci = as_interval(impact.get("ci95"))
    n = impact.get("n")
    judged = judge_improvement(code, impact)
    if judged.demonstrated:
        verdict = "Improvement: the 95 % interval of the change excludes zero."
    elif ci is None:
        verdict = "Not demonstrated: no 95 % interval was measured."
    else:
        verdict = "Not demonstrated: " + judged.detail.split(": ", 1)[-1] + "."
    return Impact(
        metric=(metric_label(metric) if metric else "Unnamed metric") + label_unit,
        before=fmt(before) if before is not None else "not measured",
        after=fmt(after) if after is not None else "not measured",
        change=fig.signed(after - before, change_fmt) if before is not None and after is not None else "",
        interval=fig.signed_interval(ci, change_fmt) if ci else "no interval",
        n=f"n = {n}" if n else "",
        demonstrated=judged.demonstrated,
        verdict=verdict,
    )


def server_claims_table(evidence: Mapping[str, Any]) -> Block | None:
    """`claims` ({workload: {log|metrics: {claimed_tps, ratio, ...}}}) beside `delivered`
    ({workload: {mean_tps, ci95}}) as one table, the way the measure stage records an
    overclaim; None when the evidence has no such pair."""
    claims, delivered = evidence.get("claims"), evidence.get("delivered")
    if not isinstance(claims, Mapping) or not isinstance(delivered, Mapping):
        return None
    rows = []
    for workload in workloads_in(delivered):
        got = delivered[workload]
        by_source = claims.get(workload) or {}
        mean, ci = as_number(got.get("mean_tps")), as_interval(got.get("ci95"))

        def claim(source: str, by_source: Mapping[str, Any] = by_source, mean: float | None = mean) -> str:
            c = by_source.get(source)
            value = as_number(c.get("claimed_tps")) if isinstance(c, Mapping) else None
            if value is None:
                return "not measured"
            return fig.tps(value) + (f" ({fig.ratio(value / mean)})" if mean else "")

        rows.append(
            [
                workload,
                fig.tps(mean) if mean is not None else "",
                fig.interval(ci, fig.tps) if ci else "",
                claim("log"),
                claim("metrics"),
            ]
        )
    if not rows:
        return None
    return Block(
        "table",
        caption="Delivered at the client against what the server claims over the same requests (tok/s; "
        "in brackets, the claim over the delivered mean).",
        columns=["Workload", "Delivered", "95 % interval", "Server log", "/metrics"],
        numeric=[False, True, True, True, True],
        rows=rows,
    )


def why_it_matters(code: str, blocking: bool) -> str:
    if code.startswith("lab."):
        return (WHY.get(code) or LAB_BLOCKING_WHY) if blocking else LAB_WARNING_WHY
    return WHY.get(code) or GENERIC_WHY


def build_finding(
    index: int,
    finding: Mapping[str, Any],
    stage_titles: Mapping[str, tuple[str, str]],
    *,
    described_causes: Mapping[str, str],
) -> FindingSection:
    """One finding, whatever its code: what we saw, why it matters, the change, its effect.

    `described_causes` is the measurement's {cause code: plain words}, for `explained_by`."""
    code = str(finding.get("code") or "unclassified")
    evidence = finding.get("evidence") or {}
    lead = ""
    rows: list[Row] = []
    tables: list[Block] = []
    if isinstance(evidence, Mapping):
        lead = str(evidence.get("summary") or "")
        claims_table = server_claims_table(evidence)
        if claims_table is not None:
            tables.append(claims_table)
        for key, value in evidence.items():
            if key == "summary" or (claims_table is not None and key in ("claims", "delivered")):
                continue
            if key == "explained_by" and isinstance(value, Sequence) and not isinstance(value, str):
                text = (
                    " ".join(f"{c}: {describe_cause(described_causes, str(c))}" for c in value)
                    or "no known cause"
                )
                rows.append(Row("Explained by", text))
                continue
            rows.append(Row(EVIDENCE_LABELS.get(str(key)) or humanize(str(key)), value_text(str(key), value)))
    elif evidence:
        lead = str(evidence)
    impacts = [build_impact(code, i) for i in impacts_of(finding)]
    if impacts:
        impact_note = ""
    elif finding.get("impact") is None and code.startswith("metrics."):
        impact_note = (
            "No performance change: this finding corrects how throughput is counted, not how fast it is."
        )
    else:
        impact_note = "No measured impact was recorded for this finding."
    see_also = None
    for prefix, stage in STAGE_OF_PREFIX.items():
        if code.startswith(prefix) and stage in stage_titles:
            see_also = stage_titles[stage]
    return FindingSection(
        anchor=f"finding-{index}",
        number=f"2.{index}",
        code=code,
        title=str(finding.get("title") or code),
        lead=lead,
        evidence=rows,
        evidence_tables=tables,
        why=str(finding.get("why") or why_it_matters(code, finding.get("blocking") is True)),
        change=build_change(finding.get("change")),
        impacts=impacts,
        impact_note=impact_note,
        see_also=see_also,
    )
