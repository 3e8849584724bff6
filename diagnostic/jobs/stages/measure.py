"""The measure stage: delivered throughput of the customer's configuration and, when the
earlier stages proved changes, of the tuned configuration, with the same protocol
(METHODOLOGY.md, "Measurement" and "The day as a whole").

The customer's configuration is measured first: reproduce measures it with this protocol
where it serves after its true cold start, and this stage records that measurement (or,
without one, starts the configuration again warm and measures it here); then the tuned one
from a true cold start, whose seconds become `cold_start.after_s`. Each workload's
difference gets Welch's 95 % interval; both configurations are also set against their
memory roofline.

The day's cold-start change needs samples on both sides. The tuned configuration is started
cold once here (it must be started to be measured anyway); its second sample is the triage's
final step when that step started the same configuration as far as a start goes: the same
loader, JIT cache and NCCL settings, the same speculative method and draft model. The FP4
backend and the draft length may differ (they change no byte read and, once the kept cache
holds the backend's kernels, which this start's own log shows, no compile). Otherwise the
tuned configuration is started cold a second time. The section names where each sample
came from.
"""

from __future__ import annotations

import copy
from typing import Any

from diagnostic.jobs.registry import register_stage
from diagnostic.jobs.stage_context import StageContext
from diagnostic.jobs.stages.ensure_serving import ensure_serving
from diagnostic.pipelines.changes import apply_changes
from diagnostic.pipelines.explain import distance, explain_step
from diagnostic.pipelines.fp4.backends import PIN_ENV
from diagnostic.pipelines.measure.protocol import measure_on_session
from diagnostic.pipelines.roofline import fraction_of_bound, roofline, served_profile
from diagnostic.pipelines.stats import compare, t_interval, welch
from diagnostic.pipelines.triage import section as triage_section
from lab.catalog import Catalog
from lab.engines import launch_view, parse_log

CUSTOMER = "customer"
TUNED = "tuned"
COLD_START_TIMEOUT_LAB_S = 3600.0
# True cold starts of the tuned configuration: two give the day's cold-start change an
# interval against the customer's two (triage), for little lab time once it starts fast.
TUNED_COLD_STARTS = 2
# vLLM's line when its torch.compile cache held the graphs ("Directly load the compiled
# graph(s) for dynamic shape from the cache, took 4.0 s", vllm/compilation/backends.py).
CACHE_HIT = "Directly load the compiled graph"


def run(ctx: StageContext) -> dict[str, Any]:
    customer = customer_as_run(ctx)
    tuned = ctx.config
    workloads = tuple(customer["workloads"])
    changed = launch_view(tuned) != launch_view(customer)

    early = (ctx.earlier_result("reproduce") or {}).get("customer_measurement")
    if isinstance(early, dict) and isinstance(early.get("section"), dict):
        # Reproduce measured it with this protocol where it served after its true cold start.
        ctx.log("customer's configuration: measured by reproduce, right after its true cold start, "
                "with this stage's protocol")
        section = _record(ctx, copy.deepcopy(early["section"]), CUSTOMER, workloads)
        section["customer_measured"] = "reproduce: right after the configuration's true cold start"
    else:
        ensure_serving(ctx, customer)
        ctx.progress(5, "measuring the customer's configuration: delivered tokens, single stream")
        section = _measure(ctx, customer, CUSTOMER, workloads)
        section["customer_measured"] = "measure: after a start of the configuration"
    ctx.add_findings(section.pop("findings", []))
    ctx.check_cancelled()
    facts = ctx.session.facts()
    bounds = {CUSTOMER: _roofline(customer, facts, section, workloads, ctx.catalog)}
    sections: dict[str, Any] = {}
    if changed:
        after_samples, after_source, first_boot = _tuned_cold_starts(ctx, tuned)
        ctx.check_cancelled()
        ctx.progress(60, "measuring the tuned configuration")
        after = _measure(ctx, tuned, TUNED, workloads)
        after.pop("findings", None)
        section["tuned"] = {w: after[w] for w in workloads if w in after}
        section["tuned_server_claimed_tps"] = after.get("server_claimed_tps")
        section["tuned_reconciliation"] = after.get("reconciliation")
        section["difference"] = {
            w: _difference(section[w], after[w]) for w in workloads
            if section[w].get("ci95") is not None and after.get(w, {}).get("ci95") is not None
        }
        bounds[TUNED] = _roofline(tuned, facts, after, workloads, ctx.catalog)
        # Merged into the triage stage's cold_start section (findings.build_findings).
        sections["cold_start"] = _cold_start_after(ctx, after_samples, after_source, first_boot)
        for w, diff in section["difference"].items():
            lo, hi = diff["ci95"]
            ctx.log(f"{w}: {diff['before']:.2f} -> {diff['after']:.2f} tok/s, difference "
                    f"{diff['diff']:+.2f} [{lo:+.2f}, {hi:+.2f}], p = {diff['p']:.3g}")
    section["roofline"] = bounds
    explained_config, explained_side = (tuned, TUNED) if changed else (customer, CUSTOMER)
    explained_rates = section["tuned"] if changed else section
    section["explain"] = explain_rest(ctx, explained_config, explained_side, explained_rates,
                                      bounds[explained_side], facts, workloads)
    sections["measurement"] = section
    ctx.progress(100, "measured" + (" before and after" if changed else ""))
    return {"sections": sections, "tuned_measured": changed}


