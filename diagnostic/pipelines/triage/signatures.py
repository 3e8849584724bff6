"""Which fault a cold-start stall is, decided from telemetry alone (METHODOLOGY.md,
"Loading triage"; LAB_MODEL.md section 5).

Three faults look alike from outside (minutes of log silence); their telemetry does not:

- `load.weights_io`: the disk reads little and in storms, the page cache climbs, system CPU
  is high (an mmap loader page-faulting its way through the checkpoint);
- `load.jit_compile`: many compiler processes at full user CPU, the disk and the GPU idle,
  after the weights are in;
- `load.rendezvous`: every node idle with the data NICs silent while one node keeps talking
  on its management NIC (bootstrap retries): the others wait for it.

A node whose GPU is busy through the silence is doing real work that logs nothing (graph
capture): that is no fault. Anything else is `unexplained`, with its figures; a window the
sampler covered too thinly is `evidence_incomplete`. Each verdict carries the figures that
decided it and, for a refusal, why each signature did not fit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from diagnostic.pipelines.triage.frames import MIN_COVERAGE

WEIGHTS_IO = "load.weights_io"
JIT_COMPILE = "load.jit_compile"
RENDEZVOUS = "load.rendezvous"
FAULTS = (WEIGHTS_IO, JIT_COMPILE, RENDEZVOUS)
UNEXPLAINED = "unexplained"
INCOMPLETE = "evidence_incomplete"
GPU_WORK = "gpu_work"  # the engine works on the GPU without logging: not a fault
IDLE = "idle"  # per node only: nothing happening (a rendezvous needs every node's view)

# Thresholds, each with the physics it stands for (LAB_MODEL.md section 5).
# A sequential NVMe read is gigabytes per second; a page-faulting loader reaches a few
# hundred megabytes, so "low" is well under the former and "reading" well over idle noise.
DISK_LOW_MBPS = 1500.0
DISK_READING_MBPS = 20.0
# Storms of reads: second by second the rate swings by more than its own mean (a
# streaming reader stays within a few tenths of it).
BURSTY_CV = 0.5
PAGE_CACHE_CLIMB_GIB_PER_MIN = 1.0
SYSTEM_CPU_HIGH_PCT = 10.0
# Compilation: several compiler processes keeping most cores busy in user space.
COMPILERS_MANY = 4.0
CPU_USER_FULL_PCT = 70.0
DISK_IDLE_MBPS = 20.0
GPU_IDLE_PCT = 10.0
# Idle: a node with almost nothing to do.
IDLE_CPU_PCT = 5.0
IDLE_DISK_MBPS = 5.0
IDLE_GPU_PCT = 5.0
DATA_NIC_SILENT_MBPS = 1.0
# A busy GPU: graph capture and KV profiling keep it above this most of the time.
GPU_BUSY_PCT = 30.0
# The late node's management NIC carries several times the others' background chatter.
LATE_NODE_RATIO = 3.0
LATE_NODE_MIN_MBPS = 0.2


@dataclass
class NodeReading:
    """One node's telemetry over one stall window, read against each signature."""

    node: str
    summary: dict[str, Any]
    kind: str  # WEIGHTS_IO | JIT_COMPILE | GPU_WORK | IDLE | UNEXPLAINED | INCOMPLETE
    why_not: dict[str, str] = field(default_factory=dict)


def _get(summary: Mapping[str, Any], key: str) -> float | None:
    value = summary.get(key)
    return None if value is None else float(value)


def _weights_io(s: Mapping[str, Any]) -> str | None:
    """None when the window has the weights-I/O signature, else why not."""
    mean = _get(s, "disk_read_mbps_mean")
    if mean is None or mean < DISK_READING_MBPS:
        return f"the local disk is not reading (mean {mean} MB/s)"
    if mean > DISK_LOW_MBPS:
        return f"the disk streams at {mean:.0f} MB/s, a sequential reader's speed"
    cv = _get(s, "disk_read_cv")
    if cv is None or cv < BURSTY_CV:
        return f"the reads are steady, not bursty (CV {cv})"
    climb = _get(s, "page_cache_gib_per_min")
    if climb is None or climb < PAGE_CACHE_CLIMB_GIB_PER_MIN:
        return f"the page cache does not climb ({climb} GiB/min)"
    sys_pct = _get(s, "cpu_system_pct_median") or 0.0
    user_pct = _get(s, "cpu_user_pct_median") or 0.0
    if sys_pct < SYSTEM_CPU_HIGH_PCT or sys_pct <= user_pct:
        return f"system CPU is not high ({sys_pct:.1f} % system, {user_pct:.1f} % user)"
    if (_get(s, "compilers_median") or 0.0) >= 1:
        return "compiler processes run"
    return None


