"""`python -m lab sim serve --scenario FILE --state-dir DIR`: the simulated lab on loopback.

Builds the state folder (inventory, known_hosts, client key), starts every node's SSH
server, prints one line saying where the inventory is, and runs until SIGINT or
SIGTERM, when it stops engines, HTTP endpoints and sockets and exits 0.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from lab.sim.lab import SimLab
from lab.sim.scenario import ScenarioError, load_scenario


def serve(scenario_path: str | Path, state_dir: str | Path) -> int:
    try:
        scenario = load_scenario(scenario_path)
    except ScenarioError as exc:
        sys.stderr.write(f"labsim: scenario {scenario_path}: {exc}\n")
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    lab = SimLab(scenario, state_dir)
    try:
        try:
            lab.start()
        except OSError as exc:
            sys.stderr.write(f"labsim: cannot start the lab in {state_dir}: {exc}\n")
            return 1
        down = [f["node_down"] for f in scenario.faults("node_down")]
        note = f" ({', '.join(down)} down)" if down else ""
        sys.stdout.write(f"labsim: {scenario.nodes} nodes up{note}; inventory at {lab.inventory_path}; "
                         f"lab time x{scenario.dilation:g}; stop with Ctrl-C\n")
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
    finally:
        lab.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
