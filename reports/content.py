"""What the report says: a findings.json document turned into the report's content model.

The model is plain dataclasses holding finished text (every figure already formatted by
`reports.figures`) and inline SVG plots, so the templates only lay it out. Sections come
from what is present: a section whose findings key is missing or null is stated as not
run, never filled in; a finding code this module has no words for renders through the
same generic finding section as every other (title, evidence, change, impact).

Shapes read beyond DESIGN.md's schema (all optional, documented for the pipelines):

- `job.simulated` (or `job.lab` reading `sim:NAME`) marks a simulated lab;
  `job.lab_dilation` (or `time_dilation`/`dilation`): its lab seconds per wall second,
  printed on the cover; `job.lab_day`: ISO date of the lab day (money-back deadline).
- `finding.change`: `config` ({dotted path: {"from", "to"}} or {path: value}), `flags`
  (list of launch arguments, or {"add": [...], "remove": [...]}), `env` ({NAME: value,
  null to unset}), `note` (text); other keys print as labelled values.
- `finding.impact`: one object (a list is read too); `ci95` is the 95 % interval of the
  change `after - before`; optional `n`, `unit`, `better` ("higher"|"lower").
- `cold_start.phases[]`: {run: before|after, node, phase, start_s, end_s};
  `cold_start.waterfall[]`: {step, fixes, n, cold_start_s, ci95, delta_ci95};
  `cold_start.stalls[]`: {run, node, cause, start_s, end_s, silent_s, telemetry: {t_s: [...], series...}}.
- `fp4.verdict` and `fp4.verdict_after` (garbage|degraded|correct) are the FP4 pipeline's
  verdicts, printed as written (without `verdict_after`, the pass rate only);
  `fp4.backends[]`: per-backend checks.
- `speculative.baseline|none|best.{workload}`: {n, mean_tps, ci95, runs?};
  `speculative.trials[]`: {workload, method, k, stage: screen|confirm, n, mean_tps, ci95}.
- `measurement` as the measure stage writes it (`diagnostic/pipelines/measure.py`; the
  findings schema's `workload_measurement` and `run`): `{workload}.runs[]` with 0-based
  `index` and `prompt_index`, `tokens` (delivered), `usage_completion_tokens`, `ttft_s`,
  `decode_tps`, `e2e_tps`; `{workload}.outliers` (positions among the runs with a rate);
  `{workload}.server_claim.{log,metrics}`; `reconciliation_detail`: {workload: [tested
  cause: {code, present, explains_ratio, observed_ratio, predicted_ratio, evidence}]}.
  `measurement.after` (same shape, the recommended configuration measured by the same
  protocol; when absent, `speculative.best` is the "after").
- `finding.evidence.claims` / `.delivered` (the measure stage's overclaim evidence) print
  as one table; `explained_by` prints each cause with the measurement's description of it,
  `measurement.cause_descriptions` ({cause code: plain words}, every cause it tested).
"""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from reports import figures as fig
from reports import sections
from reports.moneyback import MoneyBackDecision, impacts_of, judge_improvement
from reports.structure import (
    Block,
    Change,
    Cover,
    DiffLine,
    FigureCounter,
    FindingSection,
    Impact,
    MoneyBackView,
    ReportContent,
    Row,
    SummaryRow,
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


# --------------------------------------------------------------------------- findings


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


# --------------------------------------------------------------------------- cover and summary


DILATION_KEYS = ("lab_dilation", "time_dilation", "dilation")


def lab_description(job: Mapping[str, Any]) -> tuple[str, str]:
    """The lab's name and, for a simulated lab, how much faster than real time it ran.

    A lab is simulated when `job.simulated` is true or `job.lab` reads `sim:NAME`. Its
    speed-up is `job.lab_dilation` (also read as `time_dilation` or `dilation`), else
    estimated from `lab_time_s / wall_time_s` and said to be an estimate.
    """
    lab = str(job.get("lab") or "not recorded")
    kind, sep, rest = lab.partition(":")
    name = rest if sep and kind in ("sim", "inventory", "lab") and rest else lab
    if not (job.get("simulated") is True or kind == "sim"):
        return name, "Durations are wall-clock time on our lab."
    dilation = next((as_number(job.get(k)) for k in DILATION_KEYS if as_number(job.get(k))), None)
    if dilation is None:
        lab_s, wall_s = as_number(job.get("lab_time_s")), as_number(job.get("wall_time_s"))
        if lab_s and wall_s:
            speed = f"about {lab_s / wall_s:.0f}\u00d7 faster than real time (lab time over wall time)"
        else:
            speed = "at a speed-up that was not recorded"
    else:
        speed = f"{fig.number(dilation)}\u00d7 faster than real time"
    return (
        f"Simulated lab \u201c{name}\u201d",
        f"This diagnostic ran on a simulated lab, {speed}. Every duration in this report is lab time.",
    )


NODE_TYPES = {"dgx-spark": "DGX Spark", "gb10": "GB10"}


def node_type_label(node_type: Any) -> str:
    """The machine's name as people write it: `dgx-spark` -> DGX Spark; others as given."""
    return NODE_TYPES.get(str(node_type), str(node_type)) if node_type else "nodes"


def _gbps(value: Any) -> str:
    number = as_number(value)
    return f"{fig.number(number)} Gbps" if number is not None else "? Gbps"


def config_rows(config: Mapping[str, Any]) -> list[Row]:
    """The customer's configuration as it was reproduced, one line per concern."""
    rows: list[Row] = []
    engine = config.get("engine") or {}
    if engine:
        name = {"vllm": "vLLM", "sglang": "SGLang"}.get(str(engine.get("name")), str(engine.get("name")))
        rows.append(Row("Engine", f"{name} {engine.get('version', '')}".strip()))
    model = config.get("model") or {}
    if model:
        rows.append(Row("Model", f"{model.get('id', '?')} ({model.get('quantization', '?')})"))
    cluster = config.get("cluster") or {}
    if cluster:
        rows.append(
            Row(
                "Cluster",
                f"{cluster.get('nodes', '?')} \u00d7 {node_type_label(cluster.get('node_type'))}, "
                f"{_gbps(cluster.get('link_gbps'))} data link",
            )
        )
    par = config.get("parallel") or {}
    if par:
        ep = ", expert parallel" if par.get("expert_parallel") else ""
        rows.append(Row("Parallelism", f"TP {par.get('tp', '?')} \u00d7 PP {par.get('pp', '?')}{ep}"))
    serving = config.get("serving") or {}
    if serving:
        parts = []
        if "max_model_len" in serving:
            parts.append(f"context {fig.number(serving['max_model_len'])}")
        if "kv_cache_dtype" in serving:
            parts.append(f"KV cache {serving['kv_cache_dtype']}")
        if "gpu_memory_utilization" in serving:
            parts.append(f"memory {serving['gpu_memory_utilization']}")
        if serving.get("enforce_eager"):
            parts.append("eager mode")
        rows.append(Row("Serving", ", ".join(parts)))
        loader = f"load format {serving.get('load_format', 'auto')}"
        if "safetensors_load_strategy" in serving:
            loader += f", {serving['safetensors_load_strategy']} safetensors"
        if "jit_cache" in serving:
            loader += f", {serving['jit_cache']} JIT cache"
        rows.append(Row("Loading", loader))
        if "moe_backend" in serving or "linear_backend" in serving:
            rows.append(
                Row(
                    "FP4 kernels",
                    f"MoE {serving.get('moe_backend', 'auto')}, "
                    f"linear {serving.get('linear_backend', 'auto')}",
                )
            )
    spec = config.get("speculative")
    if "speculative" in config:
        if spec:
            draft = f" ({spec['draft_model']})" if spec.get("draft_model") else ""
            rows.append(
                Row(
                    "Speculative decoding",
                    setting_label(spec.get("method"), spec.get("num_speculative_tokens")) + draft,
                )
            )
        else:
            rows.append(Row("Speculative decoding", "none"))
    env = config.get("env") or {}
    if env:
        rows.append(Row("Environment", " ".join(f"{k}={v}" for k, v in env.items())))
    if config.get("extra_args"):
        rows.append(Row("Extra arguments", shlex.join(str(a) for a in config["extra_args"])))
    reported = config.get("reported") or {}
    if reported:
        parts = []
        if as_number(reported.get("decode_tps")) is not None:
            parts.append(f"{fig.tps(reported['decode_tps'])} tok/s decode")
        if as_number(reported.get("cold_start_s")) is not None:
            parts.append(f"{fig.seconds(reported['cold_start_s'])} cold start")
        if parts:
            rows.append(Row("Your own figures", ", ".join(parts)))
    return rows


def _decode_before(findings: Mapping[str, Any], workload: str) -> Mapping[str, Any] | None:
    for section in (findings.get("measurement"), (findings.get("speculative") or {}).get("baseline")):
        if isinstance(section, Mapping) and isinstance(section.get(workload), Mapping):
            return section[workload]
    return None


def _decode_after(findings: Mapping[str, Any], workload: str) -> Mapping[str, Any] | None:
    measured_after = (findings.get("measurement") or {}).get("after")
    for section in (measured_after, (findings.get("speculative") or {}).get("best")):
        if isinstance(section, Mapping) and isinstance(section.get(workload), Mapping):
            return section[workload]
    return None


def _impact_for(findings: Mapping[str, Any], metric: str) -> Mapping[str, Any] | None:
    for finding in findings.get("findings") or []:
        if isinstance(finding, Mapping):
            for impact in impacts_of(finding):
                if impact.get("metric") == metric:
                    return impact
    return None


def _mean_and_interval(block: Mapping[str, Any] | None) -> tuple[str, str]:
    if not block or as_number(block.get("mean_tps")) is None:
        return "not measured", ""
    ci = as_interval(block.get("ci95"))
    return fig.tps(float(block["mean_tps"])), f"({fig.interval(ci, fig.tps)})" if ci else ""


def summary_rows(findings: Mapping[str, Any]) -> list[SummaryRow]:
    """Before and after for decode per workload, cold start and FP4 output."""
    rows: list[SummaryRow] = []
    workloads = workloads_in(findings.get("measurement"), (findings.get("speculative") or {}).get("best"))
    for workload in workloads:
        before, after = _decode_before(findings, workload), _decode_after(findings, workload)
        b_mean = as_number(before.get("mean_tps")) if before else None
        a_mean = as_number(after.get("mean_tps")) if after else None
        change = change_sub = ""
        if b_mean is not None and a_mean is not None:
            change = fig.signed(a_mean - b_mean, fig.tps)
            impact = _impact_for(findings, f"decode_tps.{workload}")
            ci = as_interval(impact.get("ci95")) if impact else None
            change_sub = fig.signed_interval(ci, fig.tps) if ci else ""
        note = ""
        if after and after.get("k") is not None:
            note = f"after: {setting_label(after.get('method'), after.get('k'))}"
        b_text, b_sub = _mean_and_interval(before)
        a_text, a_sub = _mean_and_interval(after)
        rows.append(
            SummaryRow(
                f"Decode rate, {workload} (tok/s)", b_text, a_text, change, note, b_sub, a_sub, change_sub
            )
        )
    cold = findings.get("cold_start")
    if present(cold):
        b, a = as_number(cold.get("before_s")), as_number(cold.get("after_s"))
        rows.append(
            SummaryRow(
                "Cold start",
                fig.minutes(b) if b is not None else "not measured",
                fig.minutes(a) if a is not None else "not measured",
                fig.signed(a - b, fig.seconds) if a is not None and b is not None else "",
                "true cold start" + ("s" if a is not None else "") + ", page cache dropped",
                f"({fig.seconds(b)})" if b is not None else "",
                f"({fig.seconds(a)})" if a is not None else "",
            )
        )
    fp4 = findings.get("fp4")
    if present(fp4):
        rates = fp4.get("canary_pass_rate") or {}

        def detail(backend: Any, rate: Any) -> str:
            parts = [str(backend)] if backend else []
            if as_number(rate) is not None:
                parts.append(f"{fig.percent(rate)} of canaries")
            return ", ".join(parts)

        # The FP4 pipeline decides the verdict after the change; without one the report
        # shows the canary pass rate it measured and does not judge it.
        verdict_after, backend_after = fp4.get("verdict_after"), fp4.get("backend_after")
        verdict_text, verdict_sub = str(verdict_after), detail(backend_after, rates.get("after"))
        if not verdict_after:
            rate_after = as_number(rates.get("after"))
            verdict_text = "not checked" if rate_after is None else f"{fig.percent(rate_after)} of canaries"
            verdict_sub = detail(backend_after, None)
        rows.append(
            SummaryRow(
                "FP4 output",
                str(fp4.get("verdict") or "not checked"),
                verdict_text,
                "",
                "",
                detail(fp4.get("backend_before"), rates.get("before")),
                verdict_sub,
            )
        )
    return rows


def headline(findings: Mapping[str, Any], lab: str, money: MoneyBackDecision) -> list[str]:
    """The opening paragraphs of the summary, built only from what was measured."""
    found = [f for f in findings.get("findings") or [] if isinstance(f, Mapping)]
    # A metrics finding without an impact corrects how throughput is counted; it changes
    # nothing about the serving, so it is not "standing between" the customer and anything.
    corrections = [
        f for f in found if str(f.get("code") or "").startswith("metrics.") and not impacts_of(f)
    ]
    serving = [f for f in found if f not in corrections]
    on_lab = lab[0].lower() + lab[1:]
    paras = []
    if serving:
        text = (
            f"We reproduced your configuration on our {on_lab} and found {len(serving)} "
            f"thing{'s' if len(serving) != 1 else ''} standing between it and the numbers this hardware "
            "delivers. Each is described in section 2 with the evidence that decided it, the exact change, "
            "and the change's measured effect."
        )
        if corrections:
            text += (
                f" Section 2 also has {len(corrections)} finding{'s' if len(corrections) != 1 else ''} on "
                "how throughput is counted."
            )
        paras.append(text)
    elif corrections:
        paras.append(
            f"We reproduced your configuration on our {on_lab} and measured it as it stands; this "
            "engagement measured no change to the serving. Section 2 has "
            f"{len(corrections)} finding{'s' if len(corrections) != 1 else ''} on how its throughput is "
            "counted."
        )
    else:
        paras.append(f"We ran the diagnostic on our {on_lab}; it recorded no findings.")
    gains = []
    for workload in workloads_in(
        findings.get("measurement"), (findings.get("speculative") or {}).get("best")
    ):
        before, after = _decode_before(findings, workload), _decode_after(findings, workload)
        b = as_number(before.get("mean_tps")) if before else None
        a = as_number(after.get("mean_tps")) if after else None
        if a is not None and b is not None:
            gains.append(f"single-stream decode on {workload} goes from {fig.tps(b)} to {fig.tps(a)} tok/s")
    cold = findings.get("cold_start")
    if (
        present(cold)
        and as_number(cold.get("before_s")) is not None
        and as_number(cold.get("after_s")) is not None
    ):
        gains.append(
            f"a cold start falls from {fig.minutes(cold['before_s'])} to {fig.minutes(cold['after_s'])}"
        )
    fp4 = findings.get("fp4")
    if present(fp4) and fp4.get("verdict") in ("garbage", "degraded"):
        rates = fp4.get("canary_pass_rate") or {}
        if as_number(rates.get("before")) is not None and as_number(rates.get("after")) is not None:
            # "Correct again" is the FP4 pipeline's verdict to give, not this report's.
            if fp4.get("verdict_after") == "correct":
                gains.append(
                    f"the model's answers are correct again ({fig.percent(rates['before'])} \u2192 "
                    f"{fig.percent(rates['after'])} of canary prompts)"
                )
            else:
                gains.append(
                    f"canary prompts answered correctly go from {fig.percent(rates['before'])} to "
                    f"{fig.percent(rates['after'])}"
                )
    if gains:
        text = "; ".join(gains[:-1]) + (" and " if len(gains) > 1 else "") + gains[-1]
        paras.append(f"With the changes in this report, {text}.")
    if money.eligible:
        paras.append(f"This engagement is free of charge. {money.reason}")
    return paras


def money_back_view(money: MoneyBackDecision, tz: dt.tzinfo) -> MoneyBackView:
    """The money-back status, the rule clause by clause, and the staff overrides."""
    conditions = []
    for c in money.conditions:
        result = {True: "applies", False: "does not apply", None: "not assessed"}[c.holds]
        conditions.append(Row(c.label, result, c.detail))
    overrides = [
        [
            o.at.astimezone(tz).strftime("%Y-%m-%d %H:%M %Z"),
            o.by,
            "free of charge" if o.eligible else "charged",
            o.reason,
        ]
        for o in money.overrides
    ]
    return MoneyBackView(
        eligible=money.eligible,
        headline="applies, this engagement is free of charge" if money.eligible else "does not apply",
        status="Applies: this engagement is free of charge"
        if money.eligible
        else "Does not apply: improvements demonstrated",
        reason=money.reason,
        computed_status="free of charge" if money.computed_eligible else "charged as agreed",
        conditions=conditions,
        overrides=overrides,
    )


# --------------------------------------------------------------------------- entry point


def stopped_early(job: Mapping[str, Any]) -> str:
    """A sentence saying that the diagnostic stopped before some stages, and why ("" when
    every stage ran). The job records skipped stages as cancelled, "not run: <reason>"."""
    skipped = [
        s for s in job.get("stages") or []
        if isinstance(s, Mapping) and str(s.get("message") or "").startswith("not run: ")
    ]
    if not skipped:
        return ""
    reason = str(skipped[0]["message"]).removeprefix("not run: ")
    names = ", ".join(str(s.get("name")) for s in skipped)
    return (
        f"The diagnostic stopped early ({reason}), so these stages did not run: {names}. Section 2 says "
        "what stopped it."
    )


def build_report(
    findings: Mapping[str, Any],
    *,
    customer: str,
    money_back: MoneyBackDecision,
    issued: dt.date,
    version: str = "",
    tz: dt.tzinfo = dt.UTC,
    with_plots: bool = True,
) -> ReportContent:
    """The whole report's content from one findings document."""
    job = findings.get("job") or {}
    config = findings.get("config") or {}
    lab, lab_note = lab_description(job)
    figures = FigureCounter(with_plots)

    stages = [
        sections.cold_start_section(findings.get("cold_start"), figures, "3.1"),
        sections.fp4_section(findings.get("fp4"), "3.2"),
        sections.speculative_section(findings.get("speculative"), config, figures, "3.3"),
        sections.throughput_section(findings, figures, "3.4"),
    ]
    stage_titles = {s.anchor: (s.anchor, f"{s.number} {s.title}") for s in stages if s.ran}
    found = [f for f in findings.get("findings") or [] if isinstance(f, Mapping)]
    described = cause_descriptions(findings.get("measurement"))
    finding_sections = [
        build_finding(i, f, stage_titles, described_causes=described) for i, f in enumerate(found, start=1)
    ]
    appendices = [sections.methodology_appendix(findings, "A"), sections.raw_runs_appendix(findings, "B")]

    model_name = str((config.get("model") or {}).get("id", "")).rsplit("/", 1)[-1]
    cluster = config.get("cluster") or {}
    machine = node_type_label(cluster.get("node_type"))
    nodes = f"{cluster['nodes']} \u00d7 {machine}" if cluster.get("nodes") else ""
    notices = []
    stopped = stopped_early(findings.get("job") or {})
    if stopped:
        notices.append(stopped)
    if findings.get("schema") != "diagnostic.findings/1":
        notices.append(
            f"Findings schema {findings.get('schema')!r}; this report reads diagnostic.findings/1."
        )
    return ReportContent(
        cover=Cover(
            title="Serving diagnostic: written findings",
            subtitle=" on ".join(p for p in (model_name, nodes) if p),
            customer=customer,
            date=f"{issued.day} {issued:%B %Y}",
            lab=lab,
            lab_note=lab_note,
            job_id=str(job.get("id", "")),
            version=version,
            config=config_rows(config),
        ),
        headline=headline(findings, lab, money_back),
        summary=summary_rows(findings),
        money_back=money_back_view(money_back, tz),
        findings=finding_sections,
        stages=stages,
        appendices=appendices,
        notices=notices,
    )
