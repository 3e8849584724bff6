"""Reproduce: start the customer's configuration on the lab exactly as given, from cold,
and keep what the start looked like.

The context is a requirement (METHODOLOGY.md): the model's native context, unless the
customer stated less (`requirements.max_context`), is what the configuration should hold
(diagnostic.pipelines.native_context). A configuration whose KV cache cannot hold one request of its
max_model_len fails to start; from the engine's own figures and the nodes' memory the stage
then looks for the memory settings that hold the target (an fp8 KV cache, a higher
gpu_memory_utilization within what the node allows) and proves them: that configuration is
started cold, and serves one request of the whole length, and its start is the one kept
(finding context.native, the change in config_changes). Only when nothing fits (or the proof
fails) is the context shortened to the length the engine named (load.kv_budget, which then
says what would fit: nodes, weights a node), started cold again, and that start kept. A
configuration that starts below its target while the engine's own KV capacity (or settings
it predicts) would hold the target gets context.native too, proved the same way after the
customer's start and measurement; one at its target costs nothing more.

Cold means cold (METHODOLOGY.md): the session stops every engine and drops the page
cache before launching, and the telemetry sampler runs from before the launch, so the
loading triage can read the whole cold start from this stage's result.

On a day whose later stages would replace the engine before the measure stage, the
customer's configuration is then measured where it serves, with the measure stage's own
protocol (two warm-ups, n = 15 per workload, the same prompt sets): it is serving right
after a true cold start, and starting it again later would cost a start that compiles its
kernels and waits at the rendezvous again (minutes of lab time on the reference lab). The
measure stage records that measurement; when it is missing or incomplete (an engine that
stopped answering), the measure stage measures the configuration itself.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

from diagnostic.jobs.faults import LabFault
from diagnostic.jobs.stage_context import StageContext, StopJob
from diagnostic.pipelines import changes
from diagnostic.pipelines.changes import apply_changes
from diagnostic.pipelines.client import EndpointError, session_api_key
from diagnostic.pipelines.measure.protocol import MeasurementError, measure_on_session
from diagnostic.pipelines.native_context import (
    PROOF_MIN_WALL_S,
    PROOF_TIMEOUT_LAB_S,
    EngineKv,
    capacity_lines,
    context_target,
    kv_from_log,
    kv_from_refusal,
    logged_weights_gib,
    native_request,
    node_memory,
    plan_fit,
    profile_weights_gib,
    settings_words,
    would_fit_words,
)
from diagnostic.pipelines.triage.coldstart import launch_offsets
from lab.engines import parse_log
from lab.engines.base import argument_refusal
from lab.engines.logs import crash_family
from lab.session import LabError, LabSession, LaunchFailed, LaunchResult, shown_spec

# Lab seconds a cold start may take before it counts as hung: the reference lab's
# worst published cold start is well under half of this.
LAUNCH_TIMEOUT_LAB_S = 3600.0
# Per node, about fifteen minutes of 1 Hz samples; longer series are thinned evenly.
MAX_SAMPLES_PER_NODE = 900
LOG_TAIL_CHARS = 64 * 1024
CRASH_TAIL_CHARS = 4000


# What the engine's kv_budget event (lab.engines, parse_log) carries into the finding.
KV_BUDGET_FIELDS = ("max_model_len", "kv_needed_gib", "kv_available_gib", "estimated_max_model_len")


def kv_budget_evidence(log_tail: str, engine: str = "vllm") -> dict[str, Any] | None:
    """What the engine said when the KV cache could not hold one request of max_model_len:
    the configured length, the memory needed and available, and the longest that fits
    (the figures its wording gives), read by the engines' log parser."""
    # The last one: a log that holds an earlier start's refusal too ends with this start's.
    for event in reversed(list(parse_log(engine, log_tail.splitlines()))):
        if event["kind"] == "kv_budget":
            return {k: event[k] for k in KV_BUDGET_FIELDS if event.get(k) is not None}
    return None


def thin_samples(samples: list[dict[str, Any]], limit: int) -> tuple[list[dict[str, Any]], int]:
    """Every k-th sample so that at most `limit` remain (always keeping the last), and k."""
    if len(samples) <= limit:
        return samples, 1
    stride = math.ceil(len(samples) / limit)
    kept = samples[::stride]
    if kept[-1] is not samples[-1]:
        kept = [*kept[: limit - 1], samples[-1]]
    return kept, stride


