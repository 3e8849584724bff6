"""Preflight: can this lab run this configuration faithfully? Checked from node facts
before anything is launched (and after the job's sweep stopped what earlier jobs left).

A configuration that needs more nodes than the lab has is the customer's: a finding, and
the job stops. Everything else is the lab's own condition, for staff, never the customer's
finding: each told once with the nodes it holds on. A blocking one (a node the
configuration needs does not answer, no GPU, no model directory) is a lab fault that
holds the day (orchestration); the others (a slow link, a skewed clock, memory in use,
another engine version) are kept in the result for the staff's job page.

The model's memory (its weights' share of a node and the KV cache its context needs, from
the profile of its entry in the lab's catalog) is checked against what the engine may take
of a node's memory, and kept in the result with its figures; a model whose profile lacks
a figure is not guessed at, and the check says which it lacks.

Once the checks pass, before any engine starts, every node the configuration uses runs the
agent's `mem-bw-probe` (all at once; a few lab seconds): the memory bandwidth a streaming
read reaches there, which the measure stage's "where the rest goes" reads the weights at
instead of the accelerator's specified peak. The result's `memory_bandwidth` keeps each
node's median and raw repeats, the lab-wide figure (the median of the nodes' medians) and
the slowest node's, or `unavailable` and why (a node without torch answers `unsupported`,
one whose memory is held `busy`): then the split falls back to the specified peak. The
probe is evidence, never a check: whatever it answers, preflight goes on.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, NoReturn

from diagnostic.jobs.faults import LabFault
from diagnostic.jobs.stage_context import StageContext, StopJob
from diagnostic.pipelines.native_context import context_target
from lab.catalog import Catalog
from lab.inventory import Node
from lab.session import AgentError, NodeUnreachable

# What each node type's GPU reports; a lab with other hardware reproduces the customer's
# configuration only approximately.
COMPUTE_CAPABILITY = {"dgx-spark": "12.1", "gb10": "12.1"}
# Node clocks further apart than this make the per-node timelines of a cold start
# (rendezvous: "one node late") unreliable.
CLOCK_SKEW_LIMIT_S = 5.0
# mem-bw-probe's buffer and repeats: 2 GiB is far beyond any cache, five 2 GiB reads take
# ~0.05 s at GB10's ~200 GB/s, so the probe costs its ~2 lab s of setup on every node at once.
MEM_BW_PROBE_MIB = 2048
MEM_BW_PROBE_REPEATS = 5
MEM_BW_PROBE_TIMEOUT_S = 120.0


def run(ctx: StageContext) -> dict[str, Any]:
    config = ctx.config
    session = ctx.session
    parallel = config["parallel"]
    needed = int(parallel["tp"]) * int(parallel["pp"])
    nodes = list(session.nodes)

    if len(nodes) < needed:
        _too_few_nodes(ctx, needed, nodes)
    used = session.nodes_for(config)
    used_names = {n.name for n in used}

    ctx.progress(10, f"collecting facts from {len(nodes)} nodes")
    wall_start = time.monotonic()
    lab_before = session.clock.now()
    facts = session.facts(tolerate=True)
    collect_lab_s = session.clock.now() - lab_before
    ctx.log(f"facts collected in {time.monotonic() - wall_start:.2f} s wall")

    reachable = {name: f for name, f in facts.items() if isinstance(f, dict)}
    failed = {name: f for name, f in facts.items() if not isinstance(f, dict)}
    conditions = Conditions()

    _needed_nodes_answer(failed, used_names)
    checks: list[dict[str, Any]] = []
    if failed:
        for name, error in sorted(failed.items()):
            conditions.add("lab.node_unreachable", name,
                           "did not answer (the configuration does not need it)", {"error": str(error)})
        checks.append({"check": "reachable", "ok": False, "unreachable": sorted(failed)})
    else:
        checks.append({"check": "reachable", "ok": True, "nodes": len(reachable)})

    for node in used:
        node_facts = reachable.get(node.name)
        if node_facts is None:
            continue
        checks.extend(_check_node(conditions, node, node_facts, config))

    checks.append(_check_clocks(conditions, reachable, collect_lab_s))
    memory = model_memory_check(config, ctx.catalog, [reachable[n.name] for n in used if n.name in reachable])
    ctx.log(f"model memory: {memory['summary']}")
    checks.append(memory)

    summary = {name: _node_summary(f) for name, f in reachable.items()}
    grouped = conditions.grouped()
    for condition in grouped:
        ctx.log(f"lab condition ({'blocking' if condition['blocking'] else 'noted'}): {condition['summary']}")
    blocking = [c for c in grouped if c["blocking"]]
    if not blocking:
        ctx.progress(80, "measuring the memory bandwidth a streaming read reaches (mem-bw-probe)")
    bandwidth = (memory_bandwidth(session, [n.name for n in used if n.name in reachable])
                 if not blocking else {"unavailable": "not probed: the lab holds the day (preflight's "
                                                      "blocking conditions)"})
    ctx.log("memory bandwidth: " + bandwidth_summary(bandwidth))
    result = {
        # Reports on a simulated lab say so on their cover, with its time dilation.
        "lab_dilation": session.inventory.time_dilation,
        "needed_nodes": needed,
        "used_nodes": [n.name for n in used],
        "nodes": summary,
        "checks": checks,
        # The lab's own conditions, each once with the nodes it concerns: for staff, never
        # the customer's findings.
        "lab_conditions": grouped,
        "blocking": sorted({str(c["code"]) for c in blocking}),
        # What a streaming read reaches on each node (mem-bw-probe), for the measure
        # stage's split of the step; {"unavailable": why} when no node measured it.
        "memory_bandwidth": bandwidth,
    }
    codes = sorted({str(c["code"]) for c in blocking})
    ctx.progress(100, f"preflight done; blocking: {', '.join(codes) or 'none'}")
    if blocking:
        first = blocking[0]
        raise LabFault(
            str(first["code"]).removeprefix("lab."),
            "; ".join(c["summary"] for c in blocking),
            nodes=sorted({n for c in blocking for n in c["nodes"]}),
            evidence={"conditions": blocking},
        )
    return result


def _too_few_nodes(ctx: StageContext, needed: int, nodes: list[Any]) -> NoReturn:
    parallel = ctx.config["parallel"]
    ctx.add_finding(
        "config.layout_exceeds_lab",
        f"The configuration needs {needed} nodes (tp {parallel['tp']} x pp {parallel['pp']}); "
        f"the lab has {len(nodes)}",
        evidence={"needed": needed, "available": len(nodes), "nodes": [n.name for n in nodes]},
        change={"parallel": "run on a lab with at least tp x pp nodes"},
        blocking=True,
    )
    raise StopJob(
        f"preflight: the configuration needs {needed} nodes, lab has {len(nodes)}",
        {"needed_nodes": needed, "lab_nodes": [n.name for n in nodes], "checks": []},
    )


def _needed_nodes_answer(failed: dict[str, Any], used_names: set[str]) -> None:
    """A node the configuration needs that did not answer is a lab fault, never the
    customer's: retried after a pause (a node rebooting answers again), and once the
    attempts are spent the day is held for staff."""
    needed_down = sorted(n for n in failed if n in used_names)
    if needed_down:
        unreachable = {n: failed[n] for n in needed_down}
        causes: dict[str, BaseException] = {}
        for name, error in unreachable.items():
            causes.update(error.nodes if isinstance(error, NodeUnreachable) else {name: error})
        if all(isinstance(e, NodeUnreachable) for e in unreachable.values()):
            raise NodeUnreachable(causes)
        raise LabFault("agent_failed", f"the node agent failed on {', '.join(needed_down)}",
                       nodes=needed_down, evidence={n: str(e) for n, e in unreachable.items()})


def _node_summary(f: dict[str, Any]) -> dict[str, Any]:
    return {
        "host": f.get("host"),
        "arch": f.get("arch"),
        "kernel": f.get("kernel"),
        "mem_total_kib": f.get("mem_total_kib"),
        "mem_available_kib": f.get("mem_available_kib"),
        "gpus": f.get("gpus"),
        "nics": f.get("nics"),
        "model_dir": f.get("model_dir"),
        "engines": f.get("engines"),
    }


def memory_bandwidth(session: Any, nodes: list[str]) -> dict[str, Any]:
    """Run `mem-bw-probe` on `nodes` at once and gather what they measured: {method,
    size_mib, repeats, nodes {name: {median_gbs, gbs, seconds, bytes_read, device}},
    median_gbs (of the nodes' medians), min_gbs and min_node, failed {name: why} (nodes
    that answered no figure), lab_s}, or {unavailable: why, failed, lab_s} when no node
    answered one. Never raises: the probe informs the split of the step, it gates nothing."""
    if not nodes:
        return {"unavailable": "no node to probe"}
    lab_before = session.clock.now()
    try:
        answers = session.agent_all(
            "mem-bw-probe", "--size-mib", str(MEM_BW_PROBE_MIB), "--repeats", str(MEM_BW_PROBE_REPEATS),
            nodes=nodes, timeout=MEM_BW_PROBE_TIMEOUT_S, tolerate=True)
    except Exception as exc:  # evidence only: a failed probe never fails the job
        answers = {name: exc for name in nodes}
    lab_s = round(max(0.0, session.clock.now() - lab_before), 3)
    measured: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    method = None
    for name in nodes:
        answer = answers.get(name) if isinstance(answers, dict) else None
        if isinstance(answer, AgentError):
            failed[name] = f"mem-bw-probe {answer.code}: {answer.message}"
            continue
        if not isinstance(answer, dict):
            failed[name] = f"mem-bw-probe: {answer if answer is not None else 'no answer'}"
            continue
        try:
            gbs = [float(g) for g in answer["gbs"]]
            median = float(answer["median_gbs"])
            seconds = [float(t) for t in answer.get("seconds") or []]
        except (KeyError, TypeError, ValueError) as exc:
            failed[name] = f"mem-bw-probe: malformed answer ({exc!r})"
            continue
        if not gbs or not median > 0:
            failed[name] = "mem-bw-probe: no positive figure"
            continue
        method = method or answer.get("method")
        measured[name] = {"median_gbs": median, "gbs": gbs, "seconds": seconds,
                          "bytes_read": answer.get("bytes_read"), "device": answer.get("device")}
    if not measured:
        reasons = sorted(set(failed.values()))
        return {"unavailable": "; ".join(reasons) or "no node answered", "failed": failed, "lab_s": lab_s}
    medians = {name: m["median_gbs"] for name, m in measured.items()}
    slowest = min(medians, key=lambda n: (medians[n], n))
    return {
        "method": method, "size_mib": MEM_BW_PROBE_MIB, "repeats": MEM_BW_PROBE_REPEATS,
        "nodes": measured,
        "median_gbs": round(statistics.median(medians.values()), 3),
        "min_gbs": round(medians[slowest], 3), "min_node": slowest,
        "failed": failed, "lab_s": lab_s,
    }


def bandwidth_summary(bandwidth: dict[str, Any]) -> str:
    """One line for the stage log."""
    if "unavailable" in bandwidth:
        return f"not measured ({bandwidth['unavailable']})"
    text = (f"{bandwidth['median_gbs']:.1f} GB/s (median of {len(bandwidth['nodes'])} nodes' medians, "
            f"{bandwidth['repeats']} repeats each; slowest {bandwidth['min_node']} "
            f"{bandwidth['min_gbs']:.1f}) in {bandwidth['lab_s']:.1f} lab s")
    if bandwidth.get("failed"):
        text += f"; no figure from {', '.join(sorted(bandwidth['failed']))}"
    return text


class Conditions:
    """The lab's conditions found node by node, told once each with the nodes it holds on
    ("8 nodes: spark-01, ...: vllm not installed") rather than once per node."""

    def __init__(self) -> None:
        self._found: dict[tuple[str, str, bool], dict[str, Any]] = {}

    def add(self, code: str, node: str, words: str, evidence: dict[str, Any], *,
            blocking: bool = False) -> None:
        entry = self._found.setdefault((code, words, blocking), {"nodes": [], "evidence": {}})
        entry["nodes"].append(node)
        entry["evidence"][node] = evidence

    def grouped(self) -> list[dict[str, Any]]:
        out = []
        for (code, words, blocking), entry in self._found.items():
            nodes = sorted(entry["nodes"])
            where = f"node {nodes[0]}" if len(nodes) == 1 else f"{len(nodes)} nodes: {', '.join(nodes)}"
            out.append({"code": code, "summary": f"{where}: {words}", "nodes": nodes,
                        "blocking": blocking, "evidence": entry["evidence"]})
        return sorted(out, key=lambda c: (not c["blocking"], c["code"], c["nodes"]))


def _check_node(
    conditions: Conditions, node: Node, facts: dict[str, Any], config: dict[str, Any]
) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    for check in (_check_gpu, _check_memory, _check_data_nics, _check_engine_user, _check_model_dir,
                  _check_engine):
        checks.extend(check(conditions, node, facts, config))
    return checks


def _check_gpu(
    conditions: Conditions, node: Node, facts: dict[str, Any], config: dict[str, Any]
) -> list[dict[str, Any]]:
    """The GPU and its compute capability."""
    checks: list[dict[str, Any]] = []
    name = node.name
    gpus = facts.get("gpus") or []
    expected_cc = COMPUTE_CAPABILITY.get(str(config["cluster"]["node_type"]))
    if not gpus:
        conditions.add("lab.gpu_missing", name, "reports no GPU (check the driver: nvidia-smi)",
                       {"gpus": gpus}, blocking=True)
        checks.append({"check": "gpu", "node": name, "ok": False})
    else:
        capabilities = sorted({str(g.get("compute_capability")) for g in gpus})
        ok = expected_cc is None or capabilities == [expected_cc]
        checks.append({"check": "compute_capability", "node": name, "ok": ok,
                       "found": capabilities, "expected": expected_cc})
        if not ok:
            conditions.add(
                "lab.compute_capability", name,
                f"compute capability {', '.join(capabilities)}, the customer's "
                f"{config['cluster']['node_type']} has {expected_cc}",
                {"found": capabilities, "expected": expected_cc, "gpus": [g.get("name") for g in gpus]},
            )
    return checks


def _check_memory(
    conditions: Conditions, node: Node, facts: dict[str, Any], config: dict[str, Any]
) -> list[dict[str, Any]]:
    """Memory available against what the engine will ask for."""
    checks: list[dict[str, Any]] = []
    name = node.name
    total = int(facts.get("mem_total_kib") or 0)
    available = int(facts.get("mem_available_kib") or 0)
    utilization = float(config["serving"]["gpu_memory_utilization"])
    # GB10 memory is unified: nvidia-smi reports none, so /proc/meminfo decides. The
    # engine reserves gpu_memory_utilization of the total and refuses to start below it.
    wanted = utilization * total
    mem_ok = total > 0 and available >= wanted
    checks.append({"check": "memory", "node": name, "ok": mem_ok, "mem_total_kib": total,
                   "mem_available_kib": available, "wanted_kib": round(wanted)})
    if not mem_ok:
        # Engines of this platform were stopped before the facts were read (the job's
        # sweep): what holds the memory is something else on the node.
        conditions.add(
            "lab.memory_unavailable", name,
            f"less memory available than the engine will ask for (gpu_memory_utilization {utilization})",
            {"mem_total_kib": total, "mem_available_kib": available, "wanted_kib": round(wanted),
             "gpu_memory_utilization": utilization},
        )
    return checks


def _check_data_nics(
    conditions: Conditions, node: Node, facts: dict[str, Any], config: dict[str, Any]
) -> list[dict[str, Any]]:
    """Each data interface: present, up, at the customer's link speed."""
    checks: list[dict[str, Any]] = []
    name = node.name
    link_mbps = float(config["cluster"]["link_gbps"]) * 1000
    by_name = {n.get("name"): n for n in facts.get("nics") or []}
    for nic in node.data_nics:
        found = by_name.get(nic)
        speed = found.get("speed_mbps") if found else None
        state = found.get("operstate") if found else None
        ok = found is not None and state == "up" and (speed is None or speed >= link_mbps)
        checks.append({"check": "data_nic", "node": name, "nic": nic, "ok": ok,
                       "speed_mbps": speed, "operstate": state, "expected_mbps": link_mbps})
        if ok:
            continue
        if found is None:
            words = f"has no data interface {nic}"
        elif state != "up" or speed is None:
            words = f"data interface {nic} is {state}"
        else:
            words = (f"data interface {nic} runs at {speed / 1000:g} Gbps, "
                     f"below the customer's {link_mbps / 1000:g}")
        conditions.add("lab.link_speed", name, words, {"nic": nic, "speed_mbps": speed, "operstate": state,
                                                      "config_link_gbps": link_mbps / 1000})
    return checks


