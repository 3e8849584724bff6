"""A simulated node's hardware over lab time: what it is doing, what its memory and page
cache hold, its NICs and RDMA devices, and the telemetry those add up to.

The engine (lab/sim/engine.py) tells the hardware what each phase does to it -- an
activity, a load streaming into page cache, memory the engine holds, the process's end --
and the node agent (lab/sim/node.py) reads back samples at 1 Hz of lab time and the
facts of its network. LAB_MODEL.md sections 1 and 5 give the signatures. Nothing here
names the scenario's truth: only what a node's /proc and /sys would show.
"""

from __future__ import annotations

import bisect
import math
import random
import threading
from dataclasses import dataclass
from typing import Any

from lab.sim.scenario import Scenario, rdma_device_names

KIB_PER_GIB = 1024 * 1024
BASE_USED_GIB = 3.6  # the OS, the desktop services and the agent itself
BASE_CACHED_GIB = 1.4  # page cache that is not model weights
NIC_MTU = 1500
RDMA_PORT_STATE = "ACTIVE"  # a cabled ConnectX-7 port with its link up


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


def node_ipv4(nic_index: int, node_index: int) -> str:
    """A made-up address: one /24 per NIC position (management first), one host per node,
    so the same NIC of every node shares a subnet as it would behind one switch."""
    return f"10.{10 + nic_index}.0.{11 + node_index}/24"


def data_address(node_index: int) -> str:
    """A node's address on its first data NIC (the inventory's data_addr)."""
    return node_ipv4(1, node_index).split("/")[0]


class NodeHardware:
    """One node's hardware timeline, from which its telemetry and facts are read."""

    def __init__(self, scenario: Scenario, index: int) -> None:
        self.scenario = scenario
        self.index = index
        self.name = scenario.node_names[index]
        self.lock = threading.RLock()
        self.weights_cached_gb = 0.0  # model weights the page cache still holds
        self._load: tuple[float, float, float, float] | None = None  # disk start, end, cached0, weights
        self._activities: list[Activity] = []
        self._cache_gib = Series(0.0)  # page cache holding model files, beyond BASE_CACHED_GIB
        self._engine_gib = Series(0.0)  # memory the engine holds
        # The clock_offset_s fault: how far this node's own clock reads ahead of lab time.
        # The simulation runs on lab time; only what the node reports by its clock (the
        # agent's times, telemetry stamps, engine log stamps) is read off the skewed one.
        self.clock_offset_s = sum(float(f["clock_offset_s"]) for f in scenario.faults("clock_offset_s")
                                  if f.get("node") in (None, self.name))

    def node_time(self, t: float) -> float:
        """What this node's own clock reads at lab time t."""
        return t + self.clock_offset_s

    # -- what the engine does to the hardware ---------------------------------------------------
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

    def record_exit(self, t: float) -> None:
        """The engine process ended at t: its activity stops, a load in progress keeps what it read."""
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

    def drop_page_cache(self, t: float) -> None:
        """What `echo 3 > /proc/sys/vm/drop_caches` does: no model file stays cached."""
        with self.lock:
            self.weights_cached_gb = 0.0
            self._cache_gib.set(t, 0.0)

    # -- what /proc and /sys show ------------------------------------------------------------------
    def data_link_gbps(self) -> float:
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

    def nic_facts(self) -> list[dict[str, Any]]:
        """Each NIC as the agent's facts describe it, by name as /sys/class/net lists them;
        the management NIC holds the default route."""
        nics = self.scenario.node["nics"]
        data_mbps = round(self.data_link_gbps() * 1000)
        found = [{"name": nics["mgmt"], "speed_mbps": round(nics["mgmt_gbps"] * 1000), "mtu": NIC_MTU,
                  "operstate": "up", "ipv4": [node_ipv4(0, self.index)], "default_route": True}]
        for i, name in enumerate(nics["data"], start=1):
            found.append({"name": name, "speed_mbps": data_mbps, "mtu": NIC_MTU, "operstate": "up",
                          "ipv4": [node_ipv4(i, self.index)], "default_route": False})
        return sorted(found, key=lambda n: str(n["name"]))

    def rdma_facts(self) -> list[dict[str, Any]]:
        """One RoCE device per data NIC, named by rdma-core's rule from its net device."""
        data = self.scenario.node["nics"]["data"]
        devices = [{"name": device, "net_device": nic, "ports": [{"port": 1, "state": RDMA_PORT_STATE}]}
                   for device, nic in zip(rdma_device_names(data), data, strict=True)]
        return sorted(devices, key=lambda d: str(d["name"]))

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
        link_mbps = self.data_link_gbps() * 1000
        if kind == "process_start":
            cpu_user = 100.0 / self.scenario.node["cpu_cores"] * u(0.9, 1.0) + 0.5
            cpu_sys, disk = u(0.8, 1.5), u(15.0, 60.0)
        elif kind == "model_init":
            # Building the model and choosing its kernels: one core busy, nothing read yet.
            cpu_user = 100.0 / self.scenario.node["cpu_cores"] * u(0.9, 1.0) + 0.4
            cpu_sys, disk = u(0.4, 1.0), u(0.0, 2.0)
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
        elif kind == "hang":
            # silent_hang_s: one thread spins on one core; nothing else moves.
            cpu_user = 100.0 / self.scenario.node["cpu_cores"] * u(0.95, 1.0) + 0.3
            cpu_sys = u(0.8, 1.4)
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