def run(ctx: StageContext) -> dict[str, Any]:
    session = ctx.session
    config = ctx.config

    ctx.progress(2, "pushing the node agent")
    session.push_agent()
    ctx.check_cancelled()

    ctx.progress(8, "starting the telemetry sampler")
    session.start_sampler()
    sampler_from = session.clock.now()
    ctx.check_cancelled()

    ctx.progress(10, "launching the customer's configuration with cold caches")
    config_changes: list[dict[str, Any]] = []
    context: dict[str, Any] = {}
    refused = False
    evidence = _launch_marks(session, config)
    try:
        launched = session.launch(config, cold=True, timeout_s=LAUNCH_TIMEOUT_LAB_S)
    except LaunchFailed as exc:
        if _a_crash(exc, str(config["engine"]["name"])):
            launched, evidence, sampler_from = _start_after_crash(ctx, config, exc)
        else:
            refused = True
            launched, evidence, sampler_from, config, config_changes, context = _start_with_fixes(
                ctx, config, exc, sampler_from)

    ctx.log(f"serving at {launched.endpoint} after {launched.cold_start_s:.1f} lab s")
    corrected = {node: c for node, c in launched.start_corrections_s.items() if abs(c) >= 1.0}
    if corrected:
        # The node's clock disagrees with the platform's; the cold start used the bounded time.
        ctx.log("node start times held inside their launch calls (clock skew?): "
                + ", ".join(f"{node} {c:+.3f} lab s" for node, c in sorted(corrected.items())))
    ctx.progress(80, f"serving after {launched.cold_start_s:.0f} lab s; collecting telemetry and logs")
    telemetry = _collect_telemetry(ctx, sampler_from)
    engine_log = session.logs()
    ctx.attach(f"engine log, {engine_log.node} ({engine_log.size} bytes)", engine_log.text,
               limit=LOG_TAIL_CHARS)

    measured = measure_customer(ctx, config) if measure_here(ctx) else None
    if not refused:
        # After the customer's start and measurement: a proof restarts the engine.
        more, context = native_context_check(ctx, config, engine_log.text)
        config_changes += more

    cold_start = {
        "before_s": launched.cold_start_s,
        # The loading triage fills these; reproduce only measures.
        "after_s": None,
        "root_causes": None,
        "phases": None,
    }
    ctx.progress(100, f"reproduced: cold start {launched.cold_start_s:.0f} lab s")
    return {
        "launched": True,
        "endpoint": launched.endpoint,
        "cold_start_s": launched.cold_start_s,
        "started_at": launched.started_at,
        "ready_at": launched.ready_at,
        "warm": launched.warm,
        # Per node, lab seconds added to the start it reported by its own clock (0 where
        # the clocks agree): a skewed clock shows here, not in cold_start_s.
        "start_corrections_s": launched.start_corrections_s,
        # Where each node's log ended and the lab time just before the launch: the loading
        # triage reads this start's evidence from exactly there, as it reads its own.
        **evidence,
        # As launched, with every secret masked: the session's specs already show the API
        # key's mask, not the engine key it uploaded (lab.session); masked again here so that
        # no stage result, staff page or findings document can ever hold one.
        "launch": [
            {k: spec.get(k) for k in ("node", "role", "rank", "argv", "env", "log_file")}
            for spec in map(shown_spec, launched.specs)
        ],
        "engine_log": {
            "node": engine_log.node,
            "path": engine_log.path,
            "size": engine_log.size,
            "tail": engine_log.text[-LOG_TAIL_CHARS:],
        },
        **telemetry,
        "customer_measurement": measured,
        # Memory settings that hold the target context (proved), or a length that fits when
        # nothing does: the day's other stages (and the tuned configuration) run with it.
        "config_changes": config_changes,
        # The target context, what the engine said of its KV cache, the fit and its proof
        # (diagnostic.pipelines.native_context); the gap section reports it.
        "context": context,
        "sections": {"cold_start": cold_start},
    }


def measure_here(ctx: StageContext) -> bool:
    """Whether to measure the customer's configuration here: only on a day that measures it,
    and only when a stage between this one and measure would replace the engine serving it
    (with none, measure finds it still serving and measures it there itself)."""
    plan = list(ctx.job.stage_runs.order_by("order").values_list("name", "order"))
    at = {name: order for name, order in plan}
    if "measure" not in at:
        return False
    return any(at[ctx.stage.name] < order < at["measure"] for _, order in plan)


def measure_customer(ctx: StageContext, config: dict[str, Any]) -> dict[str, Any] | None:
    """The measure stage's protocol on the configuration serving after this stage's cold start:
    {section, measured_at}, or None when it is not a whole measurement."""
    workloads = tuple(config["workloads"])
    ctx.progress(85, "measuring the customer's configuration where it serves (delivered tokens)")
    began = ctx.session.clock.now()
    try:
        section = measure_on_session(ctx.session, engine=str(config["engine"]["name"]),
                                     version=str(config["engine"]["version"]), workloads=workloads,
                                     progress=lambda msg: ctx.log(f"customer: {msg}"))
    except (MeasurementError, EndpointError, LabError) as exc:
        ctx.log(f"the customer's configuration was not measured here ({exc}); the measure stage will")
        return None
    short = [w for w in workloads
             if (section.get(w) or {}).get("ci95") is None
             or int((section.get(w) or {}).get("n") or 0) < int(section["protocol"]["n"])]
    if short:
        ctx.log(f"the measurement here is incomplete ({', '.join(short)}: fewer runs than the protocol's); "
                "the measure stage measures the configuration itself")
        return None
    spent = ctx.session.clock.now() - began
    ctx.log(f"customer's configuration measured where it serves ({spent:.0f} lab s)")
    return {"section": section, "measured_at": began}


