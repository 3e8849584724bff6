"""Test doubles for the lab side of orchestration tests: a session factory that refuses
to be used, a session whose node facts the test writes (for preflight checks that need
facts a healthy simulated lab would never report), and scenario copies that run faster."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import yaml

from diagnostic.bookings.models import Lab
from lab.clock import LabClock
from lab.config import DEFAULT_ENGINE_VERSIONS
from lab.inventory import Inventory, parse_inventory
from lab.session import LabSession


def no_lab(lab: Lab) -> AbstractContextManager[Any]:
    """A session factory for stages that must not touch the lab."""
    raise AssertionError(f"this test's stages should not open a session on {lab.name}")


def inventory(nodes: int = 8) -> Inventory:
    data = {
        "schema": "lab.inventory/1",
        "name": "facts-lab",
        "catalog": str(Path(__file__).resolve().parents[2] / "lab" / "catalog.yaml"),
        "nodes": [
            {"name": f"spark-{i + 1:02d}", "host": "127.0.0.1", "port": 40000 + i,
             "role": "head" if i == 0 else "worker"}
            for i in range(nodes)
        ],
    }
    return parse_inventory(data, base=Path("/nonexistent"))


def healthy_facts(name: str, *, time: float = 1_700_000_000.0) -> dict[str, Any]:
    """Facts of a GB10 node as the agent reports them, all checks passing."""
    return {
        "host": name, "time": time, "kernel": "6.11.0-1016-nvidia", "arch": "aarch64",
        "cpu_count": 20, "mem_total_kib": 127_600_000, "mem_available_kib": 120_000_000,
        "gpus": [{"name": "NVIDIA GB10", "compute_capability": "12.1", "driver": "580.95",
                  "memory_total_mib": None}],
        "nics": [
            {"name": "enP7s7", "speed_mbps": 10000, "mtu": 1500, "operstate": "up"},
            {"name": "enp1s0f0np0", "speed_mbps": 100000, "mtu": 9000, "operstate": "up"},
            {"name": "enP2p1s0f0np0", "speed_mbps": 100000, "mtu": 9000, "operstate": "up"},
        ],
        "model_dir": {"path": "/models/kimi-k2", "exists": True, "free_bytes": 10**12},
        # The release the reference configuration names (vLLM's default, a modelled one).
        "engines": {"vllm": DEFAULT_ENGINE_VERSIONS["vllm"], "sglang": None},
        "python": "3.12.3",
    }


class FactsSession:
    """Answers `facts` from a table (an Exception entry is an unreachable node), and
    `status` / `stop` from `engines` (node -> the status of the engine it runs; none by
    default); every other lab call is a test error."""

    def __init__(self, facts: dict[str, Any], nodes: int = 8,
                 engines: dict[str, dict[str, Any]] | None = None) -> None:
        self.inventory = inventory(nodes)
        self.clock = LabClock(1.0, 0.0)
        self._facts = facts
        self.facts_calls = 0
        self.engines = dict(engines or {})
        self.stop_calls: list[list[str]] = []
        self.owner: dict[str, str] | None = None

    def _names(self, nodes: Any) -> list[str]:
        return [n if isinstance(n, str) else n.name for n in (nodes or self.inventory.nodes)]

    def status(self, nodes: Any = None) -> dict[str, Any]:
        idle = {"running": False, "pid": None, "exit_code": None, "spec_sha256": None, "owner": None}
        return {name: self._facts[name] if isinstance(self._facts.get(name), Exception)
                else copy.deepcopy(self.engines.get(name, idle)) for name in self._names(nodes)}

    def stop(self, nodes: Any = None) -> dict[str, Any]:
        names = self._names(nodes)
        self.stop_calls.append(names)
        out: dict[str, Any] = {}
        for name in names:
            if isinstance(self._facts.get(name), Exception):
                out[name] = self._facts[name]
                continue
            engine = self.engines.pop(name, None)
            out[name] = {"stopped": [engine["pid"]] if engine and engine.get("running") else []}
        return out

    @property
    def nodes(self) -> tuple[Any, ...]:
        return self.inventory.nodes

    def nodes_for(self, config: dict[str, Any]) -> list[Any]:
        return LabSession.nodes_for(self, config)  # type: ignore[arg-type]

    def facts(self, nodes: Any = None, *, tolerate: bool = False) -> dict[str, Any]:
        assert tolerate, "preflight must ask for every node's facts, tolerating failures"
        self.facts_calls += 1
        return {name: f if isinstance(f, Exception) else copy.deepcopy(f) for name, f in self._facts.items()}

    def factory(self) -> Any:
        @contextmanager
        def open_session(lab: Lab) -> Iterator[FactsSession]:
            yield self

        return open_session


FAST_DILATION = 150


def fast_scenario(tmp_path: Path, source: Path, dilation: float = FAST_DILATION) -> Path:
    """A copy of a scenario file that runs at `dilation` (FAST_DILATION unless a test needs
    a slower clock to act mid-stage) lab seconds per wall second: a ten-minute cold start
    takes seconds, and lab-time figures stay what they are."""
    data = yaml.safe_load(source.read_text())
    data["dilation"] = dilation
    path = tmp_path / source.name
    path.write_text(yaml.safe_dump(data))
    return path
