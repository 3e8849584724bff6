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
  of it (`measurement.cause_descriptions`, passed in by the caller); `decided_by` (the
  triage's deciding readings, each with `<name>_range` across nodes) lends its ranges to
  the rows it repeats; nested values print in words, never as keys.
- `impact.metric` `decode_tps_<workload>` (also `decode_tps.<workload>`); a unit
  "share of ..." is a fraction, printed as a percentage.

`by_impact` orders the findings: blocking ones first, then by the measured change
relative to its metric, then those with none.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Mapping, Sequence
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
    waterfall_proofs,
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
        "NCCL needs to be told which interface carries its bootstrap and which RDMA devices carry the "
        "collectives. Left to probe, each node tries its interfaces in turn and retries until every node "
        "answers, so the whole start waits for its slowest node; and a node that settles on the wrong "
        "device carries collective traffic far below the data link's speed."
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
    "nodes": "Nodes where we saw it",
    "waiting_nodes": "Nodes that waited",
    "disk_read_cv": "Disk read, coefficient of variation",
    "page_cache_gib_per_min": "Page cache growth",
    "page_cache_gib_end": "Page cache at the end",
    "kernel_jit_s": "Kernel compilation",
    "compilers_median": "Compiler processes, median",
    "compilers_peak": "Compiler processes, peak",
    "gpu_util_pct_median": "GPU utilisation, median",
    "late_node_mgmt_nic_mbps_p90": "Late node's management NIC, 90th percentile",
    "other_nodes_mgmt_nic_mbps_p90_max": "Other nodes' management NIC, 90th percentile (highest)",
    "data_nic_mbps_median": "Data NIC, median",
    "bootstrap_retries": "NCCL bootstrap retries",
    "nccl_ib_hca": "NCCL_IB_HCA",
    "gloo_socket_ifname": "GLOO_SOCKET_IFNAME",
    "window_s": "Window examined",
    "loader": "Loader",
    "verdict": "Verdict of the FP4 check",
    "canary_set_sha256": "Canary set (sha256)",
    "perplexity_before": "Perplexity of a reference passage, your kernels",
    "perplexity_after": "Perplexity of a reference passage, with the change",
    "failed_checks": "Checks failed",
    "table_row": "Dispatch-table entry",
    "signature_gone_after_fix": "Signature gone after the fix",
    "workload": "Workload",
    "customer": "Your setting",
    "best": "Fastest setting on this workload",
    "best_vs_customer": "Fastest against yours",
    "customer_vs_none": "Yours against no speculation",
    "deployed": "Setting we deploy",
}

# A finding's evidence may carry the pipeline's `decided_by`: the readings that decided it,
# each with `<name>_range` across the nodes. They are the rows above, so each reading is
# shown once, its range beside it.
RANGE_SUFFIX = "_range"

NCCL_NAMES = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA")
NCCL_NOTE = (
    "The interface names above are our lab's; set your own nodes' names. NCCL_SOCKET_IFNAME is the "
    'management NIC, the one holding the default route (ip route show default names it after "dev"). '
    "NCCL_IB_HCA lists the RDMA devices of the data NICs, comma-separated: ibdev2netdev prints each RDMA "
    "device beside its network interface, and without it /sys/class/infiniband/<device>/device/net/ names "
    "the interface of each device."
)


