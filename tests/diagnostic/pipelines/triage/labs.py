"""Simulated labs for the triage tests: scenarios built from the reference file with the
changes a test needs, the customer configurations with any subset of the three loading
faults, and a lab session that reaches the simulated nodes in-process (the same agent
answers, without SSH) or over loopback SSH.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml

from lab.engines import normalize_config
from lab.inventory import Node, load_inventory
from lab.session import LabSession
from lab.sim.lab import SimLab
from lab.sim.node import SimNode
from lab.sim.scenario import Scenario, parse_scenario, rendezvous_needs
from lab.sim.sshd import run_command
from lab.ssh import Result

ROOT = Path(__file__).resolve().parents[4]
REFERENCE = ROOT / "lab" / "scenarios" / "reference-kimi-k2-8spark.yaml"
OUT_OF_BOX = ROOT / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"
# Lab seconds per wall second: a 560 s cold start in under three wall seconds. The
# session polls /health every 20 ms of wall time, about 8 lab s here: cold starts are
# measured to within that, far below the seconds a fault costs.
DILATION = 400.0
FAULTS = ("load.weights_io", "load.jit_compile", "load.rendezvous")

T = TypeVar("T")


def scenario(*, seed: int = 11, dilation: float = DILATION, nics: dict[str, Any] | None = None,
             faults: list[dict[str, Any]] | None = None, load: dict[str, Any] | None = None,
             engine: str = "vllm", version: str | None = None) -> Scenario:
    """The reference lab with another seed and the given changes. The reference file's
    explicit rendezvous needs name the reference NICs; they are dropped so that the needs
    follow the scenario's own NIC names (LAB_MODEL.md section 1)."""
    data = yaml.safe_load(REFERENCE.read_text())
    data["name"] = "triage-test"
    data["seed"] = seed
    data["dilation"] = dilation
    data["truth"]["load"]["rendezvous"].pop("needs", None)
    if nics is not None:
        data["cluster"].setdefault("node", {})["nics"] = nics
    if load:
        data["truth"]["load"].update(load)
    data["truth"]["faults"] = list(faults or [])
    if engine != "vllm" or version is not None:
        data["engine"] = {"name": engine, **({"version": version} if version else {})}
    return parse_scenario(data)


def customer(scn: Scenario, faults: Iterable[str] = FAULTS, *, engine: str = "vllm",
             version: str | None = None) -> dict[str, Any]:
    """The out-of-box configuration with only `faults` left in it: the others fixed the
    way a careful customer would have (names from the scenario itself). `version`: the
    engine release it names (the engine's default when None)."""
    raw: dict[str, Any] = copy.deepcopy(yaml.safe_load(OUT_OF_BOX.read_text()))
    if engine != "vllm" or version is not None:
        raw["engine"] = {"name": engine, **({"version": version} if version else {})}
    if engine != "vllm":
        raw["speculative"] = None  # the reference EAGLE-3 draft is a vLLM setting here
    faults = set(faults)
    if "load.weights_io" not in faults:
        raw["serving"]["load_format"] = "fastsafetensors"
    if "load.jit_compile" not in faults:
        raw["serving"]["jit_cache"] = "persisted"
    if "load.rendezvous" not in faults:
        raw["env"] = dict(rendezvous_needs(scn.node["nics"]))
    return normalize_config(raw)


class InProcessConnection:
    """A node reached in-process: the simulated node's own answer to the command line,
    and its sandbox for files. Stands in for lab.ssh.NodeConnection."""

    def __init__(self, node: Node, sim: SimNode) -> None:
        self.node = node
        self.sim = sim

    def run(self, argv: list[str], *, timeout: float, stdin: bytes | None = None,
            on_output: object = None, idempotent: bool = True) -> Result:
        answer = run_command(self.sim, shlex.join(argv))
        return Result(self.node.name, tuple(argv), answer.exit_status, answer.stdout.encode(),
                      answer.stderr.encode())

    def makedirs(self, *remote_dirs: str) -> None:
        for remote_dir in remote_dirs:
            self.sim.host_path(remote_dir).mkdir(parents=True, exist_ok=True)

    def put_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o644) -> None:
        path = self.sim.host_path(remote_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def get_bytes(self, remote_path: str) -> bytes:
        return self.sim.host_path(remote_path).read_bytes()

    def close(self) -> None:
        return None


class InProcessSSH:
    """lab.ssh.LabSSH's interface over InProcessConnections."""

    def __init__(self, sim: SimLab, nodes: Iterable[Node]) -> None:
        self.connections = {n.name: InProcessConnection(n, sim.node(n.name)) for n in nodes}

    def __getitem__(self, name: str) -> InProcessConnection:
        return self.connections[name]

    def each(self, fn: Callable[[Any], T], nodes: Iterable[str] | None = None) -> dict[str, T | Exception]:
        names = list(nodes) if nodes is not None else list(self.connections)

        def call(name: str) -> T | Exception:
            try:
                return fn(self.connections[name])
            except Exception as exc:
                return exc

        with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            return dict(zip(names, pool.map(call, names), strict=True))

    def close(self) -> None:
        return None


@contextmanager
def lab(scn: Scenario, state_dir: Path, *, ssh: bool = False) -> Iterator[tuple[SimLab, LabSession]]:
    """A started simulated lab and a session on it: in-process by default, loopback SSH
    when `ssh`."""
    with SimLab(scn, state_dir) as sim:
        inventory = load_inventory(sim.inventory_path)
        session = LabSession(inventory)
        if not ssh:
            session.ssh.close()
            session.ssh = InProcessSSH(sim, inventory.nodes)  # type: ignore[assignment]
        try:
            yield sim, session
        finally:
            session.close()


def finding_codes(result: dict[str, Any]) -> list[str]:
    return [f["code"] for f in result["findings"]]


def late_node(scn: Scenario, nodes: int = 8, formed: int = 0) -> str:
    """The node the simulator makes late at the `formed`-th rendezvous of a lab (the
    simulator's own rule, lab/sim/engine.py RendezvousHub): tests may read the truth."""
    import random

    rank = random.Random(f"{scn.seed}:late:{formed}").randrange(1, nodes)
    return scn.node_names[rank]
