"""`python -m lab sim serve` and the whole lab driven by the platform's lab session."""

from __future__ import annotations

import copy
import json
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from lab.inventory import load_inventory
from lab.scenarios import scenario_path
from lab.session import LabSession
from lab.sim.cli import serve
from lab.sim.lab import SimLab
from lab.sim.scenario import parse_scenario

from .conftest import load_path_fixed

REPO = Path(__file__).resolve().parents[3]


def test_sim_serve_runs_until_sigterm_and_exits_0(tmp_path: Path) -> None:
    scenario = yaml.safe_load(scenario_path("reference-kimi-k2-8spark").read_text())
    scenario["dilation"] = 500
    path = tmp_path / "fast.yaml"
    path.write_text(yaml.safe_dump(scenario))
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "lab", "sim", "serve", "--scenario", str(path),
                             "--state-dir", str(state)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("labsim: 8 nodes up;") and str(state / "inventory.yaml") in line
        inventory = load_inventory(state / "inventory.yaml")
        assert inventory.time_dilation == 500 and inventory.time_origin > 0
        with socket.create_connection(("127.0.0.1", inventory.head.port), timeout=5) as s:
            assert s.recv(7) == b"SSH-2.0"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", inventory.head.port), timeout=2)


def test_serve_refuses_a_bad_scenario_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("schema: labsim.scenario/1\ntruth: {load: {warp: 9}}\n")
    assert serve(path, tmp_path / "state") == 2
    assert "truth.load.warp: unknown field" in capsys.readouterr().err


def test_the_lab_session_launches_and_measures_a_cold_start_over_ssh(make_lab: Callable[..., SimLab]) -> None:
    lab = make_lab(dilation=100)
    with LabSession.open(lab.inventory_path) as session:
        session.start_sampler()
        result = session.launch(load_path_fixed(), cold=True, timeout_s=3600)
        assert httpx.get(f"{result.endpoint}/health", trust_env=False).status_code == 200
        # The first start with a kept JIT cache still compiles: 20 + 8 + 2 + 12.4 + 150 + 15 + 75 + 5.
        # The session times from its first launch call; at this dilation the eight calls
        # over SSH spread over up to a few wall tenths of a second: tens of lab seconds.
        expected = 20 + 8 + 2 + 597 / 8 / 6 + 150 + 15 + 75 + 5
        print(f"session cold start {result.cold_start_s:.1f} lab s (formula {expected:.1f})")
        assert expected - 2 <= result.cold_start_s <= expected + 120
        log = session.logs().text
        assert "Starting vLLM server on http://0.0.0.0:" in log
        samples = session.telemetry(since=result.started_at)
        assert sorted(samples) == [f"spark-0{i}" for i in range(1, 9)]
        assert max(s["compilers"] for s in samples["spark-02"]) >= 16
        stopped = session.stop()
        assert all(v["stopped"] for v in stopped.values())
        session.stop_sampler()
    calls = [json.loads(line)["verb"] for line in lab.calls_log_path.read_text().splitlines()]
    assert calls.count("launch") == 8 and calls.count("drop-caches") == 8


def test_the_session_tells_the_configuration_it_launched_from_any_other(
    make_lab: Callable[..., SimLab],
) -> None:
    lab = make_lab()
    ours = load_path_fixed()
    other = copy.deepcopy(ours)
    other["speculative"]["num_speculative_tokens"] = 3  # the one difference
    nodes = [f"spark-0{i}" for i in range(1, 9)]
    with LabSession.open(lab.inventory_path) as session:
        fresh = session.serving_state(ours)
        assert (fresh.serving, fresh.other_configuration, fresh.idle_nodes) == (False, False, nodes)
        assert fresh.healthy is None  # not asked: the nodes already said no

        session.launch(ours, cold=False, timeout_s=3600)
        calls = _agent_calls(lab)
        assert session.serves(ours) is True
        # One status call per node, nothing else on the nodes.
        assert [c["verb"] for c in _agent_calls(lab)[len(calls):]] == ["status"] * 8

        # /health answers just the same for `other`: only the nodes can tell them apart.
        assert httpx.get(f"{session.endpoint}/health", trust_env=False).status_code == 200
        state = session.serving_state(other)
        assert state.serving is False and state.other_configuration
        assert "spark-01" in state.other_nodes and not state.idle_nodes
        assert "a different configuration is running on spark-01" in state.reason
        assert session.serves(other) is False

        session.stop()
        stopped = session.serving_state(ours)
        assert (stopped.serving, stopped.other_configuration, stopped.idle_nodes) == (False, False, nodes)
        assert session.serves(ours) is False


def test_a_node_clock_running_ahead_does_not_shorten_the_cold_start(make_lab: Callable[..., SimLab]) -> None:
    data = yaml.safe_load(scenario_path("reference-kimi-k2-8spark").read_text())
    data["truth"]["faults"] = [{"clock_offset_s": 600, "node": "spark-03"}]
    lab = make_lab(parse_scenario(data), dilation=100)
    with LabSession.open(lab.inventory_path) as session:
        facts = session.facts()
        assert 540 < facts["spark-03"]["time"] - facts["spark-02"]["time"] < 660
        result = session.launch(load_path_fixed(), cold=True, timeout_s=3600)
    # spark-03 reports its start 600 lab s late by our clock; taken as it is, the cold start
    # would read about 600 lab s shorter than it was (negative, here).
    expected = 20 + 597 / 8 / 6 + 8 + 150 + 15 + 75 + 5
    print(f"skewed cold start {result.cold_start_s:.1f} lab s (formula {expected:.1f}), "
          f"corrections {result.start_corrections_s}")
    # The correction shows the skew, less the part of the launch call after the engine
    # started: spark-03's start is taken as the call's answer, which is no earlier than the
    # start, so the figure may come out short by that much, and by no more.
    corrections = result.start_corrections_s
    assert sorted(corrections) == [f"spark-0{i}" for i in range(1, 9)]
    assert -600 - 1 <= corrections["spark-03"] <= -600 + 120
    call_tail = corrections["spark-03"] + 600
    assert expected - 2 - call_tail <= result.cold_start_s <= expected + 120
    assert all(abs(c) < 1 for node, c in corrections.items() if node != "spark-03")
    assert result.started_at <= result.ready_at


def _agent_calls(lab: SimLab) -> list[dict[str, object]]:
    return [json.loads(line) for line in lab.calls_log_path.read_text().splitlines()]