METRIC_LABELS = {
    "cold_start_s": "Cold start",
    "weights_load_s": "Weights-load phase",
    "kernel_jit_s": "Kernel-compile phase",
    "distributed_init_s": "Rendezvous (distributed init) phase",
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


WORKLOAD_METRIC_PREFIXES = ("decode_tps_", "ttft_s_")


def metric_label(metric: str) -> str:
    """`decode_tps_code` (or `decode_tps.code`) -> `Decode rate, code`; unknown metrics are humanized."""
    base, _, qualifier = metric.partition(".")
    for prefix in WORKLOAD_METRIC_PREFIXES:
        if not qualifier and base.startswith(prefix):
            base, qualifier = prefix[:-1], base[len(prefix) :]
    label = METRIC_LABELS.get(base) or humanize(base)
    return f"{label}, {qualifier}" if qualifier else label


def impact_unit(impact: Mapping[str, Any]) -> str:
    """The impact's unit; a share of something ("share of canaries") is a fraction."""
    metric = str(impact.get("metric") or "")
    unit = str(impact.get("unit") or fig.unit_for_key(metric.replace(".", "_")))
    return "fraction" if unit.startswith("share") else unit


def impact_formatters(unit: str) -> tuple[fig.Formatter, fig.Formatter, str]:
    """How an impact table prints a metric's values and its change, and the unit its label
    carries: rates go bare with `(tok/s)` in the label, fraction changes in percentage points."""
    if unit.startswith("share"):
        unit = "fraction"
    if unit == "tok/s":
        return fig.tps, fig.tps, " (tok/s)"
    if unit == "fraction":
        return fig.percent, lambda v: f"{v * 100:.1f} pp".replace("-", fig.MINUS), ""
    return fig.formatter_for(unit), fig.formatter_for(unit), ""


def _env_changes(change: Mapping[str, Any]) -> dict[str, tuple[Any, Any, bool]]:
    """Every environment variable the change sets or unsets: {NAME: (from, to, known_from)}.

    A pipeline may write a variable both as a configuration path (`env.NAME`: {from, to})
    and in `env`; it is one change and is printed once."""
    found: dict[str, tuple[Any, Any, bool]] = {}
    for path, value in (change.get("config") or {}).items():
        if str(path).startswith("env.") and isinstance(value, Mapping):
            found[str(path)[4:]] = (value.get("from"), value.get("to"), "from" in value)
    for name, value in (change.get("env") or {}).items():
        if isinstance(value, Mapping):
            found[str(name)] = (value.get("from"), value.get("to"), "from" in value)
        elif str(name) in found:
            previous, _, known = found[str(name)]
            found[str(name)] = (previous, value, known)
        else:
            found[str(name)] = (None, value, False)
    return found


def build_change(change: Any) -> Change:
    """A finding's `change` as a diff of configuration and environment, flags and notes."""
    diff: list[DiffLine] = []
    flags_add = flags_remove = ""
    notes: list[str] = []
    other: list[Row] = []
    if not isinstance(change, Mapping):
        return Change(diff, flags_add, flags_remove, [str(change)] if change else [], other)
    for path, value in (change.get("config") or {}).items():
        if str(path).startswith("env.") and isinstance(value, Mapping):
            continue  # printed with the environment below
        if isinstance(value, Mapping) and ("from" in value or "to" in value):
            if "from" in value:
                diff.append(DiffLine("-", f"{path}: {_config_value(value['from'])}"))
            if value.get("to") is not None:
                diff.append(DiffLine("+", f"{path}: {_config_value(value['to'])}"))
        else:
            diff.append(DiffLine("+", f"{path}: {_config_value(value)}"))
    env = _env_changes(change)
    for name, (before, after, _) in env.items():
        if before is not None:
            diff.append(DiffLine("-", f"{name}={before}"))
        if after is not None:
            diff.append(DiffLine("+", f"{name}={after}"))
        elif before is None:
            diff.append(DiffLine("-", f"{name}  (unset it)"))
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
    if any(name in env and env[name][1] is not None for name in NCCL_NAMES):
        notes.append(NCCL_NOTE)
    for key, value in change.items():
        if key not in {"config", "env", "flags", "note"}:
            other.append(Row(humanize(str(key)), value_text(str(key), value)))
    return Change(diff, flags_add, flags_remove, notes, other)


def build_impact(code: str, impact: Mapping[str, Any]) -> Impact:
    """One measured impact: before, after, the change and its 95 % interval, judged."""
    metric = str(impact.get("metric") or "")
    fmt, change_fmt, label_unit = impact_formatters(impact_unit(impact))
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
        n=_n_text(impact, n),
        demonstrated=judged.demonstrated,
        verdict=verdict,
    )


def _n_text(impact: Mapping[str, Any], n: Any) -> str:
    """`n = 2 and 4` when the two sides have their own counts (cold starts), else `n = 15`."""
    before, after = impact.get("n_before"), impact.get("n_after")
    if isinstance(before, int) and isinstance(after, int) and before != after:
        return f"n = {before} and {after}"
    return f"n = {n}" if n else ""


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


