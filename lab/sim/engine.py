"""The simulated inference engine on a node: its cold start, its log, and its end.

A launch (the `launch` agent verb) becomes an `EngineProcess`: a background thread that
runs the release installed on the node (the scenario's `engine.version`) the way that
release does. It learns what it was started with from `lab.engines.parse_launch` with
that version's flag table, and refuses what the version refuses as argparse does (usage
line, `<prog>: error: ...`, exit 2 within seconds, nothing loaded). Then it walks
LAB_MODEL.md section 5's phases in the engines' real order on the lab clock -- process
start, distributed init (every rank waits for the slowest at the rendezvous), model
init (FP4 kernels chosen and logged), weights load, compile and kernel JIT, KV cache
allocation (the ranks meet again), graph capture, API ready -- writing the version's own
log lines (lab/sim/release.py: every engine line is a format string from the release's
table, filled) with lab-time stamps, and recording on the node what each phase does to
its hardware (lab/sim/hardware.py), from which the node synthesizes telemetry. On the
head node the API phase ends by starting the serving engine (lab/sim/http.py). The
engine sees its node only through `EngineHost`.

Refusals a real lab makes (LAB_MODEL.md section 9) are made here too, at the end of
process start and before any weight is read: a model, draft or tokenizer named by a hub
id on an offline node, and a model that ships its own code started without
`--trust-remote-code`. A FP4 backend the version accepts but that cannot run on sm_121
(`truth.fp4.unsupported`) ends the process at model init with the engine's error.

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lab.agent.agent import ENGINE_ENV_FIXED
from lab.clock import LabClock
from lab.engines import BACKEND_FLAGS
from lab.sim import logfmt
from lab.sim.hardware import NodeHardware, node_ipv4
from lab.sim.paths import NodePaths
from lab.sim.release import Line, Release
from lab.sim.scenario import Scenario

if TYPE_CHECKING:
    from lab.engines import ParsedLaunch
    from lab.sim.http import ServingEngine

SHARDS = 64
# The batch sizes the simulated SGLang says it captured graphs for (0.5.23's capture line
# lists them as `bs=[...]`): the simulator's choice, up to its 48 running requests; SGLang
# derives its own list from server_args, which this does not reproduce.
CAPTURE_BATCH_SIZES = [1, 2, 4, 8, 16, 24, 32, 40, 48]
GIB = 1024**3
# Seconds of a rendezvous wait after which torch.distributed gives up (its store timeout).
RENDEZVOUS_TIMEOUT_S = 1800.0
# NCCL's socket connect retries (NCCL_SOCKET_RETRY_CNT, NCCL_SOCKET_RETRY_SLEEP_MSEC
# defaults): retry n sleeps n x 100 ms, so 34 retries span about a minute.
NCCL_RETRY_COUNT = 34
NCCL_RETRY_SLEEP_MS = 100
# What the simulated nodes' NCCL reports about itself (NCCL's own lines, not an engine's).
NCCL_VERSION = "2.27.7+cuda13.0"
CUDA_DRIVER_VERSION = 13000
# An mmap loader's progress comes in page-fault storms roughly this far apart (lab s).
MMAP_BURST_EVERY_S = 55.0
MODEL_INIT_S = 2.0  # LAB_MODEL.md section 5: model init, kernel backends chosen
ARGPARSE_EXIT_S = 3.0  # imports, then argparse refuses
ACTIVATION_PEAK_GIB = 2.3  # what KV profiling finds the forward pass needs
GRAPH_POOL_GIB = 0.52
# The kv_budget fault leaves the KV cache this share of what one request of the model's
# native context needs: a fixed amount of memory on that lab, so a shorter max_model_len fits.
KV_BUDGET_FRACTION = 0.4

# vLLM's NvFp4MoeBackend values for its --moe-backend choices (oracle/nvfp4.py's mapping;
# the rest upper-cased), and the order its oracle tries them on sm_12x.
VLLM_MOE_VALUES = {"cutlass": "VLLM_CUTLASS"}
# The list vLLM's NVFP4 MoE oracle prints after "out of potential backends:", whatever the
# device and whether --moe-backend forced the choice: its AVAILABLE_BACKENDS, the same in
# both modelled releases (fused_moe/oracle/nvfp4.py: 0.29.0 lines 196-205, 0.34.0 lines
# 238-247; B12X is left out of automatic choice until the SM121 CUTLASS guard is resolved,
# and prioritize_humming reorders it only on SM90).
VLLM_MOE_POTENTIAL = ("FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "FLASHINFER_CUTEDSL_BATCHED",
                      "FLASHINFER_CUTLASS", "VLLM_CUTLASS", "MARLIN", "HUMMING", "EMULATION")
# Where the engines' Python lives on a node (traceback frames name these files).
SITE = "/usr/local/lib/python3.12/dist-packages"
# huggingface_hub's error when a repo id has no local snapshot and HF_HUB_OFFLINE=1
# (huggingface_hub/_snapshot_download.py); the engines let it through as is.
HUB_OFFLINE_ERROR = (
    "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot "
    "folder for the specified revision on the local disk and outgoing traffic has been disabled. "
    "To enable repo look-ups and downloads online, pass 'local_files_only=False' as input.")

# The compile range vLLM names when it loads compiled graphs from its cache (its default
# batched-token limit); only the cache-hit line shows it.
COMPILE_RANGE = "[1, 8192]"


class EngineStopped(Exception):
    """The process was terminated while it waited; unwinds its timeline thread."""


class EngineFailed(Exception):
    """The engine ends with an error: the lines it writes, then its exit code."""

    def __init__(self, code: int = 1) -> None:
        super().__init__(code)
        self.code = code


# -- what the launch asks for -------------------------------------------------------------


# vLLM's safetensors_weights_iterator (model_loader/weight_utils.py, 0.29.0 and 0.34.0): the
# filesystems it calls network ones, and the share of the available memory a checkpoint
# must fit in for the unset strategy to prefetch it.
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "lustre")
PREFETCH_RAM_PCT = 90
# config/load.py: DEFAULT_SAFETENSORS_PREFETCH_NUM_THREADS and _BLOCK_SIZE.
PREFETCH_THREADS = 8
PREFETCH_BLOCK_BYTES = 16 * 1024 * 1024


def fits_in_ram(checkpoint_bytes: float, available_bytes: float) -> bool:
    """The whole checkpoint (every file in the folder, not the rank's share) within 90 % of
    the available memory, as vLLM's iterator measures it."""
    return checkpoint_bytes <= PREFETCH_RAM_PCT / 100 * available_bytes


def auto_prefetches(fs_type: str, checkpoint_bytes: float, available_bytes: float) -> bool:
    """Whether vLLM's unset load strategy prefetches: a network filesystem and a checkpoint
    that fits (fits_in_ram)."""
    return fs_type in NETWORK_FILESYSTEMS and fits_in_ram(checkpoint_bytes, available_bytes)


def prefetches(config: dict[str, Any], *, auto_prefetch: bool = False) -> bool:
    """vLLM's `prefetch` strategy, or the unset one when it decides to (`auto_prefetch`);
    an explicit `lazy` never prefetches."""
    serving = config.get("serving", {})
    if serving.get("load_format") == "fastsafetensors":
        return False
    strategy = serving.get("safetensors_load_strategy")
    return strategy == "prefetch" or (strategy is None and auto_prefetch)


def loader_for(config: dict[str, Any], *, auto_prefetch: bool = False, world: int = 1) -> str:
    """mmap (the default), eager, or fastsafetensors, from the normalized configuration.
    A prefetch reads checkpoint files into the page cache with threads before the workers
    map them (model_loader/weight_utils.py), but each rank only its share of the files
    (`sorted_files[rank::world_size]`): alone it is a sequential read at the drive's speed
    like eager's; across nodes, whose page caches are their own, most of what a rank maps
    is still faulted in, so it stays mmap (`prefetch_share` says how much is read fast)."""
    serving = config.get("serving", {})
    if serving.get("load_format") == "fastsafetensors":
        return "fastsafetensors"
    if serving.get("safetensors_load_strategy") == "eager":
        return "eager"
    if prefetches(config, auto_prefetch=auto_prefetch) and world <= 1:
        return "eager"
    return "mmap"


def prefetch_share(config: dict[str, Any], *, auto_prefetch: bool, world: int) -> float:
    """The share of a rank's weights its own prefetch brought into its node's page cache."""
    return 1.0 / max(1, world) if prefetches(config, auto_prefetch=auto_prefetch) else 0.0


@dataclass(frozen=True)
class Fp4Choice:
    """The NVFP4 kernels a launch runs with: what each flag asked for ("" = the version's
    default rule), what runs, and the backend whose truth (speed, broken) applies."""

    moe: str
    linear: str
    default: str

    @property
    def moe_running(self) -> str:
        return self.moe or self.default

    @property
    def linear_running(self) -> str:
        return self.linear or self.default

    @property
    def backend(self) -> str:
        """The MoE override first (the experts are most of the weights), then the linear
        one, then the default rule's pick."""
        return self.moe or self.linear or self.default


def fp4_choice(release: Release, argv: Sequence[str], default: str) -> Fp4Choice:
    """LAB_MODEL.md section 6: the FP4 backends come from the flags alone (environment
    variables choose nothing), by the version's default rule where a flag is absent or
    `auto`. vLLM lower-cases a choice and turns `-` into `_` (its flags' type)."""
    picked = []
    for option in (BACKEND_FLAGS[release.engine]["moe"], BACKEND_FLAGS[release.engine]["linear"]):
        _, value = release.option(argv, option)
        value = value or ""
        if release.engine == "vllm":
            value = value.lower().replace("-", "_")
        picked.append("" if value in ("", "auto") else value)
    return Fp4Choice(picked[0], picked[1], default)


def backend_state(backend: str, fp4: dict[str, Any]) -> str:
    if backend in fp4["broken"]:
        return "broken"
    if backend in fp4["degraded"]:
        return "degraded"
    return "ok"


def weights_per_node_gb(model: dict[str, Any], nodes: int) -> float:
    return float(model["checkpoint_gb"]) / max(1, nodes)


def is_hub_id(name: str) -> bool:
    """A name the engine resolves through the hub (an `org/name` id), not a local path."""
    return not name.startswith(("/", "./", "../", "~"))


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
        return all(env_meets(m.process_env, self.needs) for m in self.members.values())

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
    @property
    def engine_user(self) -> str: ...
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
        # The launch spec's env (what the platform set), and the process's whole environment
        # as the agent builds it: its fixed offline variables, then the spec's.
        self.env: dict[str, str] = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
        self.process_env: dict[str, str] = {**ENGINE_ENV_FIXED, **self.env}
        self.log_path = log_path
        self.started = started
        self.rank = 0
        self._once_written: set[tuple[str, int, str]] = set()  # vLLM's *_once lines written
        self.engine = str(spec.get("engine", "vllm"))
        self.release: Release | None = None
        self.exit_code: int | None = None
        self.exited_at: float | None = None  # lab time of the exit
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
        self._api_server = False
        self.headless = False
        self._bar_open = False  # a progress bar's line is still open (no newline yet)
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
        except EngineFailed as exc:
            code = exc.code
        except TimeoutError as exc:
            self._fail_in_core("RuntimeError", str(exc), frames=_DIST_FRAMES, code=None)
            code = 1
        except Exception as exc:  # the simulator's own bug: still end like a process would
            self.write_raw(logfmt.python_traceback([], f"{type(exc).__name__}: {exc}"))
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
        self.exited_at = now
        self.exit_code = code
        self._done.set()

    # -- writing the log ----------------------------------------------------------------------
    def write_raw(self, lines: list[str]) -> None:
        with self._log_lock, self.log_path.open("a", encoding="utf-8") as fh:
            if self._bar_open:  # tqdm closes its bar (a newline) when the loop it wraps ends
                fh.write("\n")
                self._bar_open = False
            for line in lines:
                fh.write(line + "\n")

    def write_bar(self, update: str, *, closed: bool = False) -> None:
        """One update of a tqdm progress bar as tqdm writes it to a file: a carriage return,
        the bar, and a newline only when the bar closes."""
        with self._log_lock, self.log_path.open("a", encoding="utf-8", newline="") as fh:
            fh.write("\r" + update + ("\n" if closed else ""))
            self._bar_open = not closed

    def stamp(self, t: float) -> float:
        """Lab time t as the node's clock reads it: what the log's timestamps show."""
        return self.node.hardware.node_time(t)

    @property
    def rel(self) -> Release:
        assert self.release is not None, "the release is known once the argv is parsed"
        return self.release

    def log(self, t: float, line: Line, message: str, level: str | None = None, *,
            scheduler: bool = True) -> None:
        """One engine log line: `message` is `line` (a format string of the release)
        filled, at the level its logger call has in the release (INFO where the table has
        none). vLLM's prefix names the line's file and line number; SGLang's names the
        scheduler's TP rank (`scheduler=False` for the HTTP server's own lines). A vLLM
        `*_once` line is written once per message, on rank 0 only with scope "global"."""
        if line.writers == "rank 0" and self.rank != 0:
            return  # the head's engine core or API server writes it; workers run neither
        if line.once is not None:
            if line.once == "global" and self.rank != 0:
                return
            key = (line.file, line.line, message)
            if key in self._once_written:
                return
            self._once_written.add(key)
        level = level or (line.level or "info").upper()
        self.write_raw([self._format(self.stamp(t), line.source, message, level, scheduler)])

    def _format(self, stamp: float, source: str, message: str, level: str, scheduler: bool) -> str:
        if self.engine == "sglang":
            return logfmt.sglang(stamp, message, tp_rank=self.rank if scheduler else None)
        return logfmt.vllm(level, stamp, source, message)

    def serving_log(self, line: Line, message: str) -> None:
        """The serving engine's lines (stats, spec-decode metrics, batches), stamped now."""
        self.log(self.clock.now(), line, message)

    def nccl(self, level: str, message: str) -> None:
        """NCCL's own line (`host:pid:tid [dev] NCCL INFO ...`), written only when the
        engine's environment asks NCCL for it (NCCL_DEBUG), as the library does."""
        wanted = self.process_env.get("NCCL_DEBUG", "").upper()
        shown = {"INFO": ("INFO", "WARN"), "TRACE": ("INFO", "WARN"), "WARN": ("WARN",)}
        if level in shown.get(wanted, ()):
            self.write_raw([logfmt.nccl(self.node.name, self.pid, f"NCCL {level} {message}")])

    # -- failing -------------------------------------------------------------------------------
    def _fail_in_core(self, exc_type: str, message: str, *, frames: list[tuple[str, int, str, str]],
                      code: int | None = 1) -> None:
        """An error in the engine's core (model init, KV allocation, the rendezvous):
        vLLM's EngineCore logs the traceback at ERROR, then its API server's traceback
        points above (the table's engine_core_failed line); SGLang's scheduler logs it,
        then its launcher notices the child died (the table's child_failed line).
        Raises EngineFailed(code) unless code is None."""
        t = self.stamp(self.clock.now())
        if self.engine == "vllm" and self.headless and frames and frames[0][2] == "run_engine_core":
            # The same error raised in a --headless node's worker process, not an engine core.
            frames = [*_VLLM_WORKER_FRAMES, *frames[1:]]
        body = logfmt.python_traceback(frames, f"{exc_type}: {message}")
        if self.engine == "sglang":
            # sglang/srt/managers/scheduler.py: logger.error(f"Scheduler hit an exception: {traceback}")
            lines = [logfmt.sglang(t, f"Scheduler hit an exception: {body[0]}", tp_rank=self.rank),
                     *body[1:]]
            child = self.rel.line("child_failed")
            lines.append(logfmt.sglang(t, child.text))
        else:
            # The head's engine core: vllm/v1/engine/core.py, logger.exception("EngineCore
            # failed to start."). A --headless node runs no engine core, only the workers of
            # v1/executor/multiproc_executor.py: logger.exception("WorkerProc failed to start.").
            if self.headless:
                source, said = f"multiproc_executor.py:{_VLLM_WORKER_LINE}", "WorkerProc failed to start."
            else:
                source, said = f"core.py:{_VLLM_CORE_LINE}", "EngineCore failed to start."
            lines = [logfmt.vllm("ERROR", t, source, said)]
            lines += [logfmt.vllm("ERROR", t, source, line) for line in body]
            if self._api_server:
                failed = self.rel.line("engine_core_failed").fmt(finished={"EngineCore_DP0": 1})
                lines += logfmt.python_traceback(_VLLM_API_FRAMES, f"RuntimeError: {failed}")
        self.write_raw(lines)
        if code is not None:
            raise EngineFailed(code)

    def _fail_at_startup(self, exception_line: str, frames: list[tuple[str, int, str, str]]) -> None:
        """An error while the process builds its configuration or tokenizer (before any
        rank meets another): a plain Python traceback, exit 1."""
        self.write_raw(logfmt.python_traceback(frames, exception_line))
        raise EngineFailed(1)

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

    # -- the launch ------------------------------------------------------------------------------
    def _parse(self, argv: list[str]) -> ParsedLaunch | None:
        """The launch as the installed release reads it; None (after writing argparse's
        refusal and waiting out the imports) when the release refuses it."""
        from lab.engines import ENGINES, EngineArgError, parse_launch
        from lab.engines.argv import EngineException, NotReproduced

        detected = next((name for name, e in ENGINES.items() if e.invocation(argv) is not None), None)
        if detected is not None:
            self.engine = detected
        installed = self.node.engine_versions().get(self.engine)
        if installed is None:
            # python3 -m <module> with the module not installed
            self.write_raw([f"/usr/bin/python3: No module named {self.engine}"])
            raise EngineFailed(1)
        self.release = Release(self.engine, installed)
        try:
            try:
                return parse_launch(argv, dict(self.env), version=installed)
            except TypeError:
                # lab.engines before its `version=` keyword: it parses with its default version.
                return parse_launch(argv, dict(self.env))
        except NotReproduced as exc:
            # Something the release accepts that the simulated lab does not model: said as
            # the simulator's own words, never as the engine's (intake and the node agent
            # refuse such a launch before it gets here).
            self.at(self.started + ARGPARSE_EXIT_S)
            self.write_raw([f"simulated lab: this launch is not reproduced: {exc.message}"])
            raise EngineFailed(1) from None
        except EngineException as exc:
            # The release's own code refuses it (FlexibleArgumentParser, a configuration
            # class): a traceback ending in its exception, exit 1, not argparse's exit 2.
            self.at(self.started + ARGPARSE_EXIT_S)
            self._fail_at_startup(exc.error_line, _VLLM_API_FRAMES[:2])
        except EngineArgError as exc:
            self.at(self.started + ARGPARSE_EXIT_S)
            self.write_raw(self._argparse_lines(exc))
            return None
        return None  # unreachable: every refusal above returns or raises

    def _argparse_lines(self, exc: Exception) -> list[str]:
        """What argparse prints before exit 2: its usage line, then `<prog>: error: ...`."""
        text = str(exc).strip()
        if text.startswith("usage:"):
            return text.splitlines()
        prog = getattr(exc, "prog", None) or self.rel.table.get("prog") or self.engine
        usage = self.rel.table.get("usage") or f"{prog} [-h] [options]"
        message = getattr(exc, "message", None) or text
        return [f"usage: {usage}", f"{prog}: error: {message}"]

    # -- the cold start -----------------------------------------------------------------------
    def _timeline(self) -> int:
        scenario = self.node.scenario
        load = scenario.truth["load"]
        argv = [str(a) for a in self.spec.get("argv") or []]
        parsed = self._parse(argv)
        if parsed is None:
            return 2
        config = parsed.config
        config["engine"] = {**config.get("engine", {}), "name": self.engine, "version": self.rel.version}
        self.rank = int(parsed.node_rank or 0)
        nnodes = max(1, int(parsed.nnodes or 1))
        parallel = config.get("parallel", {})
        # The checkpoint is split across every rank of the layout (tp x pp nodes).
        nodes_used = max(1, int(parallel.get("tp", 1)) * int(parallel.get("pp", 1)))
        serving = config.get("serving", {})
        self.headless = bool(parsed.headless)
        self._api_server = not parsed.headless and self.rank == 0
        fp4 = fp4_choice(self.rel, argv, scenario.truth["fp4"]["default_backend"])
        t = self.started

        # 1. process start, imports; the configuration and tokenizer are read at its end
        for name in self.rel.unknown_vllm_env(self.env):
            self.log(t, self.rel.line("unknown_env_warning", contains="%s"),
                     self.rel.line("unknown_env_warning", contains="%s").pct(name), "WARNING")
        if self.engine == "sglang" and not fp4.moe:
            self._sglang_moe_override_line(t)
        proc_end = t + load["proc_start_s"]
        self._phase("process_start", t, proc_end)
        self.at(proc_end)
        self._check_loadable(argv, config)
        t = proc_end

        # 2. distributed init: every rank waits for the slowest at the rendezvous
        t = self._distributed_init(t, parsed, nnodes)

        # 3. model init: the FP4 kernels are chosen (and, by vLLM, logged)
        t = self._model_init(t, fp4)

        # 4. weights load
        t = self._load_weights(t, config, nodes_used, fp4)
        for fault in scenario.faults("silent_hang_s"):
            # A post-load step that logs nothing and keeps one core busy (none of section
            # 5's signatures): what an unexplained stall looks like.
            hang_end = t + float(fault["silent_hang_s"])
            self._phase("hang", t, hang_end)
            self.at(hang_end)
            t = hang_end

        # 5. compile and kernel JIT (no torch.compile with --enforce-eager: the kernels only)
        eager = bool(serving.get("enforce_eager"))
        t = self._jit(t, fp4.backend, compiled=not eager)

        # 6. KV profiling and cache allocation (a collective: the ranks meet again)
        t, memory_gib = self._kv_phase(t, serving, nodes_used)
        port = int(parsed.port or 8000)
        # Build the API server (tokenizer, text model) while the graphs are captured, so its
        # wall-clock set-up cost is not multiplied by the dilation into a longer cold start.
        server = self._serving_engine(config, argv, fp4.backend, port) if self._api_server else None

        # 7. graph capture (none with --enforce-eager), then the engine's ready line
        t = self._capture_phase(t, config, memory_gib)

        # 8. API ready (the head serves; workers wait for work)
        return self._serve(t, server, port, config)

    def _kv_phase(self, t: float, serving: dict[str, Any], nodes_used: int) -> tuple[float, float]:
        """KV profiling and cache allocation, after the ranks meet; returns its end and the
        memory the engine then holds (weights and KV cache, GiB)."""
        scenario = self.node.scenario
        if self.group is not None:
            self.node.hardware.record_activity(t, math.inf, "wait", {})
            released = self.group.arrive("kv", self, t, stall_if_env_wrong=False).release
            assert released is not None
            self._phase("kv_wait", t, released, "wait")
            self.at(released)
            t = released
        kv_start = t
        kv_end = t + scenario.truth["load"]["kv_alloc_s"]
        self._phase("kv_alloc", kv_start, kv_end)
        self.at(kv_end)
        weights_gib = weights_per_node_gb(scenario.model, nodes_used) * 1e9 / GIB
        kv_gib = self._kv_report(kv_end, serving, weights_gib)
        self.node.hardware.engine_memory(kv_end, weights_gib + kv_gib)
        return kv_end, weights_gib + kv_gib

    def _capture_phase(self, t: float, config: dict[str, Any], memory_gib: float) -> float:
        """Graph capture (none in eager mode), then the engine's own init-done line."""
        serving = config.get("serving", {})
        eager = bool(serving.get("enforce_eager"))
        capture_s = 0.0 if eager else self.node.scenario.truth["load"]["graph_capture_s"]
        if capture_s > 0:
            self._phase("graph_capture", t, t + capture_s)
            self.at(t + capture_s)
            t += capture_s
            self._graphs_captured(t, capture_s, config, memory_gib)
        jit_phase = next(p for p in self.phases if p.name == "jit")
        if self.engine == "vllm" and eager:
            # Eager mode compiles nothing, so compilation_time stays 0 and v1/engine/core.py
            # writes the form without "(compilation: ...)".
            line = next(x for x in self.rel.lines("engine_init") if x.text.endswith("took %.2f s"))
            self.log(t, line, line.pct(t - jit_phase.start))
        elif self.engine == "vllm":
            line = next(x for x in self.rel.lines("engine_init") if x.text.endswith("(compilation: %.2f s)"))
            self.log(t, line, line.pct(t - jit_phase.start, jit_phase.seconds))
        else:
            self._sglang_pool_line(t, config, memory_gib)
        return t

    def _serve(self, t: float, server: Any, port: int, config: dict[str, Any]) -> int:
        """The head's API comes up and serves (until a scripted crash); a worker waits."""
        load = self.node.scenario.truth["load"]
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
            self._fail_at_startup(f"OSError: [Errno 98] error while attempting to bind on address "
                                  f"('0.0.0.0', {port}): {exc}", _VLLM_API_FRAMES[:1])
        # The ready lines first: whoever waits on ready_at then finds them in the log.
        self._ready_lines(api_end, port, config)
        self.ready_at = api_end
        self._phase("serving", api_end, math.inf)

        crash = self.node.scenario.faults("engine_crash_after_s")
        if crash:
            crash_at = api_end + crash[0]["engine_crash_after_s"]
            self.at(crash_at)
            self._crash(crash_at)
            return 1
        self.at(math.inf)
        return 0

    def _sglang_moe_override_line(self, t: float) -> None:
        """SGLang 0.5.23 resolves an `auto` MoE runner for modelopt_fp4 on SM110/SM120 (GB10
        is 12.1) to flashinfer_cutlass while it reads its arguments, and says so
        (arg_groups/overrides.py) on every node, before any rank meets another; 0.5.12 has
        no such rule."""
        found = [x for x in self.rel.lines("moe_runner_backend") if "SM110/SM120" in x.text]
        if found and self.node.scenario.truth["fp4"]["default_backend"] == "flashinfer_cutlass":
            self.log(t, found[0], found[0].text, scheduler=False)

    # -- 1. what the process reads before it meets anyone ---------------------------------------
    def _model_path(self, config: dict[str, Any]) -> str:
        return str(config.get("model", {}).get("path") or self.node.paths.model_dir)

    def _holds(self, name: str) -> bool:
        """Whether `name` is a path on this node's disk: the scenario's model or one of its
        drafts, or a directory present in the node's filesystem."""
        model = self.node.scenario.model
        held = {str(model.get("path", ""))} | {str(d["path"]) for d in model.get("drafts", [])}
        if name.rstrip("/") in held:
            return True
        try:
            return self.node.host_path(name).exists()
        except ValueError:
            return False

    def _check_loadable(self, argv: list[str], config: dict[str, Any]) -> None:
        """LAB_MODEL.md section 9: offline, a hub id resolves only to a local snapshot (the
        lab keeps none: it addresses its copies by path); a model whose code ships with it
        needs --trust-remote-code before its tokenizer loads."""
        rel = self.rel
        offline = self.process_env.get("HF_HUB_OFFLINE", "") not in ("", "0")
        model = self._model_path(config)
        spec = config.get("speculative") or {}
        draft = str(spec.get("draft_model") or "")
        if self.engine == "vllm":
            tokenizer = rel.option(argv, "--tokenizer")[1] or model
            trust = rel.flag_on(argv, "--trust-remote-code")
        else:
            tokenizer = rel.option(argv, "--tokenizer-path")[1] or model
            trust = rel.flag_on(argv, "--trust-remote-code")
        for name, frames in ((model, _CONFIG_FRAMES[self.engine]), (draft, _CONFIG_FRAMES[self.engine]),
                             (tokenizer, _TOKENIZER_FRAMES[self.engine])):
            if name and is_hub_id(name) and not self._holds(name):
                # Offline (the agent's HF_HUB_OFFLINE=1) the hub library fails at once;
                # online, a lab node would still reach no hub: the same end, later.
                if offline:
                    self._fail_at_startup(HUB_OFFLINE_ERROR, frames)
                self._fail_at_startup("OSError: We couldn't connect to 'https://huggingface.co' to load "
                                      "the files, and couldn't find them in the cached files.", frames)
        # vLLM loads the tokenizer in its API server and engine core, on the head only: a
        # --headless node reads the model config (Kimi K2's and DeepSeek V3's are registered
        # configurations, no remote code) and goes on to the rendezvous, where it waits for
        # a head that has already failed. SGLang's schedulers load it on every node.
        loads_tokenizer = self.engine != "vllm" or not self.headless
        if (self.node.scenario.model.get("remote_code") and not trust and tokenizer == model
                and loads_tokenizer):
            message = rel.line("trust_remote_code", startswith="Failed to load the tokenizer").text
            self._fail_at_startup(f"RuntimeError: {message}", _TOKENIZER_FRAMES[self.engine])

    # -- 2. the rendezvous ------------------------------------------------------------------------
    def _interface(self) -> tuple[str, str]:
        """The socket interface NCCL bootstraps on, and this node's address there: the one
        NCCL_SOCKET_IFNAME names, else NCCL's own pick (the first data NIC)."""
        nics = self.node.scenario.node["nics"]
        names = [nics["mgmt"], *nics["data"]]
        wanted = self.process_env.get("NCCL_SOCKET_IFNAME", "").lstrip("=^")
        name = wanted.split(",")[0] if wanted else nics["data"][0]
        index = names.index(name) if name in names else 1
        node_index = self.node.scenario.node_names.index(self.node.name)
        return name, node_ipv4(index, node_index).split("/")[0]

    def _broadcast_address(self) -> str:
        """Where vLLM's multi-node head binds its broadcast queue (get_ip): VLLM_HOST_IP,
        else the address of the interface holding the default route (the management NIC)."""
        given = self.process_env.get("VLLM_HOST_IP")
        if given:
            return given
        node_index = self.node.scenario.node_names.index(self.node.name)
        return node_ipv4(0, node_index).split("/")[0]

    def _distributed_init(self, t: float, parsed: ParsedLaunch, nnodes: int) -> float:
        load = self.node.scenario.truth["load"]
        if self.engine == "vllm" and nnodes > 1 and self.rank == 0 and self.rel.has_line("mq_leader"):
            line = self.rel.line("mq_leader")
            self.log(t, line, line.pct(0, 0, parsed.master_addr, self._broadcast_address(), nnodes, 1))
        if self.engine == "sglang" and self.rel.has_line("dist_init_begin"):
            begin = self.rel.line("dist_init_begin")
            self.log(t, begin, begin.text)
        ifname, address = self._interface()
        if "NCCL_SOCKET_IFNAME" in self.process_env:
            chosen = self.process_env["NCCL_SOCKET_IFNAME"]
            self.nccl("INFO", f"NCCL_SOCKET_IFNAME set by environment to {chosen}")
        self.nccl("INFO", f"Bootstrap: Using {ifname}:{address}<0>")
        self.nccl("INFO", f"cudaDriverVersion {CUDA_DRIVER_VERSION}")
        self.nccl("INFO", f"NCCL version {NCCL_VERSION}")
        release = t
        if nnodes > 1:
            key = (parsed.master_addr, parsed.master_port)
            self.group = self.node.hub.join(self, key, nnodes)
            # Whether this node is the one that comes late shows in its own traffic at once:
            # its bootstrap retries over the management network while the others wait.
            own_env_ok = env_meets(self.process_env, self.group.needs)
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
        if self.engine == "sglang" and self.rel.has_line("dist_init_end"):
            ends = self.rel.line("dist_init_end")
            self.log(end, ends, ends.fmt({"time.perf_counter() - tic": end - t,
                                          "before_avail_memory - local_gpu_memory": 0.0}))
        hcas = self.process_env.get("NCCL_IB_HCA") or ",".join(
            str(d["name"]) for d in self.node.hardware.rdma_facts())
        devices = " ".join(f"[{i}]{d.strip().lstrip('=^')}:1/RoCE" for i, d in enumerate(hcas.split(",")))
        self.nccl("INFO", f"NET/IB : Using {devices} [RO]; OOB {ifname}:{address}<0>")
        return end

    def _bootstrap_retries(self, t: float, release: float) -> None:
        """The late node's NCCL bootstrap keeps failing to reach the root over the wrong
        interface: NCCL's socket retry line (misc/socket.cc), retry n after n x 100 ms."""
        _, address = self._interface()
        root = ".".join([*address.split(".")[:3], "11"])  # the head's address on that subnet
        mark = t
        for attempt in range(1, NCCL_RETRY_COUNT + 1):
            sleep_ms = attempt * NCCL_RETRY_SLEEP_MS
            if mark >= release:
                break
            self.at(mark)
            self.nccl("INFO", f"socketStartConnect: connect to {root}<{43000 + self.node.launch_count}> "
                              f"returned Connection timed out, retrying ({attempt}/{NCCL_RETRY_COUNT}) "
                              f"after sleep for {sleep_ms} msec")
            mark += sleep_ms / 1000.0
        self.at(release)

    # -- 3. model init ----------------------------------------------------------------------------
    def _model_init(self, t: float, fp4: Fp4Choice) -> float:
        """The model is built and its NVFP4 kernels chosen (LAB_MODEL.md section 6). vLLM
        logs its MoE choice and linear kernel here; SGLang logs none here (0.5.23 named its
        MoE runner while it read its arguments, _sglang_moe_override_line: the package wins
        over section 6's "no backend line"). A backend that cannot run NVFP4 here ends the
        process with the engine's error."""
        end = t + MODEL_INIT_S
        self._phase("model_init", t, end)
        self.at(end)
        unsupported = self.node.scenario.truth["fp4"]["unsupported"]
        if self.engine == "vllm":
            self._vllm_fp4_lines(end, fp4, unsupported)
        elif fp4.moe_running in unsupported or fp4.linear_running in unsupported:
            bad, flag = ((fp4.moe_running, "moe_runner_backend") if fp4.moe_running in unsupported
                         else (fp4.linear_running, "fp4_gemm_runner_backend"))
            # Not in the release tables: the kernels' own check, worded after SGLang's
            # "(trtllm-gen MoE kernels are SM100-only)" override note.
            self._fail_in_core("RuntimeError", f"{flag}={bad!r} cannot run NVFP4 on this device "
                               "(compute capability 12.1): its kernels are built for SM100 only",
                               frames=_SGLANG_INIT_FRAMES)
        return end

    def _vllm_fp4_lines(self, t: float, fp4: Fp4Choice, unsupported: list[str]) -> None:
        rel = self.rel
        moe = fp4.moe_running
        value = VLLM_MOE_VALUES.get(moe, moe.upper())
        if moe in unsupported:
            # vLLM's MoE oracle refusing a backend for the device (oracle/nvfp4.py: 0.29.0
            # _make_log_unsupported, 0.34.0 make_log_unsupported in oracle/base.py, both
            # quoting the name); the wording is not in the release tables.
            self._fail_in_core("ValueError", f"NvFp4 MoE backend '{value}' does not support the deployment "
                               "configuration since kernel does not support current device.",
                               frames=_VLLM_INIT_FRAMES)
        available = list(VLLM_MOE_POTENTIAL)
        line = rel.line("moe_backend")
        values = {"backend.value": value, "available_backend_strs": available, "self.name": "NvFp4",
                  "lora": "", "available": f" out of potential backends: {available}"}
        self.log(t, line, line.fmt(values))
        linear = fp4.linear_running
        # The kernel class the release's choice covers (its table's nvfp4_linear_kernels,
        # from _LINEAR_BACKEND_KERNEL_MAP; the W4A16 variants are not the NVFP4 GEMM's).
        covered = rel.table.get("nvfp4_linear_kernels") or {}
        kernel = next((k for k, c in covered.items() if c == linear and "W4A16" not in k),
                      "".join(p.capitalize() for p in linear.split("_")) + "NvFp4LinearKernel")
        if linear in unsupported:
            # vLLM's linear kernel selection finding none (kernels/linear/__init__.py); the
            # wording is not in the release tables.
            self._fail_in_core("ValueError", "Failed to find a kernel that can implement the NVFP4 linear "
                               f"layer. Reasons: {kernel} requires a compute capability the device (12.1) "
                               "does not have", frames=_VLLM_INIT_FRAMES)
        gemm = rel.line("nvfp4_linear_kernel")
        self.log(t, gemm, gemm.pct(kernel))

    # -- 4. weights ---------------------------------------------------------------------------------
    def _load_weights(self, t: float, config: dict[str, Any], nodes_used: int, fp4: Fp4Choice) -> float:
        load = self.node.scenario.truth["load"]
        weights = weights_per_node_gb(self.node.scenario.model, nodes_used)
        checkpoint = float(self.node.scenario.model["checkpoint_gb"]) * 1e9
        available = self.node.hardware.memory_kib(t)[1] * 1024.0
        fs = str(self.node.scenario.node["model_fs"])
        auto = self.engine == "vllm" and auto_prefetches(fs, checkpoint, available)
        loader = loader_for(config, auto_prefetch=auto, world=nodes_used)
        read_gbs = load["mmap_read_gbs"] if loader == "mmap" else load["nvme_read_gbs"]
        share = prefetch_share(config, auto_prefetch=auto, world=nodes_used)
        if loader == "mmap" and share > 0:
            # The prefetched share at the drive's speed, the rest faulted in.
            read_gbs = 1.0 / (share / load["nvme_read_gbs"] + (1 - share) / load["mmap_read_gbs"])
        cached = min(self.node.hardware.weights_cached_gb, weights)
        cache_s = cached / load["page_cache_gbs"]
        disk_s = (weights - cached) / read_gbs
        total = cache_s + disk_s
        end = t + total
        free = float(self.node.scenario.node["cuda_free_gib"])
        if self.engine == "sglang" and loader == "fastsafetensors" \
                and not self.node.scenario.node["fastsafetensors"]:
            # SGLang does not depend on the package: its iterator raises at the first read.
            begin = self.rel.line("load_weight_begin")
            self.log(t, begin, begin.fmt({"get_available_gpu_memory(self.device, self.gpu_id)": free}))
            missing = self.rel.line("fastsafetensors_missing")
            self._fail_in_core("ImportError", missing.text, frames=[
                *_SGLANG_INIT_FRAMES,
                (f"{SITE}/{missing.file}", missing.line - 1, "fastsafetensors_weights_iterator",
                 "raise ImportError(")])
        self._phase("weights_load", t, end, None, loader=loader)
        # Hardware activity: first what the page cache still holds, then the disk.
        if cache_s > 0:
            self.node.hardware.record_activity(t, t + cache_s, "load_cache", {})
        if disk_s > 0:
            self.node.hardware.record_activity(t + cache_s, end, f"load_{loader}", {"read_gbs": read_gbs})
        self.node.hardware.begin_load(t + cache_s, end, cached, weights, loader)
        self.node.hardware.engine_memory_ramp(t, end, weights * 1e9 / GIB)
        gib = weights * 1e9 / GIB

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

        if self.engine == "sglang":
            begin = self.rel.line("load_weight_begin")
            self.log(t, begin, begin.fmt({"get_available_gpu_memory(self.device, self.gpu_id)": free}))
            self.at(end)
        else:
            # Every rank's model runner says it starts (gpu/model_runner.py, info_once); only
            # rank 0 draws the shards' progress bar (model_loader/weight_utils.py
            # enable_tqdm: the first rank of the world): on the other nodes the weights are
            # minutes of silence, told apart by telemetry alone.
            start = self.rel.line("load_model_begin", file="gpu/model_runner.py")
            self.log(t, start, start.text)
            prefetching = self._prefetch_lines(t, config, fs, checkpoint, available, auto)
            if self.rank == 0:
                # tqdm writes the bar to stderr, not through the logger: no stamp, each update
                # after a carriage return, a newline when it closes; its own elapsed time only.
                shards = self.rel.line("shard_progress", contains="safetensors")
                self.write_bar(logfmt.shard_progress(shards.text, 0, SHARDS, 0.0))
                for i in range(SHARDS):
                    done_at = t + shard_done(i)
                    self.at(done_at)
                    self.write_bar(logfmt.shard_progress(shards.text, i + 1, SHARDS, done_at - t),
                                   closed=i + 1 == SHARDS)
            self.at(end)
            if prefetching:
                done = self.rel.line("prefetch_run", contains="finished")
                self.log(end, done, done.pct(total))
        self.node.hardware.finish_load(end, weights)
        if self.engine == "sglang":
            line = self.rel.line("load_weight_end", startswith="Load weight end. elapsed=")
            self.log(end, line, line.fmt({
                "time.perf_counter() - tic_total": total, "self.weight_load_time": total,
                "type(self.model).__name__": _ARCHITECTURE,
                "quant_str + ', ' if quant_str else ''": "",
                "after_avail_memory": free - gib, "self.weight_load_mem_usage": gib}))
        else:
            took = self.rel.line("weights_loaded", file="default_loader.py")
            self.log(end, took, took.pct(total))
            if "marlin" in (fp4.moe_running, fp4.linear_running):
                # Marlin repacks the FP4 weights once they are read: its warning_once is in
                # the kernel's process_weights_after_loading (kernels/linear/nvfp4/marlin.py),
                # after "Loading weights took" and before the model runner's total.
                marlin = self.rel.line("marlin_fp4", file="marlin.py")
                self.log(end, marlin, marlin.text)
            model = self.rel.line("model_loading", file="gpu/model_runner.py")
            self.log(end, model, model.pct(round(gib, 2), total + 1.2))
        return end

    def _prefetch_lines(self, t: float, config: dict[str, Any], fs: str, checkpoint: float,
                        available: float, auto: bool) -> bool:
        """What every rank's safetensors iterator says before it reads: the filesystem and
        sizes (info_once), then why it prefetches or not, in the release's words. True when
        it prefetches (its finished line comes when the read ends); `auto` is
        auto_prefetches' answer for this node."""
        strategy = config["serving"].get("safetensors_load_strategy")
        if config["serving"].get("load_format") == "fastsafetensors" or strategy == "torchao":
            return False
        fs_name = fs.upper() if fs else "unknown"
        fits = fits_in_ram(checkpoint, available)
        line = self.rel.line("checkpoint_fs")
        self.log(t, line, line.pct(fs_name, checkpoint / GIB, available / GIB))
        network = fs in NETWORK_FILESYSTEMS
        prefetch = prefetches(config, auto_prefetch=auto)
        if strategy is None and not auto:
            if network:
                line = self.rel.line("prefetch_decision", startswith="Network filesystem")
                self.log(t, line, line.pct(fs_name, checkpoint / GIB, PREFETCH_RAM_PCT, available / GIB))
            elif fits:
                line = self.rel.line("prefetch_decision", contains="If you want to force")
                self.log(t, line, line.pct(fs_name))
            else:
                line = self.rel.line("prefetch_decision", contains="and the checkpoint size")
                self.log(t, line, line.pct(fs_name, checkpoint / GIB, PREFETCH_RAM_PCT, available / GIB))
        elif strategy == "prefetch" and not fits:
            line = self.rel.line("prefetch_decision", startswith="safetensors_load_strategy=")
            self.log(t, line, line.pct(checkpoint / GIB, PREFETCH_RAM_PCT, available / GIB))
        if prefetch:
            line = self.rel.line("prefetch_run", contains="started")
            self.log(t, line, line.pct(PREFETCH_THREADS, PREFETCH_BLOCK_BYTES))
        return prefetch

    # -- 5. compile and JIT ---------------------------------------------------------------------------
    def _jit_cache_marker(self, backend: str) -> Path | None:
        """The file a completed JIT leaves in the engine's compile cache: under its own cache
        variable (vLLM's VLLM_CACHE_ROOT, SGLang's SGLANG_CACHE_DIR) when the launch sets
        one, else under the engine user's home (~/.cache/vllm, ~/.cache/sglang), which
        survives restarts as it does on bare metal. The lab's ephemeral cache is a
        per-launch folder the node empties before each launch."""
        variable = "VLLM_CACHE_ROOT" if self.engine == "vllm" else "SGLANG_CACHE_DIR"
        root = self.env.get(variable) or f"/home/{self.node.engine_user}/.cache/{self.engine}"
        try:
            base = self.node.host_path(root)
        except ValueError:
            return None
        digest = hashlib.sha256(f"{self.engine}:{self.rel.version}:{backend}".encode()).hexdigest()[:10]
        return base / "torch_compile_cache" / digest / f"rank_{self.rank}_0" / "vllm_compile_cache.py"

    def _jit(self, t: float, backend: str, compiled: bool = True) -> float:
        """Compile and kernel JIT: the log is silent while the compilers run; vLLM reports
        torch.compile's total at the end (and its cache hit), SGLang nothing. With
        `compiled` false (--enforce-eager) vLLM runs no torch.compile, so it writes neither
        line; the kernels' JIT still runs."""
        load = self.node.scenario.truth["load"]
        marker = self._jit_cache_marker(backend)
        warm = marker is not None and marker.is_file()
        seconds = load["jit_warm_s"] if warm else load["jit_cold_s"]
        end = t + seconds
        self._phase("jit", t, end, "jit", cold=not warm)
        self.at(end)
        if marker is not None and not warm:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(json.dumps({"backend": backend, "compiled_at": end}) + "\n")
        if self.engine == "vllm" and warm and compiled:
            # vLLM says when its kept cache held the compiled graphs (compilation/backends.py).
            hit = self.rel.line("compile_cache_hit")
            hit_args = ("", COMPILE_RANGE, seconds) if hit.text.startswith("%s") else (COMPILE_RANGE, seconds)
            self.log(end, hit, hit.pct(*hit_args))
        if self.engine == "vllm" and compiled:
            line = self.rel.line("torch_compile")
            # 0.34's line starts with a %s naming the compiled module (empty for the model).
            args = ("", seconds) if line.text.startswith("%s") else (seconds,)
            self.log(end, line, line.pct(*args))
        return end

    # -- 6. KV cache -------------------------------------------------------------------------------------
    def _kv_report(self, t: float, serving: dict[str, Any], weights_gib: float) -> float:
        """Log the KV cache size; on too little memory fail like the engine does. GiB allocated."""
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
        available = max(0.0, available)
        rel = self.rel
        if self.engine == "vllm":
            # Each worker profiles its memory and says what the cache may take
            # (gpu_worker.determine_available_memory) before the head's engine core sizes
            # the cache and checks it against the context.
            avail = rel.line("available_kv_memory")
            self.log(t, avail, avail.pct(round(available, 2)))
        # vLLM refuses a context its KV cache cannot hold; SGLang sizes its pool from memory
        # alone, starts with a pool shorter than its context, and refuses only a pool of no
        # token at all (pool_configurator.py's "Not enough memory"); longer requests are
        # refused when they arrive (lab.sim.http).
        if available < needed and (self.engine != "sglang" or available * GIB < per_token):
            if self.engine == "vllm" and self.headless:
                # vLLM checks the KV budget in the head's engine core
                # (check_enough_kv_cache_memory): a --headless node's workers reported their
                # memory and wait for the head's next call, which never comes.
                self.node.hardware.record_activity(t, math.inf, "wait", {})
                self._phase("wait_head", t, math.inf, None)
                self.at(math.inf)
            self._kv_refusal(max_len, needed, available, per_token)
        tokens = int(available * GIB / per_token)
        self.kv_tokens = tokens
        if self.engine == "sglang":
            free = float(scenario.node["cuda_free_gib"]) - weights_gib - available
            # The pool's own line (mem_cache/memory_pool.py; MLA pools report one KV size).
            # 0.5.23's "Post-capture KV sizing" variant needs SGLANG_ENABLE_POST_CAPTURE_KV_SIZING
            # and is never written for MLA models: not this one.
            line = next(x for x in rel.lines("kv_cache_allocated")
                        if x.file.endswith("mem_cache/memory_pool.py") and "KV size" in x.text)
            torch_dtype = "torch.bfloat16" if dtype == "bf16" else "torch.float8_e4m3fn"
            self.log(t, line, line.fmt({"cache_name": "KV Cache", "self.dtype": torch_dtype,
                                        "num_tokens": tokens, "kv_size_GB": available}))
            pool = rel.line("memory_pool_end")
            self.log(t, pool, pool.fmt({"get_available_gpu_memory(self.device, self.gpu_id)": free}))
            if tokens < max_len and rel.has_line("kv_pool_short"):
                short = rel.line("kv_pool_short")  # 0.5.23's warning; 0.5.12 writes none
                self.log(t, short, short.pct(tokens, max_len))
        else:
            size = rel.line("kv_cache_size")
            args: tuple[Any, ...] = (f"{tokens:,}", f"{max_len:,}", tokens / max_len)
            if size.text.startswith("%s"):
                args = ("GPU", *args)
            self.log(t, size, size.pct(*args))
        return available

    def _kv_refusal(self, max_len: int, needed: float, available: float, per_token: int) -> None:
        rel = self.rel
        if self.engine == "sglang":
            message = rel.line("not_enough_memory").text
            self._fail_in_core("RuntimeError", message, frames=_SGLANG_INIT_FRAMES)
        estimated = int(available * GIB / per_token)
        estimate = rel.line("kv_budget_error", startswith="Based on").fmt(estimated_max_len=estimated)
        text = rel.line("kv_budget_error", startswith="To serve").fmt({
            "max_model_len": max_len, "format_gib(needed_memory)": round(needed, 2),
            "format_gib(available_memory)": round(available, 2), "estimated_msg": estimate,
            # 0.34's hint (not in the table): what the 0.29 line says in the same place.
            "hint": "Try increasing `gpu_memory_utilization` when initializing the engine."})
        self._fail_in_core("ValueError", text, frames=_VLLM_KV_FRAMES)

    # -- 7. graphs ---------------------------------------------------------------------------------------
    def _graphs_captured(self, t: float, capture_s: float, config: dict[str, Any], used_gib: float) -> None:
        rel = self.rel
        if self.engine == "vllm":
            line = rel.line("graph_capture")
            self.log(t, line, line.pct(capture_s, GRAPH_POOL_GIB))
            return
        free = float(self.node.scenario.node["cuda_free_gib"]) - used_gib - GRAPH_POOL_GIB
        spec = config.get("speculative") or {}
        # The main runner's line names its backend through graph_backend[device] ("cuda
        # graph" in 0.5.12's model_runner.py, "CUDA graph" in 0.5.23's cuda_graph_setup.py)
        # and 0.5.23 the role and step it captured ("target verify" under speculation).
        values = {"time.perf_counter() - tic": capture_s, "capture_time": capture_s,
                  "mem_usage": GRAPH_POOL_GIB, "memory_usage_gb": GRAPH_POOL_GIB,
                  "self.graph_mem_usage": GRAPH_POOL_GIB, "after_mem": free,
                  "graph_backend[self.device]": "cuda graph",
                  "graph_backend[model_runner.device]": "CUDA graph",
                  "capture_name": "target verify" if spec.get("method") else "target decode",
                  "runner.capture_bs": CAPTURE_BATCH_SIZES,
                  "before_mem - after_mem": GRAPH_POOL_GIB * 0.1}
        main = next(x for x in rel.lines("cuda_graph_capture_end") if "{graph_backend[" in x.text)
        self.log(t, main, main.fmt(values))
        if spec.get("method") == "eagle3" and self.rank == 0:
            # The EAGLE worker logs its draft capture on TP rank 0 only (eagle_worker.py); the
            # key mixes writers, so the rank is checked here rather than in the table.
            draft = next((x for x in rel.lines("cuda_graph_capture_end")
                          if "eagle_worker" in x.file and x.text.startswith("Capture draft ")), None)
            if draft is not None:
                self.log(t, draft, draft.fmt(values))

    def _sglang_pool_line(self, t: float, config: dict[str, Any], used_gib: float) -> None:
        """The scheduler's summary once its pools exist (scheduler.py)."""
        line = self.rel.line("memory_pool", file="managers/scheduler.py", contains=", available_gpu_mem=")
        serving = config.get("serving", {})
        max_len = int(serving.get("max_model_len") or self.node.scenario.model["max_context"])
        free = float(self.node.scenario.node["cuda_free_gib"]) - used_gib - GRAPH_POOL_GIB
        self.log(t, line, line.fmt({
            "self.max_total_num_tokens": self.kv_tokens or 0,
            "self.server_args.chunked_prefill_size": 8192, "get_schedule().chunked_prefill_size": 8192,
            "self.max_prefill_tokens": 16384, "self.max_running_requests": 48,
            "self.model_config.context_len": max_len,
            "avail_mem": free, "self.startup_available_gpu_memory_gb": free}))

    # -- 8. ready ---------------------------------------------------------------------------------------
    def _ready_lines(self, t: float, port: int, config: dict[str, Any]) -> None:
        rel = self.rel
        if self.engine == "vllm":
            line = rel.line("api_server_start", file="api_server/entry.py")
            self.log(t, line, line.pct(f"http://0.0.0.0:{port}"))
            return
        load = self.node.scenario.truth["load"]
        if rel.has_line("startup_timings"):
            timings = rel.line("startup_timings")
            weights = next(p.seconds for p in self.phases if p.name == "weights_load")
            graphs = next((p.seconds for p in self.phases if p.name == "graph_capture"), 0.0)
            self.log(t, timings, timings.pct(weights, load["kv_alloc_s"], t - self.started,
                                             f"decode={graphs:.2f}", load["api_ready_s"]), scheduler=False)
        ready = rel.line("server_ready", file="srt/entrypoints/http_server.py")
        self.log(t, ready, ready.text, scheduler=False)

    def _serving_engine(self, config: dict[str, Any], argv: list[str], backend: str,
                        port: int) -> ServingEngine:
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
            log=lambda _message: None,
            log_line=self.serving_log,
            tokenizer_path=self.node.host_path(f"{self.node.paths.model_dir}/tokenizer.json"),
            host="127.0.0.1",
            port=port,
            seed=scenario.seed + self.node.launch_count,
            kv_capacity_tokens=self.kv_tokens,
            release=self.rel,
            argv=argv,
        )
        return server

    def _crash(self, t: float) -> None:
        """engine_crash_after_s: a fatal CUDA error takes the engine and its workers down.
        The lines are the engines' own wording (vLLM's core.py / async_llm.py, SGLang's
        scheduler), which the release tables do not carry."""
        frames = [
            (f"{SITE}/vllm/v1/engine/core.py", 806, "run_engine_core", "engine_core.run_busy_loop()"),
            (f"{SITE}/vllm/v1/engine/core.py", 833, "run_busy_loop", "self._process_engine_step()"),
            (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 264, "collective_rpc",
             "raise RuntimeError(f\"Worker failed with error '{e}'\")"),
        ]
        body = logfmt.python_traceback(
            frames, "RuntimeError: Worker failed with error 'CUDA error: an illegal memory access was "
                    "encountered', please check the stack trace above for the root cause")
        stamp = self.stamp(t)
        if self.engine == "sglang":
            lines = [logfmt.sglang(stamp, f"Scheduler hit an exception: {body[0]}", tp_rank=self.rank),
                     *body[1:], logfmt.sglang(stamp, self.rel.line("child_failed").text)]
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
                    lines = ["RuntimeError: NCCL communicator was aborted on rank "
                             f"{member.rank}."]
                    if member.process_env.get("NCCL_DEBUG", "").upper() in ("WARN", "INFO", "TRACE"):
                        lines.insert(0, logfmt.nccl(
                            member.node.name, member.pid,
                            "NCCL WARN [Service thread] Error encountered progressing operation=Connect, "
                            "res=3, closing connection"))
                    member.terminate(exit_code=1, lines=lines)


