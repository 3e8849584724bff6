"""A simulated GB10 node: its filesystem sandbox, its state, and its node agent.

Each node owns a sandbox folder that stands for its filesystem (SFTP and every agent
file argument map absolute node paths into it; `..` may not climb out). It answers the
node agent's verbs (docs/lab-contracts.md, `lab.agent/1`) with the same envelope and
data as the real agent, from simulated hardware: facts of a DGX Spark, a page cache
that remembers which weights it holds, and telemetry synthesized at 1 Hz of lab time
from what the node's engine was doing (LAB_MODEL.md section 5's signatures). Nothing
it answers names the scenario's truth.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import math
import posixpath
import random
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from lab.clock import LabClock
from lab.sim import fp4
from lab.sim.engine import EngineProcess, RendezvousHub, backend_state
from lab.sim.scenario import ENGINE_DEFAULT_VERSIONS, Scenario

AGENT_SCHEMA = "lab.agent/1"
LAUNCH_SCHEMA = "lab.launch/1"
KIB_PER_GIB = 1024 * 1024
KIB_PER_GB = 1e9 / 1024
PYTHON_VERSION = "3.12.3"
KERNEL = "6.11.0-1016-nvidia"
GPU = {"name": "NVIDIA GB10", "compute_capability": "12.1", "driver": "580.95.05"}
BASE_USED_GIB = 3.6  # the OS, the desktop services and the agent itself
BASE_CACHED_GIB = 1.4  # page cache that is not model weights
NVME_FREE_BYTES = 3_700_000_000_000  # a 4 TB drive with the OS on it
DEFAULT_LOG_MAX = 1024 * 1024
PID_START = 4100


class SandboxError(ValueError):
    """A node path that leaves the node's filesystem."""


class AgentFailure(Exception):
    """A verb that failed: the envelope's error code and message, and the exit status."""

    def __init__(self, code: str, message: str, exit_status: int = 1) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_status = exit_status


@dataclass(frozen=True)
class NodePaths:
    work_dir: str
    model_dir: str
    cache_dir: str


@dataclass
class LabContext:
    """What the nodes of one simulated lab share."""

    scenario: Scenario
    clock: LabClock
    state_dir: Path
    hub: RendezvousHub
    calls_log: Path
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class AgentResult:
    exit_status: int
    stdout: str
    stderr: str = ""


@dataclass
class Activity:
    start: float
    end: float
    kind: str
    params: dict[str, Any]


class Series:
    """A quantity over lab time, piecewise linear: steps and ramps, never rewritten backwards."""

    def __init__(self, value: float = 0.0) -> None:
        self._times: list[float] = [-math.inf]
        self._values: list[float] = [value]

    def value_at(self, t: float) -> float:
        i = bisect.bisect_right(self._times, t) - 1
        if i + 1 < len(self._times) and self._times[i + 1] > self._times[i]:
            t0, t1 = self._times[i], self._times[i + 1]
            v0, v1 = self._values[i], self._values[i + 1]
            if math.isfinite(t0):
                return v0 + (v1 - v0) * (t - t0) / (t1 - t0)
        return self._values[i]

    def _truncate(self, t: float) -> float:
        value = self.value_at(t)
        keep = bisect.bisect_right(self._times, t)
        del self._times[keep:], self._values[keep:]
        self._times.append(t)
        self._values.append(value)
        return value

    def set(self, t: float, value: float) -> None:
        self._truncate(t)
        self._times.append(t)
        self._values.append(value)

    def ramp(self, t0: float, t1: float, value: float) -> None:
        self._truncate(t0)
        self._times.append(t1)
        self._values.append(value)

    def cut(self, t: float) -> None:
        """Hold the value reached at t from then on."""
        self._truncate(t)


@dataclass
class _Sampler:
    out: str
    start: float
    interval: float
    stop: float | None = None
    written_until: float = -math.inf
    pid: int = 0