def node_list(names: Sequence[Any]) -> str:
    """`spark-01 to spark-04, spark-06 to spark-08 (7 nodes)`: runs of numbered names folded."""
    parsed = []
    for name in names:
        match = re.fullmatch(r"(.*?)(\d+)", str(name))
        parsed.append((match.group(1), match.group(2)) if match else (str(name), ""))
    groups: list[list[tuple[str, str]]] = []
    for prefix, digits in parsed:
        previous = groups[-1][-1] if groups else None
        if (
            previous is not None
            and digits
            and previous[1]
            and previous[0] == prefix
            and len(previous[1]) == len(digits)
            and int(digits) == int(previous[1]) + 1
        ):
            groups[-1].append((prefix, digits))
        else:
            groups.append([(prefix, digits)])
    parts = []
    for group in groups:
        first, last = "".join(group[0]), "".join(group[-1])
        parts.append(
            first if len(group) == 1 else f"{first}, {last}" if len(group) == 2 else f"{first} to {last}"
        )
    count = f" ({len(parsed)} nodes)" if len(parsed) > 2 else ""
    return ", ".join(parts) + count


def _evidence_value(key: str, value: Any) -> str:
    if key.endswith("nodes") and isinstance(value, Sequence) and not isinstance(value, str):
        return node_list(list(value))
    return value_text(key, value)


def evidence_rows(
    evidence: Mapping[str, Any], *, skip: Collection[str] = (), described_causes: Mapping[str, str]
) -> list[Row]:
    """A finding's evidence as labelled values with units, each reading once.

    The readings in `decided_by` that the evidence already shows lend it their range across
    nodes (`<key>_range`); those it does not show are added after it, unless the same
    figure is already shown under another name."""
    decided = evidence.get("decided_by")
    decided = decided if isinstance(decided, Mapping) else {}
    rows: list[Row] = []
    shown: list[tuple[str, Any]] = []

    def row(key: str, value: Any) -> Row:
        text = _evidence_value(key, value)
        spread = as_interval(decided.get(key + RANGE_SUFFIX))
        if spread is not None and spread[0] != spread[1]:
            fmt = fig.formatter_for(fig.unit_for_key(key))
            text += f" (from {fmt(spread[0])} to {fmt(spread[1])} across the nodes)"
        return Row(EVIDENCE_LABELS.get(key) or humanize(key), text)

    for key, value in evidence.items():
        key = str(key)
        if key in ("summary", "decided_by") or key in skip:
            continue
        if key == "explained_by" and isinstance(value, Sequence) and not isinstance(value, str):
            text = (
                " ".join(f"{c}: {describe_cause(described_causes, str(c))}" for c in value)
                or "no known cause"
            )
            rows.append(Row("Explained by", text))
            continue
        rows.append(row(key, value))
        shown.append((key, value))
    for key, value in decided.items():
        key = str(key)
        if key.endswith(RANGE_SUFFIX) or key in evidence:
            continue
        if any(value == other for _, other in shown):
            continue  # the same figure under another name (the window is the silence)
        rows.append(row(key, value))
        shown.append((key, value))
    return rows


def speed_cost_sentence(speed_cost: Mapping[str, Any]) -> str:
    """The FP4 pipeline's speed cost of correctness per workload, with its interval and
    whether its test found the two backends different."""
    parts = []
    for workload, cost in speed_cost.items():
        if not isinstance(cost, Mapping) or as_number(cost.get("diff_tps")) is None:
            continue
        text = f"{workload} {fig.signed(float(cost['diff_tps']), fig.tps)} tok/s"
        ci = as_interval(cost.get("diff_ci95"))
        if ci:
            text += f" (95 % interval {fig.signed_interval(ci, fig.tps)})"
        if cost.get("significant") is False:
            text += ", within noise"
        elif cost.get("significant") is True:
            text += ", a significant difference"
        parts.append(text)
    if not parts:
        return ""
    sentence = "Speed of the correct kernel against your default: " + "; ".join(parts) + "."
    costs = [c for c in speed_cost.values() if isinstance(c, Mapping)]
    if costs and all(c.get("significant") is False for c in costs):
        sentence += " Correct output costs no measurable speed."
    return sentence


def _without_speed_cost(note: str) -> str:
    """The FP4 change's note without the sentence in which it states the speed cost bare
    (the section prints it with its interval instead)."""
    kept = [s for s in re.split(r"(?<=\.)\s+", note) if not s.startswith("Speed cost of correctness")]
    return " ".join(kept)


def impact_size(finding: Mapping[str, Any]) -> float | None:
    """How large the finding's measured change is relative to its metric: the change over
    the value before (for a share, such as a pass rate, the change in share), the largest
    of its impacts; None when nothing was measured."""
    sizes = []
    for impact in impacts_of(finding):
        before, after = as_number(impact.get("before")), as_number(impact.get("after"))
        if before is None or after is None:
            continue
        if impact_unit(impact) == "fraction":
            sizes.append(abs(after - before))
        elif before:
            sizes.append(abs(after - before) / abs(before))
        else:
            sizes.append(1.0 if after else 0.0)
    return max(sizes) if sizes else None


