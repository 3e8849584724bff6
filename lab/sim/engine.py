"""The simulated inference engine on a node: its cold start, its log, and its end.

A launch (the `launch` agent verb) becomes an `EngineProcess`: a background thread that
walks LAB_MODEL.md section 5's phases on the lab clock -- process start, weights load,
distributed init (every rank waits for the slowest at the rendezvous), kernel JIT, KV
cache allocation, graph capture, API ready -- writing the engine's log lines in vLLM's
(or SGLang's) own formats with lab-time stamps, and recording on the node what each
phase does to the node's hardware (lab/sim/hardware.py), from which the node synthesizes
telemetry. On the head node the API phase ends by starting the serving engine
(lab/sim/http.py). The engine sees its node only through `EngineHost`.

Every duration follows from the scenario and the parsed launch alone, so a cold start
is deterministic given the scenario and seed; only the wall clock's scheduling jitters.
The platform sees none of this module's reasoning: only logs, telemetry and HTTP.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lab.clock import LabClock
from lab.sim import logfmt
from lab.sim.hardware import NodeHardware
from lab.sim.scenario import Scenario

if TYPE_CHECKING:
    from lab.sim.http import ServingEngine
    from lab.sim.node import NodePaths

SHARDS = 64
GIB = 1024**3
# Seconds of a rendezvous wait after which torch.distributed gives up (its store timeout).
RENDEZVOUS_TIMEOUT_S = 1800.0
# The late node's NCCL bootstrap retries print a warning this often (lab seconds).
BOOTSTRAP_RETRY_EVERY_S = 20.0
# An mmap loader's progress comes in page-fault storms roughly this far apart (lab s).
MMAP_BURST_EVERY_S = 55.0
ACTIVATION_PEAK_GIB = 2.3  # what KV profiling finds the forward pass needs
GRAPH_POOL_GIB = 0.52
# The kv_budget fault leaves the KV cache this share of what one request of the model's
# native context needs: a fixed amount of memory on that lab, so a shorter max_model_len fits.
KV_BUDGET_FRACTION = 0.4

# FP4 backend names as the engine spells them in its log.
BACKEND_LOG_NAMES = {
    "flashinfer_cutlass": "FlashInferCutlass",
    "flashinfer_trtllm": "FlashInferTrtllm",
    "cutlass": "Cutlass",
    "marlin": "Marlin",
    "triton": "Triton",
}


class EngineStopped(Exception):
    """The process was terminated while it waited; unwinds its timeline thread."""


# -- what the launch asks for -------------------------------------------------------------


def loader_for(config: dict[str, Any]) -> str:
    """mmap (the default), eager, or fastsafetensors, from the normalized configuration."""
    serving = config.get("serving", {})
    if serving.get("load_format") == "fastsafetensors":
        return "fastsafetensors"
    if serving.get("safetensors_load_strategy") == "eager":
        return "eager"
    return "mmap"


def fp4_backend_for(config: dict[str, Any], env: dict[str, str], default: str) -> str:
    """LAB_MODEL.md section 6: flags, then VLLM_NVFP4_GEMM_BACKEND, then
    VLLM_USE_FLASHINFER_MOE_FP4 ('1' flashinfer_cutlass, '0' cutlass), then the default."""
    serving = config.get("serving", {})
    for flag in ("moe_backend", "linear_backend"):
        value = serving.get(flag)
        if isinstance(value, str) and value and value != "auto":
            return value
    chosen = env.get("VLLM_NVFP4_GEMM_BACKEND")
    if chosen:
        return chosen
    use_flashinfer = env.get("VLLM_USE_FLASHINFER_MOE_FP4")
    if use_flashinfer == "1":
        return "flashinfer_cutlass"
    if use_flashinfer == "0":
        return "cutlass"
    return default


def backend_log_name(backend: str) -> str:
    return BACKEND_LOG_NAMES.get(backend, "".join(p.capitalize() for p in backend.split("_")))


def backend_state(backend: str, fp4: dict[str, Any]) -> str:
    if backend in fp4["broken"]:
        return "broken"
    if backend in fp4["degraded"]:
        return "degraded"
    return "ok"


def weights_per_node_gb(model: dict[str, Any], nodes: int) -> float:
    return float(model["checkpoint_gb"]) / max(1, nodes)


def load_seconds(weights_gb: float, cached_gb: float, read_gbs: float, page_cache_gbs: float) -> float:
    """What is still in page cache reads at page-cache speed, the rest at the loader's."""
    cached = min(cached_gb, weights_gb)
    return cached / page_cache_gbs + (weights_gb - cached) / read_gbs


