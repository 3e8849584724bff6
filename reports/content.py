"""What the report says: a findings.json document assembled into the report's content
model: the cover, the summary with its headline, the money-back status, the findings
(`reports.sections.findings`), and the measured sections and appendices (`reports.sections`, one
module each).

The model is plain dataclasses holding finished text (every figure already formatted by
`reports.figures`) and inline SVG plots, so the templates only lay it out. Sections come
from what is present: a section whose findings key is missing or null is stated as not
run, never filled in.

Every quantity printed in more than one place (the day's cold start and its change, each
rate and its change) is read from one recorded value (`reports.quantities`) and printed by
`reports.figures`; the summary also lists the exact changes (`setting: yours → ours`), from
the same rows as appendix B, and points to where the remaining step time goes.

The summary's "with our changes" is the tuned configuration as the measure stage measured
it (`measurement.tuned`, the change `measurement.difference`), each rate beside its share
of the hardware's bound; without it, the speculative search's own runs, said to be so
(`reports.sections.configurations`).

Shapes of `job` read beyond DESIGN.md's schema (all optional, documented for the
pipelines): `job.simulated` (or `job.lab` reading `sim:NAME`) marks a simulated lab;
`job.lab_dilation` (or `time_dilation`/`dilation`): its lab seconds per wall second,
printed on the cover; `job.lab_day`: ISO date of the lab day (money-back deadline);
`job.stages[]` with a `message` of "not run: <reason>" for a stage the job skipped.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shlex
from collections.abc import Mapping
from typing import Any

from reports import figures as fig
from reports.moneyback import MoneyBackDecision, impacts_of
from reports.quantities import day_cold_start
from reports.sections.appendices import (
    lab_time_appendix,
    methodology_appendix,
    raw_runs_appendix,
    summary_change_rows,
    tuned_configuration_appendix,
)
from reports.sections.cold_start import cold_start_section
from reports.sections.configurations import (
    SEARCH,
    SEARCH_NOTE,
    After,
    after_of,
    of_bound,
    roofline_fraction,
    tuned_setting,
)
from reports.sections.findings import ORDER_NOTE, build_finding, by_impact, impact_sources
from reports.sections.fp4 import fp4_section
from reports.sections.gap import gap_section, rest_section, summary_changes
from reports.sections.speculative import speculative_section
from reports.sections.throughput import throughput_section
from reports.structure import (
    Cover,
    FigureCounter,
    MoneyBackView,
    ReportContent,
    Row,
    SummaryRow,
    as_interval,
    as_number,
    cause_descriptions,
    present,
    setting_label,
    workloads_in,
)

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
        if serving.get("safetensors_load_strategy"):  # unset: the engine's default
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


def _decode_after(after: After, workload: str) -> Mapping[str, Any] | None:
    block = after.workloads.get(workload)
    return block if isinstance(block, Mapping) else None


def impact_for(findings: Mapping[str, Any], workload: str) -> Mapping[str, Any] | None:
    """The speculative search's impact on one workload's decode rate: the metric is
    `decode_tps_<workload>` as the search writes it (`decode_tps.<workload>` is read too)."""
    names = {f"decode_tps_{workload}", f"decode_tps.{workload}"}
    for finding in findings.get("findings") or []:
        if isinstance(finding, Mapping):
            for impact in impacts_of(finding):
                if impact.get("metric") in names:
                    return impact
    return None


def _mean_and_interval(block: Mapping[str, Any] | None) -> tuple[str, str]:
    if not block or as_number(block.get("mean_tps")) is None:
        return "not measured", ""
    ci = as_interval(block.get("ci95"))
    return fig.tps(float(block["mean_tps"])), f"({fig.interval(ci, fig.tps)})" if ci else ""


def decode_change(
    findings: Mapping[str, Any], after: After, workload: str, b_mean: float, a_mean: float
) -> tuple[str, str, str]:
    """The change of a workload's decode rate: its figure, its 95 % interval and, when the
    measure stage's test found no difference, words saying it is within noise.

    With the tuned configuration measured, the change is `measurement.difference` (Welch,
    same protocol); otherwise the speculative finding's own impact interval."""
    difference = ((findings.get("measurement") or {}).get("difference") or {}).get(workload)
    if after.measured and isinstance(difference, Mapping) and as_number(difference.get("diff")) is not None:
        ci = as_interval(difference.get("ci95"))
        noise = "" if difference.get("different") is not False else "within noise (Welch, 5 %)"
        return (
            fig.signed(float(difference["diff"]), fig.tps),
            fig.signed_interval(ci, fig.tps) if ci else "",
            noise,
        )
    impact = impact_for(findings, workload) if after.source == SEARCH else None
    ci = as_interval(impact.get("ci95")) if impact else None
    return fig.signed(a_mean - b_mean, fig.tps), fig.signed_interval(ci, fig.tps) if ci else "", ""