def _check_engine_user(
    conditions: Conditions, node: Node, facts: dict[str, Any], config: dict[str, Any]
) -> list[dict[str, Any]]:
    """The user engines run as: never root."""
    checks: list[dict[str, Any]] = []
    name = node.name
    # Engines run customers' configurations: never as root (the agent refuses the launch;
    # preflight holds the day before any start is tried, naming the node's setting).
    user = facts.get("engine_user")
    if isinstance(user, dict):
        user_ok = user.get("problem") is None and user.get("uid") != 0
        checks.append({"check": "engine_user", "node": name, "ok": user_ok, "user": user.get("name"),
                       "uid": user.get("uid")})
        if not user_ok:
            conditions.add("lab.engine_user", name,
                           f"would run engines as {user.get('name')!r}: "
                           f"{user.get('problem') or 'root'}",
                           {"engine_user": user}, blocking=True)
    return checks


def _check_model_dir(
    conditions: Conditions, node: Node, facts: dict[str, Any], config: dict[str, Any]
) -> list[dict[str, Any]]:
    """The model directory."""
    checks: list[dict[str, Any]] = []
    name = node.name
    model_dir = facts.get("model_dir") or {}
    present = bool(model_dir.get("exists"))
    checks.append({"check": "model_dir", "node": name, "ok": present, "path": model_dir.get("path")})
    if not present:
        conditions.add("lab.model_missing", name,
                       f"has no model directory {model_dir.get('path') or node.model_dir}",
                       {"model_dir": model_dir}, blocking=True)
    return checks