# -- the rendezvous ----------------------------------------------------------------------


def env_meets(env: dict[str, str], needs: dict[str, str]) -> bool:
    """Whether a rank's environment sets every variable the rendezvous needs. NCCL reads
    NCCL_IB_HCA as a list of devices, so their order and spacing do not matter."""
    for var, want in needs.items():
        got = env.get(var)
        if var == "NCCL_IB_HCA" and got is not None:
            if sorted(d.strip() for d in got.split(",")) != sorted(d.strip() for d in want.split(",")):
                return False
        elif got != want:
            return False
    return True



@dataclass
class _Barrier:
    arrivals: dict[int, float] = field(default_factory=dict)
    release: float | None = None
    stalled: bool = False


class RendezvousGroup:
    """The ranks of one multi-node engine; each barrier releases when every rank arrived."""

    def __init__(self, key: tuple[Any, ...], nnodes: int, late_rank: int, stall_s: float,
                 needs: dict[str, str]) -> None:
        self.key = key
        self.nnodes = nnodes
        self.members: dict[int, EngineProcess] = {}
        self.late_rank = late_rank
        self.stall_s = stall_s
        self.needs = needs
        self._barriers: dict[str, _Barrier] = {}
        self._cond = threading.Condition()

    def open_for(self, rank: int) -> bool:
        with self._cond:
            if rank in self.members or len(self.members) >= self.nnodes:
                return False
            return all(m.running for m in self.members.values())

    def add(self, member: EngineProcess) -> None:
        with self._cond:
            self.members[member.rank] = member

    def env_ok(self) -> bool:
        """Every rank's NCCL variables name the interfaces the data path needs."""
        return all(env_meets(m.env, self.needs) for m in self.members.values())

    def arrive(self, name: str, member: EngineProcess, t: float, *, stall_if_env_wrong: bool) -> _Barrier:
        """Wait (on the lab clock) until every rank reached barrier `name`; its release time."""
        with self._cond:
            barrier = self._barriers.setdefault(name, _Barrier())
            barrier.arrivals[member.rank] = t
            if len(barrier.arrivals) == self.nnodes and barrier.release is None:
                barrier.stalled = stall_if_env_wrong and not self.env_ok()
                barrier.release = max(barrier.arrivals.values()) + (self.stall_s if barrier.stalled else 0.0)
                self._cond.notify_all()
            deadline = t + RENDEZVOUS_TIMEOUT_S
            while barrier.release is None:
                if member.stop_event.is_set():
                    raise EngineStopped
                if member.clock.now() >= deadline:
                    raise TimeoutError(
                        f"Timed out after {RENDEZVOUS_TIMEOUT_S:.0f} seconds waiting for clients. "
                        f"{len(barrier.arrivals)}/{self.nnodes} clients joined.")
                self._cond.wait(timeout=min(0.05, max(0.001, member.clock.wall_seconds(1.0))))
            return barrier


class RendezvousHub:
    """Where launches on different nodes find the other ranks of the same engine."""

    def __init__(self, seed: int, stall_s: float, needs: dict[str, str]) -> None:
        self.seed = seed
        self.stall_s = stall_s
        self.needs = needs
        self._groups: list[RendezvousGroup] = []
        self._lock = threading.Lock()
        self._formed = 0

    def join(self, member: EngineProcess, key: tuple[Any, ...], nnodes: int) -> RendezvousGroup:
        with self._lock:
            for group in self._groups:
                if group.key == key and group.nnodes == nnodes and group.open_for(member.rank):
                    group.add(member)
                    return group
            # The node that comes late is never the head, and the same for a given seed.
            late = random.Random(f"{self.seed}:late:{self._formed}").randrange(1, nnodes) if nnodes > 1 else 0
            self._formed += 1
            group = RendezvousGroup(key, nnodes, late, self.stall_s, self.needs)
            group.add(member)
            self._groups = [g for g in self._groups if any(m.running for m in g.members.values())]
            self._groups.append(group)
            return group


# -- the process --------------------------------------------------------------------------


class EngineHost(Protocol):
    """The parts of a node (`lab.sim.node.SimNode`) an engine process runs on: its name,
    scenario and clock, the rendezvous of its lab, its files, and its hardware timeline."""

    @property
    def name(self) -> str: ...
    @property
    def scenario(self) -> Scenario: ...
    @property
    def clock(self) -> LabClock: ...
    @property
    def hub(self) -> RendezvousHub: ...
    @property
    def paths(self) -> NodePaths: ...
    @property
    def hardware(self) -> NodeHardware: ...
    @property
    def launch_count(self) -> int: ...
    def host_path(self, node_path: str) -> Path: ...
    def engine_versions(self) -> dict[str, str | None]: ...