def _tuned_cold_starts(ctx: StageContext, tuned: dict[str, Any]) -> tuple[list[float], str, float | None]:
    """The tuned configuration's true cold starts as its users will see them, where they come
    from, and the first start that filled a kept JIT cache (None when none did)."""
    ctx.progress(50, "starting the tuned configuration with cold caches")
    launched = ctx.session.launch(tuned, cold=True, timeout_s=COLD_START_TIMEOUT_LAB_S)
    first_boot = None
    if tuned["serving"]["jit_cache"] == "persisted" and compiled_kernels(ctx, tuned):
        # A kept JIT cache compiles once on a fresh lab; its users see the starts after
        # that one (METHODOLOGY.md, "As users see it"): start it cold once more.
        first_boot = launched.cold_start_s
        ctx.log(f"the first start compiled the kernels into the kept cache ({first_boot:.1f} lab s); "
                "starting it cold once more, as its users will")
        launched = ctx.session.launch(tuned, cold=True, timeout_s=COLD_START_TIMEOUT_LAB_S)
    ctx.log(f"tuned configuration serving after a true cold start of {launched.cold_start_s:.1f} lab s")
    after_samples = [launched.cold_start_s]
    borrowed = triage_after_samples(ctx, tuned)
    after_source = f"measure: the tuned configuration's true cold start (n = {len(after_samples)})"
    if borrowed and len(after_samples) + len(borrowed) >= TUNED_COLD_STARTS:
        after_samples += borrowed
        after_source += (f", and the triage's final step (n = {len(borrowed)}): the same loader, "
                         "JIT cache, NCCL settings and speculative method; only the FP4 backend or the "
                         "draft length differ, which change nothing a start reads or, with the "
                         "kernels in the kept cache, compiles")
        ctx.log("tuned configuration: the triage's final step started the same configuration as far as a "
                f"start goes; its {len(borrowed)} true cold start(s) "
                f"({', '.join(f'{v:.1f}' for v in borrowed)} lab s) are the other sample(s)")
    for _ in range(TUNED_COLD_STARTS - len(after_samples)):
        ctx.check_cancelled()
        again = ctx.session.launch(tuned, cold=True, timeout_s=COLD_START_TIMEOUT_LAB_S)
        after_samples.append(again.cold_start_s)
        ctx.log(f"tuned configuration: another true cold start, {again.cold_start_s:.1f} lab s")
    if not borrowed or len(after_samples) > 1 + len(borrowed):
        after_source = f"measure: the tuned configuration's true cold starts (n = {len(after_samples)})"
    return after_samples, after_source, first_boot