ORDER_NOTE = (
    "Findings are in order of impact: those that stopped the diagnostic first, then by the size of the "
    "measured change relative to its metric (a cold start's seconds saved over its seconds before, a "
    "rate's gain over the rate before, a pass rate's change in share), then those with no measured change."
)


def by_impact(found: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The findings in the report's order: blocking first, then the largest measured change."""

    def key(item: tuple[int, Mapping[str, Any]]) -> tuple[bool, bool, float, int]:
        index, finding = item
        size = impact_size(finding)
        return (finding.get("blocking") is not True, size is None, -(size or 0.0), index)

    return [f for _, f in sorted(enumerate(found), key=key)]


def why_it_matters(code: str, blocking: bool) -> str:
    if code.startswith("lab."):
        return (WHY.get(code) or LAB_BLOCKING_WHY) if blocking else LAB_WARNING_WHY
    return WHY.get(code) or GENERIC_WHY


def impact_sources(findings: Mapping[str, Any]) -> dict[str, str]:
    """{code prefix: how that stage measured its findings' impacts}, said under the table
    where its figures differ from the summary's (a cold start measured once, with its fix
    alone; a speculative setting by the search's own runs)."""
    sources: dict[str, str] = {}
    cold = findings.get("cold_start")
    waterfall = cold.get("waterfall") if isinstance(cold, Mapping) else None
    added, proving = waterfall_proofs(waterfall or [])
    phased = [
        i
        for f in findings.get("findings") or []
        if isinstance(f, Mapping) and str(f.get("code", "")).startswith("load.")
        for i in impacts_of(f)
        if i.get("phase")
    ]
    if phased:
        sources["load."] = (
            "Measured on the phase this change acts on, over every true cold start of the day: the starts "
            "without the change against those with it, each side's number of starts beside the metric "
            "(section 3.1 lists every start with its phases)."
        )
    elif proving:
        runs = {str(w.get("n")) for w in proving}
        once = runs == {"1"}
        sources["load."] = (
            "Measured as "
            + ("one true cold start" if once else "true cold starts")
            + (
                " of your configuration with this fix added to the ones proved before it"
                if added
                else " of your configuration with this fix alone"
            )
            + " (the waterfall in section 3.1)"
            + (
                "; a single start gives no interval, the waterfall shows each signature gone."
                if once
                else "."
            )
        )
    spec = findings.get("speculative")
    confirm = ((spec.get("protocol") or {}).get("confirm") or {}) if isinstance(spec, Mapping) else {}
    if confirm.get("n"):
        text = (
            f"Measured by the search's confirmation runs of this setting alone ({confirm['n']} runs of "
            f"{confirm.get('max_tokens', '?')} tokens)"
        )
        tuned = (findings.get("measurement") or {}).get("tuned")
        sources["specdec."] = text + (
            "; section 3.4 measures the tuned configuration, every change together, with the full protocol."
            if tuned
            else "."
        )
    return sources


def build_finding(
    index: int,
    finding: Mapping[str, Any],
    stage_titles: Mapping[str, tuple[str, str]],
    *,
    described_causes: Mapping[str, str],
    speed_cost: Mapping[str, Any] | None = None,
    impact_sources: Mapping[str, str] | None = None,
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
        rows = evidence_rows(
            evidence,
            skip={"claims", "delivered"} if claims_table is not None else set(),
            described_causes=described_causes,
        )
    elif evidence:
        lead = str(evidence)
    raw_change = finding.get("change")
    cost = speed_cost_sentence(speed_cost) if code.startswith("fp4.") and speed_cost else ""
    if cost and isinstance(raw_change, Mapping) and raw_change.get("note"):
        raw_change = {**raw_change, "note": _without_speed_cost(str(raw_change["note"]))}
    change = build_change(raw_change)
    if cost:
        change.notes.append(cost)
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
        change=change,
        impacts=impacts,
        impact_note=impact_note,
        see_also=see_also,
        impact_source=next(
            (text for prefix, text in (impact_sources or {}).items() if code.startswith(prefix)), ""
        )
        if impacts
        else "",
    )