def _check_engine(
    conditions: Conditions, node: Node, facts: dict[str, Any], config: dict[str, Any]
) -> list[dict[str, Any]]:
    """The engine release the agent sees."""
    checks: list[dict[str, Any]] = []
    name = node.name
    engine = config["engine"]
    installed = (facts.get("engines") or {}).get(engine["name"])
    engine_ok = installed == engine["version"]
    checks.append({"check": "engine", "node": name, "ok": engine_ok, "installed": installed,
                   "wanted": engine["version"]})
    if not engine_ok:
        # Not blocking: an engine in a container or another virtualenv is invisible to the
        # agent's interpreter; reproduce shows whether it starts.
        conditions.add(
            "lab.engine_version", name,
            f"shows {engine['name']} {installed or 'not installed'} to the agent; "
            f"the customer runs {engine['version']}",
            {"engine": engine["name"], "installed": installed, "wanted": engine["version"]},
        )
    return checks


def model_memory_check(
    config: dict[str, Any], catalog: Catalog, facts: list[dict[str, Any]]
) -> dict[str, Any]:
    """Whether the model fits the nodes it runs on: its checkpoint's share of a node plus
    the KV cache of one max_model_len request, against gpu_memory_utilization of the
    smallest node's memory. The sizes are the profile's in the lab's catalog; `ok` is None,
    and `summary` says why, where a figure is missing."""
    parallel = config["parallel"]
    nodes = int(parallel["tp"]) * int(parallel["pp"])
    serving = config["serving"]
    entry = catalog.served(config)
    profile = entry.profile if entry is not None else None
    out: dict[str, Any] = {"check": "model_memory", "ok": None, "catalog_version": catalog.version,
                           "model": entry.id if entry is not None else config["model"]["id"]}
    lacking = (["profile"] if profile is None
               else profile.missing("checkpoint_gb", "kv_bytes_per_token"))
    totals = [int(f.get("mem_total_kib") or 0) for f in facts]
    if not lacking and (not totals or min(totals) <= 0):
        lacking = ["the nodes' memory (mem_total_kib)"]
    if lacking or profile is None or profile.checkpoint_gb is None or profile.kv_bytes_per_token is None:
        out["summary"] = (f"not checked: the lab's catalog (version {catalog.version}) gives no "
                          f"{', '.join(lacking)} for {out['model']}")
        return out
    dtype = "fp8" if serving["kv_cache_dtype"] == "fp8" else "bf16"
    weights_gb = profile.checkpoint_gb / nodes
    kv_gb = profile.kv_bytes_per_token[dtype] * int(serving["max_model_len"]) / 1e9
    budget_gb = float(serving["gpu_memory_utilization"]) * min(totals) * 1024 / 1e9
    ok = weights_gb + kv_gb <= budget_gb
    out.update({"ok": ok, "weights_per_node_gb": round(weights_gb, 2), "kv_gb": round(kv_gb, 2),
                "kv_cache_dtype": dtype, "budget_gb": round(budget_gb, 2), "nodes": nodes})
    out["summary"] = (f"{out['model']}: {weights_gb:.1f} GB of weights a node on {nodes} nodes + "
                      f"{kv_gb:.1f} GB of {dtype} KV for {serving['max_model_len']} tokens "
                      f"{'fits' if ok else 'exceeds'} {budget_gb:.1f} GB "
                      f"(gpu_memory_utilization {serving['gpu_memory_utilization']} of the node's memory)")
    # The length the day holds the configuration to (reproduce): native unless the customer
    # asked for less. Told here when it differs, so that staff see the gap before any start.
    target = context_target(config, profile)
    if target.target != int(serving["max_model_len"]):
        target_kv = profile.kv_bytes_per_token[dtype] * target.target / 1e9
        holds = weights_gb + target_kv <= budget_gb
        out["context"] = {**target.as_dict(), "kv_gb": round(target_kv, 2), "fits": holds}
        out["summary"] += (f"; the target context, {target.target} tokens ({target.reason}), needs "
                           f"{target_kv:.1f} GB of {dtype} KV and {'fits' if holds else 'exceeds'} that")
    return out