def _cold_start_after(ctx: StageContext, after_samples: list[float], after_source: str,
                      first_boot: float | None) -> dict[str, Any]:
    """The cold start after tuning, for the triage's cold_start section, with its difference
    from the customer's true cold starts."""
    cold_start: dict[str, Any] = {
        "_merge": True,
        "after_s": round(sum(after_samples) / len(after_samples), 3),
        "after_samples_s": after_samples,
        # The interval of the same samples, so that the day's after and its interval are
        # one measurement wherever the report prints them (the triage's was of its own step).
        "after_ci95": _rounded_interval(after_samples),
        "after_source": after_source,
        **({"after_first_boot_s": first_boot} if first_boot is not None else {}),
    }
    before_samples = customer_cold_starts(ctx)
    if len(before_samples) > 1 and len(after_samples) > 1:
        test = welch(after_samples, before_samples)
        cold_start["difference"] = {
            "metric": "cold_start_s", "better": "lower",
            "before": round(sum(before_samples) / len(before_samples), 3),
            "after": round(sum(after_samples) / len(after_samples), 3),
            "diff": round(float(test["diff"]), 3),
            "ci95": [round(float(v), 3) for v in test["ci95"]],
            "p": float(test["p"]), "different": bool(test["different"]),
            "n": [len(before_samples), len(after_samples)],
            "test": "Welch's unequal-variance t-test, two-sided, alpha 0.05",
        }
    return cold_start


# What may differ between two configurations whose cold starts count as samples of one:
# the FP4 backend's fields and pins, and the draft length of the same speculative method.
FP4_FIELDS = ("moe_backend", "linear_backend")


def _rounded_interval(samples: list[float]) -> list[float] | None:
    """Student-t 95 % interval of the samples' mean to 0.1 s, None below two samples."""
    ci = t_interval(samples)
    return [round(ci[0], 1), round(ci[1], 1)] if ci else None


def start_view(config: dict[str, Any]) -> dict[str, Any]:
    """`config` as far as a start goes (what it reads, compiles and waits for): without the
    FP4 backend selection and the draft length, and without what no start reads."""
    view = copy.deepcopy(config)
    for name in FP4_FIELDS:
        (view.get("serving") or {}).pop(name, None)
    for name in PIN_ENV:
        (view.get("env") or {}).pop(name, None)
    if isinstance(view.get("speculative"), dict):
        view["speculative"].pop("num_speculative_tokens", None)
    for key in ("workloads", "reported"):
        view.pop(key, None)
    return view


def triage_after_samples(ctx: StageContext, tuned: dict[str, Any]) -> list[float]:
    """The true cold starts of the triage's final step (every proved load change together),
    when that configuration starts like `tuned`; [] otherwise (no triage, nothing proved,
    or a change since then that a start would feel)."""
    triage = ctx.earlier_result("triage") or {}
    section = triage_section.ColdStartSection(triage)
    samples = section.after_samples()
    if not section.proved or not samples:
        return []
    config = apply_changes(customer_as_run(ctx), triage.get("config_changes") or [])
    if start_view(config) != start_view(tuned):
        ctx.log("tuned configuration: it starts differently from the triage's final step "
                "(a change since then that a start feels); its cold starts are measured here")
        return []
    return samples


def customer_as_run(ctx: StageContext) -> dict[str, Any]:
    """The customer's configuration as the lab could run it: as submitted, or with the
    length that fits when its KV cache did not (reproduce's change, load.kv_budget)."""
    reproduce = ctx.earlier_result("reproduce") or {}
    fitted = reproduce.get("config_changes") or []
    return apply_changes(ctx.customer_config, fitted) if fitted else ctx.customer_config