def _start_failed(ctx: StageContext, config: dict[str, Any], exc: LaunchFailed, sampler_from: float, *,
                  retry: bool = False, reported: dict[str, Any] | None = None,
                  context: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a start that failed tells, as findings. A KV cache that cannot hold one request
    of max_model_len, with the length that would fit named by the engine, is the customer's
    to change: the finding carries the change, and the change is returned for the day to go
    on with. Anything else (or that length failing too) stops the job.

    `reported`: the failure was already logged and its telemetry collected (this is the
    telemetry); `context`: the search for memory settings that hold the target context,
    which found none (or whose proof failed): the finding says what would fit."""
    if reported is None:
        ctx.log(f"the engine did not start on {exc.node}: {exc.reason}")
        ctx.attach(f"engine log tail, {exc.node}", exc.log_tail)
        telemetry = _collect_telemetry(ctx, sampler_from)
    else:
        telemetry = reported
    engine = str(config["engine"]["name"])
    kv = kv_budget_evidence(exc.log_tail, engine)
    stopped = {"launched": False, "node": exc.node, "reason": exc.reason, **telemetry}
    if kv is not None and not retry:
        return _kv_refused(ctx, exc, kv, stopped, context)
    if kv is not None:
        _kv_refused_again(ctx, exc, kv, stopped)
    _refused_or_crashed(ctx, exc, engine, stopped)


def _kv_refused(ctx: StageContext, exc: LaunchFailed, kv: dict[str, Any], stopped: dict[str, Any],
                context: dict[str, Any] | None) -> dict[str, Any]:
    """The configuration itself does not fit: the customer's to change, not our lab. With the
    length the engine said fits, the change to it; without, the day stops."""
    fits = kv.get("estimated_max_model_len")
    change: dict[str, Any] = {
        "note": "Free memory for the KV cache instead, if the context length matters more: a "
        "higher serving.gpu_memory_utilization, an fp8 KV cache, or more nodes."
    }
    plan = (context or {}).get("plan") or {}
    would = plan.get("would_fit")
    target = int(((context or {}).get("target") or {}).get("target") or kv["max_model_len"])
    if would:
        change["note"] = would_fit_words(would, target)
    tried = (context or {}).get("tried")
    if tried:
        change["note"] = (f"Started with {settings_words(tried['settings'])} at {target:,} tokens, the "
                          f"engine did not serve that length ({tried['why']}).")
        again = tried.get("kv_budget") or {}
        fraction = tried["settings"].get("gpu_memory_utilization")
        if fraction is not None and again.get("kv_available_gib") == kv.get("kv_available_gib"):
            change["note"] += (
                f" A higher gpu_memory_utilization ({fraction:g}) gave the KV cache no more memory "
                f"({kv.get('kv_available_gib')} GiB at both fractions): something other than the "
                "fraction limits it on these nodes. Free the nodes' memory, or use more nodes.")
    if fits:
        change["config"] = {"serving.max_model_len": {"from": kv["max_model_len"], "to": fits}}
        change["note"] = (f"The rest of the day ran with serving.max_model_len {fits:,}, the longest the "
                          "engine said fits. " + change["note"])
    extra: dict[str, Any] = {}
    if context:
        extra["context"] = {k: context[k] for k in ("target", "plan", "tried") if k in context}
    ctx.add_finding(
        "load.kv_budget",
        f"The KV cache cannot hold one request of {kv['max_model_len']:,} tokens, so the engine "
        "refuses to start",
        evidence={"node": exc.node, **kv, **extra},
        change=change,
        blocking=not fits,
    )
    if fits:
        return changes.change("serving.max_model_len", kv["max_model_len"], fits,
                              finding="load.kv_budget",
                              why="the longest context whose KV cache fits, as the engine said")
    raise StopJob(
        f"reproduce: the configuration did not start on {exc.node}: its KV cache does not fit",
        stopped,
    ) from exc


def _kv_refused_again(ctx: StageContext, exc: LaunchFailed, kv: dict[str, Any],
                      stopped: dict[str, Any]) -> NoReturn:
    # The length the engine named did not fit either: nothing proved, the day stops here,
    # and the finding says so (the one the first refusal made).
    first = next((f for f in ctx.findings if f.code == "load.kv_budget"), None)
    if first is not None:
        first.blocking = True
        first.evidence["retry"] = {"node": exc.node, **kv}
        first.change["note"] = (
            f"A start with serving.max_model_len {kv['max_model_len']:,}, the engine's first estimate, "
            f"failed the same way (it then estimated {kv.get('estimated_max_model_len') or 0:,}). Free "
            "memory for the KV cache: a higher serving.gpu_memory_utilization, an fp8 KV cache, or more "
            "nodes; or a shorter context.")
    raise StopJob(
        f"reproduce: the configuration did not start on {exc.node}: its KV cache does not fit, even at "
        "the length the engine said fits",
        stopped,
    ) from exc


def _refused_or_crashed(
    ctx: StageContext, exc: LaunchFailed, engine: str, stopped: dict[str, Any]
) -> NoReturn:
    """A start that failed otherwise: the engine refused the arguments (the customer's), or
    it crashed (ours, unless shown to be the configuration's)."""
    refused = argument_refusal(exc.engine_error, exc.exit_code)
    if refused is not None:
        # The engine refused the configuration's arguments: the customer's configuration
        # (METHODOLOGY "Money back"), in the engine's own words, not a crash of our lab.
        ctx.add_finding(
            "config.engine_refused",
            f"The engine refused the configuration's arguments: {refused}",
            evidence={"node": exc.node, "engine_error": exc.engine_error, "exit_code": exc.exit_code,
                      "log_tail": exc.log_tail[-CRASH_TAIL_CHARS:]},
            change={"note": "Use only the arguments this engine version accepts (its own list is in "
                            "the error above)."},
            blocking=True,
        )
        raise StopJob(f"reproduce: the engine refused the configuration's arguments ({refused})",
                      stopped, side="customer") from exc
    ctx.add_finding(
        "lab.engine_crash",
        f"The engine did not start on {exc.node}: {exc.reason}",
        evidence={
            "node": exc.node,
            "reason": exc.reason,
            "engine_error": exc.engine_error,
            "exit_code": exc.exit_code,
            "log_tail": exc.log_tail[-CRASH_TAIL_CHARS:],
            # Each error the engine logged, a traceback as its final exception line.
            "error_lines": [
                event["message"] for event in parse_log(engine, exc.log_tail.splitlines())
                if event["kind"] == "error"
            ][-20:],
        },
        change={},
        blocking=True,
    )
    # A crash not shown to be the configuration's (the same crash twice on healthy nodes)
    # is ours: the money-back rule counts lab.engine_crash on our side.
    raise StopJob(
        f"reproduce: the configuration did not start on {exc.node} ({exc.reason})",
        stopped, side="lab",
    ) from exc


def _start_with_fixes(
    ctx: StageContext, config: dict[str, Any], exc: LaunchFailed, sampler_from: float
) -> tuple[LaunchResult, dict[str, Any], float, dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The context does not fit. First the memory settings that hold the target context,
    proved by a cold start that serves a request of that length (that start is the day's);
    when none fits, or the proof fails, the length the engine said would fit: the rest of
    the day runs on the configuration with that length (the customer's to accept or trade
    for memory), started cold again with a fresh telemetry record. Anything else stops the
    job."""
    session = ctx.session
    ctx.log(f"the engine did not start on {exc.node}: {exc.reason}")
    ctx.attach(f"engine log tail, {exc.node}", exc.log_tail)
    telemetry = _collect_telemetry(ctx, sampler_from)
    kv = kv_budget_evidence(exc.log_tail, str(config["engine"]["name"]))
    context: dict[str, Any] = {}
    if kv is not None:
        started, context = _fit_native_on_refusal(ctx, config, exc, kv)
        if started is not None:
            launched, evidence, sampler_from, fitted_config, changes = started
            return launched, evidence, sampler_from, fitted_config, changes, context
    fitted = _start_failed(ctx, config, exc, sampler_from, reported=telemetry, context=context)
    config_changes = [fitted]
    config = apply_changes(config, config_changes)
    ctx.log(f"starting the configuration again, cold, with serving.max_model_len {fitted['to']:,}")
    ctx.progress(30, "launching the configuration with the length that fits, cold caches")
    sampler_from, evidence = _fresh_record(session, config)
    try:
        launched = session.launch(config, cold=True, timeout_s=LAUNCH_TIMEOUT_LAB_S)
    except LaunchFailed as again:
        _start_failed(ctx, config, again, sampler_from, retry=True)
        raise AssertionError("a second failed start stops the job") from again
    context["shortened_to"] = fitted["to"]
    return launched, evidence, sampler_from, config, config_changes, context


def _fresh_record(session: LabSession, config: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Before starting `config` again: the telemetry sampler from now, and the launch marks."""
    session.start_sampler()
    return session.clock.now(), _launch_marks(session, config)


def _a_crash(exc: LaunchFailed, engine: str) -> bool:
    """The engine exited for a reason other than a KV budget it named or arguments it
    refused: whose it is, the configuration's or the lab's, a second start tells."""
    return (kv_budget_evidence(exc.log_tail, engine) is None
            and argument_refusal(exc.engine_error, exc.exit_code) is None)


def _start_info(exc: LaunchFailed) -> dict[str, Any]:
    return {"node": exc.node, "reason": exc.reason, "engine_error": exc.engine_error,
            "exit_code": exc.exit_code}


def _start_after_crash(
    ctx: StageContext, config: dict[str, Any], first: LaunchFailed
) -> tuple[LaunchResult, dict[str, Any], float]:
    """The engine crashed on the first start. A crash is the configuration's only when the
    same configuration crashes the same way again on healthy nodes (METHODOLOGY "Money
    back"), so the same configuration is started once more, cold: the same crash stops the
    job as the customer's finding; a start that serves goes on (the first crash noted for
    staff); a different crash is a lab fault that holds the day."""
    session = ctx.session
    ctx.log(f"the engine did not start on {first.node}: {first.reason}")
    ctx.attach(f"engine log tail, {first.node} (first start)", first.log_tail)
    ctx.log("starting the same configuration again, cold: a crash is the configuration's only when "
            "it repeats the same way")
    ctx.progress(30, "the engine crashed on the first start; starting the configuration again, cold")
    sampler_from, evidence = _fresh_record(session, config)
    try:
        launched = session.launch(config, cold=True, timeout_s=LAUNCH_TIMEOUT_LAB_S)
    except LaunchFailed as again:
        # The second start may stop first on another node: the log names it too.
        ctx.log(f"the engine did not start on {again.node}: {again.reason} (second start)")
        ctx.attach(f"engine log tail, {again.node} (second start)", again.log_tail)
        starts = [_start_info(first), _start_info(again)]
        # The same way means the same family of error (out of memory, NCCL, CUDA, the Python
        # exception type, the signal), not the same words: an out-of-memory error names
        # another free-GiB figure on every start.
        families = [crash_family(first.engine_error, first.exit_code),
                    crash_family(again.engine_error, again.exit_code)]
        for start, family in zip(starts, families, strict=True):
            start["family"] = family
        if families[0] != families[1]:
            raise LabFault("engine_crash", f"the engine crashed on two starts of the same configuration, "
                           f"differently ({families[0]}, then {families[1]}): {first.reason}; then "
                           f"{again.reason}",
                           nodes=sorted({first.node, again.node}), evidence={"starts": starts}) from again
        engine = str(config["engine"]["name"])
        telemetry = _collect_telemetry(ctx, sampler_from)
        ctx.add_finding(
            "config.engine_crash",
            f"The engine does not start with this configuration: {again.reason}",
            evidence={
                **_start_info(again),
                "starts": starts,
                "log_tail": again.log_tail[-CRASH_TAIL_CHARS:],
                "error_lines": [
                    event["message"] for event in parse_log(engine, again.log_tail.splitlines())
                    if event["kind"] == "error"
                ][-20:],
            },
            change={"note": "The same crash on two cold starts on healthy nodes: the configuration, as "
                            "the engine's own error says, is what to change."},
            blocking=True,
        )
        raise StopJob(
            f"reproduce: the configuration did not start on {again.node} ({again.reason}); "
            "the same crash on a second start",
            {"launched": False, "node": again.node, "reason": again.reason, "starts": starts, **telemetry},
            side="customer",
        ) from again
    ctx.log(f"the second start served: the first start's crash ({first.reason}) did not repeat, so it "
            "is not the configuration's; the day goes on with the second start")
    return launched, evidence, sampler_from


def _launch_marks(session: LabSession, config: dict[str, Any]) -> dict[str, Any]:
    """Where the launch's lines begin in each node's log (each launch writes its own), and
    the lab time, taken right before a launch."""
    nodes = [str(spec["node"]) for spec in session.specs_for(config)]
    return {"log_offsets": launch_offsets(nodes), "launched_from": session.clock.now() - 2.0}


def _collect_telemetry(ctx: StageContext, since: float) -> dict[str, Any]:
    """Samples since the sampler started, thinned to a size a database row carries, and
    the sampler stopped. Failing to read telemetry is logged, not fatal: the launch
    figures stand without it."""
    session = ctx.session
    try:
        raw = session.telemetry(since=since)
    except LabError as exc:
        ctx.log(f"telemetry unavailable: {exc}")
        return {"telemetry": None, "telemetry_error": str(exc)}
    thinned: dict[str, list[dict[str, Any]]] = {}
    strides: dict[str, int] = {}
    for node, samples in raw.items():
        thinned[node], strides[node] = thin_samples(samples, MAX_SAMPLES_PER_NODE)
    try:
        session.stop_sampler()
    except LabError as exc:
        ctx.log(f"could not stop the sampler: {exc}")
    counts = {node: len(samples) for node, samples in raw.items()}
    ctx.log(f"telemetry: {sum(counts.values())} samples from {len(counts)} nodes")
    return {"telemetry": thinned, "telemetry_samples": counts, "telemetry_stride": strides}


# -- the native context ---------------------------------------------------------------------------

Started = tuple[LaunchResult, dict[str, Any], float, dict[str, Any], list[dict[str, Any]]]


def _profile(ctx: StageContext, config: dict[str, Any]) -> Any:
    entry = ctx.catalog.served(config)
    return entry.profile if entry is not None else None


def _nodes_used(config: dict[str, Any]) -> int:
    return int(config["parallel"]["tp"]) * int(config["parallel"]["pp"])


def _node_memory(ctx: StageContext, config: dict[str, Any]) -> Any:
    """The used nodes' memory with no engine running: preflight's facts (read after the
    job's sweep stopped every engine), else the nodes asked now: after a failed start that
    is the same; beside a running engine the memory it holds is missing from what is free,
    so the ceiling drops to the configured fraction (conservative, never optimistic)."""
    used = [node.name for node in ctx.session.nodes_for(config)]
    nodes = ((ctx.earlier_result("preflight") or {}).get("nodes") or {})
    facts = [nodes[n] for n in used if isinstance(nodes.get(n), dict)]
    if len(facts) < len(used):
        try:
            fresh = ctx.session.facts(used, tolerate=True)
        except LabError as exc:
            ctx.log(f"node memory unavailable ({exc}); the configured memory fraction is the ceiling")
            fresh = {}
        facts = [f for f in fresh.values() if isinstance(f, dict)]
    return node_memory(facts)


def _context_changes(config: dict[str, Any], settings: dict[str, Any], target: int,
                     why: str) -> list[dict[str, Any]]:
    """The fields to change for `settings` at `target` tokens, as proved changes."""
    serving = config["serving"]
    out = [changes.change(f"serving.{name}", serving[name], value, finding="context.native", why=why)
           for name, value in settings.items() if serving.get(name) != value]
    if int(serving["max_model_len"]) != target:
        out.append(changes.change("serving.max_model_len", serving["max_model_len"], target,
                                  finding="context.native", why=why))
    return out


def _prove(ctx: StageContext, config: dict[str, Any], length: int) -> dict[str, Any]:
    """One request of `length` tokens (prompt and output) on the engine serving `config`,
    and the lines in which the engine stated its KV cache on this start."""
    session = ctx.session
    ctx.log(f"proof: one request of {length:,} tokens (prompt and output) on the engine started at "
            "that length")
    try:
        tokenizer = session.tokenizer_path()
    except LabError as exc:
        return {"served": False, "error": f"no tokenizer for the proof prompt: {exc}", "lab_s": 0.0}
    proof = native_request(
        session.endpoint, length=length, tokenizer_path=tokenizer, api_key=session_api_key(session),
        lab_now=session.clock.now,
        wall_timeout_s=max(PROOF_MIN_WALL_S, session.clock.wall_seconds(PROOF_TIMEOUT_LAB_S)))
    try:
        text = session.logs().text
    except LabError:
        text = ""
    proof["engine_lines"] = capacity_lines(text, str(config["engine"]["name"]))
    if proof["served"]:
        ctx.log(f"proof: served {proof['prompt_tokens']:,} + {proof['completion_tokens']:,} tokens in "
                f"{proof['lab_s']:.0f} lab s")
    else:
        ctx.log(f"proof: not served ({proof.get('error')})")
    return proof


def _start_and_prove(
    ctx: StageContext, config: dict[str, Any], length: int, *, cold: bool, sampled: bool = True
) -> tuple[LaunchResult | None, dict[str, Any], float, dict[str, Any]]:
    """Start `config` (at `length`) and prove it serves that length: (the start or None,
    the launch marks, the sampler's start, what happened: `proof`, or `why` it did not).
    `sampled`: the start is one the day keeps, recorded by the telemetry sampler."""
    session = ctx.session
    if sampled:
        sampler_from, evidence = _fresh_record(session, config)
    else:
        sampler_from, evidence = session.clock.now(), _launch_marks(session, config)
    began = session.clock.now()
    try:
        launched = session.launch(config, cold=cold, timeout_s=LAUNCH_TIMEOUT_LAB_S)
    except LaunchFailed as again:
        ctx.attach(f"engine log tail, {again.node} (start at {length:,} tokens)", again.log_tail)
        if sampled:
            _collect_telemetry(ctx, sampler_from)
        said = kv_budget_evidence(again.log_tail, str(config["engine"]["name"]))
        why = (f"it refused to start: {again.reason}" if said is None else
               f"it refused to start: {said.get('kv_available_gib')} GiB of KV memory for "
               f"{said.get('kv_needed_gib')} GiB needed")
        ctx.log(f"the start at {length:,} tokens failed on {again.node}: {again.reason}")
        failed = {"why": why, "node": again.node, "reason": again.reason, "kv_budget": said,
                  "lab_s": round(session.clock.now() - began, 1)}
        return None, evidence, sampler_from, failed
    proof = _prove(ctx, config, length)
    outcome = {"proof": proof, "start_lab_s": round(launched.cold_start_s, 1),
               "lab_s": round(session.clock.now() - began, 1)}
    if not proof["served"]:
        outcome["why"] = f"the request of {length:,} tokens was not served: {proof.get('error')}"
    return launched, evidence, sampler_from, outcome


def _native_finding(ctx: StageContext, *, config: dict[str, Any], target: Any, plan: dict[str, Any],
                    outcome: dict[str, Any], config_changes: list[dict[str, Any]],
                    refusal: dict[str, Any] | None, pool_tokens: int | None = None) -> None:
    """context.native: the target held with the proved settings, the engine's words, the
    request served and its lab seconds. `pool_tokens`: the KV pool of a configuration that
    started at the target length with too small a pool to serve a request of it (SGLang)."""
    proof = outcome["proof"]
    settings = plan["settings"]
    words = settings_words(settings)
    length = target.target
    if refusal is not None:
        title = (f"The context of {length:,} tokens fits with {words}: the configuration as given does not "
                 f"start, and with {words} the engine started at {length:,} tokens and served a request of "
                 "that length")
    elif pool_tokens is not None:
        title = (f"The KV cache holds {pool_tokens:,} tokens, so a request longer than that is refused "
                 f"although the context is set to {target.configured:,}; with {words} the engine started at "
                 f"{length:,} tokens and served a request of that length")
    else:
        title = (f"The configuration runs at {target.configured:,} tokens while the context of "
                 f"{length:,} fits" + (f" with {words}" if settings else "")
                 + f": the engine started at {length:,} tokens and served a request of that length")
    note = (f"Serve {length:,} tokens ({target.reason})" + (f" with {words}" if settings else "")
            + "; proved by a start at that length and one request of "
            f"{proof['total_tokens']:,} tokens ({proof['prompt_tokens']:,} prompt + "
            f"{proof['completion_tokens']:,} output) served in {proof['lab_s']:.0f} lab s.")
    if plan.get("alternatives"):
        alt = plan["alternatives"][0]
        note += (f" Also predicted to fit, not started: kv_cache_dtype {alt['kv_cache_dtype']} at "
                 f"gpu_memory_utilization {alt['gpu_memory_utilization']:g}.")
    ctx.add_finding(
        "context.native",
        title,
        evidence={
            "target": target.as_dict(),
            **({"refusal": refusal} if refusal is not None else {}),
            "engine": plan["engine"],
            "plan": {k: plan[k] for k in ("ceiling", "options", "chosen") if k in plan},
            **({"pool_tokens": pool_tokens} if pool_tokens is not None else {}),
            "engine_lines": proof.get("engine_lines") or [],
            "request": {k: proof.get(k) for k in ("max_model_len", "prompt_tokens", "completion_tokens",
                                                  "total_tokens", "finish_reason", "lab_s")},
            "start_lab_s": outcome.get("start_lab_s"),
            "lab_s": outcome.get("lab_s"),
        },
        change={"config": {c["path"]: {"from": c["from"], "to": c["to"]} for c in config_changes},
                "note": note},
    )


def _fit_native_on_refusal(ctx: StageContext, config: dict[str, Any], exc: LaunchFailed,
                           kv: dict[str, Any]) -> tuple[Started | None, dict[str, Any]]:
    """The engine refused: the memory settings that hold the target context, from its own
    figures, started cold and proved. (The start and the changed configuration, or None, and
    the record of the search.)"""
    engine = str(config["engine"]["name"])
    profile = _profile(ctx, config)
    target = context_target(config, profile)
    # `refused`: the configuration as given did not start, so reproduce's changes are what
    # the lab could run it with (measure's customer_as_run), not tuning.
    record: dict[str, Any] = {"target": target.as_dict(), "lab_s": 0.0, "refused": True}
    nodes = _nodes_used(config)
    weights = logged_weights_gib(exc.log_tail, engine) or profile_weights_gib(profile, nodes)
    said = kv_from_refusal(kv, config, weights_gib=weights, profile=profile) if weights else None
    if said is None:
        record["why"] = "the engine's refusal and the lab's catalog give no KV or weight figures to fit with"
        ctx.log(f"context: {record['why']}")
        return None, record
    plan = plan_fit(said, target=target.target, memory=_node_memory(ctx, config), profile=profile,
                    nodes=nodes, lab_nodes=len(ctx.session.nodes))
    record["plan"] = plan
    if plan["settings"] is None:
        ctx.log(f"context: nothing holds {target.target:,} tokens on these nodes: "
                f"{would_fit_words(plan['would_fit'], target.target)}")
        return None, record
    why = f"holds {target.target:,} tokens ({target.reason}); proved by a start and a request of that length"
    fixes = _context_changes(config, plan["settings"], target.target, why)
    if not fixes:
        record["why"] = "the engine's figures and the prediction disagree: nothing to change"
        return None, record
    fitted = apply_changes(config, fixes)
    ctx.log(f"context: {target.target:,} tokens should fit with {settings_words(plan['settings'])} "
            f"(predicted {plan['chosen']['predicted_kv_gib']} GiB of KV memory for "
            f"{plan['chosen']['needed_gib']} needed); starting it cold to prove it")
    ctx.progress(30, f"starting the configuration at {target.target:,} tokens with "
                     f"{settings_words(plan['settings'])}, cold caches")
    launched, evidence, sampler_from, outcome = _start_and_prove(ctx, fitted, target.target, cold=True)
    record["lab_s"] = outcome.get("lab_s", 0.0)
    if launched is None or "why" in outcome:
        record["tried"] = {"settings": plan["settings"], **outcome}
        return None, record
    record["proof"] = outcome["proof"]
    record["settings"] = plan["settings"]
    _native_finding(ctx, config=config, target=target, plan=plan, outcome=outcome, config_changes=fixes,
                    refusal={"node": exc.node, **kv})
    return (launched, evidence, sampler_from, fitted, fixes), record


def native_context_check(ctx: StageContext, config: dict[str, Any],
                         log_text: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A configuration that started: when it runs below its target context and the engine's
    own KV capacity (or settings predicted from it) would hold the target, prove it (a start
    at the target and one request of that length) and return the change. At the target, no
    lab time at all."""
    engine = str(config["engine"]["name"])
    profile = _profile(ctx, config)
    target = context_target(config, profile)
    record: dict[str, Any] = {"target": target.as_dict(), "lab_s": 0.0}
    nodes = _nodes_used(config)
    weights = logged_weights_gib(log_text, engine) or profile_weights_gib(profile, nodes)
    said: EngineKv | None = None
    if weights:
        said = kv_from_log(log_text, config, engine=engine, weights_gib=weights, profile=profile)
    if said is not None:
        record["engine"] = said.as_dict()
        record["engine_lines"] = capacity_lines(log_text, engine)
    # SGLang starts with a KV pool smaller than its context length and refuses, at serving
    # time, a request longer than the pool (its scheduler's max_req_input_len): the length
    # configured is then not the length served. vLLM refuses to start instead.
    short = said is not None and said.tokens is not None and said.tokens < target.target
    if short and said is not None:
        record["pool_tokens"] = said.tokens
    if not target.below and not short:
        return [], record
    if said is None:
        record["why"] = "the engine's log gives no KV capacity to reason with"
        ctx.log(f"context: runs at {target.configured:,} tokens, below {target.target:,}; {record['why']}")
        return [], record
    plan = plan_fit(said, target=target.target, memory=_node_memory(ctx, config), profile=profile,
                    nodes=nodes, lab_nodes=len(ctx.session.nodes))
    record["plan"] = plan
    if plan["settings"] is None:
        ctx.log(f"context: runs at {target.configured:,} tokens; {target.target:,} does not fit on these "
                f"nodes ({would_fit_words(plan['would_fit'], target.target)})")
        return [], record
    why = f"holds {target.target:,} tokens ({target.reason}); proved by a start and a request of that length"
    fixes = _context_changes(config, plan["settings"], target.target, why)
    native = apply_changes(config, fixes)
    held = f", with {settings_words(plan['settings'])}" if plan["settings"] else ""
    served = target.configured if target.below else said.tokens or 0
    ctx.log(f"context: serves at most {served:,} tokens while its KV cache ({said.tokens or 0:,} tokens"
            f"{held}) should hold {target.target:,}; starting it at {target.target:,} to prove it")
    ctx.progress(90, f"proving the context of {target.target:,} tokens")
    launched, _, _, outcome = _start_and_prove(ctx, native, target.target, cold=False, sampled=False)
    record["lab_s"] = outcome.get("lab_s", 0.0)
    if launched is None or "why" in outcome:
        record["tried"] = {"settings": plan["settings"], **outcome}
        ctx.log(f"context: not proved ({outcome.get('why')}); no finding")
        return [], record
    record["proof"] = outcome["proof"]
    record["settings"] = plan["settings"]
    _native_finding(ctx, config=config, target=target, plan=plan, outcome=outcome, config_changes=fixes,
                    refusal=None, pool_tokens=None if target.below else said.tokens)
    return fixes, record
