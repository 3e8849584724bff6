#!/usr/bin/env python3
"""The node agent: one stdlib-only script that the platform copies to every lab node and
runs over SSH as `python3 agent.py VERB [ARGS] --json`.

It reports the node's facts, samples telemetry in a detached process, starts and stops
the inference engine from a `lab.launch/1` spec, serves the engine log by byte offset,
drops the page cache, runs the NVFP4 probe and measures the memory bandwidth a streaming
read reaches. Every verb prints one `lab.agent/1` JSON
object on stdout (docs/lab-contracts.md, schema.json beside this file) and exits 0 on
success, 2 on a usage error, 1 on any other failure.

Nodes have only python3, so nothing outside the standard library is imported (torch only
inside fp4-probe and mem-bw-probe, when the node has it), and the code stays within Python 3.8 (the
oldest interpreter its tests run under; README.md; 3.7 lacks importlib.metadata).

The engine runs customers' configurations, so it never runs with the agent's privileges
or environment: when the agent is root it starts the engine as the node's service user
(`engine_user` in the node's own config file), always with a fixed PATH and an
environment built from allow-lists, and it refuses a spec whose env sets a variable, or a
value, outside the lab's environment policy for the spec's engine and version (the policy
is written into this file when the platform pushes it, so its checksum covers it; a spec
written by anything but the platform is held to it too). Only drop-caches needs
privilege: as root it writes the file itself, otherwise it asks `sudo -n` for the one
command a narrow sudoers rule allows.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import errno
import hashlib
import ipaddress
import json
import os
import platform
import pwd
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

AGENT_VERSION = "1.0.0"
SCHEMA = "lab.agent/1"
LAUNCH_SCHEMA = "lab.launch/1"

VERBS = (
    "self-check", "facts", "sampler", "telemetry", "launch", "stop", "status", "logs",
    "drop-caches", "fp4-probe", "mem-bw-probe",
)
SAMPLER_ACTIONS = ("start", "stop")

# Processes whose presence marks kernel JIT compilation (nvcc and its stages, and the C++
# compiler that torch extensions and FlashInfer invoke).
COMPILERS = frozenset({"nvcc", "cicc", "ptxas", "cc1plus"})
ENGINE_PACKAGES = ("vllm", "sglang")
# Loader packages an engine imports only when a configuration asks for them: SGLang's
# --load-format fastsafetensors needs the fastsafetensors package, which it does not
# depend on (a node without it fails at the load).
LOADER_PACKAGES = ("fastsafetensors",)

ENGINE_RECORD = "engine.json"  # the pidfile of the launched engine, in the work dir
ENGINE_EXIT = "engine.exit.json"  # written by the supervisor when the engine exits
# Each launch writes its own log: the previous launch's file is kept beside it as
# LOG.1, LOG.2, ... (oldest first), at most this many.
LOG_ARCHIVE_KEEP = 20
DEFAULT_GRACE_S = 20.0  # SIGTERM to SIGKILL; below the platform's 60 s call timeout
SAMPLER_STOP_WAIT_S = 5.0
DEFAULT_LOG_MAX = 1 << 20
NVIDIA_SMI_TIMEOUT_S = 10.0
IP_COMMAND_TIMEOUT_S = 10.0
SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's size

# The node's own settings, written by its operator (README.md, "Engine user"); the
# platform cannot change them. LAB_AGENT_CONFIG points elsewhere (tests).
NODE_CONFIG = os.environ.get("LAB_AGENT_CONFIG") or "/etc/gb10-diag/agent.json"
NODE_CONFIG_DEFAULTS: dict[str, Any] = {
    "engine_user": "diag",  # who runs the engine when the agent is root
    "engine_path": "/usr/local/bin:/usr/bin:/bin",  # the engine's PATH, whatever the agent's
    "engine_env": {},  # the operator's own additions (HF_HOME, CUDA_HOME, ...)
    # The node's cache volume (the inventory's cache_dir): the one place a path in a launch
    # spec's env (the JIT cache directories) may point.
    "cache_dir": "/var/cache/diag",
    # The lab's models directory (the catalog's models_dir): the one place a path in a
    # launch spec's argv (the model, its draft, a tokenizer or chat template) may point.
    "models_dir": "/models",
}
# The folder of the cache volume that belongs to one launch: the lab places an ephemeral
# JIT cache there (serving.jit_cache: ephemeral), and `launch` empties it first, so every
# start compiles its kernels again, as a container without a kept volume does.
PER_LAUNCH_CACHE = "per-launch"
# Engines run offline: a model or draft named by id resolves only to the copy the lab
# placed in its cache, never to a download (the operator's engine_env may say otherwise).
ENGINE_ENV_FIXED = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# What the engine keeps of the agent's own environment: locale and time zone only.
AGENT_ENV_KEPT = ("LANG", "LANGUAGE", "TZ")
AGENT_ENV_KEPT_PREFIXES = ("LC_",)
# The environment a launch spec may give the engine: lab/env_policy.yaml compiled, per
# engine and version, with the release tables (lab.env_policy.compiled_policy). The
# platform writes it into the next line when it pushes the agent (lab.agent_push.agent_source),
# so the checksum the platform verifies after the push covers the policy as well; an
# agent.py copied by other means holds none and launches no spec that sets a variable.
ENV_POLICY_JSON = ""
ENV_POLICY_SCHEMA = "lab.env-policy/1"
# The flags a launch spec's argv may carry: each modelled release's reviewed list
# (lab/engines/releases/<engine>-<version>.flags.yaml, compiled by lab.flag_policy), written
# into the next line at the push like the environment policy. An agent.py without it
# launches nothing.
FLAG_POLICY_JSON = ""
FLAG_POLICY_SCHEMA = "lab.flag-policy/1"
MAX_FLAG_VALUE_CHARS = 4096
MAX_JSON_VALUE_CHARS = 16384
MAX_ARGV_TOKENS = 512
MAX_ENV_VALUE_CHARS = 4096
MAX_ENV_ITEMS = 64  # names in one interface or choice list
# drop-caches without root: the one command the sudoers rule allows (README.md).
SUDO = os.environ.get("LAB_AGENT_SUDO") or "/usr/bin/sudo"
DROP_CACHES_SUDO = ("-n", "/usr/bin/tee", "/proc/sys/vm/drop_caches")
SUDO_TIMEOUT_S = 30.0

FP4_BACKENDS = ("reference", "cutlass", "flashinfer_cutlass")
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E4M3_MAX = 448.0
NVFP4_BLOCK = 16
FP4_PROBE_GLOBAL_SCALE = 2.0 ** -10  # a power of two keeps every probe input exact in bf16
# mem-bw-probe: a buffer far larger than any cache (GB10's L2 is 24 MiB), read whole by a
# reduction that writes one number, so the timed traffic is the read.
MEM_BW_DEFAULT_MIB = 2048
MEM_BW_DEFAULT_REPEATS = 5
MEM_BW_MAX_REPEATS = 100
MEM_BW_WARMUP = 2
MEM_BW_METHOD = ("torch.sum over a {size_mib} MiB float32 buffer on the GPU (a read-dominated "
                 "streaming reduction), each repeat timed with CUDA events after "
                 f"{MEM_BW_WARMUP} untimed warm-up passes")


class AgentError(Exception):
    """A failure reported in the envelope: `code` for programs, `message` for people."""

    def __init__(self, code: str, message: str, exit_status: int = 1) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_status = exit_status


def usage_error(message: str) -> AgentError:
    return AgentError("usage", message, exit_status=2)


# -- /proc and /sys readers ---------------------------------------------------------------

# Where the agent reads /proc and /sys. A node never sets these; tests point them at a
# fake tree to check the readers against a machine they describe (a GB10 with RDMA NICs).
PROC_ROOT = os.environ.get("LAB_AGENT_PROC_ROOT") or "/proc"
SYS_ROOT = os.environ.get("LAB_AGENT_SYS_ROOT") or "/sys"


def proc_file(rel: str) -> str:
    return f"{PROC_ROOT.rstrip('/')}/{rel}"


def sys_file(rel: str) -> str:
    return f"{SYS_ROOT.rstrip('/')}/{rel}"


def list_dir(path: str) -> list[str]:
    """The sorted entries of a folder, or none when it is missing or unreadable."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def read_text(path: str) -> str | None:
    """The file's text, or None when it does not exist or cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def read_int(path: str) -> int | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def meminfo() -> dict[str, int]:
    """/proc/meminfo in KiB (the kernel's "kB")."""
    values: dict[str, int] = {}
    for line in (read_text(proc_file("meminfo")) or "").splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[name.strip()] = int(parts[0])
    return values


class ProcStat:
    """The fields of /proc/PID/stat the agent needs to tell its own processes apart."""

    def __init__(self, state: str, pgrp: int, starttime: int) -> None:
        self.state = state
        self.pgrp = pgrp
        self.starttime = starttime  # clock ticks after boot: with the pid, a unique identity

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")  # a zombie has finished, whoever reaps it


def proc_stat(pid: int) -> ProcStat | None:
    text = read_text(proc_file(f"{pid}/stat"))
    if text is None:
        return None
    # The command name is in parentheses and may itself contain spaces or ')'.
    fields = text[text.rfind(")") + 2:].split()
    try:
        return ProcStat(fields[0], int(fields[2]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def is_running(pid: int, starttime: int | None) -> bool:
    st = proc_stat(pid)
    return st is not None and st.alive and (starttime is None or st.starttime == starttime)


def boot_id() -> str | None:
    text = read_text(proc_file("sys/kernel/random/boot_id"))
    return text.strip() if text else None


def process_ids() -> list[int]:
    try:
        return [int(name) for name in os.listdir(PROC_ROOT) if name.isdigit()]
    except OSError:
        return []


def group_members(pgid: int, not_before: int) -> list[int]:
    """Live processes of a process group that started no earlier than its leader did
    (so a group id reused after the leader's death is not mistaken for ours)."""
    members = []
    for pid in process_ids():
        st = proc_stat(pid)
        if st is not None and st.pgrp == pgid and st.alive and st.starttime >= not_before:
            members.append(pid)
    return sorted(members)


def write_json_atomic(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def read_json(path: str) -> dict[str, Any] | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


# -- self-check and facts -----------------------------------------------------------------

def agent_file() -> str:
    return os.path.realpath(__file__)


def self_check(args: argparse.Namespace) -> dict[str, Any]:
    with open(agent_file(), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return {"version": AGENT_VERSION, "sha256": digest, "python": platform.python_version()}


def nvidia_smi(query: str, *extra: str) -> list[list[str]] | None:
    """Rows of an nvidia-smi CSV query, or None when there is no working nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run(
            [exe, f"--query-gpu={query}", *extra], capture_output=True, text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    lines = [line for line in res.stdout.splitlines() if line.strip()]
    return [[cell.strip() for cell in row] for row in csv.reader(lines, skipinitialspace=True)]


def not_available(cell: str) -> bool:
    return cell == "" or "N/A" in cell or cell.startswith("[")


def parse_mib(cell: str) -> int | None:
    """'122880 MiB' -> 122880; '[N/A]' (GB10: unified memory has no figure) -> None."""
    if not_available(cell):
        return None
    try:
        return int(float(cell.split()[0]))
    except (ValueError, IndexError):
        return None


def gpus() -> list[dict[str, Any]]:
    rows = nvidia_smi("name,compute_cap,driver_version,memory.total", "--format=csv,noheader")
    found = []
    for row in rows or []:
        if len(row) < 4:
            continue
        found.append({
            "name": row[0],
            "compute_capability": None if not_available(row[1]) else row[1],
            "driver": None if not_available(row[2]) else row[2],
            "memory_total_mib": parse_mib(row[3]),
        })
    return found


RTF_UP = 0x1  # /proc/net/route's flag of a usable route


def ipv4_number(hex_word: str) -> int:
    """An address or mask from /proc/net/route: the kernel prints the network-order bytes
    as one native-endian word, so they are turned back into bytes first."""
    return int.from_bytes(struct.pack("=I", int(hex_word, 16)), "big")


def dotted(number: int) -> str:
    return socket.inet_ntoa(number.to_bytes(4, "big"))


def ipv4_routes() -> list[tuple[str, int, int]]:
    """(interface, destination, mask) of every usable route in the main table."""
    routes = []
    for line in (read_text(proc_file("net/route")) or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            flags = int(fields[3], 16)
            dest, mask = ipv4_number(fields[1]), ipv4_number(fields[7])
        except (ValueError, struct.error):
            continue
        if flags & RTF_UP:
            routes.append((fields[0], dest, mask))
    return routes


def local_ipv4_from_fib_trie() -> list[str]:
    """The host's own addresses: the leaves /proc/net/fib_trie marks `/32 host LOCAL`."""
    found: list[str] = []
    leaf = None
    for line in (read_text(proc_file("net/fib_trie")) or "").splitlines():
        text = line.strip()
        if text.startswith("|-- "):
            leaf = text[4:]
        elif text.startswith("/32 host LOCAL") and leaf is not None and leaf not in found:
            found.append(leaf)
    return found


def ipv4_from_proc(routes: list[tuple[str, int, int]]) -> dict[str, list[str]]:
    """Each local address on the interface whose connected route holds it (the longest
    such prefix); fib_trie names no interfaces, the routes do. Loopback is left out."""
    by_nic: dict[str, list[str]] = {}
    for address in local_ipv4_from_fib_trie():
        try:
            number = int.from_bytes(socket.inet_aton(address), "big")
        except OSError:
            continue
        if number >> 24 == 127:
            continue
        holding = [(mask, nic) for nic, dest, mask in routes if mask and number & mask == dest]
        if holding:
            mask, nic = max(holding)
            by_nic.setdefault(nic, []).append(f"{address}/{bin(mask).count('1')}")
    return by_nic


def ipv4_from_ip_command() -> dict[str, list[str]] | None:
    """`ip -j -4 addr`: exact even when two interfaces share a subnet. None when there is
    no `ip`, or one too old for JSON."""
    exe = shutil.which("ip")
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, "-j", "-4", "addr", "show"], capture_output=True, text=True,
                             timeout=IP_COMMAND_TIMEOUT_S, check=False)
        links = json.loads(res.stdout) if res.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if not isinstance(links, list):
        return None
    by_nic: dict[str, list[str]] = {}
    for link in links:
        if not isinstance(link, dict) or not isinstance(link.get("ifname"), str):
            continue
        for info in link.get("addr_info") or []:
            if isinstance(info, dict) and info.get("family") == "inet" and "local" in info:
                by_nic.setdefault(link["ifname"], []).append(f"{info['local']}/{info.get('prefixlen', 32)}")
    return by_nic


def ipv4_addresses(routes: list[tuple[str, int, int]]) -> dict[str, list[str]]:
    # `ip` asks the kernel, not the /proc tree, so it is used only on the real /proc.
    if PROC_ROOT == "/proc":
        found = ipv4_from_ip_command()
        if found is not None:
            return found
    return ipv4_from_proc(routes)


def nics() -> list[dict[str, Any]]:
    names = [n for n in list_dir(sys_file("class/net")) if n != "lo"]
    if not names:
        return []
    routes = ipv4_routes()
    addresses = ipv4_addresses(routes)
    default_via = {nic for nic, dest, mask in routes if dest == 0 and mask == 0}
    found = []
    for name in names:
        base = sys_file(f"class/net/{name}")
        speed = read_int(f"{base}/speed")  # EINVAL when the link is down or virtual
        found.append({
            "name": name,
            "speed_mbps": speed if speed is not None and speed > 0 else None,
            "mtu": read_int(f"{base}/mtu"),
            "operstate": (read_text(f"{base}/operstate") or "unknown").strip() or "unknown",
            "ipv4": addresses.get(name, []),
            "default_route": name in default_via,
        })
    return found


RDMA_PORT_STATES = ("NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")


def rdma_devices() -> list[dict[str, Any]]:
    """Every RDMA device with its net device and port states: the names NCCL_IB_HCA takes."""
    found = []
    for name in list_dir(sys_file("class/infiniband")):
        base = sys_file(f"class/infiniband/{name}")
        net = list_dir(f"{base}/device/net")
        ports = []
        for port in sorted(int(p) for p in list_dir(f"{base}/ports") if p.isdigit()):
            # The kernel writes the state as "4: ACTIVE"; the name is what people read.
            raw = (read_text(f"{base}/ports/{port}/state") or "").strip()
            state = raw.partition(":")[2].strip() if ":" in raw else raw
            ports.append({"port": port, "state": state if state in RDMA_PORT_STATES else "unknown"})
        found.append({"name": name, "net_device": net[0] if net else None, "ports": ports})
    return found


def _mount_field(text: str) -> str:
    """A /proc/mounts field with the kernel's octal escapes (\\040 for a space) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def fs_type(path: str, mounts: str | None = None) -> str | None:
    """The type of the filesystem serving `path`: the /proc/mounts entry whose mount point
    is the longest prefix of the resolved path, the rule the kernel uses and the one vLLM's
    loader reads to decide whether to prefetch (NFS and Lustre are network filesystems)."""
    if mounts is None:
        mounts = read_text("/proc/mounts")
    if mounts is None:
        return None
    resolved = os.path.realpath(path)
    best, found = "", None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = _mount_field(parts[1])
        if (resolved == point or resolved.startswith(os.path.join(point, ""))) and len(point) > len(best):
            best, found = point, parts[2]
    return found


def model_dir_facts(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        return {"path": path, "exists": False, "free_bytes": None, "fs_type": None}
    st = os.statvfs(path)
    return {"path": path, "exists": True, "free_bytes": st.f_bavail * st.f_frsize,
            "fs_type": fs_type(path)}


def engine_versions(packages: tuple[str, ...] = ENGINE_PACKAGES) -> dict[str, str | None]:
    # Only the interpreter running the agent is searched: an engine installed in another
    # virtualenv or a container is invisible here (point the inventory's python at it).
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def facts(args: argparse.Namespace) -> dict[str, Any]:
    mem = meminfo()
    uname = os.uname()
    return {
        "host": socket.gethostname(),
        "time": time.time(),
        "kernel": uname.release,
        "arch": uname.machine,
        "cpu_count": os.cpu_count() or 0,
        "mem_total_kib": mem.get("MemTotal", 0),
        "mem_available_kib": mem.get("MemAvailable", 0),
        "gpus": gpus(),
        "nics": nics(),
        "rdma": rdma_devices(),
        "model_dir": model_dir_facts(args.model_dir),
        "engines": engine_versions(),
        "loaders": engine_versions(LOADER_PACKAGES),
        "python": platform.python_version(),
        "engine_user": engine_user_facts(),
    }


# -- detached processes -------------------------------------------------------------------

class ReadyPipe:
    """The channel a detached child uses to tell the agent it started (or why not)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.open = True

    def send(self, message: dict[str, Any]) -> None:
        if not self.open:
            return
        self.open = False
        try:
            os.write(self.fd, json.dumps(message).encode())
        finally:
            os.close(self.fd)


def detach(body: Callable[[ReadyPipe], None]) -> dict[str, Any]:
    """Run `body` in a child in its own session, with stdio on /dev/null, and return the
    message it sends once started. The child outlives the agent.

    stdio must not be inherited: an SSH command ends only when every holder of its
    stdout has closed it, so a daemon keeping it would hang the platform's call.
    """
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        status = 1
        ready = ReadyPipe(write_fd)
        try:
            os.close(read_fd)
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            if null > 2:
                os.close(null)
            body(ready)
            status = 0
        except BaseException as exc:
            why = exc.message if isinstance(exc, AgentError) else f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(OSError):
                ready.send({"error": why})
        finally:
            os._exit(status)
    os.close(write_fd)
    chunks = []
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    try:
        message = json.loads(b"".join(chunks).decode())
    except ValueError:
        message = {"error": "the detached process exited before reporting that it started"}
    if "error" in message:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it now if it is already gone
    return message if isinstance(message, dict) else {"error": repr(message)}


def terminate_group(pgid: int, not_before: int, grace_s: float) -> tuple[list[int], list[int]]:
    """SIGTERM a process group, SIGKILL what is left after `grace_s`.
    Returns (the members found, the members still alive at the end)."""
    members = group_members(pgid, not_before)
    if not members:
        return [], []
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, SAMPLER_STOP_WAIT_S)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return members, []
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not group_members(pgid, not_before):
                return members, []
            time.sleep(0.05)
    return members, group_members(pgid, not_before)


# -- sampler and telemetry ------------------------------------------------------------------

def whole_disks() -> set[str]:
    """Block devices that are whole physical disks: /sys/block (no partitions) minus
    virtual devices (loop, ram, zram, device-mapper, md), whose reads would count the
    same bytes twice."""
    try:
        names = os.listdir(sys_file("block"))
    except OSError:
        return set()
    return {n for n in names if "/virtual/" not in os.path.realpath(sys_file(f"block/{n}"))}


def disk_sectors_read() -> int:
    disks = whole_disks()
    total = 0
    for line in (read_text(proc_file("diskstats")) or "").splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[2] in disks:
            total += int(fields[5])
    return total


def net_bytes() -> dict[str, tuple[int, int]]:
    counters: dict[str, tuple[int, int]] = {}
    for line in (read_text(proc_file("net/dev")) or "").splitlines()[2:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        name = name.strip()
        if name == "lo" or len(fields) < 9:
            continue
        counters[name] = (int(fields[0]), int(fields[8]))
    return counters


def cpu_ticks() -> list[int]:
    """Aggregate jiffies: user nice system idle iowait irq softirq steal."""
    for line in (read_text(proc_file("stat")) or "").splitlines():
        if line.startswith("cpu "):
            ticks = [int(x) for x in line.split()[1:9]]
            return ticks + [0] * (8 - len(ticks))
    return [0] * 8


def compiler_processes() -> int:
    count = 0
    for pid in process_ids():
        comm = read_text(proc_file(f"{pid}/comm"))
        if comm is not None and comm.strip() in COMPILERS:
            count += 1
    return count


def gpu_utilisation() -> float | None:
    rows = nvidia_smi("utilization.gpu", "--format=csv,noheader,nounits")
    values = []
    for row in rows or []:
        try:
            values.append(float(row[0]))
        except (ValueError, IndexError):
            continue
    return round(sum(values) / len(values), 1) if values else None


class Snapshot:
    """Cumulative counters at one instant; a sample is the difference of two."""

    def __init__(self) -> None:
        self.t = time.time()
        self.mono = time.monotonic()
        self.cpu = cpu_ticks()
        self.mem = meminfo()
        self.sectors = disk_sectors_read()
        self.net = net_bytes()
        self.compilers = compiler_processes()
        self.gpu_util = gpu_utilisation()


def sample(prev: Snapshot, cur: Snapshot) -> dict[str, Any]:
    dt = max(cur.mono - prev.mono, 1e-6)
    # Counters can step back (iowait does on some kernels; a NIC reset zeroes its own):
    # a negative delta is read as no activity.
    d = [max(0, cur.cpu[i] - prev.cpu[i]) for i in range(len(cur.cpu))]
    total = sum(d)
    if total:
        cpu = {
            "user": round(100.0 * (d[0] + d[1]) / total, 2),  # nice is user work too
            "system": round(100.0 * (d[2] + d[5] + d[6]) / total, 2),  # with irq, softirq
            "iowait": round(100.0 * d[4] / total, 2),
            "idle": round(100.0 * d[3] / total, 2),
        }
    else:
        cpu = {"user": 0.0, "system": 0.0, "iowait": 0.0, "idle": 100.0}
    net = {}
    for name, (rx, tx) in sorted(cur.net.items()):
        if name in prev.net:
            prx, ptx = prev.net[name]
            net[name] = {
                "rx_mbps": round(max(0, rx - prx) * 8 / 1e6 / dt, 3),
                "tx_mbps": round(max(0, tx - ptx) * 8 / 1e6 / dt, 3),
            }
    mem = cur.mem
    return {
        "t": round(cur.t, 3),
        "cpu": cpu,
        "mem": {
            "available_kib": mem.get("MemAvailable", 0),
            "cached_kib": mem.get("Cached", 0),
            "swap_used_kib": max(0, mem.get("SwapTotal", 0) - mem.get("SwapFree", 0)),
        },
        "disk_read_mbps": round(max(0, cur.sectors - prev.sectors) * SECTOR_BYTES / 1e6 / dt, 3),
        "net": net,
        "compilers": cur.compilers,
        "gpu_util": cur.gpu_util,
    }


class SamplerStopped(Exception):
    pass


def raise_stopped(signum: int, frame: object) -> NoReturn:
    raise SamplerStopped


def run_sampler(out_fd: int, interval: float) -> None:
    prev = Snapshot()
    due = prev.mono
    while True:
        due += interval
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            due = time.monotonic()  # fell behind (a slow nvidia-smi): skip, don't burst
        cur = Snapshot()
        # One write(2) on an O_APPEND descriptor: a reader never sees half a line from a
        # sample that was interrupted, and concurrent readers see whole lines or none.
        os.write(out_fd, (json.dumps(sample(prev, cur), separators=(",", ":")) + "\n").encode())
        prev = cur


def sampler_pidfile(out: str) -> str:
    return f"{out}.pid"


def running_sampler(out: str) -> dict[str, Any] | None:
    record = read_json(sampler_pidfile(out))
    if record is None or record.get("boot_id") != boot_id():
        return None
    pid = record.get("pid")
    if not isinstance(pid, int) or not is_running(pid, record.get("starttime")):
        return None
    return record


def sampler_start(args: argparse.Namespace) -> dict[str, Any]:
    out = os.path.abspath(args.out)
    existing = running_sampler(out)
    if existing is not None:
        # One sampler per file; a second start keeps the first (and its interval).
        return {"pid": existing["pid"], "out": out}
    try:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        out_fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        raise AgentError("io_error",
                         f"sampler start: cannot open --out {out!r}: {exc.strerror}") from exc
    interval = args.interval
    pidfile = sampler_pidfile(out)

    def body(ready: ReadyPipe) -> None:
        signal.signal(signal.SIGTERM, raise_stopped)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        me = os.getpid()
        st = proc_stat(me)
        write_json_atomic(pidfile, {
            "pid": me, "starttime": st.starttime if st else None, "boot_id": boot_id(),
            "out": out, "interval": interval, "started": time.time(),
        })
        ready.send({"pid": me})
        try:
            run_sampler(out_fd, interval)
        except SamplerStopped:
            pass
        finally:
            record = read_json(pidfile)
            if record is not None and record.get("pid") == me:
                os.unlink(pidfile)

    message = detach(body)
    os.close(out_fd)
    if "error" in message:
        raise AgentError("io_error", f"sampler start: {message['error']}")
    return {"pid": message["pid"], "out": out}


def sampler_stop(args: argparse.Namespace) -> dict[str, Any]:
    out = os.path.abspath(args.out)
    record = running_sampler(out)
    if record is None:
        return {"stopped": False}
    pid, starttime = record["pid"], record.get("starttime")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + SAMPLER_STOP_WAIT_S
        while time.monotonic() < deadline and is_running(pid, starttime):
            time.sleep(0.05)
        if not is_running(pid, starttime):
            break
    if is_running(pid, starttime):
        raise AgentError("stop_failed", f"sampler stop: process {pid} survived SIGKILL")
    with contextlib.suppress(FileNotFoundError):  # the sampler removes it on SIGTERM
        os.unlink(sampler_pidfile(out))
    return {"stopped": True}


def telemetry(args: argparse.Namespace) -> dict[str, Any]:
    out = os.path.abspath(args.out)
    samples = []
    try:
        with open(out, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        data = b""
    except OSError as exc:
        raise AgentError("io_error",
                         f"telemetry: cannot read --out {out!r}: {exc.strerror}") from exc
    for line in data.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue  # a torn last line from a sampler killed mid-write
        t = obj.get("t") if isinstance(obj, dict) else None
        if isinstance(t, (int, float)) and t > args.since:
            samples.append(obj)
    return {"samples": samples, "running": running_sampler(out) is not None}


# -- the engine ---------------------------------------------------------------------------

def work_dir(args: argparse.Namespace) -> str:
    return os.path.abspath(args.work_dir or os.path.dirname(agent_file()))


# -- the environment policy --------------------------------------------------------------
# One implementation of the value rules, used here and by the platform (lab.env_policy
# imports these functions), so that intake and the node cannot disagree about a value.

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# A NIC (IFNAMSIZ: 15 characters) or RDMA device name, as NCCL, gloo and /sys name them.
_DEVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_DEVICE_PORT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}(:[0-9]{1,3})?\Z")
_INT = re.compile(r"[-+]?[0-9]{1,19}\Z")
_FLOAT = re.compile(r"[-+]?([0-9]{1,19}(\.[0-9]{0,19})?|\.[0-9]{1,19})([eE][-+]?[0-9]{1,3})?\Z")
# C0 and C1 controls, DEL, lone surrogates and the line/paragraph separators (lab.config's
# CONTROL_CATEGORIES): a value holding one would split or hide part of a log line or env.
_ENV_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def env_policy() -> dict[str, Any] | None:
    """The policy the platform wrote into this file when it pushed it (None in a copy that
    was not pushed)."""
    if not ENV_POLICY_JSON:
        return None
    policy = json.loads(ENV_POLICY_JSON)
    if not isinstance(policy, dict) or policy.get("schema") != ENV_POLICY_SCHEMA:
        raise AgentError("invalid_spec", f"the environment policy in agent.py is not {ENV_POLICY_SCHEMA}")
    return policy


def permitted_env(policy: dict[str, Any], engine: Any, version: Any) -> dict[str, Any] | None:
    """Every variable a launch of `engine` `version` may set -> its rule: the libraries'
    (common), the platform's own (the JIT cache directories) and those of the engine's
    list that this version reads. None when the policy does not know the version."""
    versions = policy.get("engines", {}).get(engine) if isinstance(engine, str) else None
    if not isinstance(versions, dict) or not isinstance(version, str) or version not in versions:
        return None
    return {**policy["common"], **policy["platform"], **versions[version]}


def env_engine_label(policy: dict[str, Any] | None, engine: str, version: str) -> str:
    """"vLLM 0.34.0": how a message names an engine version."""
    labels = (policy or {}).get("labels") or {}
    return f"{labels.get(engine, engine)} {version}"


def env_rule_text(rule: dict[str, Any], cache_dir: str | None = None) -> str:
    """What a value of `rule` must be, in words: "takes a whole number from 1 to 64"."""
    kind = rule.get("rule")
    if kind == "interface":
        port = ", each optionally with :PORT" if rule.get("ports") else ""
        return ("takes interface names (letters, digits, '.', '_' and '-'" + port + "), "
                "comma-separated, optionally led by ^ (all but) or = (exactly)")
    if kind == "number":
        what = "a whole number" if rule.get("type") == "int" else "a number"
        return f"takes {what} from {rule.get('min')} to {rule.get('max')}"
    if kind == "choice":
        choices = ", ".join(str(c) for c in rule.get("choices") or [])
        if rule.get("list"):
            lead = ", optionally led by ^ (all but)" if rule.get("negatable") else ""
            return f"takes a comma-separated list of {choices}{lead}"
        return f"takes one of {choices}"
    if kind == "bool":
        return "takes 0 or 1"
    if kind == "path-in-cache":
        where = f" ({cache_dir})" if cache_dir else ""
        return f"takes an absolute path inside the node's cache volume{where}, without '..'"
    if kind == "secret":
        return "takes one line of printable text"
    if kind == "address":
        return "takes an IP address"
    return f"has a rule this agent does not know ({kind!r}); it is refused"


def _number_ok(value: str, rule: dict[str, Any]) -> bool:
    if not (_INT if rule.get("type") == "int" else _FLOAT).match(value):
        return False
    number = int(value) if rule.get("type") == "int" else float(value)
    low, high = rule.get("min"), rule.get("max")
    return (low is None or number >= low) and (high is None or number <= high)


def _items(value: str, lead: str) -> list[str] | None:
    """A comma list's items after an optional leading character of `lead`; None when an
    item is empty or there are too many."""
    if value[:1] and value[:1] in lead:
        value = value[1:]
    items = value.split(",")
    if len(items) > MAX_ENV_ITEMS or not all(items):
        return None
    return items


def _in_cache(value: str, cache_dir: str | None) -> bool:
    if not value.startswith("/") or ".." in value.split("/") or os.path.normpath(value) != value:
        return False
    if cache_dir is None:
        return True
    root = os.path.normpath(cache_dir)
    return value == root or value.startswith(root.rstrip("/") + "/")


def env_value_problem(value: str, rule: dict[str, Any], cache_dir: str | None = None) -> str | None:
    """Why `value` breaks `rule` (the rule in words, env_rule_text), None when it meets it.
    A path is checked as written here; the agent also resolves it on the node."""
    if not isinstance(value, str) or len(value) > MAX_ENV_VALUE_CHARS or _ENV_CONTROL.search(value):
        return env_rule_text(rule, cache_dir) + f" (at most {MAX_ENV_VALUE_CHARS} characters, " \
            "no control characters)"
    kind = rule.get("rule")
    ok = False
    if kind == "interface":
        items = _items(value, "^=")
        pattern = _DEVICE_PORT if rule.get("ports") else _DEVICE
        ok = items is not None and all(pattern.match(i) for i in items)
    elif kind == "number":
        ok = _number_ok(value, rule)
    elif kind == "choice":
        choices = [str(c) for c in rule.get("choices") or []]
        if rule.get("list"):
            items = _items(value, "^" if rule.get("negatable") else "")
            ok = items is not None and all(i in choices for i in items)
        else:
            ok = value in choices
    elif kind == "bool":
        ok = value in ("0", "1")
    elif kind == "path-in-cache":
        ok = _in_cache(value, cache_dir)
    elif kind == "secret":
        ok = True  # any one line (an empty key turns authentication off)
    elif kind == "address":
        try:
            ipaddress.ip_address(value)
            ok = True
        except ValueError:
            ok = False
    return None if ok else env_rule_text(rule, cache_dir)


def spec_env_problem(env: dict[str, str], engine: Any, version: Any, cache_dir: str | None,
                     policy: dict[str, Any] | None) -> tuple[str, str] | None:
    """(field, why) for the first thing wrong with a launch spec's env under `policy`: a
    variable it does not permit for `engine` `version` (the message lists those it does),
    or a value breaking its rule (secrets are never quoted). None when the env passes."""
    if not env:
        return None
    if policy is None:
        return ("env", "this agent.py holds no environment policy (the platform writes it in "
                       "when it pushes the agent); push the agent from the platform")
    allowed = permitted_env(policy, engine, version)
    if allowed is None:
        known = ", ".join(f"{e} {v}" for e, vs in sorted(policy.get("engines", {}).items())
                          for v in sorted(vs))
        return ("version", f"{engine!r} {version!r} is not an engine version the environment "
                           f"policy knows, so no variable may be set; known: {known}")
    label = env_engine_label(policy, engine, version)
    for name in sorted(env):
        rule = allowed.get(name)
        if rule is None:
            return (f"env.{name}", f"is not a variable the lab permits for {label}; "
                                   f"permitted: {', '.join(sorted(allowed))}")
        problem = env_value_problem(env[name], rule, cache_dir)
        if problem is not None:
            shown = "the value" if rule.get("rule") == "secret" else repr(env[name][:200])
            return (f"env.{name}", f"{shown} is not accepted; {name} {problem}")
    return None


def resolved_outside(env: dict[str, str], allowed: dict[str, Any], cache_dir: str) -> str | None:
    """A path-in-cache variable whose path, resolved on this node (symbolic links
    followed), leaves the cache volume: None when there is none. A path in the per-launch
    folder is not resolved through what is there now: `launch` replaces the folder with an
    empty one of its own before the engine starts (fresh_launch_cache)."""
    root = os.path.realpath(cache_dir)
    for name in sorted(env):
        if uses_launch_cache({name: env[name]}, cache_dir):
            continue
        if (allowed.get(name) or {}).get("rule") == "path-in-cache":
            real = os.path.realpath(env[name])
            if real != root and not real.startswith(root.rstrip("/") + "/"):
                return name
    return None


# -- the flag policy ---------------------------------------------------------------------
# One implementation of the flag rules and of reading an argv by them, used here and by the
# platform (lab.flag_policy imports these functions): intake, rendering, the simulated
# nodes and this agent cannot disagree about a flag or a value.

FLAG_RULES = ("switch", "number", "choice", "identifier", "name", "models-path", "secret",
              "address", "host-port", "json")
# Inside a JSON value (rule json's `keys`), besides the rules above that take one value.
JSON_KEY_RULES = ("number", "choice", "identifier", "name", "models-path", "bool", "ints")
# A backend, parser or policy name as the engines spell them (flashinfer_cutlass, gpt-oss).
_IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
# A served model name: a hub id or a path-like label (moonshotai/Kimi-K2-Instruct-0905).
_NAME = re.compile(r"[A-Za-z0-9/][A-Za-z0-9_.:/@+-]{0,255}\Z")
# A host name (underscores too: the tuned command names the head HEAD_NODE_DATA_ADDRESS).
_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\Z")
_PYTHON = re.compile(r"python3(\.[0-9]{1,2})?\Z")


def flag_policy() -> dict[str, Any] | None:
    """The flag lists the platform wrote into this file when it pushed it (None in a copy
    that was not pushed)."""
    if not FLAG_POLICY_JSON:
        return None
    policy = json.loads(FLAG_POLICY_JSON)
    if not isinstance(policy, dict) or policy.get("schema") != FLAG_POLICY_SCHEMA:
        raise AgentError("invalid_spec", f"the flag policy in agent.py is not {FLAG_POLICY_SCHEMA}")
    return policy


def release_flags(policy: dict[str, Any] | None, engine: Any, version: Any) -> dict[str, Any] | None:
    """The list of `engine` `version` ({entry, positionals, flags, list, label}), None when
    the policy does not know the version."""
    versions = (policy or {}).get("releases", {}).get(engine) if isinstance(engine, str) else None
    if not isinstance(versions, dict) or not isinstance(version, str):
        return None
    found = versions.get(version)
    return found if isinstance(found, dict) else None


def _under(path: str, root: str) -> bool:
    root = os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def _clean_absolute(value: str) -> bool:
    return value.startswith("/") and ".." not in value.split("/") and os.path.normpath(value) == value


def flag_rule_text(rule: dict[str, Any], models_dir: str | None = None) -> str:
    """What a value of `rule` must be, in words: "takes a whole number from 1 to 4096"."""
    kind = rule.get("rule")
    words = [str(w) for w in rule.get("words") or []]
    also = f", or {' or '.join(words)}" if words else ""
    if kind == "switch":
        return "takes no value"
    if kind in ("number", "choice", "secret"):
        return env_rule_text(rule) + also
    if kind == "identifier":
        return "takes a name of letters, digits, '_', '.' and '-' (at most 64)" + also
    if kind == "name":
        return "takes a name of letters, digits and _ . : / @ + - (at most 256)" + also
    if kind == "models-path":
        where = f" ({models_dir})" if models_dir else ""
        return f"takes an absolute path inside the lab's models directory{where}, without '..'" + also
    if kind == "address":
        return "takes an IP address or a host name"
    if kind == "host-port":
        return "takes HOST:PORT"
    if kind == "json":
        keys = ", ".join(sorted(rule.get("keys") or {}))
        return f"takes a JSON object whose keys are among {keys}" + also
    return f"has a rule this agent does not know ({kind!r}); it is refused"


def _address_ok(value: str) -> bool:
    if _HOSTNAME.match(value) and len(value) <= 253:
        return True
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _host_port_ok(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
        return False
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return _address_ok(host)


def _json_key_problem(key: str, value: Any, rule: dict[str, Any], models_dir: str | None) -> str | None:
    kind = rule.get("rule")
    ok = False
    if kind == "number":
        number_ok = isinstance(value, int) and not isinstance(value, bool)
        if rule.get("type") == "float":
            number_ok = number_ok or isinstance(value, float)
        ok = number_ok and rule.get("min", value) <= value <= rule.get("max", value)
        what = f"a number from {rule.get('min')} to {rule.get('max')}"
    elif kind == "bool":
        ok, what = isinstance(value, bool), "true or false"
    elif kind == "ints":
        ok = isinstance(value, list) and len(value) <= MAX_ENV_ITEMS and all(
            isinstance(v, int) and not isinstance(v, bool)
            and rule.get("min", v) <= v <= rule.get("max", v) for v in value)
        what = f"a list of whole numbers from {rule.get('min')} to {rule.get('max')}"
    elif isinstance(value, str):
        return flag_value_problem(value, rule, models_dir)
    else:
        what = flag_rule_text(rule, models_dir)[len("takes "):]
    return None if ok else f"takes {what}"


def _json_problem(value: str, rule: dict[str, Any], models_dir: str | None) -> str | None:
    if len(value) > MAX_JSON_VALUE_CHARS:
        return flag_rule_text(rule, models_dir) + f" (at most {MAX_JSON_VALUE_CHARS} characters)"
    try:
        data = json.loads(value)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        return flag_rule_text(rule, models_dir)
    keys = rule.get("keys") or {}
    for key in data:
        if key not in keys:
            return (f"key {key!r} is not accepted (keys that can name code, files or the "
                    f"network are not); accepted: {', '.join(sorted(keys))}")
        problem = _json_key_problem(key, data[key], keys[key], models_dir)
        if problem is not None:
            return f"key {key!r} {problem}"
    return None


def flag_value_problem(value: str, rule: dict[str, Any], models_dir: str | None = None) -> str | None:
    """Why `value` breaks the flag rule `rule` (the rule in words), None when it meets it.
    A path is checked as written here; the agent also resolves it on the node."""
    limit = MAX_JSON_VALUE_CHARS if rule.get("rule") == "json" else MAX_FLAG_VALUE_CHARS
    if not isinstance(value, str) or len(value) > limit or _ENV_CONTROL.search(value):
        return flag_rule_text(rule, models_dir) + f" (at most {limit} characters, " \
            "no control characters)"
    if value in [str(w) for w in rule.get("words") or []]:
        return None
    kind = rule.get("rule")
    ok = False
    if kind in ("number", "choice", "secret"):
        return None if env_value_problem(value, rule) is None else flag_rule_text(rule, models_dir)
    if kind == "identifier":
        ok = bool(_IDENTIFIER.match(value))
    elif kind == "name":
        ok = bool(_NAME.match(value))
    elif kind == "models-path":
        ok = _clean_absolute(value) and (models_dir is None or _under(value, models_dir))
    elif kind == "address":
        ok = _address_ok(value)
    elif kind == "host-port":
        ok = _host_port_ok(value)
    elif kind == "json":
        return _json_problem(value, rule, models_dir)
    return None if ok else flag_rule_text(rule, models_dir)


def _nargs(entry: dict[str, Any]) -> Any:
    """How many values a flag of the list takes, as its release's argparse reads it."""
    if entry.get("rule") == "switch":
        return 0
    nargs = entry.get("nargs")
    return 1 if nargs is None else nargs


def _is_value(token: str) -> bool:
    """Whether argparse would read `token` as an argument rather than an option: a negative
    number is a value, anything else led by '-' is an option."""
    return not token.startswith("-") or bool(_INT.match(token) or _FLOAT.match(token))


def _program_problem(program: str, expected: str, engine_path: str | None) -> str | None:
    base = program.rsplit("/", 1)[-1]
    named = bool(_PYTHON.match(base)) if expected == "python3" else base == expected
    if not named:
        return f"must start the engine ({expected}), got {program!r}"
    if "/" not in program:
        return None
    if not _clean_absolute(program):
        return f"{program!r} must be a bare name or an absolute path without '..'"
    if engine_path is not None and os.path.dirname(program) not in engine_path.split(":"):
        return (f"{program!r} is not on the engine PATH {engine_path} (engine_path in "
                f"{NODE_CONFIG}); name the program alone, or add its folder there")
    return None


def argv_problem(argv: list[str], engine: Any, version: Any, policy: dict[str, Any] | None,
                 models_dir: str | None = None, engine_path: str | None = None
                 ) -> tuple[str, str] | None:
    """(field, why) for the first thing wrong with a launch spec's argv under the flag
    policy, None when it passes: the engine's entry point first (its program found on the
    engine PATH), then every token an exact flag of the release's list, with the values
    that flag takes, each meeting its rule, or one of the release's positionals."""
    if policy is None:
        return ("argv", "this agent.py holds no flag policy (the platform writes it in when it "
                        "pushes the agent); push the agent from the platform")
    listed = release_flags(policy, engine, version)
    if listed is None:
        known = ", ".join(f"{e} {v}" for e, vs in sorted(policy.get("releases", {}).items())
                          for v in sorted(vs))
        return ("version", f"{engine!r} {version!r} is not an engine version the flag policy "
                           f"knows, so nothing may be launched; known: {known}")
    if len(argv) > MAX_ARGV_TOKENS:
        return ("argv", f"holds {len(argv)} tokens; at most {MAX_ARGV_TOKENS}")
    label, where = listed.get("label", f"{engine} {version}"), listed.get("list", "its list")
    entry = [str(e) for e in listed.get("entry") or []]
    if not entry:
        return ("argv", f"the flag policy names no entry point for {label}")
    problem = _program_problem(argv[0], entry[0], engine_path)
    if problem is not None:
        return ("argv[0]", problem)
    if len(argv) < len(entry):
        return ("argv", f"must start with {' '.join(entry)} (the entry point of {label})")
    for index in range(1, len(entry)):
        if argv[index] != entry[index]:
            return (f"argv[{index}]", f"must be {entry[index]!r} ({' '.join(entry)} starts "
                                      f"{label}), got {argv[index]!r}")
    flags = listed.get("flags") or {}
    positionals = list(listed.get("positionals") or [])
    index = len(entry)
    while index < len(argv):
        token = argv[index]
        field = f"argv[{index}]"
        if _is_value(token):
            if not positionals:
                return (field, f"{token[:200]!r} is not an argument {label} takes here")
            rule = positionals.pop(0)
            problem = flag_value_problem(token, rule, models_dir)
            if problem is not None:
                return (field, f"{token[:200]!r} is not accepted as {rule.get('name')}; it {problem}")
            index += 1
            continue
        name, eq, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        rule = flags.get(name)
        if rule is None:
            return (field, f"{name[:200]!r} is not a flag the lab permits for {label} (the list: "
                           f"{where})")
        nargs = _nargs(rule)
        if eq:
            if nargs == 0:
                return (field, f"{name} takes no value")
            values, index = [inline], index + 1
        else:
            index += 1
            values = []
            while index < len(argv) and _is_value(argv[index]) and (
                    nargs in ("+", "*") or (isinstance(nargs, int) and len(values) < nargs)
                    or (nargs == "?" and not values)):
                values.append(argv[index])
                index += 1
            wanted = {0: 0, "?": None, "*": None, "+": None}.get(nargs, nargs)
            if (isinstance(wanted, int) and len(values) != wanted) or (nargs == "+" and not values):
                return (field, f"{name} takes {nargs if nargs != '+' else 'one or more'} "
                               f"value{'s' if nargs != 1 else ''}")
        for value in values:
            problem = flag_value_problem(value, rule, models_dir)
            if problem is not None:
                shown = "the value" if rule.get("rule") == "secret" else repr(value[:200])
                return (field, f"{shown} is not accepted; {name} {problem}")
    return None


def paths_problem(cwd: Any, log_file: Any, base: str) -> tuple[str, str] | None:
    """(field, why) when the spec's cwd or log_file, read against the work dir `base`,
    leaves it (lexically: '..' and absolute paths elsewhere), None when both lie inside."""
    for field, value in (("cwd", cwd), ("log_file", log_file)):
        if not isinstance(value, str) or not value or "\x00" in value:
            return (field, f"must be a path inside the work dir {base}")
        full = os.path.normpath(os.path.join(base, value))
        if not _under(full, base) or (field == "log_file" and full == os.path.normpath(base)):
            return (field, f"{value!r} is outside the work dir {base}; the engine's files stay there")
    return None


def own_addresses() -> set[str]:
    """The IPv4 addresses this node's interfaces hold (loopback included)."""
    found = {"127.0.0.1"}
    for addresses in ipv4_addresses(ipv4_routes()).values():
        found.update(a.split("/")[0] for a in addresses)
    return found


def not_own_address(env: dict[str, str], allowed: dict[str, Any], own: set[str]) -> str | None:
    """An address variable (VLLM_HOST_IP) naming an address this node does not hold: None
    when there is none."""
    for name in sorted(env):
        if (allowed.get(name) or {}).get("rule") == "address" and env[name] not in own:
            return name
    return None


def node_config() -> dict[str, Any]:
    """The operator's settings (NODE_CONFIG) over the defaults; a missing file is the
    defaults, a malformed one refuses the launch rather than guess."""
    config = dict(NODE_CONFIG_DEFAULTS)
    try:
        with open(NODE_CONFIG, encoding="utf-8") as f:
            given = json.load(f)
    except FileNotFoundError:
        return config
    except (OSError, ValueError) as exc:
        raise AgentError("not_permitted", f"node config {NODE_CONFIG}: cannot read it ({exc})") from exc
    if not isinstance(given, dict):
        raise AgentError("not_permitted", f"node config {NODE_CONFIG}: must hold a JSON object")
    for key, value in given.items():
        if key not in NODE_CONFIG_DEFAULTS:
            raise AgentError("not_permitted", f"node config {NODE_CONFIG}: unknown key {key!r}; "
                             f"accepted: {', '.join(sorted(NODE_CONFIG_DEFAULTS))}")
        expected = type(NODE_CONFIG_DEFAULTS[key])
        if not isinstance(value, expected) or (key == "engine_env" and not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items())):
            raise AgentError("not_permitted", f"node config {NODE_CONFIG}: {key} must be a "
                             f"{'mapping of strings' if key == 'engine_env' else 'string'}")
        config[key] = value
    return config


class EngineUser:
    """Who the engine runs as: the service user when the agent is root, else the agent's
    own (unprivileged) user."""

    def __init__(self, entry: Any, switch: bool) -> None:
        self.name = entry.pw_name
        self.uid = entry.pw_uid
        self.gid = entry.pw_gid
        self.home = entry.pw_dir
        self.switch = switch  # setuid needed (the agent is root, the user is not)
        self.groups = os.getgrouplist(self.name, self.gid) if switch else []


def engine_user(config: dict[str, Any]) -> EngineUser:
    """Who would run an engine here: the agent's own user when it is not root, else the
    node config's engine_user. Never root: a customer's configuration runs in the engine,
    and root would own the node (not_permitted, which preflight reports for the node)."""
    if os.geteuid() != 0:
        return EngineUser(pwd.getpwuid(os.geteuid()), switch=False)
    name = config["engine_user"]
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise AgentError("not_permitted", f"launch: the agent runs as root and the engine user "
                         f"{name!r} does not exist; create it (useradd --system {name}) or set "
                         f"engine_user in {NODE_CONFIG}") from None
    if entry.pw_uid == 0:
        raise AgentError("not_permitted", root_engine_user(name, NODE_CONFIG))
    return EngineUser(entry, switch=True)


def root_engine_user(name: str, where: str) -> str:
    """The refusal of a node config whose engine user is root (the agent's and the
    simulated node's words)."""
    return (f"launch: engine_user {name!r} in {where} is root; engines run customers' "
            "configurations and never as root: name an unprivileged service user "
            "(useradd --system diag)")


def engine_user_facts(config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Who an engine would run as here, for `facts` (preflight refuses a node whose engines
    would run as root): name, uid (None when the user does not exist) and the launch's
    refusal when it would refuse (None otherwise)."""
    try:
        config = config if config is not None else node_config()
        user = engine_user(config)
    except AgentError as exc:
        name = (config or {}).get("engine_user", NODE_CONFIG_DEFAULTS["engine_user"])
        try:
            uid: int | None = pwd.getpwnam(str(name)).pw_uid
        except KeyError:
            uid = None
        return {"name": str(name), "uid": uid, "problem": exc.message}
    return {"name": user.name, "uid": user.uid, "problem": None}


def engine_environment(spec_env: dict[str, str], config: dict[str, Any],
                       user: EngineUser) -> dict[str, str]:
    """The engine's whole environment: the agent's locale, the offline switches, the
    operator's engine_env, the spec's (already allow-listed) variables, and PATH, HOME,
    USER fixed last. Nothing else of the agent's environment (LD_*, PYTHON*, proxies,
    the SSH session's variables) reaches the engine."""
    env = {k: v for k, v in os.environ.items()
           if k in AGENT_ENV_KEPT or k.startswith(AGENT_ENV_KEPT_PREFIXES)}
    env.update(ENGINE_ENV_FIXED)
    env.update(config["engine_env"])
    env.update(spec_env)
    env.update({"PATH": config["engine_path"], "HOME": user.home, "USER": user.name,
                "LOGNAME": user.name})
    return env


def uses_launch_cache(env: dict[str, str], cache_dir: str) -> bool:
    """Whether a launch's env places something in the cache volume's per-launch folder."""
    folder = os.path.normpath(os.path.join(cache_dir, PER_LAUNCH_CACHE))
    return any(os.path.normpath(v) == folder or os.path.normpath(v).startswith(folder + "/")
               for v in env.values() if v.startswith("/"))


def fresh_launch_cache(cache_dir: str, user: EngineUser) -> str:
    """Empty the cache volume's per-launch folder (PER_LAUNCH_CACHE) for the launch about to
    start, owned by the engine user: nothing an earlier launch compiled is left in it. A
    symbolic link in its place is removed, never followed."""
    path = os.path.join(cache_dir, PER_LAUNCH_CACHE)
    try:
        if os.path.islink(path) or (os.path.exists(path) and not os.path.isdir(path)):
            os.unlink(path)
        elif os.path.isdir(path):
            shutil.rmtree(path)
        os.makedirs(path, mode=0o700)
        if user.switch:
            os.chown(path, user.uid, user.gid)
    except OSError as exc:
        raise AgentError("io_error", f"launch: cannot empty the per-launch cache {path!r} "
                         f"({exc.strerror or exc}); cache_dir in {NODE_CONFIG} must be a folder "
                         "the agent may write") from exc
    return path


def resolve_program(program: str, path: str) -> str:
    """argv[0] found on the engine's PATH, not the agent's (an absolute path as given)."""
    if "/" in program:
        return program
    found = shutil.which(program, path=path)
    if found is None:
        raise AgentError("launch_failed", f"cannot start {program!r}: not found on the engine "
                         f"PATH {path} (engine_path in {NODE_CONFIG})")
    return found


def privilege_drop(user: EngineUser) -> dict[str, Any]:
    """Popen arguments that start the engine as `user` (none when no switch is needed).
    Python 3.9 has user/group/extra_groups; before, the same three calls in the child."""
    if not user.switch:
        return {}
    if sys.version_info >= (3, 9):  # noqa: UP036 - the agent also runs on 3.8
        return {"user": user.uid, "group": user.gid, "extra_groups": user.groups}

    def drop() -> None:
        os.setgroups(user.groups)
        os.setgid(user.gid)
        os.setuid(user.uid)

    return {"preexec_fn": drop}


def spec_problem(spec: Any, base: str, *, cache_dir: str | None, models_dir: str | None,
                 engine_path: str | None = None, policies: tuple[Any, Any] | None = None
                 ) -> tuple[str, str] | None:
    """(field, why) for the first thing wrong with a launch spec as data (nothing on the
    node is looked at): its schema, an argv that is the engine's entry point with only
    flags and values of the release's list (argv_problem), an env inside the environment
    policy, cwd and log_file inside the work dir `base`, an owner of names to strings.
    The node agent and the simulated nodes both hold specs to this. `policies`: the
    (environment, flag) policies, else those written into this file at the push."""
    env_rules, flag_rules = policies if policies is not None else (env_policy(), flag_policy())
    if not isinstance(spec, dict):
        return ("(spec)", "must hold a JSON object")
    if spec.get("schema") != LAUNCH_SCHEMA:
        return ("schema", f"must be {LAUNCH_SCHEMA!r}, got {spec.get('schema')!r}")
    argv = spec.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return ("argv", f"must be a non-empty list of strings, got {argv!r}"[:300])
    env = spec.get("env", {})
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return ("env", "must map variable names to string values")
    if not all(_ENV_NAME.match(k) for k in env):
        return ("env", "must map variable names (letters, digits and _) to string values")
    problem = argv_problem(argv, spec.get("engine"), spec.get("version"), flag_rules,
                           models_dir, engine_path)
    if problem is not None:
        return problem
    problem = spec_env_problem(env, spec.get("engine"), spec.get("version"), cache_dir, env_rules)
    if problem is not None:
        return problem
    problem = paths_problem(spec.get("cwd", "."), spec.get("log_file"), base)
    if problem is not None:
        return problem
    owner = spec.get("owner")
    if owner is not None and not (isinstance(owner, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in owner.items())):
        return ("owner", "must map names to strings (the platform and job that launched it)")
    return None


def _resolved_inside(path: str, base: str) -> bool:
    """Whether `path` (or, for a file not yet there, its folder) resolves inside `base`
    with symbolic links followed."""
    root = os.path.realpath(base)
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip("/") + "/")


def load_spec(path: str, base: str, config: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], str]:
    """The launch spec, checked before anything on the node is created or moved
    (spec_problem, then the paths resolved on the node: cwd, log_file and the env's cache
    paths, symbolic links followed, must stay where they were written to be), and the
    sha256 of the file's bytes exactly as read: what `status` later reports, so the
    platform can tell which configuration the engine was started from."""
    config = config if config is not None else dict(NODE_CONFIG_DEFAULTS)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        raise AgentError("not_found", f"launch: no readable spec at --spec {path!r}") from None
    digest = hashlib.sha256(raw).hexdigest()
    try:
        spec = json.loads(raw.decode("utf-8", errors="replace"))
    except ValueError as exc:
        raise AgentError("invalid_spec", f"launch: {path} is not JSON: {exc}") from exc
    if not isinstance(spec, dict):
        raise AgentError("invalid_spec", f"launch: {path} must hold a JSON object")
    problem = spec_problem(spec, base, cache_dir=config["cache_dir"],
                           models_dir=config["models_dir"], engine_path=config["engine_path"])
    if problem is not None:
        raise AgentError("invalid_spec", f"spec.{problem[0]}: {problem[1]}")
    env = spec.get("env", {})
    policy = env_policy()
    allowed = permitted_env(policy, spec.get("engine"), spec.get("version")) if policy else None
    outside = resolved_outside(env, allowed or {}, config["cache_dir"]) if env else None
    if outside is not None:
        raise AgentError("invalid_spec", f"spec.env.{outside}: {env[outside]!r} resolves (through a "
                         f"symbolic link) outside the node's cache volume {config['cache_dir']}")
    foreign = not_own_address(env, allowed or {}, own_addresses()) if env else None
    if foreign is not None:
        raise AgentError("invalid_spec", f"spec.env.{foreign}: {env[foreign]!r} is not an address "
                         "of this node; each rank names its own")
    cwd = os.path.normpath(os.path.join(base, spec.get("cwd", ".")))
    log_file = os.path.normpath(os.path.join(base, spec["log_file"]))
    if not os.path.isdir(cwd):
        raise AgentError("invalid_spec", f"spec.cwd: must be an existing directory, got {spec.get('cwd')!r}")
    for field, target in (("cwd", cwd), ("log_file", os.path.dirname(log_file))):
        probe = target
        while not os.path.exists(probe) and probe != os.path.dirname(probe):
            probe = os.path.dirname(probe)  # the deepest folder that exists decides
        if not _resolved_inside(probe, base):
            raise AgentError("invalid_spec", f"spec.{field}: {spec.get(field)!r} resolves (through "
                             f"a symbolic link) outside the work dir {base}")
    if os.path.islink(log_file):
        raise AgentError("invalid_spec", f"spec.log_file: {spec['log_file']!r} is a symbolic link")
    return {**spec, "env": env, "cwd": cwd, "log_file": log_file}, digest


def archived_logs(path: str) -> list[tuple[int, str]]:
    """The earlier launches' logs kept beside `path` (`path`.N), oldest first."""
    folder, base = os.path.split(path)
    found = []
    for name in list_dir(folder or "."):
        suffix = name[len(base) + 1:] if name.startswith(base + ".") else ""
        if suffix.isdigit():
            found.append((int(suffix), os.path.join(folder, name)))
    return sorted(found)


def rotate_log(path: str, keep: int = LOG_ARCHIVE_KEEP) -> str | None:
    """Move the previous launch's log at `path` aside (to `path`.N, N one past the newest
    kept), so that this launch's log starts empty and holds nothing of an earlier one;
    drop the oldest beyond `keep`. Returns where the old log went, None when there was none."""
    try:
        if os.path.getsize(path) == 0:
            return None
    except OSError:
        return None
    kept = archived_logs(path)
    target = f"{path}.{(kept[-1][0] + 1) if kept else 1}"
    os.replace(path, target)
    archive = [name for _, name in kept] + [target]
    for old in archive[:max(0, len(archive) - keep)]:
        with contextlib.suppress(OSError):
            os.unlink(old)
    return target


def launch_owner(spec: dict[str, Any]) -> dict[str, str] | None:
    """Who started the engine, as the launch spec says (`owner`: the platform and its job);
    None when the spec names nobody."""
    owner = spec.get("owner")
    if not isinstance(owner, dict):
        return None
    return {str(k): str(v) for k, v in owner.items() if isinstance(v, (str, int))}


def engine_record(wd: str) -> dict[str, Any] | None:
    """The launch record, if it was written since the node last booted."""
    record = read_json(os.path.join(wd, ENGINE_RECORD))
    if record is None or record.get("boot_id") != boot_id():
        return None
    return record


def engine_running(record: dict[str, Any]) -> bool:
    return is_running(record["pid"], record.get("starttime"))


def ignore_signal(signum: int, frame: object) -> None:
    # A handler rather than SIG_IGN: handlers reset to default on exec, SIG_IGN would be
    # inherited by the engine and make it deaf to stop.
    pass


def launch(args: argparse.Namespace) -> dict[str, Any]:
    wd = work_dir(args)
    if not os.path.isdir(wd):
        raise AgentError("not_found", f"launch: --work-dir {wd!r} is not a directory")
    config = node_config()
    # Every check before anything is created or moved: the spec, who would run it, and
    # its program on the engine PATH.
    spec, spec_sha256 = load_spec(args.spec, wd, config)
    user = engine_user(config)
    env = engine_environment(spec["env"], config, user)
    argv = [resolve_program(spec["argv"][0], env["PATH"]), *spec["argv"][1:]]
    current = engine_record(wd)
    if current is not None and engine_running(current):
        raise AgentError("already_running",
                         f"launch: an engine already runs here (pid {current['pid']}); "
                         "run `stop` first")
    if uses_launch_cache(spec["env"], config["cache_dir"]):
        fresh_launch_cache(config["cache_dir"], user)
    try:
        os.makedirs(os.path.dirname(spec["log_file"]), exist_ok=True)
        rotate_log(spec["log_file"])
        log_fd = os.open(spec["log_file"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise AgentError("io_error", f"spec.log_file: cannot open {spec['log_file']!r}: "
                         f"{exc.strerror}") from exc
    record_path = os.path.join(wd, ENGINE_RECORD)
    exit_path = os.path.join(wd, ENGINE_EXIT)
    drop = privilege_drop(user)

    def supervise(ready: ReadyPipe) -> None:
        # The supervisor leads the engine's process group: `stop` signals the group, and
        # the supervisor survives SIGTERM long enough to record the engine's exit code.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, ignore_signal)
        me = os.getpid()
        me_stat = proc_stat(me)
        with contextlib.suppress(OSError):
            os.unlink(exit_path)  # the previous engine's
        started = time.time()
        try:
            # A list argv and no shell: every argument reaches the engine as written.
            proc = subprocess.Popen(
                argv, env=env, cwd=spec["cwd"], stdin=subprocess.DEVNULL, stdout=log_fd,
                stderr=subprocess.STDOUT, close_fds=True, **drop,
            )
        except OSError as exc:
            raise AgentError("launch_failed", f"cannot start {argv[0]!r}: {exc.strerror or exc} "
                             "(spec.argv[0] must be an executable on the node's PATH)") from exc
        os.close(log_fd)
        st = proc_stat(proc.pid)
        boot = boot_id()
        try:
            write_json_atomic(record_path, {
                "pid": proc.pid, "starttime": st.starttime if st else None,
                "pgid": me, "group_since": me_stat.starttime if me_stat else 0,
                "boot_id": boot, "started": started, "log_file": spec["log_file"],
                "spec": os.path.abspath(args.spec), "spec_sha256": spec_sha256, "argv": argv,
                "user": user.name, "owner": launch_owner(spec),
            })
        except OSError:
            # An engine that stop and status cannot find must not keep running.
            proc.kill()
            proc.wait()
            raise
        ready.send({"pid": proc.pid, "started": started})
        code = proc.wait()
        write_json_atomic(exit_path, {"pid": proc.pid, "exit_code": code, "ended": time.time(),
                                      "boot_id": boot})

    message = detach(supervise)
    os.close(log_fd)
    if "error" in message:
        raise AgentError("launch_failed", f"launch: {message['error']}")
    return {"pid": message["pid"], "log_file": spec["log_file"], "started": message["started"]}


def stop(args: argparse.Namespace) -> dict[str, Any]:
    record = engine_record(work_dir(args))
    if record is None:
        return {"stopped": []}
    found, left = terminate_group(int(record["pgid"]), int(record.get("group_since") or 0),
                                  args.grace)
    if left:
        raise AgentError("stop_failed", f"stop: processes {left} survived SIGKILL "
                         "(uninterruptible I/O?); check them on the node")
    return {"stopped": found}


def status(args: argparse.Namespace) -> dict[str, Any]:
    wd = work_dir(args)
    record = engine_record(wd)
    if record is None:
        return {"running": False, "pid": None, "exit_code": None, "spec_sha256": None,
                "owner": None, "log_file": None}
    running = engine_running(record)
    exit_code = None
    if not running:
        ended = read_json(os.path.join(wd, ENGINE_EXIT))
        if ended is not None and ended.get("pid") == record["pid"] \
                and ended.get("boot_id") == record.get("boot_id"):
            exit_code = ended.get("exit_code")
    # The spec the engine was started from, by the hash of its bytes at launch: the file
    # itself may have been rewritten since. A record written before hashes were kept
    # has none.
    digest = record.get("spec_sha256")
    owner = record.get("owner")
    log_file = record.get("log_file")
    return {"running": running, "pid": record["pid"], "exit_code": exit_code,
            "spec_sha256": digest if isinstance(digest, str) else None,
            "owner": owner if isinstance(owner, dict) else None,
            "log_file": log_file if isinstance(log_file, str) else None}


# -- logs ---------------------------------------------------------------------------------

def utf8_complete(chunk: bytes) -> int:
    """Length of `chunk` without a trailing, incomplete UTF-8 sequence, so that the next
    read starts on a character boundary instead of splitting one into two U+FFFDs."""
    for back in range(1, min(4, len(chunk)) + 1):
        byte = chunk[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII)
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 \
                else 4 if byte >> 3 == 0b11110 else 1
            return len(chunk) - back if need > back else len(chunk)
    return len(chunk)


def logs(args: argparse.Namespace) -> dict[str, Any]:
    path = os.path.abspath(args.file)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            # An offset past the end means the file was truncated or replaced (a new
            # launch): start again from its beginning.
            start = args.since if args.since <= size else 0
            f.seek(start)
            chunk = f.read(min(args.max, size - start))
    except FileNotFoundError:
        raise AgentError("not_found", f"logs: no file at --file {path!r}") from None
    except OSError as exc:
        raise AgentError("io_error", f"logs: cannot read --file {path!r}: {exc.strerror}") from exc
    keep = utf8_complete(chunk)
    # Hold back a split character unless --max is smaller than one character and more
    # follows, where holding back would never make progress.
    if keep > 0 or start + len(chunk) >= size:
        chunk = chunk[:keep]
    return {"path": path, "offset": start, "next_offset": start + len(chunk), "size": size,
            "text": chunk.decode("utf-8", "replace")}


# -- page cache ---------------------------------------------------------------------------

DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_caches(args: argparse.Namespace) -> dict[str, Any]:
    hint = ("dropping the page cache needs root, or the sudoers rule that lets this user run "
            f"`sudo {' '.join(DROP_CACHES_SUDO)}` (README.md), on a host whose /proc/sys is "
            "writable (containers usually mount it read-only); without it a start is not cold")
    before = meminfo().get("Cached", 0)
    os.sync()  # dirty pages cannot be dropped; write them back first
    if os.geteuid() == 0:
        try:
            with open(DROP_CACHES, "w") as f:
                f.write("3\n")
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT):
                raise AgentError("not_permitted", f"drop-caches: cannot write 3 to {DROP_CACHES}: "
                                 f"{exc.strerror}; {hint}") from exc
            raise
    else:
        drop_caches_with_sudo(hint)
    return {"dropped": True, "mem_cached_kib_before": before,
            "mem_cached_kib_after": meminfo().get("Cached", 0)}


def drop_caches_with_sudo(hint: str) -> None:
    """Write 3 through the one command the sudoers rule allows; -n: never a prompt."""
    uid = os.geteuid()
    try:
        res = subprocess.run([SUDO, *DROP_CACHES_SUDO], input=b"3\n", stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, timeout=SUDO_TIMEOUT_S)
    except FileNotFoundError:
        raise AgentError("not_permitted", f"drop-caches: running as uid {uid} and {SUDO} is "
                         f"not installed; {hint}") from None
    except subprocess.TimeoutExpired:
        raise AgentError("not_permitted", f"drop-caches: running as uid {uid}; sudo did not "
                         f"answer within {SUDO_TIMEOUT_S:g} s; {hint}") from None
    if res.returncode != 0:
        said = " ".join(res.stderr.decode("utf-8", "replace").split())[:200]
        raise AgentError("not_permitted", f"drop-caches: running as uid {uid}; sudo refused "
                         f"({said or 'exit ' + str(res.returncode)}); {hint}")


# -- FP4 probe ----------------------------------------------------------------------------

def e4m3_values(low: float, high: float) -> list[float]:
    """Positive normal FP8 E4M3 numbers in [low, high]: 1.mmm x 2^e, 3 mantissa bits."""
    found = []
    for exp in range(-6, 9):
        for mant in range(8):
            v = (1 + mant / 8) * 2.0 ** exp
            if low <= v <= high and v <= E4M3_MAX:
                found.append(v)
    return found


def probe_operand(rng: random.Random, rows: int, k: int
                  ) -> tuple[list[list[float]], list[list[float]]]:
    """A matrix built from NVFP4 parts, so any correct NVFP4 quantizer recovers exactly
    these E2M1 values and E4M3 block scales: every block holds a +-6 (its scale is then
    amax / 6) and the first block's scale is E4M3's largest, 448 (so the per-tensor scale
    that quantizers derive from the tensor's amax is the one used here)."""
    scales_pool = e4m3_values(16.0, E4M3_MAX)
    values = []
    scales = []
    for r in range(rows):
        row_values: list[float] = []
        row_scales = []
        for b in range(k // NVFP4_BLOCK):
            block = [rng.choice(E2M1_MAGNITUDES) * rng.choice((1.0, -1.0))
                     for _ in range(NVFP4_BLOCK)]
            block[rng.randrange(NVFP4_BLOCK)] = rng.choice((6.0, -6.0))
            row_values.extend(block)
            row_scales.append(E4M3_MAX if (r, b) == (0, 0) else rng.choice(scales_pool))
        values.append(row_values)
        scales.append(row_scales)
    return values, scales


def dequantize(values: list[list[float]], scales: list[list[float]], global_scale: float
               ) -> list[list[float]]:
    return [[v * scales[r][j // NVFP4_BLOCK] * global_scale for j, v in enumerate(row)]
            for r, row in enumerate(values)]


def probe_inputs(seed: int, size: int) -> dict[str, Any]:
    """A (size x size, NVFP4 parts) and B (size x size floats, exactly NVFP4-representable)
    for seed; output = dequant(A) @ B^T. Deterministic on every machine."""
    rng = random.Random(seed)
    a_values, a_scales = probe_operand(rng, size, size)
    b_values, b_scales = probe_operand(rng, size, size)
    return {
        "a_fp4": {"values": a_values, "block_scales": a_scales,
                  "global_scale": FP4_PROBE_GLOBAL_SCALE, "block_size": NVFP4_BLOCK},
        "b": dequantize(b_values, b_scales, FP4_PROBE_GLOBAL_SCALE),
    }


def fp4_probe(args: argparse.Namespace) -> dict[str, Any]:
    unsupported = AgentError("unsupported", "fp4-probe needs torch with a CUDA GPU; none here")
    try:
        import torch
    except ImportError:
        raise unsupported from None
    if not torch.cuda.is_available():
        raise unsupported
    if args.backend not in FP4_BACKENDS:
        raise AgentError("unsupported", f"fp4-probe: --backend {args.backend!r} is not one this "
                         f"agent runs; accepted: {', '.join(FP4_BACKENDS)}")
    inputs = probe_inputs(args.seed, args.size)
    output = run_fp4_gemm(torch, args.backend, inputs)
    return {"backend": args.backend, "m": args.size, "n": args.size, "k": args.size, **inputs,
            "output": output}


def run_fp4_gemm(torch: Any, backend: str, inputs: dict[str, Any]) -> list[list[float]]:
    dev = torch.device("cuda")
    a_fp4 = inputs["a_fp4"]
    g = a_fp4["global_scale"]
    a = torch.tensor(dequantize(a_fp4["values"], a_fp4["block_scales"], g), device=dev)
    b = torch.tensor(inputs["b"], device=dev)
    if backend == "reference":
        return [[float(x) for x in row] for row in (a.double() @ b.double().T).tolist()]
    a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)  # exact: see probe_operand
    # Engines' convention: the quantizer takes the inverse per-tensor scale
    # (448 * 6 / amax) and the GEMM multiplies by alpha = 1 / (inverse_a * inverse_b).
    inv_a = (E4M3_MAX * 6.0 / a16.abs().max().float()).reshape(1)
    inv_b = (E4M3_MAX * 6.0 / b16.abs().max().float()).reshape(1)
    alpha = 1.0 / (inv_a * inv_b)
    if backend == "cutlass":
        from vllm import _custom_ops as ops

        qa, sa = ops.scaled_fp4_quant(a16, inv_a)
        qb, sb = ops.scaled_fp4_quant(b16, inv_b)
        out = ops.cutlass_scaled_fp4_mm(qa, qb, sa, sb, alpha, torch.bfloat16)
    else:  # flashinfer_cutlass
        import flashinfer

        qa, sa = flashinfer.fp4_quantize(a16, inv_a)
        qb, sb = flashinfer.fp4_quantize(b16, inv_b)
        out = flashinfer.mm_fp4(qa, qb.T, sa, sb.T, alpha, torch.bfloat16, backend="cutlass")
    return [[float(x) for x in row] for row in out.float().tolist()]


# -- memory bandwidth probe ---------------------------------------------------------------

def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def mem_bw_probe(args: argparse.Namespace) -> dict[str, Any]:
    """The memory bandwidth a streaming read reaches on this node's GPU: what an engine's
    decode step gets when it reads the weights, rather than the specified peak."""
    # An engine holds the memory and the bandwidth: a probe beside it measures neither.
    current = engine_record(work_dir(args))
    if current is not None and engine_running(current):
        raise AgentError("busy", f"mem-bw-probe: an engine runs here (pid {current['pid']}) and holds "
                         "the GPU's memory and bandwidth; stop it first")
    unsupported = AgentError("unsupported", "mem-bw-probe needs torch with a CUDA GPU; none here")
    try:
        import torch
    except ImportError:
        raise unsupported from None
    if not torch.cuda.is_available():
        raise unsupported
    return run_mem_bw(torch, args.size_mib, args.repeats)


def run_mem_bw(torch: Any, size_mib: int, repeats: int) -> dict[str, Any]:
    dev = torch.device("cuda")
    count = size_mib * (1 << 20) // 4
    try:
        buf = torch.ones(count, dtype=torch.float32, device=dev)  # every page touched
    except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is a RuntimeError
        raise AgentError("busy", f"mem-bw-probe: cannot allocate {size_mib} MiB on the GPU "
                         f"(something holds its memory): {str(exc).splitlines()[0][:200]}") from None
    try:
        for _ in range(MEM_BW_WARMUP):
            buf.sum()
        torch.cuda.synchronize()
        seconds = []
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            buf.sum()
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1000.0)  # elapsed_time is in ms
    finally:
        del buf
        torch.cuda.empty_cache()
    bytes_read = count * 4
    gbs = [bytes_read / s / 1e9 for s in seconds]
    return {"device": str(torch.cuda.get_device_name(dev)), "size_mib": size_mib, "repeats": repeats,
            "bytes_read": bytes_read, "seconds": seconds, "gbs": gbs, "median_gbs": median(gbs),
            "method": MEM_BW_METHOD.format(size_mib=size_mib)}


# -- command line -------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    """argparse that raises a usage AgentError instead of printing and exiting."""

    def error(self, message: str) -> NoReturn:
        raise usage_error(f"{self.prog}: {message} ({self.format_usage().strip()})")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be a number (epoch seconds), got {text!r}")
    return value


def repeats_count(text: str) -> int:
    value = non_negative_int(text)
    if not 1 <= value <= MEM_BW_MAX_REPEATS:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to {MEM_BW_MAX_REPEATS}, got {text!r}")
    return value


def buffer_mib(text: str) -> int:
    value = non_negative_int(text)
    if value < 64:
        raise argparse.ArgumentTypeError(f"must be an integer >= 64 (MiB), got {text!r}")
    return value


def probe_size(text: str) -> int:
    value = non_negative_int(text)
    if value == 0 or value % 128:
        raise argparse.ArgumentTypeError(f"must be a positive multiple of 128, got {text!r}")
    return value


if TYPE_CHECKING:  # annotation only: subscripting collections.abc fails on Python 3.8
    Handler = Callable[[argparse.Namespace], dict[str, Any]]


def parser_for(verb: str) -> tuple[Parser, Handler]:
    p = Parser(prog=f"agent.py {verb}", add_help=False, allow_abbrev=False)
    p.add_argument("--json", action="store_true", help="print one compact JSON line")
    handler: Handler
    if verb == "self-check":
        handler = self_check
    elif verb == "facts":
        p.add_argument("--model-dir", required=True, metavar="P")
        handler = facts
    elif verb == "sampler start":
        p.add_argument("--out", required=True, metavar="FILE")
        p.add_argument("--interval", type=positive_float, default=1.0, metavar="S")
        handler = sampler_start
    elif verb == "sampler stop":
        p.add_argument("--out", required=True, metavar="FILE")
        handler = sampler_stop
    elif verb == "telemetry":
        p.add_argument("--out", required=True, metavar="FILE")
        p.add_argument("--since", type=finite_float, default=0.0, metavar="T")
        handler = telemetry
    elif verb in ("launch", "stop", "status"):
        if verb == "launch":
            p.add_argument("--spec", required=True, metavar="FILE")
        if verb == "stop":
            p.add_argument("--grace", type=positive_float, default=DEFAULT_GRACE_S, metavar="S")
        p.add_argument("--work-dir", metavar="DIR", default=None)
        handler = {"launch": launch, "stop": stop, "status": status}[verb]
    elif verb == "logs":
        p.add_argument("--file", required=True, metavar="F")
        p.add_argument("--since", type=non_negative_int, required=True, metavar="OFFSET")
        p.add_argument("--max", type=non_negative_int, default=DEFAULT_LOG_MAX, metavar="BYTES")
        handler = logs
    elif verb == "drop-caches":
        handler = drop_caches
    elif verb == "mem-bw-probe":
        p.add_argument("--size-mib", type=buffer_mib, default=MEM_BW_DEFAULT_MIB, metavar="MIB")
        p.add_argument("--repeats", type=repeats_count, default=MEM_BW_DEFAULT_REPEATS, metavar="N")
        p.add_argument("--work-dir", metavar="DIR", default=None)
        handler = mem_bw_probe
    else:  # fp4-probe
        p.add_argument("--backend", required=True, metavar="B")
        p.add_argument("--seed", type=int, required=True, metavar="N")
        p.add_argument("--size", type=probe_size, default=128, metavar="M")
        handler = fp4_probe
    return p, handler


def parse(argv: Sequence[str]) -> tuple[str, Handler, argparse.Namespace]:
    words = [a for a in argv if a != "--json"]
    if not words or words[0] not in VERBS:
        given = f"unknown verb {words[0]!r}" if words else "no verb given"
        raise usage_error(f"{given}; accepted verbs: {', '.join(VERBS)} "
                          "(sampler takes start or stop)")
    verb = words[0]
    rest = list(argv)
    rest.remove(verb)
    if verb == "sampler":
        action = words[1] if len(words) > 1 else None
        if action not in SAMPLER_ACTIONS:
            raise usage_error(f"sampler: expected start or stop, got {action!r} "
                              "(sampler start --out FILE [--interval S] | sampler stop --out FILE)")
        verb = f"sampler {action}"
        rest.remove(action)
    p, handler = parser_for(verb)
    return verb, handler, p.parse_args(rest)


def emit(envelope: dict[str, Any], compact: bool) -> None:
    if compact:
        text = json.dumps(envelope, separators=(",", ":"), allow_nan=False)
    else:
        text = json.dumps(envelope, indent=2, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def verb_named(argv: Sequence[str]) -> str | None:
    words = [a for a in argv if a != "--json"]
    if not words:
        return None
    if words[0] == "sampler" and len(words) > 1 and words[1] in SAMPLER_ACTIONS:
        return f"sampler {words[1]}"
    return words[0]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    compact = "--json" in argv
    verb = verb_named(argv)
    try:
        verb, handler, args = parse(argv)
        data = handler(args)
    except AgentError as exc:
        emit({"schema": SCHEMA, "verb": verb, "ok": False,
              "error": {"code": exc.code, "message": exc.message}}, compact)
        return exc.exit_status
    except Exception as exc:  # the envelope must still be JSON, whatever broke
        emit({"schema": SCHEMA, "verb": verb, "ok": False,
              "error": {"code": "internal", "message": f"{type(exc).__name__}: {exc}"}}, compact)
        return 1
    emit({"schema": SCHEMA, "verb": verb, "ok": True, "data": data}, compact)
    return 0


if __name__ == "__main__":
    sys.exit(main())
