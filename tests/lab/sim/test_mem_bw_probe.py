"""The simulated nodes' memory bandwidth probe: the scenario's hardware section (peak times
the fraction reachable when streaming, LAB_MODEL.md section 1), a small deterministic
noise, lab time spent, and `busy` beside an engine, in the real agent's schema."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any

import pytest

from lab.agent import validate_response
from lab.agent.agent import MEM_BW_METHOD
from lab.sim.lab import SimLab
from lab.sim.node import MEM_BW_SETUP_S, SimNode
from lab.sim.scenario import Scenario, parse_scenario

from .conftest import launch, out_of_box, stop_all, wait_ready

AGENT = "/var/lib/diag/agent.py"


def probe(node: SimNode, *args: str) -> tuple[int, dict[str, Any]]:
    result = node.run_agent(AGENT, ["mem-bw-probe", *args, "--json"])
    answer = json.loads(result.stdout)
    validate_response(answer)
    return result.exit_status, answer


def slow_memory(seed: int = 3) -> Scenario:
    return parse_scenario({"schema": "labsim.scenario/1", "name": "slow-memory", "seed": seed,
                           "cluster": {"nodes": 2, "node": {"mem_bw_gbs": 300, "mem_bw_efficiency": 0.6}}})


def test_it_reaches_the_peak_times_the_streaming_fraction_of_the_scenario_s_hardware(
        make_lab: Callable[..., SimLab]) -> None:
    # At 20 lab seconds per wall second the bound below leaves a quarter second of wall time
    # for the SSH round trip; at the suite's usual 1000 it was 5 ms, which a busy machine
    # exceeds.
    lab = make_lab(slow_memory(), dilation=20)
    before = lab.clock.now()
    status, answer = probe(lab.head, "--repeats", "7", "--size-mib", "1024")
    spent = lab.clock.now() - before
    assert status == 0, answer
    got = answer["data"]
    assert got["device"] == "NVIDIA GB10" and got["method"] == MEM_BW_METHOD.format(size_mib=1024)
    assert got["method"].startswith("torch.sum over a 1024 MiB float32 buffer")
    assert (got["size_mib"], got["repeats"], got["bytes_read"]) == (1024, 7, 1024 * 2**20)
    assert len(got["gbs"]) == len(got["seconds"]) == 7
    assert got["median_gbs"] == pytest.approx(180.0, rel=0.03)  # 300 x 0.6
    assert all(g == pytest.approx(180.0, rel=0.05) for g in got["gbs"])
    assert len(set(got["gbs"])) == 7  # each repeat its own noise
    for g, s in zip(got["gbs"], got["seconds"], strict=True):
        assert s == pytest.approx(got["bytes_read"] / (g * 1e9), rel=1e-12)
    assert got["median_gbs"] == statistics.median(got["gbs"])
    # Setup and the repeats pass on the lab clock (and a little wall scheduling on top).
    assert spent >= MEM_BW_SETUP_S + sum(got["seconds"]) - 0.01
    assert spent < MEM_BW_SETUP_S + 5


def test_the_defaults_and_the_reference_lab(sim_lab: SimLab) -> None:
    status, answer = probe(sim_lab.node("spark-03"))
    assert status == 0
    got = answer["data"]
    assert (got["size_mib"], got["repeats"]) == (2048, 5)
    assert got["median_gbs"] == pytest.approx(273 * 0.75, rel=0.03)


def test_the_noise_is_deterministic_per_scenario_node_and_call(make_lab: Callable[..., SimLab]) -> None:
    first, second = make_lab(slow_memory()), make_lab(slow_memory())
    a = probe(first.head)[1]["data"]["gbs"]
    assert probe(second.head)[1]["data"]["gbs"] == a
    assert probe(first.node("spark-02"))[1]["data"]["gbs"] != a
    assert probe(first.head)[1]["data"]["gbs"] != a  # the next call draws anew
    assert probe(make_lab(slow_memory(seed=4)).head)[1]["data"]["gbs"] != a


def test_it_is_busy_while_an_engine_runs_and_measures_again_once_stopped(sim_lab: SimLab) -> None:
    procs = launch(sim_lab, out_of_box())
    wait_ready(procs)
    status, answer = probe(sim_lab.head)
    assert status == 1 and answer["error"]["code"] == "busy"
    assert f"pid {procs[0].pid}" in answer["error"]["message"]
    stop_all(sim_lab)
    assert probe(sim_lab.head)[0] == 0


def test_a_buffer_larger_than_the_free_memory_cannot_be_allocated(sim_lab: SimLab) -> None:
    status, answer = probe(sim_lab.head, "--size-mib", str(200 * 1024))
    assert status == 1 and answer["error"]["code"] == "busy"
    assert "cannot allocate" in answer["error"]["message"]


def test_bad_arguments_are_usage_errors_as_on_a_real_node(sim_lab: SimLab) -> None:
    status, answer = probe(sim_lab.head, "--repeats", "0")
    assert status == 2 and answer["error"]["code"] == "usage" and "--repeats" in answer["error"]["message"]