# Traceback frames (Python's traceback format; the files and functions are the engines'
# own, the line numbers illustrative): where each failure is raised.
_VLLM_CORE_LINE = 708
_VLLM_WORKER_LINE = 1091
_ARCHITECTURE = "DeepseekV3ForCausalLM"
_VLLM_API_FRAMES = [
    ("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
    (f"{SITE}/vllm/entrypoints/cli/main.py", 73, "main", "args.dispatch_function(args)"),
    (f"{SITE}/vllm/entrypoints/cli/serve.py", 60, "cmd", "uvloop.run(run_server(args))"),
    (f"{SITE}/vllm/v1/engine/utils.py", 1073, "wait_for_engine_startup",
     "raise RuntimeError("),
]
_VLLM_INIT_FRAMES = [
    (f"{SITE}/vllm/v1/engine/core.py", 691, "run_engine_core",
     "engine_core = EngineCoreProc(*args, **kwargs)"),
    (f"{SITE}/vllm/v1/worker/gpu_model_runner.py", 3010, "load_model",
     "self.model = model_loader.load_model("),
    (f"{SITE}/vllm/model_executor/layers/quantization/modelopt.py", 1180, "__init__",
     "self.nvfp4_backend, self.experts_cls = select_nvfp4_moe_backend("),
]
_VLLM_WORKER_FRAMES = [
    (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 1057, "worker_main",
     "worker = WorkerProc(*args, **kwargs)"),
    (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 822, "__init__", "self.worker.load_model()"),
]
_VLLM_KV_FRAMES = [
    (f"{SITE}/vllm/v1/engine/core.py", 691, "run_engine_core",
     "engine_core = EngineCoreProc(*args, **kwargs)"),
    (f"{SITE}/vllm/v1/engine/core.py", 83, "__init__", "self._initialize_kv_caches(vllm_config)"),
    (f"{SITE}/vllm/v1/core/kv_cache_utils.py", 700, "check_enough_kv_cache_memory", "raise ValueError("),
]
_DIST_FRAMES = [
    (f"{SITE}/torch/distributed/c10d_logger.py", 81, "wrapper", "return func(*args, **kwargs)"),
    (f"{SITE}/torch/distributed/distributed_c10d.py", 1710, "init_process_group",
     "store, rank, world_size = next(rendezvous_iterator)"),
]
_SGLANG_INIT_FRAMES = [
    (f"{SITE}/sglang/srt/managers/scheduler.py", 2900, "run_scheduler_process",
     "scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)"),
    (f"{SITE}/sglang/srt/model_executor/model_runner.py", 300, "__init__",
     "self.initialize(min_per_gpu_memory)"),
]
_CONFIG_FRAMES = {
    "vllm": [
        ("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
        (f"{SITE}/vllm/engine/arg_utils.py", 1400, "create_engine_config",
         "speculative_config = self.create_speculative_config("),
        (f"{SITE}/vllm/transformers_utils/config.py", 600, "get_config",
         "config_dict, _ = PretrainedConfig.get_config_dict("),
        (f"{SITE}/huggingface_hub/_snapshot_download.py", 235, "snapshot_download",
         "raise LocalEntryNotFoundError("),
    ],
    "sglang": [
        ("<frozen runpy>", 198, "_run_module_as_main", "return _run_code(code, main_globals, None,"),
        (f"{SITE}/sglang/srt/server_args.py", 1200, "__post_init__",
         "self._handle_model_specific_adjustments()"),
        (f"{SITE}/sglang/srt/utils/hf_transformers/config.py", 300, "get_config",
         "config = AutoConfig.from_pretrained("),
        (f"{SITE}/huggingface_hub/_snapshot_download.py", 235, "snapshot_download",
         "raise LocalEntryNotFoundError("),
    ],
}
_TOKENIZER_FRAMES = {
    "vllm": [
        ("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
        (f"{SITE}/vllm/entrypoints/cli/serve.py", 60, "cmd", "uvloop.run(run_server(args))"),
        (f"{SITE}/vllm/tokenizers/hf.py", 200, "from_pretrained", "raise RuntimeError(err_msg) from e"),
    ],
    "sglang": [
        ("<frozen runpy>", 198, "_run_module_as_main", "return _run_code(code, main_globals, None,"),
        (f"{SITE}/sglang/srt/managers/tokenizer_manager.py", 250, "__init__",
         "self.tokenizer = get_tokenizer("),
        (f"{SITE}/sglang/srt/utils/hf_transformers/tokenizer.py", 203, "get_tokenizer",
         "raise RuntimeError(err_msg) from e"),
    ],
}


