"""Fixtures for the simulated lab's tests: a started SimLab at a fast dilation, and
helpers that launch a configuration on it the way the lab session does (render the
launch specs, hand each node its spec) without going through SSH."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.engines import render
from lab.inventory import load_inventory
from lab.scenarios import scenario_path
from lab.sim.engine import EngineProcess
from lab.sim.lab import SimLab
from lab.sim.scenario import Scenario, load_scenario
from lab.sim.tokenizer import default_cache_dir

REPO = Path(__file__).resolve().parents[3]
OUT_OF_BOX = REPO / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"
FAST = 1000.0  # lab seconds per wall second: a 560-lab-second cold start in ~0.6 s


def out_of_box() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(OUT_OF_BOX.read_text())
    return config


def load_path_fixed(*, nccl: bool = True) -> dict[str, Any]:
    """The out-of-box configuration with the three load-path fixes applied."""
    config = copy.deepcopy(out_of_box())
    config["serving"]["safetensors_load_strategy"] = "eager"
    config["serving"]["jit_cache"] = "persisted"
    if nccl:
        config["env"] = {"NCCL_SOCKET_IFNAME": "enP7s7", "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0"}
    return config


def launch(lab: SimLab, config: dict[str, Any], *, extra_argv: list[str] | None = None,
           per_launch_cache: bool = True) -> list[EngineProcess]:
    """Start `config` on the nodes it needs, head first; the engine process of each node.
    `extra_argv` is appended to every node's command line as written (unchecked);
    `per_launch_cache` False renders as outside the lab (an ephemeral cache sets nothing)."""
    inventory = load_inventory(lab.inventory_path)
    specs = render(config, inventory.nodes, catalog=inventory.catalog, per_launch_cache=per_launch_cache)
    procs = []
    for spec in specs:
        spec["argv"] += extra_argv or []
        node = lab.node(spec["node"])
        node.launch(spec, node.host_path(spec["log_file"]))
        procs.append(node.processes[-1])
    return procs


def wait_ready(procs: list[EngineProcess], timeout: float = 20.0) -> EngineProcess:
    """Wait until the head serves (or its process ended); the head's process."""
    head = procs[0]
    deadline = time.monotonic() + timeout
    while head.ready_at is None and head.running:
        if time.monotonic() > deadline:
            raise AssertionError(f"the engine did not get ready within {timeout} s wall")
        time.sleep(0.01)
    return head


def wait_exit(proc: EngineProcess, timeout: float = 20.0) -> int:
    assert proc.wait(timeout), f"the engine on {proc.node.name} is still running after {timeout} s"
    assert proc.exit_code is not None
    return proc.exit_code


def stop_all(lab: SimLab) -> None:
    for node in lab.nodes.values():
        node.stop_engines()


@pytest.fixture(scope="session")
def tokenizer_cache() -> Path:
    """The machine's tokenizer cache: training the BPE once is enough for every test run."""
    return default_cache_dir()


@pytest.fixture
def make_lab(tmp_path: Path, tokenizer_cache: Path) -> Iterator[Callable[..., SimLab]]:
    """make_lab(scenario="reference-kimi-k2-8spark", dilation=FAST) -> a started SimLab."""
    labs: list[SimLab] = []

    def make(scenario: str | Scenario = "reference-kimi-k2-8spark", dilation: float = FAST) -> SimLab:
        loaded = scenario if isinstance(scenario, Scenario) else load_scenario(scenario_path(scenario))
        lab = SimLab(loaded, tmp_path / f"lab{len(labs)}", dilation=dilation,
                     tokenizer_cache=tokenizer_cache)
        labs.append(lab)
        return lab.start()

    yield make
    for lab in labs:
        lab.stop()


@pytest.fixture
def sim_lab(make_lab: Callable[..., SimLab]) -> SimLab:
    """The reference lab at a fast dilation."""
    return make_lab()