def customer_cold_starts(ctx: StageContext) -> list[float]:
    """The customer's true cold starts, as the triage (or, without it, reproduce) measured them."""
    return triage_section.customer_cold_starts(ctx.earlier_result("triage"), ctx.earlier_result("reproduce"))


def compiled_kernels(ctx: StageContext, config: dict[str, Any]) -> bool:
    """Did the start that just finished compile its kernels (rather than load them from the
    kept cache)? From the engine's own log: a compile phase without a cache hit."""
    if config["engine"]["name"] != "vllm":
        # SGLang logs no cache hit we know of: take the start as its users see it.
        return False
    text = ctx.session.logs().text
    compiled = any(e["kind"] == "compile" for e in parse_log("vllm", text.splitlines()))
    # vLLM says when it loads compiled graphs from its cache instead of compiling them.
    return compiled and CACHE_HIT not in text


def _measure(
    ctx: StageContext, config: dict[str, Any], label: str, workloads: tuple[str, ...]
) -> dict[str, Any]:
    section = measure_on_session(
        ctx.session,
        engine=config["engine"]["name"],
        version=config["engine"].get("version"),
        workloads=workloads,
        progress=lambda msg: ctx.log(f"{label}: {msg}"),
    )
    ctx.check_cancelled()
    return _record(ctx, section, label, workloads)


def _record(
    ctx: StageContext, section: dict[str, Any], label: str, workloads: tuple[str, ...]
) -> dict[str, Any]:
    """The measurements of `section` (measure_on_session's) on the StageContext, and a
    finding for a workload without an interval."""
    for workload in workloads:
        summary = section[workload]
        if summary.get("ci95") is None:
            # Fewer than two runs gave a decode rate (failed or abandoned requests): there is
            # no interval to report, and a figure without one is not a measurement.
            ctx.add_finding(
                "measure.too_few_runs",
                f"Only {summary.get('n', 0)} {workload} run(s) of the {label} configuration gave a "
                "decode rate; no interval",
                evidence={"workload": workload, "configuration": label, "n": summary.get("n", 0),
                          "warnings": section.get("warnings", [])},
            )
            continue
        ctx.add_measurement(
            workload=workload,
            configuration=label,
            n=int(summary["n"]),
            mean_tps=float(summary["mean_tps"]),
            ci95=(float(summary["ci95"][0]), float(summary["ci95"][1])),
            ttft_s=summary.get("ttft_s"),
            samples=list(summary["runs"]),
        )
    return section


