"""A simulated GB10 node: its filesystem sandbox, its state, and its node agent.

Each node owns a sandbox folder that stands for its filesystem (SFTP and every agent
file argument map absolute node paths into it; `..` may not climb out). It answers the
node agent's verbs (docs/lab-contracts.md, `lab.agent/1`) with the same envelope and
data as the real agent, from its simulated hardware (lab/sim/hardware.py): facts of a
DGX Spark, a page cache that remembers which weights it holds, telemetry synthesized
at 1 Hz of lab time from what the node's engine was doing (LAB_MODEL.md section 5's
signatures), and the memory bandwidth a streaming read reaches (`mem-bw-probe`, from the
scenario's hardware section, as a real node's measurement would reveal it). Nothing it
answers names the scenario's truth.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import posixpath
import random
import re
import shutil
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from lab.agent.agent import (
    MEM_BW_DEFAULT_MIB,
    MEM_BW_DEFAULT_REPEATS,
    MEM_BW_MAX_REPEATS,
    MEM_BW_METHOD,
    PER_LAUNCH_CACHE,
    launch_owner,
    not_own_address,
    root_engine_user,
    rotate_log,
    spec_problem,
    uses_launch_cache,
)
from lab.clock import LabClock
from lab.env_policy import compiled_policy as compiled_env_policy
from lab.flag_policy import compiled_policy as compiled_flag_policy
from lab.sim import fp4
from lab.sim.engine import EngineProcess, RendezvousHub, backend_state
from lab.sim.hardware import NodeHardware
from lab.sim.paths import NodePaths
from lab.sim.scenario import ENGINE_DEFAULT_VERSIONS, Scenario

AGENT_SCHEMA = "lab.agent/1"
# Where a node keeps its own settings (the agent's NODE_CONFIG), as its messages name it.
NODE_CONFIG = "/etc/gb10-diag/agent.json"
PYTHON_VERSION = "3.12.3"
KERNEL = "6.11.0-1016-nvidia"
GPU = {"name": "NVIDIA GB10", "compute_capability": "12.1", "driver": "580.95.05"}
NVME_FREE_BYTES = 3_700_000_000_000  # a 4 TB drive with the OS on it
DEFAULT_LOG_MAX = 1024 * 1024
PID_START = 4100
# mem-bw-probe: each repeat's bandwidth is the streaming figure times exp(N(0, sigma));
# torch's import, the CUDA context, the buffer's allocation and the warm-up passes take
# a fixed few lab seconds before the timed repeats.
MEM_BW_SIGMA = 0.01
MEM_BW_SETUP_S = 2.0


class SandboxError(ValueError):
    """A node path that leaves the node's filesystem."""


class AgentFailure(Exception):
    """A verb that failed: the envelope's error code and message, and the exit status."""

    def __init__(self, code: str, message: str, exit_status: int = 1) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_status = exit_status


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
class _Sampler:
    out: str
    start: float
    interval: float
    stop: float | None = None
    written_until: float = -math.inf
    pid: int = 0