def summary_rows(findings: Mapping[str, Any]) -> list[SummaryRow]:
    """Before and after for decode per workload, cold start and FP4 output."""
    rows: list[SummaryRow] = []
    after = after_of(findings)
    tuned = tuned_setting(findings)
    for workload in workloads_in(findings.get("measurement"), after.workloads):
        before, block_after = _decode_before(findings, workload), _decode_after(after, workload)
        b_mean = as_number(before.get("mean_tps")) if before else None
        a_mean = as_number(block_after.get("mean_tps")) if block_after else None
        change = change_sub = change_third = ""
        if b_mean is not None and a_mean is not None:
            change, change_sub, change_third = decode_change(findings, after, workload, b_mean, a_mean)
        note = ""
        if block_after and block_after.get("k") is not None:
            note = f"after: {setting_label(block_after.get('method'), block_after.get('k'))}"
        elif after.measured and tuned is not None:
            note = f"after: {setting_label(*tuned)}"
        if after.source == SEARCH and block_after:
            note += (", " if note else "") + "search runs only"
        b_text, b_sub = _mean_and_interval(before)
        a_text, a_sub = _mean_and_interval(block_after)
        rows.append(
            SummaryRow(
                f"Decode rate, {workload} (tok/s)",
                b_text,
                a_text,
                change,
                note,
                b_sub,
                a_sub,
                change_sub,
                before_third=of_bound(roofline_fraction(findings, True, workload)) if before else "",
                after_third=of_bound(roofline_fraction(findings, False, workload))
                if block_after and after.measured
                else "",
                change_third=change_third,
            )
        )
    cold = day_cold_start(findings)
    if cold is not None:
        b, a = cold.before_s, cold.after_s
        change = fig.signed(cold.change_s, fig.seconds) if cold.change_s is not None else ""
        # The measure stage's Welch test of the tuned configuration's true cold starts
        # against the customer's, when both were started more than once.
        ci = cold.change_ci95
        change_sub = fig.signed_interval(ci, fig.seconds_bare) + " s" if ci else ""
        change_third = "within noise (Welch, 5 %)" if cold.different is False else ""
        if cold.change_s is not None and not cold.change_ci95:
            change_third = "one start of yours: each cause's interval is in its finding"
        rows.append(
            SummaryRow(
                "Cold start",
                fig.minutes(b) if b is not None else "not measured",
                fig.minutes(a) if a is not None else "not measured",
                change,
                "true cold start" + ("s" if a is not None else "") + ", page cache dropped",
                f"({fig.seconds(b)})" if b is not None else "",
                f"({fig.seconds(a)})" if a is not None else "",
                change_sub,
                change_third=change_third,
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


def summary_notes(findings: Mapping[str, Any]) -> list[str]:
    """What the summary table's figures need said beside them: where the after figures
    come from when the tuned configuration was not measured, and the one-time compile of
    a kept JIT cache."""
    notes: list[str] = []
    after = after_of(findings)
    if after.source == SEARCH:
        notes.append(SEARCH_NOTE)
    cold = findings.get("cold_start")
    if present(cold):
        first = as_number(cold.get("after_first_boot_s"))
        if first is not None:
            notes.append(
                f"The first start after the change compiles the kernels once into the kept cache "
                f"({fig.minutes(first)}, {fig.seconds(first)}); the cold start above is every start after it."
            )
    return notes


def stage_lab_seconds(job: Mapping[str, Any], name: str) -> float | None:
    """A stage's lab seconds as the job recorded them (`job.stages[].lab_seconds`)."""
    for stage in job.get("stages") or []:
        if isinstance(stage, Mapping) and stage.get("name") == name:
            return as_number(stage.get("lab_seconds"))
    return None


def rest_notes(findings: Mapping[str, Any], number: str) -> list[str]:
    """One sentence under the summary table on the distance left, pointing to where the
    measured step is split (the figures are the measure stage's, printed as in that section)."""
    explain = (findings.get("measurement") or {}).get("explain")
    if not number or not isinstance(explain, Mapping):
        return []
    said = []
    for workload in workloads_in({k: {"mean_tps": 0} for k, v in explain.items()
                                  if isinstance(v, Mapping) and "parts" in v}):
        entry = explain[workload]
        bound = entry.get("to_bound") or {}
        baseline = entry.get("to_baseline") or {}
        if as_number(bound.get("share")) is None:
            continue
        text = f"{workload} {fig.percent(float(bound['share']))} of the hardware's bound"
        if as_number(baseline.get("share")) is not None:
            text += f" and {fig.percent(float(baseline['share']))} of the lab's baseline"
        said.append(text)
    if not said:
        return []
    whose = "With our changes" if explain.get("configuration") == "tuned" else "As it stands"
    return [f"{whose}, the decode rate reaches " + "; ".join(said)
            + f". Section {number} splits each measured step into its parts, to show where the rest goes."]


def headline(findings: Mapping[str, Any], lab: str, money: MoneyBackDecision) -> list[str]:
    """The opening paragraphs of the summary, built only from what was measured."""
    found = [f for f in findings.get("findings") or [] if isinstance(f, Mapping)]
    # A metrics finding without an impact corrects how throughput is counted; it changes
    # nothing about the serving, so it is not "standing between" the customer and anything.
    corrections = [f for f in found if str(f.get("code") or "").startswith("metrics.") and not impacts_of(f)]
    serving = [f for f in found if f not in corrections]
    on_lab = lab[0].lower() + lab[1:]
    paras = []
    if serving:
        text = (
            f"We reproduced your configuration on our {on_lab} and found {len(serving)} "
            f"thing{'s' if len(serving) != 1 else ''} standing between it and the numbers this hardware "
            "delivers. Each is described in section 2, the largest measured effect first, with the evidence "
            "that decided it, the exact change, and the change's measured effect."
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
    after = after_of(findings)
    for workload in workloads_in(findings.get("measurement"), after.workloads):
        before, block_after = _decode_before(findings, workload), _decode_after(after, workload)
        b = as_number(before.get("mean_tps")) if before else None
        a = as_number(block_after.get("mean_tps")) if block_after else None
        if a is not None and b is not None:
            _, _, noise = decode_change(findings, after, workload, b, a)
            gains.append(
                f"single-stream decode on {workload} goes from {fig.tps(b)} to {fig.tps(a)} tok/s"
                + (" (a difference within noise)" if noise else "")
            )
    cold = day_cold_start(findings)
    if cold is not None and cold.before_s is not None and cold.after_s is not None:
        gains.append(f"a cold start falls from {fig.minutes(cold.before_s)} to {fig.minutes(cold.after_s)}")
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
        lead = "With the changes in this report, measured together"
        if after.source == SEARCH:
            lead = "With the changes in this report (decode rates from the speculative search alone)"
        paras.append(f"{lead}, {text}.")
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


def stopped_early(job: Mapping[str, Any]) -> str:
    """A sentence saying that the diagnostic stopped before some stages, and why ("" when
    every stage ran). The job records skipped stages as cancelled, "not run: <reason>"."""
    skipped = [
        s
        for s in job.get("stages") or []
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
        cold_start_section(findings.get("cold_start"), figures, "3.1"),
        fp4_section(findings.get("fp4"), "3.2"),
        speculative_section(findings.get("speculative"), config, figures, "3.3"),
        throughput_section(findings, figures, "3.4"),
    ]
    # The gap stage's section and the split of the step appear when their stages wrote them;
    # a day from before them keeps its four sections as they were.
    if "gap" in findings:
        stages.append(gap_section(findings.get("gap"), f"3.{len(stages) + 1}", stage_lab_seconds(job, "gap")))
    if present((findings.get("measurement") or {}).get("explain")):
        stages.append(rest_section(findings, f"3.{len(stages) + 1}"))
    stage_titles = {s.anchor: (s.anchor, f"{s.number} {s.title}") for s in stages if s.ran}
    rest_number = next((s.number for s in stages if s.anchor == "rest" and s.ran), "")
    found = by_impact([f for f in findings.get("findings") or [] if isinstance(f, Mapping)])
    described = cause_descriptions(findings.get("measurement"))
    fp4 = findings.get("fp4")
    speed_cost = fp4.get("speed_cost") if isinstance(fp4, Mapping) else None
    sources = impact_sources(findings)
    finding_sections = [
        build_finding(
            i,
            f,
            stage_titles,
            described_causes=described,
            speed_cost=speed_cost if isinstance(speed_cost, Mapping) else None,
            impact_sources=sources,
        )
        for i, f in enumerate(found, start=1)
    ]
    numbers: dict[str, list[str]] = {}
    for section in finding_sections:
        numbers.setdefault(section.code, []).append(section.number)
    # Appendices that have nothing to show are left out; the others are lettered in order.
    drafts = [
        methodology_appendix(findings, ""),
        tuned_configuration_appendix(findings, "", {code: ", ".join(n) for code, n in numbers.items()}),
        lab_time_appendix(findings, ""),
        raw_runs_appendix(findings, ""),
    ]
    appendices = [
        dataclasses.replace(a, number=chr(ord("A") + i))
        for i, a in enumerate(d for d in drafts if d is not None)
    ]

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
        summary_notes=summary_notes(findings) + rest_notes(findings, rest_number),
        changes=summary_changes(
            summary_change_rows(findings, {code: ", ".join(n) for code, n in numbers.items()})
        ),
        findings_order=ORDER_NOTE if len(finding_sections) > 1 else "",
        money_back=money_back_view(money_back, tz),
        findings=finding_sections,
        stages=stages,
        appendices=appendices,
        notices=notices,
    )