VERBS = ("self-check", "facts", "sampler", "telemetry", "launch", "stop", "status", "logs",
         "drop-caches", "fp4-probe")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise AgentFailure("usage", f"{self.prog}: {message} ({self.format_usage().strip()})", 2)


def _number(kind: type, check: Any, what: str) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not check(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


_positive = _number(float, lambda v: 0 < v < math.inf, "a number of seconds > 0")
_count = _number(int, lambda v: v >= 0, "an integer >= 0")
_finite = _number(float, math.isfinite, "a number (epoch seconds)")
_probe_size = _number(int, lambda v: v > 0 and v % 128 == 0, "a positive multiple of 128")


def _verb_parser(verb: str) -> argparse.ArgumentParser:
    """The arguments each verb takes, as the real agent (lab/agent/agent.py) takes them."""
    p = _Parser(prog=f"agent.py {verb}", add_help=False, allow_abbrev=False)
    p.add_argument("--json", action="store_true")
    if verb == "facts":
        p.add_argument("--model-dir", required=True)
    elif verb == "sampler start":
        p.add_argument("--out", required=True)
        p.add_argument("--interval", type=_positive, default=1.0)
    elif verb == "sampler stop":
        p.add_argument("--out", required=True)
    elif verb == "telemetry":
        p.add_argument("--out", required=True)
        p.add_argument("--since", type=_finite, default=0.0)
    elif verb in ("launch", "stop", "status"):
        if verb == "launch":
            p.add_argument("--spec", required=True)
        if verb == "stop":
            p.add_argument("--grace", type=_positive, default=20.0)
        p.add_argument("--work-dir", default=None)
    elif verb == "logs":
        p.add_argument("--file", required=True)
        p.add_argument("--since", type=_count, required=True)
        p.add_argument("--max", type=_count, default=DEFAULT_LOG_MAX)
    elif verb == "fp4-probe":
        p.add_argument("--backend", required=True)
        p.add_argument("--seed", type=int, required=True)
        p.add_argument("--size", type=_probe_size, default=128)
    return p


def _verb_of(args: list[str]) -> str | None:
    words = [a for a in args if a != "--json"]
    if not words:
        return None
    if words[0] == "sampler" and len(words) > 1 and words[1] in ("start", "stop"):
        return f"sampler {words[1]}"
    return words[0]


def _parse(args: list[str]) -> tuple[str, argparse.Namespace]:
    words = [a for a in args if a != "--json"]
    if not words or words[0] not in VERBS:
        given = f"unknown verb {words[0]!r}" if words else "no verb given"
        raise AgentFailure("usage", f"{given}; accepted verbs: {', '.join(VERBS)}", 2)
    rest = list(args)
    rest.remove(words[0])
    verb = words[0]
    if verb == "sampler":
        action = words[1] if len(words) > 1 else None
        if action not in ("start", "stop"):
            raise AgentFailure("usage", f"sampler: expected start or stop, got {action!r}", 2)
        rest.remove(action)
        verb = f"sampler {action}"
    return verb, _verb_parser(verb).parse_args(rest)


def _utf8_complete(chunk: bytes) -> int:
    """Length of chunk without a trailing incomplete UTF-8 sequence."""
    for back in range(1, min(4, len(chunk)) + 1):
        byte = chunk[-back]
        if byte & 0xC0 != 0x80:
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return len(chunk) - back if need > back else len(chunk)
    return len(chunk)


class SimNode:
    """One node of the simulated lab."""

    def __init__(self, ctx: LabContext, index: int, paths: NodePaths) -> None:
        self.ctx = ctx
        self.scenario = ctx.scenario
        self.clock = ctx.clock
        self.hub = ctx.hub
        self.index = index
        self.name = ctx.scenario.node_names[index]
        self.role = "head" if index == 0 else "worker"
        self.paths = paths
        self.root = ctx.state_dir / "nodes" / self.name / "root"
        self.root.mkdir(parents=True, exist_ok=True)
        self._root_resolved = self.root.resolve()
        self.lock = threading.RLock()
        self.processes: list[EngineProcess] = []
        self.launch_count = 0
        self.weights_cached_gb = 0.0
        self._load: tuple[float, float, float, float] | None = None  # disk start, end, cached0, weights
        self._activities: list[Activity] = []
        self._cache_gib = Series(0.0)  # page cache holding model files, beyond BASE_CACHED_GIB
        self._engine_gib = Series(0.0)  # memory the engine holds
        self._samplers: dict[str, _Sampler] = {}
        self._next_pid = PID_START + 1000 * index
        # The clock_offset_s fault: how far this node's own clock reads ahead of lab time.
        # The simulation runs on lab time; only what the node reports by its clock (the
        # agent's times, telemetry stamps, engine log stamps) is read off the skewed one.
        self.clock_offset_s = sum(float(f["clock_offset_s"]) for f in ctx.scenario.faults("clock_offset_s")
                                  if f.get("node") in (None, self.name))
        for d in (paths.work_dir, paths.model_dir, paths.cache_dir):
            self.host_path(d).mkdir(parents=True, exist_ok=True)

    # -- the filesystem sandbox ---------------------------------------------------------------
    def host_path(self, node_path: str) -> Path:
        """Where an absolute node path lives in the sandbox; relative paths start at /root."""
        if not isinstance(node_path, str) or "\x00" in node_path:
            raise SandboxError(f"{node_path!r}: not a path")
        full = node_path if node_path.startswith("/") else f"/root/{node_path}"
        parts: list[str] = []
        for comp in full.split("/"):
            if comp in ("", "."):
                continue
            if comp == "..":
                if not parts:
                    raise SandboxError(f"{node_path}: '..' climbs above / of {self.name}")
                parts.pop()
                continue
            parts.append(comp)
        host = self.root.joinpath(*parts)
        resolved = host.resolve()
        if resolved != self._root_resolved and self._root_resolved not in resolved.parents:
            raise SandboxError(f"{node_path}: resolves outside {self.name}'s filesystem")
        return host

    def node_path(self, host: Path) -> str:
        rel = Path(host).resolve().relative_to(self._root_resolved)
        return "/" + rel.as_posix() if str(rel) != "." else "/"

    def node_time(self, t: float) -> float:
        """What this node's own clock reads at lab time t."""
        return t + self.clock_offset_s

    def _pid(self) -> int:
        with self.lock:
            self._next_pid += 1
            return self._next_pid

    def engine_versions(self) -> dict[str, str | None]:
        versions: dict[str, str | None] = dict(ENGINE_DEFAULT_VERSIONS)
        versions[self.scenario.engine["name"]] = self.scenario.engine["version"]
        return versions

    # -- what the engine tells the node ----------------------------------------------------------
    def record_activity(self, start: float, end: float, kind: str, params: dict[str, Any]) -> None:
        """From `start` the hardware does `kind`; whatever was open-ended before stops there."""
        with self.lock:
            for act in self._activities:
                if act.end > start >= act.start:
                    act.end = start
            self._activities = [a for a in self._activities if a.end > a.start]
            self._activities.append(Activity(start, end, kind, dict(params)))

    def activity_at(self, t: float) -> Activity | None:
        with self.lock:
            for act in reversed(self._activities):
                if act.start <= t < act.end:
                    return act
        return None

    def begin_load(self, disk_start: float, end: float, cached0: float, weights: float, loader: str) -> None:
        """The page cache fills as the weights stream in; mmap's readahead fills about twice as much."""
        with self.lock:
            self._load = (disk_start, end, cached0, weights)
            if end > disk_start:
                factor = 2.0 if loader == "mmap" else 1.0
                cap = self.scenario.node["mem_gib"] * 0.85 - BASE_CACHED_GIB
                level = self._cache_gib.value_at(disk_start)
                target = min(cap, level + factor * (weights - cached0) * 1e9 / (1024**3))
                self._cache_gib.ramp(disk_start, end, target)

    def finish_load(self, t: float, weights: float) -> None:
        with self.lock:
            self.weights_cached_gb = max(self.weights_cached_gb, weights)
            self._load = None

    def engine_memory_ramp(self, t0: float, t1: float, gib: float) -> None:
        with self.lock:
            self._engine_gib.ramp(t0, t1, gib)

    def engine_memory(self, t: float, gib: float) -> None:
        with self.lock:
            self._engine_gib.set(t, gib)

    def record_exit(self, proc: EngineProcess, t: float) -> None:
        """The process ended at t: its activity stops, a load in progress keeps what it read."""
        with self.lock:
            for act in self._activities:
                if act.end > t:
                    act.end = max(act.start, t)
            self._activities = [a for a in self._activities if a.end > a.start]
            if self._load is not None:
                disk_start, end, cached0, weights = self._load
                done = 0.0 if t <= disk_start else min(1.0, (t - disk_start) / max(1e-9, end - disk_start))
                self.weights_cached_gb = max(self.weights_cached_gb, cached0 + (weights - cached0) * done)
                self._load = None
            self._cache_gib.cut(t)
            self._engine_gib.set(t, 0.0)

    # -- telemetry ------------------------------------------------------------------------------
    def _nic_gbps(self) -> float:
        speed = float(self.scenario.network["link_gbps"])
        for fault in self.scenario.faults("nic_degraded_gbps"):
            if fault.get("node") in (None, self.name):
                speed = float(fault["nic_degraded_gbps"])
        return speed

    def memory_kib(self, t: float) -> tuple[int, int, int]:
        """(total, available, cached) in kB, as /proc/meminfo would say at lab time t."""
        node = self.scenario.node
        total = round(node["mem_gib"] * KIB_PER_GIB)
        with self.lock:
            engine = self._engine_gib.value_at(t)
            cache = self._cache_gib.value_at(t)
        used = (BASE_USED_GIB + engine) * KIB_PER_GIB
        available = int(max(0.0, total - used))
        cached = int((BASE_CACHED_GIB + cache) * KIB_PER_GIB)
        return total, available, cached

    def sample(self, t: float) -> dict[str, Any]:
        """One telemetry sample at lab time t, from what the node was doing then."""
        rng = random.Random(f"{self.scenario.seed}:{self.name}:{round(t * 10)}")
        act = self.activity_at(t)
        kind = act.kind if act else "idle"
        s = t - act.start if act else 0.0
        params = act.params if act else {}
        u = rng.uniform
        cpu_user, cpu_sys, iowait = u(0.3, 1.2), u(0.2, 0.6), u(0.0, 0.2)
        disk = u(0.0, 0.4)
        mgmt = u(0.01, 0.08)
        data = u(0.0, 0.005)
        compilers = 0
        gpu = 0.0
        link_mbps = self._nic_gbps() * 1000
        if kind == "process_start":
            cpu_user = 100.0 / self.scenario.node["cpu_cores"] * u(0.9, 1.0) + 0.5
            cpu_sys, disk = u(0.8, 1.5), u(15.0, 60.0)
        elif kind == "load_mmap":
            # Page-fault storms: two seconds of reads in every five, ~read_gbs on average.
            burst = int(s) % 5 < 2
            disk = params["read_gbs"] * 1000 * (2.3 if burst else 0.13) * u(0.85, 1.15)
            cpu_user, cpu_sys, iowait = u(2.0, 4.0), u(18.0, 26.0), u(6.0, 12.0)
            gpu = u(0.0, 3.0)
        elif kind in ("load_eager", "load_fastsafetensors"):
            disk = params["read_gbs"] * 1000 * u(0.93, 1.05)
            cpu_user, cpu_sys, iowait = u(3.0, 5.0), u(5.0, 8.0), u(2.0, 5.0)
            gpu = u(0.0, 5.0)
        elif kind == "load_cache":
            disk = u(0.0, 3.0)
            cpu_user, cpu_sys = u(4.0, 7.0), u(6.0, 10.0)
            gpu = u(0.0, 5.0)
        elif kind == "rendezvous_wait":
            cpu_user, cpu_sys, disk = u(0.2, 0.8), u(0.1, 0.4), u(0.0, 0.2)
            data = 0.0
            if params.get("late"):
                mgmt = u(0.3, 0.9) if int(s) % 4 == 0 else u(0.04, 0.1)
            else:
                mgmt = u(0.02, 0.08)
        elif kind == "distributed_init":
            data = min(link_mbps * 0.9, u(18000.0, 40000.0)) if s < 3 else u(50.0, 300.0)
            cpu_user, cpu_sys, gpu = u(5.0, 7.0), u(2.0, 4.0), u(5.0, 20.0)
        elif kind == "jit":
            if params.get("cold"):
                compilers = rng.randint(16, 20)
                cpu_user, cpu_sys, disk = u(93.0, 99.0), u(0.5, 2.5), u(0.0, 0.3)
                iowait = 0.0
            else:
                compilers = rng.randint(0, 2)
                cpu_user, disk = u(8.0, 18.0), u(20.0, 80.0)
        elif kind == "wait":
            cpu_user, gpu = u(0.5, 1.5), u(0.0, 2.0)
        elif kind == "kv_alloc":
            burst = int(s) % 3 == 0
            gpu = u(80.0, 97.0) if burst else u(0.0, 15.0)
            data = u(50.0, 500.0) if burst else u(0.0, 5.0)
            cpu_user = u(4.0, 6.0)
        elif kind == "graph_capture":
            gpu = u(5.0, 20.0) if int(s) % 7 == 6 else u(55.0, 97.0)
            data = min(link_mbps * 0.5, u(500.0, 6000.0)) if int(s) % 7 < 2 else u(10.0, 100.0)
            cpu_user = u(5.0, 8.0)
        elif kind == "api_ready":
            cpu_user, gpu = u(3.0, 5.0), u(0.0, 3.0)
        elif kind == "serving":
            cpu_user, gpu = u(1.0, 3.0), u(0.0, 4.0)
        idle = max(0.0, 100.0 - cpu_user - cpu_sys - iowait)
        _, available, cached = self.memory_kib(t)
        nics = self.scenario.node["nics"]
        net = {nics["mgmt"]: {"rx_mbps": round(mgmt, 3), "tx_mbps": round(mgmt * u(0.6, 1.0), 3)}}
        for nic in nics["data"]:
            net[nic] = {"rx_mbps": round(data * u(0.9, 1.0), 3), "tx_mbps": round(data * u(0.9, 1.0), 3)}
        return {
            "t": float(self.node_time(t)),
            "cpu": {"user": round(cpu_user, 2), "system": round(cpu_sys, 2), "iowait": round(iowait, 2),
                    "idle": round(idle, 2)},
            "mem": {"available_kib": available, "cached_kib": cached, "swap_used_kib": 0},
            "disk_read_mbps": round(disk, 2),
            "net": net,
            "compilers": compilers,
            "gpu_util": round(gpu, 1),
        }

    def _sample_times(self, sampler: _Sampler, after: float, until: float) -> list[float]:
        first = math.ceil(sampler.start)
        k0 = max(0, math.floor((after - first) / sampler.interval) + 1) if after >= first else 0
        times = []
        k = k0
        while True:
            t = first + k * sampler.interval
            if t > until:
                break
            if t > after:
                times.append(float(t))
            k += 1
        return times

    def _materialize(self, sampler: _Sampler, now: float) -> None:
        """Append the samples up to now to the sampler's file, as the real sampler would have."""
        until = now if sampler.stop is None else min(now, sampler.stop)
        times = self._sample_times(sampler, sampler.written_until, until)
        if not times:
            return
        path = self.host_path(sampler.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            for t in times:
                fh.write(json.dumps(self.sample(t), separators=(",", ":")) + "\n")
        sampler.written_until = times[-1]

    # -- the agent ------------------------------------------------------------------------------
    def run_agent(self, script: str, args: list[str]) -> AgentResult:
        """Answer `python3 <script> ARGS` as the real agent would: one JSON object on stdout."""
        verb: str | None = _verb_of(args)
        t = self.clock.now()
        envelope: dict[str, Any]
        try:
            verb, ns = _parse(args)
            data = self._dispatch(verb, ns, script)
            envelope = {"schema": AGENT_SCHEMA, "verb": verb, "ok": True, "data": data}
            status = 0
        except (AgentFailure, SandboxError) as exc:
            if isinstance(exc, SandboxError):
                exc = AgentFailure("not_permitted", str(exc), 1)
            envelope = {"schema": AGENT_SCHEMA, "verb": verb, "ok": False,
                        "error": {"code": exc.code, "message": exc.message}}
            status = exc.exit_status
        compact = "--json" in args
        text = json.dumps(envelope, separators=(",", ":")) if compact else json.dumps(envelope, indent=2)
        self._log_call(verb or "", args, t, status)
        return AgentResult(status, text + "\n")

    def _log_call(self, verb: str, args: list[str], t: float, status: int) -> None:
        line = json.dumps({"t": round(t, 3), "wall": round(time.time(), 3), "node": self.name,
                           "verb": verb, "args": args, "exit": status})
        with self.ctx.lock, self.ctx.calls_log.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    def _dispatch(self, verb: str, ns: argparse.Namespace, script: str) -> dict[str, Any]:
        if verb == "self-check":
            return self._self_check(script)
        if verb == "facts":
            return self.facts(ns.model_dir)
        if verb == "sampler start":
            return self._sampler_start(ns.out, ns.interval)
        if verb == "sampler stop":
            return self._sampler_stop(ns.out)
        if verb == "telemetry":
            return self._telemetry(ns.out, ns.since)
        if verb == "launch":
            return self._launch(ns.spec)
        if verb == "stop":
            return {"stopped": self.stop_engines()}
        if verb == "status":
            return self.status()
        if verb == "logs":
            return self._logs(ns.file, ns.since, ns.max)
        if verb == "drop-caches":
            return self.drop_caches()
        return self._fp4_probe(ns.backend, ns.seed, ns.size)

    def _self_check(self, script: str) -> dict[str, Any]:
        path = self.host_path(script)
        source = path.read_bytes()
        match = re.search(rb"^(?:__version__|VERSION|AGENT_VERSION)\s*=\s*['\"]([^'\"]+)['\"]", source, re.M)
        return {
            "version": match.group(1).decode() if match else "unknown",
            "sha256": hashlib.sha256(source).hexdigest(),
            "python": PYTHON_VERSION,
        }

    def facts(self, model_dir: str) -> dict[str, Any]:
        t = self.clock.now()
        total, available, _ = self.memory_kib(t)
        nics = self.scenario.node["nics"]
        data_mbps = round(self._nic_gbps() * 1000)
        model_host = self.host_path(model_dir)
        return {
            "host": self.name,
            "time": self.node_time(t),
            "kernel": KERNEL,
            "arch": "aarch64",
            "cpu_count": int(self.scenario.node["cpu_cores"]),
            "mem_total_kib": total,
            "mem_available_kib": available,
            # nvidia-smi on GB10 reports no memory figure: the GPU shares the unified memory.
            "gpus": [{**GPU, "compute_capability": self.scenario.node["compute_capability"],
                      "memory_total_mib": None}],
            "nics": [{"name": nics["mgmt"], "speed_mbps": round(nics["mgmt_gbps"] * 1000), "mtu": 1500,
                      "operstate": "up"}]
            + [{"name": n, "speed_mbps": data_mbps, "mtu": 1500, "operstate": "up"} for n in nics["data"]],
            "model_dir": {
                "path": model_dir,
                "exists": model_host.exists(),
                "free_bytes": int(NVME_FREE_BYTES - self.scenario.model["checkpoint_gb"] * 1e9)
                if model_host.exists() else None,
            },
            "engines": self.engine_versions(),
            "python": PYTHON_VERSION,
        }

    def _sampler_start(self, out: str, interval: float) -> dict[str, Any]:
        path = self.host_path(out)
        now = self.clock.now()
        with self.lock:
            old = self._samplers.get(out)
            if old is not None and old.stop is None:
                # One sampler per file; a second start keeps the first, as on a real node.
                return {"pid": old.pid, "out": out}
            # The interval is in node-clock (lab) seconds; the simulated sampler resolves
            # whole lab seconds only.
            sampler = _Sampler(out=out, start=now, interval=float(max(1, round(interval))), pid=self._pid())
            if old is not None:
                sampler.written_until = old.written_until
            self._samplers[out] = sampler
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        return {"pid": sampler.pid, "out": out}

    def _sampler_stop(self, out: str) -> dict[str, Any]:
        self.host_path(out)
        now = self.clock.now()
        with self.lock:
            sampler = self._samplers.get(out)
            if sampler is None or sampler.stop is not None:
                return {"stopped": False}
            sampler.stop = now
            self._materialize(sampler, now)
        return {"stopped": True}

    def _telemetry(self, out: str, since: float) -> dict[str, Any]:
        self.host_path(out)
        now = self.clock.now()
        with self.lock:
            sampler = self._samplers.get(out)
            if sampler is None:  # like reading a file no sampler wrote: nothing, not running
                return {"samples": [], "running": False}
            self._materialize(sampler, now)
            until = now if sampler.stop is None else min(now, sampler.stop)
            # `since` is a reading of this node's clock, like the samples' stamps.
            times = self._sample_times(sampler, since - self.clock_offset_s, until)
            running = sampler.stop is None
        return {"samples": [self.sample(t) for t in times], "running": running}

    def telemetry_between(self, start: float, end: float, interval: float = 1.0) -> list[dict[str, Any]]:
        """Samples on a whole-second grid in [start, end] (for in-process callers such as tests)."""
        t = float(math.ceil(start))
        out = []
        while t <= end:
            out.append(self.sample(t))
            t += interval
        return out

    def _launch(self, spec_path: str) -> dict[str, Any]:
        path = self.host_path(spec_path)
        try:
            raw = path.read_bytes()
            spec = json.loads(raw.decode("utf-8"))
        except FileNotFoundError as exc:
            raise AgentFailure("not_found", f"launch: no readable spec at --spec {spec_path!r}") from exc
        except (OSError, ValueError) as exc:
            raise AgentFailure("invalid_spec", f"launch: {spec_path} is not JSON: {exc}") from exc
        if not isinstance(spec, dict):
            raise AgentFailure("invalid_spec", f"launch: {spec_path} must hold a JSON object")

        def bad(field: str, what: str) -> AgentFailure:
            return AgentFailure("invalid_spec", f"spec.{field}: {what}, got {spec.get(field)!r}")

        if spec.get("schema") != LAUNCH_SCHEMA:
            raise bad("schema", f"must be {LAUNCH_SCHEMA!r}")
        argv, env, log_file = spec.get("argv"), spec.get("env", {}), spec.get("log_file")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise bad("argv", "must be a non-empty list of strings")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in env.items()):
            raise bad("env", "must map variable names to string values")
        if not isinstance(log_file, str) or not log_file:
            raise bad("log_file", "must be a file path")
        cwd = spec.get("cwd", self.paths.work_dir)
        if not isinstance(cwd, str) or not self.host_path(posixpath.join(self.paths.work_dir, cwd)).is_dir():
            raise bad("cwd", "must be an existing directory")
        log_file = posixpath.join(self.paths.work_dir, log_file)
        return self.launch({**spec, "env": env, "log_file": log_file}, self.host_path(log_file),
                           spec_sha256=hashlib.sha256(raw).hexdigest())

    def launch(self, spec: dict[str, Any], log_host: Path, *,
               spec_sha256: str | None = None) -> dict[str, Any]:
        """Start an engine from `spec`. `spec_sha256` is the hash of the spec file's bytes as
        read (what `status` reports); in-process callers that hand over the spec itself get
        the hash of the bytes the platform would have written for it."""
        if spec_sha256 is None:
            spec_sha256 = hashlib.sha256(json.dumps(spec, indent=2).encode()).hexdigest()
        with self.lock:
            running = [p for p in self.processes if p.running]
            if running:
                raise AgentFailure("already_running", f"launch: an engine already runs here "
                                   f"(pid {running[0].pid}); run `stop` first")
            started = self.clock.now()
            proc = EngineProcess(self, pid=self._pid(), spec=spec, log_path=log_host, started=started,
                                 spec_sha256=spec_sha256)
            self.launch_count += 1
            self.processes.append(proc)
        proc.start()
        return {"pid": proc.pid, "log_file": spec["log_file"], "started": self.node_time(started)}

    def stop_engines(self) -> list[int]:
        with self.lock:
            running = [p for p in self.processes if p.running]
        return [p.pid for p in running if p.terminate()]

    def status(self) -> dict[str, Any]:
        with self.lock:
            proc = self.processes[-1] if self.processes else None
        if proc is None:
            return {"running": False, "pid": None, "exit_code": None, "spec_sha256": None}
        return {"running": proc.running, "pid": proc.pid, "exit_code": proc.exit_code,
                "spec_sha256": proc.spec_sha256}

    def _logs(self, file: str, since: int, max_bytes: int) -> dict[str, Any]:
        path = self.host_path(file)
        node_file = posixpath.normpath(file if file.startswith("/") else f"/root/{file}")
        if not path.is_file():
            raise AgentFailure("not_found", f"logs: no file at --file {node_file!r}")
        with path.open("rb") as fh:
            size = fh.seek(0, 2)
            # Past the end means the file was replaced or truncated: start again at 0.
            start = since if since <= size else 0
            fh.seek(start)
            chunk = fh.read(min(max_bytes, size - start))
        keep = _utf8_complete(chunk)
        # Hold back a character cut in two, unless nothing could ever be returned then.
        if keep > 0 or start + len(chunk) >= size:
            chunk = chunk[:keep]
        return {"path": node_file, "offset": start, "next_offset": start + len(chunk), "size": size,
                "text": chunk.decode("utf-8", "replace")}

    def drop_caches(self) -> dict[str, Any]:
        now = self.clock.now()
        _, _, before = self.memory_kib(now)
        with self.lock:
            self.weights_cached_gb = 0.0
            self._cache_gib.set(now, 0.0)
        _, _, after = self.memory_kib(now)
        return {"dropped": True, "mem_cached_kib_before": before, "mem_cached_kib_after": after}

    def _fp4_probe(self, backend: str, seed: int, size: int) -> dict[str, Any]:
        fp4_truth = self.scenario.truth["fp4"]
        known = ["reference", *sorted(fp4_truth["speed"])]
        if backend not in known:
            raise AgentFailure("unsupported", f"fp4-probe: --backend {backend!r} is not one this agent "
                               f"runs; accepted: {', '.join(known)}")
        state = "ok" if backend == "reference" else backend_state(backend, fp4_truth)
        return fp4.probe(backend, seed, size=size, state=state, error_rate=float(fp4_truth["error_rate"]))

    def shutdown(self) -> None:
        for proc in list(self.processes):
            proc.terminate()