def _check_clocks(
    conditions: Conditions, facts: dict[str, dict[str, Any]], collect_lab_s: float
) -> dict[str, Any]:
    """Node clocks against each other. Facts are read from all nodes at once, so honest
    clocks differ by at most the time the collection took; beyond that plus the limit,
    a node's clock is off."""
    times = {name: float(f["time"]) for name, f in facts.items() if isinstance(f.get("time"), int | float)}
    if len(times) < 2:
        return {"check": "clock_skew", "ok": True, "nodes": len(times)}
    reference = statistics.median(times.values())
    allowed = CLOCK_SKEW_LIMIT_S + max(0.0, collect_lab_s)
    offsets = {name: round(t - reference, 3) for name, t in times.items()}
    skewed = {name: off for name, off in offsets.items() if abs(off) > allowed}
    for name, offset in sorted(skewed.items()):
        conditions.add(
            "lab.clock_skew", name,
            f"clock {abs(offset):.1f} s {'ahead of' if offset > 0 else 'behind'} the other nodes "
            "(enable chrony/NTP)",
            {"offset_s": offset, "allowed_s": round(allowed, 3), "offsets_s": offsets},
        )
    return {"check": "clock_skew", "ok": not skewed, "offsets_s": offsets, "allowed_s": round(allowed, 3)}
