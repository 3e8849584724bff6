"""Preflight: can this lab run this configuration faithfully? Checked from node facts
before anything is launched.

Problems become findings. A blocking one (a node the configuration needs is
unreachable, too few nodes, no GPU, no model directory) stops the job, because nothing
measured after it would mean anything; the others (a slow link, a skewed clock, memory
in use, another engine version) are recorded and the job goes on.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from diagnostic.jobs.context import StageContext, StopJob
from lab.inventory import Node
from lab.session import NodeUnreachable

# What each node type's GPU reports; a lab with other hardware reproduces the customer's
# configuration only approximately.
COMPUTE_CAPABILITY = {"dgx-spark": "12.1", "gb10": "12.1"}
# Node clocks further apart than this make the per-node timelines of a cold start
# (rendezvous: "one node late") unreliable.
CLOCK_SKEW_LIMIT_S = 5.0


def run(ctx: StageContext) -> dict[str, Any]:
    config = ctx.config
    session = ctx.session
    parallel = config["parallel"]
    needed = int(parallel["tp"]) * int(parallel["pp"])
    nodes = list(session.nodes)
    checks: list[dict[str, Any]] = []

    if len(nodes) < needed:
        ctx.add_finding(
            "lab.insufficient_nodes",
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
    blocking: list[str] = []

    if failed:
        needed_down = sorted(n for n in failed if n in used_names)
        transient = all(isinstance(failed[n], NodeUnreachable) for n in needed_down)
        if needed_down and transient and not ctx.last_attempt:
            # Worth another look after a pause: a node rebooting answers again.
            raise NodeUnreachable({n: failed[n] for n in needed_down})
        for name, error in sorted(failed.items()):
            is_needed = name in used_names
            ctx.add_finding(
                "lab.node_unreachable",
                f"Node {name} did not answer" + (" and the configuration needs it" if is_needed else ""),
                evidence={"node": name, "error": str(error), "attempts": ctx.attempt,
                          "needed_by_configuration": is_needed},
                change={"lab": f"bring {name} back (power, network, sshd) before the lab day"},
                blocking=is_needed,
            )
            if is_needed:
                blocking.append("lab.node_unreachable")
        checks.append({"check": "reachable", "ok": False, "unreachable": sorted(failed)})
    else:
        checks.append({"check": "reachable", "ok": True, "nodes": len(reachable)})

    for node in used:
        node_facts = reachable.get(node.name)
        if node_facts is None:
            continue
        checks.extend(_check_node(ctx, node, node_facts, config, blocking))

    checks.append(_check_clocks(ctx, reachable, collect_lab_s))

    summary = {
        name: {
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
        for name, f in reachable.items()
    }
    result = {
        # Reports on a simulated lab say so on their cover, with its time dilation.
        "lab_dilation": session.inventory.time_dilation,
        "needed_nodes": needed,
        "used_nodes": [n.name for n in used],
        "nodes": summary,
        "checks": checks,
        "blocking": sorted(set(blocking)),
    }
    ctx.progress(100, f"preflight done; blocking: {', '.join(sorted(set(blocking))) or 'none'}")
    if blocking:
        raise StopJob(
            f"preflight: the lab cannot run this configuration ({', '.join(sorted(set(blocking)))})",
            result,
        )
    return result


def _check_node(
    ctx: StageContext, node: Node, facts: dict[str, Any], config: dict[str, Any], blocking: list[str]
) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    name = node.name

    gpus = facts.get("gpus") or []
    expected_cc = COMPUTE_CAPABILITY.get(str(config["cluster"]["node_type"]))
    if not gpus:
        ctx.add_finding(
            "lab.gpu_missing",
            f"Node {name} reports no GPU",
            evidence={"node": name, "gpus": gpus},
            change={"lab": f"check the driver on {name} (nvidia-smi)"},
            blocking=True,
        )
        blocking.append("lab.gpu_missing")
        checks.append({"check": "gpu", "node": name, "ok": False})
    else:
        capabilities = sorted({str(g.get("compute_capability")) for g in gpus})
        ok = expected_cc is None or capabilities == [expected_cc]
        checks.append({"check": "compute_capability", "node": name, "ok": ok,
                       "found": capabilities, "expected": expected_cc})
        if not ok:
            ctx.add_finding(
                "lab.compute_capability",
                f"Node {name} has compute capability {', '.join(capabilities)}, "
                f"the customer's {config['cluster']['node_type']} has {expected_cc}",
                evidence={"node": name, "found": capabilities, "expected": expected_cc,
                          "gpus": [g.get("name") for g in gpus]},
                change={"lab": "run on nodes of the customer's type; kernels dispatch by architecture"},
            )

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
        ctx.add_finding(
            "lab.memory_unavailable",
            f"Node {name} has {available / 2**20:.1f} GiB available; the engine will ask for "
            f"{wanted / 2**20:.1f} GiB (gpu_memory_utilization {utilization})",
            evidence={"node": name, "mem_total_kib": total, "mem_available_kib": available,
                      "gpu_memory_utilization": utilization},
            change={"lab": f"stop what holds memory on {name} (a leftover engine?) before launching"},
        )

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
            title = f"Node {name} has no interface {nic}"
        elif state != "up" or speed is None:
            title = f"Data interface {nic} on {name} is {state}"
        else:
            title = (
                f"Data interface {nic} on {name} runs at {speed / 1000:g} Gbps, "
                f"below the customer's {link_mbps / 1000:g}"
            )
        ctx.add_finding(
            "lab.link_speed",
            title,
            evidence={"node": name, "nic": nic, "speed_mbps": speed, "operstate": state,
                      "config_link_gbps": link_mbps / 1000},
            change={"lab": f"check the cable and switch port of {name} {nic}"},
        )

    model_dir = facts.get("model_dir") or {}
    present = bool(model_dir.get("exists"))
    checks.append({"check": "model_dir", "node": name, "ok": present, "path": model_dir.get("path")})
    if not present:
        ctx.add_finding(
            "lab.model_missing",
            f"Node {name} has no model directory {model_dir.get('path') or node.model_dir}",
            evidence={"node": name, "model_dir": model_dir},
            change={"lab": f"copy the checkpoint to {node.model_dir} on {name}"},
            blocking=True,
        )
        blocking.append("lab.model_missing")

    engine = config["engine"]
    installed = (facts.get("engines") or {}).get(engine["name"])
    engine_ok = installed == engine["version"]
    checks.append({"check": "engine", "node": name, "ok": engine_ok, "installed": installed,
                   "wanted": engine["version"]})
    if not engine_ok:
        # Not blocking: an engine in a container or another virtualenv is invisible to the
        # agent's interpreter; reproduce shows whether it starts.
        ctx.add_finding(
            "lab.engine_version",
            f"Node {name} shows {engine['name']} {installed or 'not installed'} to the agent; "
            f"the customer runs {engine['version']}",
            evidence={"node": name, "engine": engine["name"], "installed": installed,
                      "wanted": engine["version"]},
            change={"lab": f"install {engine['name']}=={engine['version']} where the agent's python sees it"},
        )
    return checks


def _check_clocks(
    ctx: StageContext, facts: dict[str, dict[str, Any]], collect_lab_s: float
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
        ctx.add_finding(
            "lab.clock_skew",
            f"Node {name}'s clock is {abs(offset):.1f} s "
            f"{'ahead of' if offset > 0 else 'behind'} the other nodes",
            evidence={"node": name, "offset_s": offset, "allowed_s": round(allowed, 3),
                      "offsets_s": offsets},
            change={"lab": f"enable time synchronisation (chrony/NTP) on {name}"},
        )
    return {"check": "clock_skew", "ok": not skewed, "offsets_s": offsets, "allowed_s": round(allowed, 3)}