def _jit_compile(s: Mapping[str, Any], after_weights: bool) -> str | None:
    compilers = _get(s, "compilers_median") or 0.0
    if compilers < COMPILERS_MANY:
        return f"few compiler processes (median {compilers:.0f})"
    user = _get(s, "cpu_user_pct_median") or 0.0
    if user < CPU_USER_FULL_PCT:
        return f"the compilers do not keep the CPU busy ({user:.0f} % user): they wait on something"
    disk = _get(s, "disk_read_mbps_median") or 0.0
    if disk > DISK_IDLE_MBPS:
        return f"the disk is busy ({disk:.0f} MB/s)"
    gpu = _get(s, "gpu_util_pct_median")
    if gpu is not None and gpu > GPU_IDLE_PCT:
        return f"the GPU is busy ({gpu:.0f} %)"
    if not after_weights:
        return "the weights are not loaded yet: kernels compile after the weights load"
    return None


def _idle(s: Mapping[str, Any]) -> str | None:
    cpu = (_get(s, "cpu_user_pct_median") or 0.0) + (_get(s, "cpu_system_pct_median") or 0.0)
    if cpu > IDLE_CPU_PCT:
        return f"the CPU is busy ({cpu:.1f} % user + system)"
    disk = _get(s, "disk_read_mbps_median") or 0.0
    if disk > IDLE_DISK_MBPS:
        return f"the disk reads {disk:.0f} MB/s"
    if (_get(s, "compilers_peak") or 0.0) > 0 and (_get(s, "compilers_median") or 0.0) >= 1:
        return "compiler processes run"
    gpu = _get(s, "gpu_util_pct_median")
    if gpu is not None and gpu > IDLE_GPU_PCT:
        return f"the GPU is busy ({gpu:.0f} %)"
    data = _get(s, "data_nic_mbps_median")
    if data is not None and data > DATA_NIC_SILENT_MBPS:
        return f"the data NICs carry {data:.1f} Mbit/s"
    return None


def read_node(node: str, summary: Mapping[str, Any], *, after_weights: bool) -> NodeReading:
    """Which signature one node's window shows: exactly one, or none (unexplained)."""
    summary = dict(summary)
    if float(summary.get("coverage") or 0.0) < MIN_COVERAGE:
        return NodeReading(node, summary, INCOMPLETE,
                           {"all": f"telemetry covers {100 * float(summary.get('coverage') or 0):.0f} % "
                                   "of the window"})
    gpu = _get(summary, "gpu_util_pct_median")
    checks = {
        WEIGHTS_IO: _weights_io(summary),
        JIT_COMPILE: _jit_compile(summary, after_weights),
        IDLE: _idle(summary),
        GPU_WORK: None if gpu is not None and gpu >= GPU_BUSY_PCT else f"the GPU is not busy ({gpu} %)",
    }
    matched = [k for k, why in checks.items() if why is None]
    if len(matched) == 1:
        return NodeReading(node, summary, matched[0])
    why_not = {k: why for k, why in checks.items() if why is not None}
    if len(matched) > 1:
        why_not["all"] = f"matches more than one signature ({', '.join(matched)})"
    return NodeReading(node, summary, UNEXPLAINED, why_not)


@dataclass
class Verdict:
    """What one stall is, across the nodes that saw it."""

    cause: str  # a FAULTS code, GPU_WORK, UNEXPLAINED or INCOMPLETE
    decided_by: dict[str, Any]
    readings: dict[str, NodeReading]
    incomplete_nodes: list[str]
    late_node: str | None = None
    why_not: dict[str, Any] = field(default_factory=dict)