def _difference(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Tuned minus customer for one workload: Welch's test and the interval of the difference."""
    test = compare(before, after)
    return {
        "metric": "decode_tps",
        "before": before["mean_tps"],
        "after": after["mean_tps"],
        "diff": round(float(test["diff"]), 6),
        "ci95": [round(float(v), 6) for v in test["ci95"]],
        "p": float(test["p"]),
        "different": bool(test["different"]),
        "test": "Welch's unequal-variance t-test, two-sided, alpha 0.05",
    }


def mean_acceptance_length(config: dict[str, Any], workload: dict[str, Any]) -> float | None:
    """Tokens emitted per verify step, as the engine says over the runs (the measurement's
    `draft_acceptance`): vLLM's 1 + accepted / drafts (spec_decode_num_drafts_total; a draft
    may propose fewer than k tokens, so drafted / k is not the number of drafts), SGLang's
    `accept len`. None without speculation or without the engine's word on it."""
    if not config.get("speculative"):
        return None
    acceptance = workload.get("draft_acceptance") or {}
    mean = acceptance.get("mean_acceptance_length")
    return float(mean) if mean is not None else None


def _roofline(
    config: dict[str, Any], facts: dict[str, Any], section: dict[str, Any], workloads: tuple[str, ...],
    catalog: Catalog,
) -> dict[str, Any]:
    """The memory bound per workload, the model's sizes from the lab's catalog entry."""
    out: dict[str, Any] = {}
    for w in workloads:
        summary = section.get(w) or {}
        bound = roofline(config, facts, catalog=catalog,
                         mean_acceptance_length=mean_acceptance_length(config, summary))
        bound["fraction"] = fraction_of_bound(summary.get("mean_tps"), bound)
        out[w] = bound
    return out


def _no_spec_rates(ctx: StageContext) -> tuple[dict[str, float], str]:
    """The speculative search's measured rates without speculation, per workload, when they
    are rates of the configuration measured here but for its speculation: no stage after
    the search changed anything a step feels ({} and why not otherwise)."""
    specdec = ctx.earlier_result("specdec") or {}
    none = ((specdec.get("sections") or {}).get("speculative") or {}).get("none") or {}
    gap_changes = (ctx.earlier_result("gap") or {}).get("config_changes") or []
    if gap_changes:
        return {}, "the gap stage changed the configuration after the speculative search measured it"
    rates = {str(w): float(b["mean_tps"]) for w, b in none.items()
             if isinstance(b, dict) and b.get("mean_tps") is not None}
    runs = {str(w): b.get("n") for w, b in none.items()
            if isinstance(b, dict) and b.get("mean_tps") is not None}
    return rates, ("the speculative search's runs without speculation (" +
                   ", ".join(f"{w} n = {n}" for w, n in runs.items()) + ")" if rates else
                   "the speculative search measured no rate without speculation")


def explain_rest(ctx: StageContext, config: dict[str, Any], side: str, rates: dict[str, Any],
                 bounds: dict[str, Any], facts: dict[str, Any], workloads: tuple[str, ...]) -> dict[str, Any]:
    """Where the rest goes, per workload (diagnostic.pipelines.explain): the measured step
    split into its parts, beside the distance to the roofline bound and to the lab's
    baseline (the gap stage's section, when it ran). The weights are read at the memory
    bandwidth preflight measured (its `memory_bandwidth`, kept here with its raw samples
    for the report), or at the specified peak without one. Only this day's measurements,
    the lab's facts and its catalogs go in."""
    profile, why = served_profile(config, ctx.catalog)
    measured_bw = (ctx.earlier_result("preflight") or {}).get("memory_bandwidth")
    if not isinstance(measured_bw, dict):
        measured_bw = {"unavailable": "preflight did not run the memory bandwidth probe on this day"}
    no_spec, no_spec_source = _no_spec_rates(ctx)
    gap = ((ctx.earlier_result("gap") or {}).get("sections") or {}).get("gap") or {}
    baseline = gap.get("baseline") if isinstance(gap, dict) else None
    base_rates = (baseline or {}).get("rates") or {}
    spec = config.get("speculative") or {}
    named = None
    if baseline:
        version = f"v{baseline['version']}" if baseline.get("version") else None
        named = " ".join(str(p) for p in (baseline.get("source"), "baseline", version) if p)
    out: dict[str, Any] = {"configuration": side, "no_spec_source": no_spec_source,
                           "baseline_source": named, "memory_bandwidth": measured_bw,
                           **({"profile_missing": why} if profile is None else {})}
    for w in workloads:
        summary = rates.get(w) or {}
        mean = summary.get("mean_tps")
        if mean is None:
            continue
        entry = explain_step(float(mean), acceptance_len=mean_acceptance_length(config, summary),
                             k=spec.get("num_speculative_tokens"), profile=profile, nodes_facts=facts,
                             config=config, no_spec_tps=no_spec.get(w), measured_bw=measured_bw)
        entry["to_bound"] = distance(float(mean), (bounds.get(w) or {}).get("bound_tps"))
        base = base_rates.get(w) if isinstance(base_rates, dict) else None
        entry["to_baseline"] = distance(float(mean), (base or {}).get("mean_tps")) if base else None
        out[w] = entry
        ctx.log(f"{w}: step {entry['step_ms']:.1f} ms = " + " + ".join(
            f"{p['part']} {p['ms']:.1f} ({p['kind']})" for p in entry["parts"]))
    return out


register_stage("measure", run)