@dataclass
class Phase:
    name: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


class EngineProcess:
    """One engine process on one node, from launch to exit."""

    def __init__(self, node: EngineHost, *, pid: int, spec: dict[str, Any], log_path: Path,
                 started: float, spec_sha256: str | None = None) -> None:
        self.node = node
        self.clock = node.clock
        self.pid = pid
        self.spec = spec
        self.spec_sha256 = spec_sha256  # of the spec file the agent read, as `status` reports
        self.env: dict[str, str] = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
        self.log_path = log_path
        self.started = started
        self.rank = 0
        self.engine = str(spec.get("engine", "vllm"))
        self.exit_code: int | None = None
        self.ready_at: float | None = None
        self.phases: list[Phase] = []
        self.stop_event = threading.Event()
        self.group: RendezvousGroup | None = None
        self.server: Any = None  # lab.sim.http.ServingEngine on the head once it serves
        self._log_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._crash_lines: list[str] | None = None
        self._pending_exit = -15
        self.kv_tokens: int | None = None
        self._master = "127.0.0.1:29500"
        # Like the real agent, each launch has its own log file (the node moved the previous
        # launch's aside before starting this one).
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.touch()

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.exit_code is None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=f"engine-{self.node.name}-{self.pid}",
                                        daemon=True)
        self._thread.start()

    def terminate(self, *, exit_code: int = -15, lines: list[str] | None = None) -> bool:
        """Stop the process (SIGTERM by default); True if it was running."""
        if not self.running:
            return False
        self._crash_lines = lines
        self._pending_exit = exit_code
        self.stop_event.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._done.wait(timeout=10)
        return True

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def _main(self) -> None:
        try:
            code = self._timeline()
        except EngineStopped:
            code = self._pending_exit
            if self._crash_lines:
                self.write_raw(self._crash_lines)
        except TimeoutError as exc:
            self._error_traceback("RuntimeError", str(exc), phase="distributed init")
            code = 1
        except Exception as exc:  # the simulator's own bug: still end like a process would
            self._error_traceback(type(exc).__name__, str(exc), phase="startup")
            code = 1
        self._exit(code)

    def _exit(self, code: int) -> None:
        now = self.clock.now()
        if self.server is not None:
            try:
                self.server.stop()
            finally:
                self.server = None
        self.node.hardware.record_exit(now)
        self.exit_code = code
        self._done.set()

    # -- writing the log ----------------------------------------------------------------------
    def write_raw(self, lines: list[str]) -> None:
        with self._log_lock, self.log_path.open("a", encoding="utf-8") as fh:
            for line in lines:
                fh.write(line + "\n")

    def stamp(self, t: float) -> float:
        """Lab time t as the node's clock reads it: what the log's timestamps show."""
        return self.node.hardware.node_time(t)

    def info(self, t: float, source: str, message: str, level: str = "INFO") -> None:
        t = self.stamp(t)
        if self.engine == "sglang":
            self.write_raw([logfmt.sglang(t, message, tp_rank=self.rank if source != "-" else None)])
        else:
            self.write_raw([logfmt.vllm(level, t, source, message)])

    def serving_log(self, message: str) -> None:
        """The serving engine's lines (stats, spec-decode metrics), stamped now."""
        self.info(self.clock.now(), "loggers.py:123", message)

    def _error_traceback(self, exc_type: str, message: str, *, phase: str) -> None:
        t = self.stamp(self.clock.now())
        frames = [
            ("/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", 691, "run_engine_core",
             "engine_core = EngineCoreProc(*args, **kwargs)"),
            ("/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", 83, "__init__",
             "self._initialize_kv_caches(vllm_config)"),
        ]
        body = logfmt.python_traceback(frames, f"{exc_type}: {message}")
        if self.engine == "sglang":
            lines = [logfmt.sglang(t, f"Scheduler hit an exception during {phase}:", tp_rank=self.rank)]
            lines += body
        else:
            lines = [logfmt.vllm("ERROR", t, "core.py:708", f"EngineCore failed to start during {phase}.")]
            lines += [logfmt.vllm("ERROR", t, "core.py:708", line) for line in body]
        self.write_raw(lines)

    # -- waiting on the lab clock -------------------------------------------------------------
    def at(self, t: float) -> None:
        """Sleep until lab time t; raise EngineStopped if terminated meanwhile."""
        while True:
            if self.stop_event.is_set():
                raise EngineStopped
            remaining = t - self.clock.now()
            if remaining <= 0:
                return
            # Waits are capped so that an endless one (t = inf) is not handed to the OS as is.
            self.stop_event.wait(min(3600.0, self.clock.wall_seconds(remaining)))

    def _phase(self, name: str, start: float, end: float, activity: str | None = "",
               **params: Any) -> Phase:
        """Record a phase; `activity` names what the hardware does (default: the phase name,
        None: the caller records the hardware activity itself)."""
        phase = Phase(name, start, end)
        self.phases.append(phase)
        if activity is not None:
            self.node.hardware.record_activity(start, end, activity or name, params)
        return phase

    # -- the cold start -----------------------------------------------------------------------
    def _timeline(self) -> int:
        from lab.engines import EngineArgError, parse_launch

        scenario = self.node.scenario
        load = scenario.truth["load"]
        t = self.started
        try:
            parsed = parse_launch(list(self.spec.get("argv") or []), dict(self.env))
        except EngineArgError as exc:
            return self._usage_error(t, exc)
        config = parsed.config
        self.engine = parsed.engine
        self.rank = int(parsed.node_rank or 0)
        nnodes = max(1, int(parsed.nnodes or 1))
        parallel = config.get("parallel", {})
        # The checkpoint is split across every rank of the layout (tp x pp nodes).
        nodes_used = max(1, int(parallel.get("tp", 1)) * int(parallel.get("pp", 1)))
        serving = config.get("serving", {})
        installed = self.node.engine_versions().get(self.engine)
        if installed is None:
            self.write_raw([f"/usr/bin/python3: No module named {self.engine}"])
            return 1

        # 1. process start, imports
        self._hello(t, parsed, installed)
        proc_end = t + load["proc_start_s"]
        self._phase("process_start", t, proc_end)
        self.at(proc_end - 1.2)
        backend = fp4_backend_for(config, self.env, scenario.truth["fp4"]["default_backend"])
        if backend not in scenario.truth["fp4"]["speed"]:
            self.at(proc_end)
            known = ", ".join(sorted(scenario.truth["fp4"]["speed"]))
            self._error_traceback("ValueError", f"Unknown NVFP4 backend {backend!r}; supported: {known}",
                                  phase="model construction")
            return 1
        self._log_backend(proc_end - 1.2, backend)
        self.info(proc_end - 1.2, "gpu_model_runner.py:2602",
                  f"Starting to load model {self._model_path(config)}...")
        self.at(proc_end)
        t = proc_end

        # 2. weights load
        t = self._load_weights(t, config, nodes_used)
        for fault in scenario.faults("silent_hang_s"):
            # A post-load step that logs nothing and keeps one core busy (none of section
            # 5's signatures): what an unexplained stall looks like.
            hang_end = t + float(fault["silent_hang_s"])
            self._phase("hang", t, hang_end)
            self.at(hang_end)
            t = hang_end

        # 3. distributed init, everyone waits for the slowest
        t = self._distributed_init(t, parsed, nnodes)

        # 4. kernel JIT
        t = self._jit(t, config, backend)

        # 5. KV profiling and cache allocation (a collective: the ranks meet again)
        if self.group is not None:
            self.node.hardware.record_activity(t, math.inf, "wait", {})
            released = self.group.arrive("kv", self, t, stall_if_env_wrong=False).release
            assert released is not None
            self._phase("kv_wait", t, released, "wait")
            self.at(released)
            t = released
        kv_start = t
        kv_end = t + load["kv_alloc_s"]
        self._phase("kv_alloc", kv_start, kv_end)
        self.at(kv_end)
        weights_gib = weights_per_node_gb(scenario.model, nodes_used) * 1e9 / GIB
        kv_gib = self._kv_report(kv_end, serving, weights_gib)
        if kv_gib is None:
            return 1
        self.node.hardware.engine_memory(kv_end, weights_gib + kv_gib)
        t = kv_end
        is_api_server = not parsed.headless and self.rank == 0
        port = int(parsed.port or 8000)
        # Build the API server (tokenizer, text model) while the graphs are captured, so its
        # wall-clock set-up cost is not multiplied by the dilation into a longer cold start.
        server = self._serving_engine(config, backend, port) if is_api_server else None

        # 6. graph capture (none with --enforce-eager)
        capture_s = 0.0 if serving.get("enforce_eager") else load["graph_capture_s"]
        if capture_s > 0:
            self._phase("graph_capture", t, t + capture_s)
            if self.engine == "sglang":
                self.info(t, "-", "Capture cuda graph begin. This can take up to several minutes.")
            self.at(t + capture_s)
            t += capture_s
            if self.engine == "sglang":
                self.info(t, "-", f"Capture cuda graph end. Time elapsed: {capture_s:.2f} s. "
                          f"mem usage={GRAPH_POOL_GIB:.2f} GB.")
            else:
                self.info(t, "gpu_model_runner.py:3480",
                          f"Graph capturing finished in {capture_s:.0f} secs, took {GRAPH_POOL_GIB:.2f} GiB")
        jit_phase = next(p for p in self.phases if p.name == "jit")
        if self.engine != "sglang":
            init_s = t - jit_phase.start
            self.info(t, "core.py:210",
                      f"init engine (profile, create kv cache, warmup model) took {init_s:.2f} seconds")

        # 7. API ready (the head serves; workers wait for work)
        if server is None:
            self._phase("ready", t, math.inf, "serving")
            self.ready_at = t
            self.at(math.inf)
            return 0
        api_end = t + load["api_ready_s"]
        self._phase("api_ready", t, api_end)
        self.at(api_end)
        try:
            server.start()
            self.server = server
        except OSError as exc:
            self._error_traceback("OSError", f"[Errno 98] error while attempting to bind on address "
                                  f"('0.0.0.0', {port}): {exc}", phase="API server start")
            return 1
        self.ready_at = api_end
        self._phase("serving", api_end, math.inf)
        if self.engine == "sglang":
            self.info(api_end, "-", f"Uvicorn running on http://0.0.0.0:{port} (Press CTRL+C to quit)")
            self.info(api_end, "-", "The server is fired up and ready to roll!")
        else:
            self.info(api_end, "api_server.py:1971", f"Starting vLLM API server 0 on http://0.0.0.0:{port}")

        crash = scenario.faults("engine_crash_after_s")
        if crash:
            crash_at = api_end + crash[0]["engine_crash_after_s"]
            self.at(crash_at)
            self._crash(crash_at)
            return 1
        self.at(math.inf)
        return 0

    # -- phases -------------------------------------------------------------------------------
    def _model_path(self, config: dict[str, Any]) -> str:
        return str(config.get("model", {}).get("path") or self.node.paths.model_dir)

    def _hello(self, t: float, parsed: Any, version: str) -> None:
        config = parsed.config
        par = config.get("parallel", {})
        if self.engine == "sglang":
            self.info(t, "-", f"server_args=ServerArgs(model_path='{self._model_path(config)}', "
                      f"tp_size={par.get('tp', 1)}, pp_size={par.get('pp', 1)}, nnodes={parsed.nnodes}, "
                      f"node_rank={parsed.node_rank}, port={parsed.port})")
            return
        self.info(t, "__init__.py:216", "Automatically detected platform cuda.")
        if parsed.headless or self.rank != 0:
            self.info(t, "api_server.py:1650", f"Launching vLLM {version} engine in headless mode "
                      f"(node rank {self.rank} of {parsed.nnodes})")
            return
        self.info(t, "api_server.py:1885", f"vLLM API server version {version}")
        # Only what vLLM itself takes as arguments (jit_cache is the platform's notion).
        args = {k: v for k, v in config.get("serving", {}).items()
                if k != "jit_cache" and v not in (None, "auto", False, "lazy")}
        self.info(t, "utils.py:328", f"non-default args: {{'model': '{self._model_path(config)}', "
                  f"'tensor_parallel_size': {par.get('tp', 1)}, "
                  f"'pipeline_parallel_size': {par.get('pp', 1)}, "
                  + ", ".join(f"'{k}': {v!r}" for k, v in sorted(args.items())) + "}")

    def _log_backend(self, t: float, backend: str) -> None:
        if self.engine == "sglang":
            self.info(t, "-", f"Using {backend} as MoE runner backend for NVFP4 "
                      "(ModelOptNvFp4FusedMoEMethod)")
        else:
            self.info(t, "modelopt.py:1009", f"Using {backend_log_name(backend)} backend for NVFP4 MoE")

    def _load_weights(self, t: float, config: dict[str, Any], nodes_used: int) -> float:
        load = self.node.scenario.truth["load"]
        weights = weights_per_node_gb(self.node.scenario.model, nodes_used)
        loader = loader_for(config)
        read_gbs = load["mmap_read_gbs"] if loader == "mmap" else load["nvme_read_gbs"]
        cached = min(self.node.hardware.weights_cached_gb, weights)
        cache_s = cached / load["page_cache_gbs"]
        disk_s = (weights - cached) / read_gbs
        total = cache_s + disk_s
        end = t + total
        self._phase("weights_load", t, end, None, loader=loader)
        # Hardware activity: first what the page cache still holds, then the disk.
        if cache_s > 0:
            self.node.hardware.record_activity(t, t + cache_s, "load_cache", {})
        if disk_s > 0:
            self.node.hardware.record_activity(t + cache_s, end, f"load_{loader}", {"read_gbs": read_gbs})
        self.node.hardware.begin_load(t + cache_s, end, cached, weights, loader)
        self.node.hardware.engine_memory_ramp(t, end, weights * 1e9 / GIB)

        def shard_done(i: int) -> float:
            gb = (i + 1) / SHARDS * weights
            if gb <= cached:
                return gb / load["page_cache_gbs"]
            raw = (gb - cached) / read_gbs
            if loader == "mmap" and disk_s > 0:
                bursts = max(1, round(disk_s / MMAP_BURST_EVERY_S))
                step = disk_s / bursts
                raw = min(disk_s, math.ceil(raw / step - 1e-9) * step)
            return cache_s + raw

        self.info(t, "weight_utils.py:470", logfmt.shard_progress(0, SHARDS, 0.0))
        for i in range(SHARDS):
            done_at = t + shard_done(i)
            self.at(done_at)
            self.info(done_at, "weight_utils.py:470", logfmt.shard_progress(i + 1, SHARDS, done_at - t))
        self.at(end)
        self.node.hardware.finish_load(end, weights)
        gib = weights * 1e9 / GIB
        if self.engine == "sglang":
            avail = self.node.scenario.node["cuda_free_gib"] - gib
            self.info(end, "-", f"Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
                      f"avail mem={avail:.2f} GB, mem usage={gib:.2f} GB.")
        else:
            self.info(end, "default_loader.py:267", f"Loading weights took {total:.2f} seconds")
            self.info(end, "gpu_model_runner.py:2634",
                      f"Model loading took {gib:.2f} GiB memory and {total + 1.2:.2f} seconds")
        return end

    def _distributed_init(self, t: float, parsed: Any, nnodes: int) -> float:
        load = self.node.scenario.truth["load"]
        master = f"{parsed.master_addr or '127.0.0.1'}:{parsed.master_port or 29500}"
        self._master = master
        if self.engine == "sglang":
            self.info(t, "-", "Init torch distributed begin.")
        else:
            self.info(t, "parallel_state.py:1208", f"world_size={nnodes} rank={self.rank} local_rank=0 "
                      f"distributed_init_method=tcp://{master} backend=nccl")
        release = t
        if nnodes > 1:
            key = (parsed.master_addr, parsed.master_port)
            self.group = self.node.hub.join(self, key, nnodes)
            # Whether this node is the one that comes late shows in its own traffic at once:
            # its bootstrap retries over the management network while the others wait.
            own_env_ok = env_meets(self.env, self.group.needs)
            retrying = self.rank == self.group.late_rank and not own_env_ok
            self.node.hardware.record_activity(t, math.inf, "rendezvous_wait", {"late": retrying})
            barrier = self.group.arrive("init", self, t, stall_if_env_wrong=True)
            assert barrier.release is not None
            release = barrier.release
            late = barrier.stalled and self.rank == self.group.late_rank
            self._phase("rendezvous_wait", t, release, "rendezvous_wait", late=late)
            if late:
                self._bootstrap_retries(t, release)
        self.at(release)
        end = release + load["rendezvous_s"]
        self._phase("distributed_init", release, end)
        self.at(end)
        if self.engine == "sglang":
            self.info(end, "-", "Init torch distributed ends. mem usage=0.00 GB")
        else:
            self.info(end, "pynccl.py:103", "vLLM is using nccl==2.27.3")
            par = parsed.config.get("parallel", {})
            tp = max(1, int(par.get("tp", 1)))
            self.info(end, "parallel_state.py:1421",
                      f"rank {self.rank} in world size {nnodes} is assigned as DP rank 0, "
                      f"PP rank {self.rank // tp}, TP rank {self.rank % tp}, EP rank {self.rank % tp}")
        return end

    def _bootstrap_retries(self, t: float, release: float) -> None:
        """The late node's NCCL bootstrap keeps failing over the wrong interface."""
        host = self.node.name
        ifname = self.env.get("NCCL_SOCKET_IFNAME")
        first = (f"NCCL INFO NCCL_SOCKET_IFNAME set by environment to {ifname}" if ifname
                 else "NCCL INFO Bootstrap : Using docker0:172.17.0.1<0>")
        self.write_raw([logfmt.nccl(host, self.pid, first)])
        attempt = 0
        mark = t + BOOTSTRAP_RETRY_EVERY_S
        while mark < release:
            self.at(mark)
            attempt += 1
            self.write_raw([
                logfmt.glog("W", self.stamp(mark), self.pid, "torch/csrc/distributed/c10d/socket.cpp:767",
                            "[c10d] The client socket has failed to connect to "
                            f"[{self._master}] (errno: 110 - Connection timed out)."),
                logfmt.nccl(host, self.pid, "misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
                            f"172.17.0.1<{43000 + attempt}> failed : Connection timed out"),
                logfmt.nccl(host, self.pid, f"NCCL INFO bootstrap.cc:77 -> 2 (retrying, attempt {attempt})"),
            ])
            mark += BOOTSTRAP_RETRY_EVERY_S
        self.at(release)
        self.write_raw([logfmt.nccl(host, self.pid,
                                    f"NCCL INFO Bootstrap : connected after {attempt} retries")])

    def _jit_cache_marker(self, backend: str) -> Path | None:
        """The file a completed JIT leaves in a kept cache volume, or None if the cache is ephemeral."""
        root = self.env.get("VLLM_CACHE_ROOT") if self.engine == "vllm" else None
        root = root or self.env.get("FLASHINFER_WORKSPACE_BASE")
        if not root:
            return None
        try:
            base = self.node.host_path(root)
        except ValueError:
            return None
        version = self.node.engine_versions().get(self.engine) or ""
        digest = hashlib.sha256(f"{self.engine}:{version}:{backend}".encode()).hexdigest()[:10]
        return base / "torch_compile_cache" / digest / f"rank_{self.rank}_0" / "vllm_compile_cache.py"

    def _jit(self, t: float, config: dict[str, Any], backend: str) -> float:
        load = self.node.scenario.truth["load"]
        marker = self._jit_cache_marker(backend)
        warm = marker is not None and marker.is_file()
        seconds = load["jit_warm_s"] if warm else load["jit_cold_s"]
        end = t + seconds
        self._phase("jit", t, end, "jit", cold=not warm)
        if self.engine != "sglang":
            root = self.env.get("VLLM_CACHE_ROOT") or "/root/.cache/vllm"
            digest = marker.parent.parent.name if marker is not None else "a1b2c3d4e5"
            self.info(t, "backends.py:548", f"Using cache directory: {root}/torch_compile_cache/{digest}"
                      f"/rank_{self.rank}_0/backbone for vLLM's torch.compile")
        self.at(end)
        if marker is not None and not warm:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(json.dumps({"backend": backend, "compiled_at": end}) + "\n")
        if self.engine == "sglang":
            self.info(end, "-", f"FlashInfer JIT kernels ready in {seconds:.2f} s")
        elif warm:
            self.info(end, "backends.py:194", "Directly load the compiled graph(s) for dynamic shape "
                      f"from the cache, took {seconds * 0.4:.3f} s")
            self.info(end, "monitor.py:34", f"torch.compile takes {seconds:.2f} s in total")
        else:
            self.info(end, "backends.py:215",
                      f"Compiling a graph for dynamic shape takes {seconds * 0.93:.2f} s")
            self.info(end, "monitor.py:34", f"torch.compile takes {seconds:.2f} s in total")
        return end

    def _kv_report(self, t: float, serving: dict[str, Any], weights_gib: float) -> float | None:
        """Log the KV cache size; on too little memory fail like vLLM does. GiB allocated, or None."""
        scenario = self.node.scenario
        dtype = "fp8" if serving.get("kv_cache_dtype", "auto") == "fp8" else "bf16"
        per_token = scenario.model["kv_bytes_per_token"][dtype]
        max_len = int(serving.get("max_model_len") or scenario.model["max_context"])
        util = float(serving.get("gpu_memory_utilization") or 0.9)
        available = scenario.node["cuda_free_gib"] * util - weights_gib - ACTIVATION_PEAK_GIB - GRAPH_POOL_GIB
        needed = per_token * max_len / GIB
        for fault in scenario.faults("kv_budget"):
            native = per_token * int(scenario.model["max_context"]) / GIB
            cap = native * KV_BUDGET_FRACTION if fault["kv_budget"] is True else float(fault["kv_budget"])
            available = min(available, cap)
        if available < needed:
            est = int(max(0.0, available) * GIB / per_token)
            self._error_traceback(
                "ValueError",
                f"not enough memory for KV cache: to serve at least one request with the model's max seq "
                f"len ({max_len}), {needed:.2f} GiB KV cache is needed, which is larger than the available "
                f"KV cache memory ({max(0.0, available):.2f} GiB). Based on the available memory, the "
                f"estimated maximum model length is {est}. Try increasing `gpu_memory_utilization` or "
                f"decreasing `max_model_len` when initializing the engine.",
                phase="KV cache allocation")
            return None
        tokens = int(available * GIB / per_token)
        self.kv_tokens = tokens
        if self.engine == "sglang":
            self.info(t, "-", f"KV Cache is allocated. #tokens: {tokens}, KV size: {available:.2f} GB")
        else:
            self.info(t, "gpu_worker.py:298", f"Available KV cache memory: {available:.2f} GiB")
            self.info(t, "kv_cache_utils.py:1087", f"GPU KV cache size: {tokens:,} tokens")
            self.info(t, "kv_cache_utils.py:1091",
                      f"Maximum concurrency for {max_len:,} tokens per request: {tokens / max_len:.2f}x")
        return available

    def _serving_engine(self, config: dict[str, Any], backend: str, port: int) -> ServingEngine:
        from lab.sim.http import ServingEngine

        scenario = self.node.scenario
        fp4 = scenario.truth["fp4"]
        state = backend_state(backend, fp4)
        server = ServingEngine(
            scenario=scenario,
            config=config,
            backend=backend,
            backend_state=state,
            error_rate=float(fp4["error_rate"]) if state == "degraded" else 0.0,
            clock=self.clock,
            log=self.serving_log,
            tokenizer_path=self.node.host_path(f"{self.node.paths.model_dir}/tokenizer.json"),
            host="127.0.0.1",
            port=port,
            seed=scenario.seed + self.node.launch_count,
            kv_capacity_tokens=self.kv_tokens,
        )
        return server

    def _crash(self, t: float) -> None:
        """engine_crash_after_s: a fatal CUDA error takes the engine and its workers down."""
        frames = [
            ("/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", 806, "run_engine_core",
             "engine_core.run_busy_loop()"),
            ("/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", 833, "run_busy_loop",
             "self._process_engine_step()"),
            ("/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/multiproc_executor.py", 264,
             "collective_rpc", "raise RuntimeError(f\"Worker failed with error '{e}'\")"),
        ]
        body = logfmt.python_traceback(
            frames, "RuntimeError: Worker failed with error 'CUDA error: an illegal memory access was "
                    "encountered', please check the stack trace above for the root cause")
        stamp = self.stamp(t)
        if self.engine == "sglang":
            lines = [logfmt.sglang(stamp, "Scheduler hit an exception:", tp_rank=self.rank), *body]
        else:
            lines = [logfmt.vllm("ERROR", stamp, "core.py:815", "EngineCore encountered a fatal error.")]
            lines += [logfmt.vllm("ERROR", stamp, "core.py:815", line) for line in body]
            lines.append(logfmt.vllm("ERROR", stamp, "async_llm.py:485", "AsyncLLM output_handler failed."))
            lines.append("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
                         "See stack trace (above) for the root cause.")
        self.write_raw(lines)
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.group is not None:
            for member in list(self.group.members.values()):
                if member is not self:
                    member.terminate(exit_code=1, lines=[logfmt.nccl(
                        member.node.name, member.pid,
                        "NCCL WARN [Service thread] Error encountered progressing operation=Connect, "
                        "res=3, closing connection"),
                        "RuntimeError: NCCL communicator was aborted on rank "
                        f"{member.rank}."])

    def _usage_error(self, t: float, exc: Exception) -> int:
        """argparse's own output for a flag the engine does not know, then exit 2."""
        self.at(t + 3.0)
        message = getattr(exc, "message", None) or str(exc)
        prog = getattr(exc, "prog", None) or "vllm serve"
        if prog == "vllm serve":
            usage = "usage: vllm serve [model_tag] [options]"
        else:
            usage = f"usage: {prog} [-h] --model-path MODEL_PATH [--tokenizer-path TOKENIZER_PATH] ..."
        self.write_raw([usage, f"{prog}: error: {message}"])
        return 2


def wait_all(processes: list[EngineProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in processes:
        p.wait(max(0.0, deadline - time.monotonic()))