def _late_node(readings: Mapping[str, NodeReading]) -> tuple[str | None, dict[str, float]]:
    """The node whose management NIC is several times busier than every other's."""
    p90 = {n: float(r.summary.get("mgmt_nic_mbps_p90") or 0.0) for n, r in readings.items()}
    if len(p90) < 2:
        return None, p90
    ranked = sorted(p90, key=lambda n: p90[n], reverse=True)
    top, rest = ranked[0], [p90[n] for n in ranked[1:]]
    background = sorted(rest)[len(rest) // 2]
    if p90[top] >= LATE_NODE_MIN_MBPS and p90[top] >= LATE_NODE_RATIO * max(background, 1e-3) \
            and p90[top] >= LATE_NODE_RATIO * max(rest):
        return top, p90
    return None, p90


def classify(windows: Mapping[str, Mapping[str, Any]], stalled: list[str], *,
             after_weights: bool, before_weights: bool = True) -> Verdict:
    """One stall from each node's window summary (`windows`: every node of the launch, over
    the stall's lab-time window; `stalled`: the nodes whose log went silent).

    A per-node signature (weights I/O, JIT) must be shown by every stalled node with full
    evidence and contradicted by none; the rendezvous is a property of the whole group:
    every node idle and data-silent, and one of them talking on its management NIC, in a
    silence that lies between the process start and the first model-init or weights line
    (`before_weights`: the ranks meet before any weight is read, LAB_MODEL.md section 5).
    NCCL's own lines are not needed: it writes them only with NCCL_DEBUG=INFO."""
    readings = {n: read_node(n, s, after_weights=after_weights) for n, s in windows.items()}
    incomplete = sorted(n for n, r in readings.items() if r.kind == INCOMPLETE)
    seen = [readings[n] for n in stalled if n in readings and readings[n].kind != INCOMPLETE]
    if not seen:
        return Verdict(INCOMPLETE, {"nodes_without_telemetry": incomplete}, readings, incomplete,
                       why_not={n: readings[n].why_not for n in stalled if n in readings})
    kinds = {r.kind for r in seen}
    if len(kinds) == 1 and (kind := next(iter(kinds))) in (WEIGHTS_IO, JIT_COMPILE, GPU_WORK):
        return Verdict(kind, _decided(kind, seen), readings, incomplete)
    if kinds == {IDLE}:
        complete = {n: r for n, r in readings.items() if r.kind != INCOMPLETE}
        others_idle = all(r.kind == IDLE or n not in stalled for n, r in complete.items())
        late, p90 = _late_node(complete)
        data_silent = all(float(r.summary.get("data_nic_mbps_median") or 0.0) <= DATA_NIC_SILENT_MBPS
                          for r in complete.values())
        if late is not None and others_idle and data_silent and before_weights:
            decided = _decided(RENDEZVOUS, seen)
            decided.update({"where": "between process start and the first model-init or weights line",
                            "late_node": late, "late_node_mgmt_nic_mbps_p90": p90[late],
                            "other_nodes_mgmt_nic_mbps_p90_max": max(v for n, v in p90.items() if n != late),
                            "waiting_nodes": sorted(stalled)})
            return Verdict(RENDEZVOUS, decided, readings, incomplete, late_node=late)
        why = ("no node talks on its management NIC more than the others" if late is None
               else "not every node is idle with its data NICs silent" if not (others_idle and data_silent)
               else "the silence comes after the weights began to load: the ranks meet before that")
        if incomplete:
            # The node we cannot see may be the one the others wait for: say so, don't guess.
            decided = {"nodes_without_telemetry": incomplete, "idle_nodes": sorted(complete)}
            return Verdict(INCOMPLETE, decided, readings, incomplete, why_not={RENDEZVOUS: why})
        return Verdict(UNEXPLAINED, _decided(IDLE, seen), readings, incomplete, why_not={RENDEZVOUS: why})
    return Verdict(UNEXPLAINED, _decided(UNEXPLAINED, seen), readings, incomplete,
                   why_not={r.node: r.why_not or {"kind": r.kind} for r in seen})


_DECIDING = {
    WEIGHTS_IO: ("disk_read_mbps_mean", "disk_read_cv", "page_cache_gib_per_min",
                 "page_cache_gib_end", "cpu_system_pct_median", "cpu_user_pct_median"),
    JIT_COMPILE: ("compilers_median", "compilers_peak", "cpu_user_pct_median", "disk_read_mbps_median",
                  "gpu_util_pct_median"),
    RENDEZVOUS: ("cpu_user_pct_median", "disk_read_mbps_median", "gpu_util_pct_median",
                 "data_nic_mbps_median"),
    GPU_WORK: ("gpu_util_pct_median", "cpu_user_pct_median"),
}


def _decided(kind: str, readings: list[NodeReading]) -> dict[str, Any]:
    """The deciding figures across the nodes: for each, the mean over the nodes and the
    range (each node was tested against the threshold on its own), and the nodes."""
    keys = _DECIDING.get(kind) or tuple(k for k in readings[0].summary if k not in ("samples",))
    out: dict[str, Any] = {"nodes": sorted(r.node for r in readings)}
    for key in keys:
        values = [float(v) for r in readings if (v := r.summary.get(key)) is not None]
        if values:
            out[key] = round(sum(values) / len(values), 3)
            out[f"{key}_range"] = [round(min(values), 3), round(max(values), 3)]
    out["window_s"] = max(int(r.summary.get("seconds") or 0) for r in readings)
    return out