VERBS = ("self-check", "facts", "sampler", "telemetry", "launch", "stop", "status", "logs",
         "drop-caches", "fp4-probe", "mem-bw-probe")


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
_buffer_mib = _number(int, lambda v: v >= 64, "an integer >= 64 (MiB)")
_repeats = _number(int, lambda v: 1 <= v <= MEM_BW_MAX_REPEATS, f"an integer from 1 to {MEM_BW_MAX_REPEATS}")


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
    elif verb == "mem-bw-probe":
        p.add_argument("--size-mib", type=_buffer_mib, default=MEM_BW_DEFAULT_MIB)
        p.add_argument("--repeats", type=_repeats, default=MEM_BW_DEFAULT_REPEATS)
        p.add_argument("--work-dir", default=None)
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
        self.hardware = NodeHardware(ctx.scenario, index)
        self._samplers: dict[str, _Sampler] = {}
        self._next_pid = PID_START + 1000 * index
        self._mem_bw_probes = 0
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
        return self.hardware.node_time(t)

    @property
    def clock_offset_s(self) -> float:
        return self.hardware.clock_offset_s

    @property
    def weights_cached_gb(self) -> float:
        """Model weights (GB) this node's page cache still holds."""
        return self.hardware.weights_cached_gb

    @property
    def engine_user(self) -> str:
        """Who the node's agent would start engines as (its node config's engine_user)."""
        return str(self.scenario.node.get("engine_user") or "diag")

    def _pid(self) -> int:
        with self.lock:
            self._next_pid += 1
            return self._next_pid

    def engine_versions(self) -> dict[str, str | None]:
        versions: dict[str, str | None] = dict(ENGINE_DEFAULT_VERSIONS)
        versions[self.scenario.engine["name"]] = self.scenario.engine["version"]
        return versions

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

    def _sampler_end(self, sampler: _Sampler) -> float | None:
        """When the sampler stopped writing: stopped, or died (the `sampler_dies_after_s`
        fault: the process exits that long after each start), or None while it runs."""
        ends = [] if sampler.stop is None else [sampler.stop]
        for fault in self.scenario.faults("sampler_dies_after_s"):
            if fault.get("node") in (None, self.name):
                ends.append(sampler.start + float(fault["sampler_dies_after_s"]))
        return min(ends) if ends else None

    def _materialize(self, sampler: _Sampler, now: float) -> None:
        """Append the samples up to now to the sampler's file, as the real sampler would have."""
        end = self._sampler_end(sampler)
        until = now if end is None else min(now, end)
        times = self._sample_times(sampler, sampler.written_until, until)
        if not times:
            return
        path = self.host_path(sampler.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            for t in times:
                fh.write(json.dumps(self.hardware.sample(t), separators=(",", ":")) + "\n")
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
        if verb == "mem-bw-probe":
            return self.mem_bw_probe(ns.size_mib, ns.repeats)
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
        total, available, _ = self.hardware.memory_kib(t)
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
            "nics": self.hardware.nic_facts(),
            "rdma": self.hardware.rdma_facts(),
            "model_dir": {
                "path": model_dir,
                "exists": model_host.exists(),
                "free_bytes": int(NVME_FREE_BYTES - self.scenario.model["checkpoint_gb"] * 1e9)
                if model_host.exists() else None,
                "fs_type": str(self.scenario.node["model_fs"]) if model_host.exists() else None,
            },
            "engines": self.engine_versions(),
            "loaders": {"fastsafetensors": self.scenario.node.get("fastsafetensors") or None},
            "python": PYTHON_VERSION,
            "engine_user": {"name": self.engine_user, "uid": 0 if self.engine_user == "root" else 998,
                            "problem": root_engine_user("root", NODE_CONFIG)
                            if self.engine_user == "root" else None},
        }

    def _sampler_start(self, out: str, interval: float) -> dict[str, Any]:
        path = self.host_path(out)
        now = self.clock.now()
        with self.lock:
            old = self._samplers.get(out)
            old_end = None if old is None else self._sampler_end(old)
            if old is not None and (old_end is None or old_end > now):
                # One sampler per file; a second start keeps the first, as on a real node
                # (a sampler that died is gone: a start starts a new one).
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
            end = self._sampler_end(sampler)
            until = now if end is None else min(now, end)
            # `since` is a reading of this node's clock, like the samples' stamps.
            times = self._sample_times(sampler, since - self.clock_offset_s, until)
            running = end is None or end > now
        return {"samples": [self.hardware.sample(t) for t in times], "running": running}

    def telemetry_between(self, start: float, end: float, interval: float = 1.0) -> list[dict[str, Any]]:
        """Samples on a whole-second grid in [start, end] (for in-process callers such as tests)."""
        t = float(math.ceil(start))
        out = []
        while t <= end:
            out.append(self.hardware.sample(t))
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

        # The real agent's checks of the spec as data, with the policies it is pushed with
        # (lab.env_policy, lab.flag_policy); then what the node's filesystem says.
        problem = spec_problem(spec, self.paths.work_dir, cache_dir=self.paths.cache_dir,
                               models_dir=posixpath.dirname(self.paths.model_dir) or "/",
                               policies=(compiled_env_policy(), compiled_flag_policy()))
        if problem is not None:
            raise AgentFailure("invalid_spec", f"spec.{problem[0]}: {problem[1]}")
        own = {"127.0.0.1", *(a.split("/")[0] for nic in self.hardware.nic_facts() for a in nic["ipv4"])}
        foreign = not_own_address(spec.get("env") or {}, compiled_env_policy()["platform"], own)
        if foreign is not None:
            raise AgentFailure("invalid_spec", f"spec.env.{foreign}: {spec['env'][foreign]!r} is not an "
                               "address of this node; each rank names its own")
        if self.engine_user == "root":
            raise AgentFailure("not_permitted", root_engine_user("root", NODE_CONFIG))
        env, log_file = spec.get("env", {}), spec["log_file"]
        cwd = posixpath.normpath(posixpath.join(self.paths.work_dir, spec.get("cwd", ".")))
        if not self.host_path(cwd).is_dir():
            raise AgentFailure("invalid_spec", f"spec.cwd: must be an existing directory, got "
                               f"{spec.get('cwd')!r}")
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
            if uses_launch_cache(spec.get("env") or {}, self.paths.cache_dir):
                # As the agent does (fresh_launch_cache): the per-launch folder starts empty.
                fresh = self.host_path(posixpath.join(self.paths.cache_dir, PER_LAUNCH_CACHE))
                if fresh.is_symlink() or fresh.is_file():
                    fresh.unlink()
                elif fresh.is_dir():
                    shutil.rmtree(fresh)
                fresh.mkdir(parents=True)
            rotate_log(str(log_host))
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
            return {"running": False, "pid": None, "exit_code": None, "spec_sha256": None,
                    "owner": None, "log_file": None}
        owner = launch_owner(proc.spec)
        return {"running": proc.running, "pid": proc.pid, "exit_code": proc.exit_code,
                "spec_sha256": proc.spec_sha256, "owner": owner,
                "log_file": str(proc.spec.get("log_file") or "") or None}

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
        _, _, before = self.hardware.memory_kib(now)
        self.hardware.drop_page_cache(now)
        _, _, after = self.hardware.memory_kib(now)
        return {"dropped": True, "mem_cached_kib_before": before, "mem_cached_kib_after": after}

    def _fp4_probe(self, backend: str, seed: int, size: int) -> dict[str, Any]:
        fp4_truth = self.scenario.truth["fp4"]
        known = ["reference", *sorted(fp4_truth["speed"])]
        if backend not in known:
            raise AgentFailure("unsupported", f"fp4-probe: --backend {backend!r} is not one this agent "
                               f"runs; accepted: {', '.join(known)}")
        state = "ok" if backend == "reference" else backend_state(backend, fp4_truth)
        return fp4.probe(backend, seed, size=size, state=state, error_rate=float(fp4_truth["error_rate"]))

    def mem_bw_probe(self, size_mib: int, repeats: int) -> dict[str, Any]:
        """A streaming read of a `size_mib` MiB buffer, timed `repeats` times: it reaches the
        node's peak bandwidth times the fraction reachable when streaming (cluster.node's
        mem_bw_gbs x mem_bw_efficiency, LAB_MODEL.md section 1), each repeat with a small
        lognormal noise. The lab clock moves on by the setup and the repeats, as on a node.
        While an engine runs it holds the memory: `busy`, as the real agent answers."""
        node = self.scenario.node
        with self.lock:
            running = [p for p in self.processes if p.running]
            self._mem_bw_probes += 1
            call = self._mem_bw_probes
        if running:
            raise AgentFailure("busy", f"mem-bw-probe: an engine runs here (pid {running[0].pid}) and "
                               "holds the GPU's memory and bandwidth; stop it first")
        if size_mib * (1 << 20) > float(node["cuda_free_gib"]) * (1 << 30):
            raise AgentFailure("busy", f"mem-bw-probe: cannot allocate {size_mib} MiB on the GPU "
                               "(something holds its memory): CUDA out of memory")
        streaming = float(node["mem_bw_gbs"]) * float(node["mem_bw_efficiency"])
        rng = random.Random(f"{self.scenario.seed}:{self.name}:mem-bw-probe:{call}")
        bytes_read = size_mib * (1 << 20) // 4 * 4
        gbs = [streaming * math.exp(rng.gauss(0.0, MEM_BW_SIGMA)) for _ in range(repeats)]
        seconds = [bytes_read / (g * 1e9) for g in gbs]
        self.clock.sleep(MEM_BW_SETUP_S + sum(seconds))
        return {"device": GPU["name"], "size_mib": size_mib, "repeats": repeats, "bytes_read": bytes_read,
                "seconds": seconds, "gbs": gbs, "median_gbs": statistics.median(gbs),
                "method": MEM_BW_METHOD.format(size_mib=size_mib)}

    def shutdown(self) -> None:
        for proc in list(self.processes):
            proc.terminate()
