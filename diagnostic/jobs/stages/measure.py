"""The measure stage: delivered throughput of the customer's configuration and, when the
earlier stages proved changes, of the tuned configuration, with the same protocol
(METHODOLOGY.md, "Measurement" and "The day as a whole").

The customer's configuration is measured first (started again warm when something else is
serving), then the tuned one from a true cold start, whose seconds become
`cold_start.after_s`. Each workload's difference gets Welch's 95 % interval; both
configurations are also set against their memory roofline.
"""

from __future__ import annotations

from typing import Any

from diagnostic.jobs.context import StageContext
from diagnostic.jobs.registry import register_stage
from diagnostic.jobs.stages.serving import ensure_serving
from diagnostic.pipelines.measure.protocol import measure_on_session
from diagnostic.pipelines.roofline import fraction_of_bound, roofline
from diagnostic.pipelines.stats import compare, welch
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
    customer = ctx.customer_config
    tuned = ctx.config
    workloads = tuple(customer["workloads"])
    changed = launch_view(tuned) != launch_view(customer)

    ensure_serving(ctx, customer)
    ctx.progress(5, "measuring the customer's configuration: delivered tokens, single stream")
    section = _measure(ctx, customer, CUSTOMER, workloads)
    ctx.add_findings(section.pop("findings", []))
    ctx.check_cancelled()
    facts = ctx.session.facts()
    bounds = {CUSTOMER: _roofline(customer, facts, section, workloads)}
    sections: dict[str, Any] = {}
    if changed:
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
        for _ in range(TUNED_COLD_STARTS - 1):
            ctx.check_cancelled()
            again = ctx.session.launch(tuned, cold=True, timeout_s=COLD_START_TIMEOUT_LAB_S)
            after_samples.append(again.cold_start_s)
            ctx.log(f"tuned configuration: another true cold start, {again.cold_start_s:.1f} lab s")
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
        bounds[TUNED] = _roofline(tuned, facts, after, workloads)
        # Merged into the triage stage's cold_start section (findings.build_findings).
        sections["cold_start"] = {
            "_merge": True,
            "after_s": round(sum(after_samples) / len(after_samples), 3),
            "after_samples_s": after_samples,
            "after_source": f"measure: the tuned configuration's true cold starts (n = {len(after_samples)})",
            **({"after_first_boot_s": first_boot} if first_boot is not None else {}),
        }
        before_samples = customer_cold_starts(ctx)
        if len(before_samples) > 1 and len(after_samples) > 1:
            test = welch(after_samples, before_samples)
            sections["cold_start"]["difference"] = {
                "metric": "cold_start_s", "better": "lower",
                "before": round(sum(before_samples) / len(before_samples), 3),
                "after": round(sum(after_samples) / len(after_samples), 3),
                "diff": round(float(test["diff"]), 3),
                "ci95": [round(float(v), 3) for v in test["ci95"]],
                "p": float(test["p"]), "different": bool(test["different"]),
                "n": [len(before_samples), len(after_samples)],
                "test": "Welch's unequal-variance t-test, two-sided, alpha 0.05",
            }
        for w, diff in section["difference"].items():
            lo, hi = diff["ci95"]
            ctx.log(f"{w}: {diff['before']:.2f} -> {diff['after']:.2f} tok/s, difference "
                    f"{diff['diff']:+.2f} [{lo:+.2f}, {hi:+.2f}], p = {diff['p']:.3g}")
    section["roofline"] = bounds
    sections["measurement"] = section
    ctx.progress(100, "measured" + (" before and after" if changed else ""))
    return {"sections": sections, "tuned_measured": changed}


def customer_cold_starts(ctx: StageContext) -> list[float]:
    """The customer's true cold starts, as the triage (or, without it, reproduce) measured them."""
    triage = ctx.earlier_result("triage") or {}
    for step in ((triage.get("sections") or {}).get("cold_start") or {}).get("waterfall") or []:
        if step.get("mode") == "baseline" and step.get("samples_s"):
            return [float(v) for v in step["samples_s"]]
    reproduce = ctx.earlier_result("reproduce") or {}
    return [float(reproduce["cold_start_s"])] if reproduce.get("cold_start_s") is not None else []


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
        workloads=workloads,
        progress=lambda msg: ctx.log(f"{label}: {msg}"),
    )
    ctx.check_cancelled()
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
    """Tokens emitted per verify step, from the engine's spec-decode counters over the runs:
    1 + k × accepted / drafted (each step drafts k). None without speculation or counters."""
    spec = config.get("speculative")
    if not spec:
        return None
    claim = workload.get("server_claim") or {}
    for source in ("metrics", "log"):
        counters = claim.get(source) or {}
        accepted, drafted = counters.get("accepted"), counters.get("drafted")
        if accepted is not None and drafted:
            return 1.0 + int(spec["num_speculative_tokens"]) * float(accepted) / float(drafted)
    return None


def _roofline(
    config: dict[str, Any], facts: dict[str, Any], section: dict[str, Any], workloads: tuple[str, ...]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for w in workloads:
        summary = section.get(w) or {}
        bound = roofline(config, facts, mean_acceptance_length=mean_acceptance_length(config, summary))
        bound["fraction"] = fraction_of_bound(summary.get("mean_tps"), bound)
        out[w] = bound
    return out


register_stage("measure", run)
