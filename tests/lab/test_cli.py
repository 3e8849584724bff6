"""`python -m lab` as consultants use it: real processes, a simulated lab on loopback."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from lab.scenarios import scenario_path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "engines" / "fixtures"


def lab_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lab", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def served_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from serve_scenario(tmp_path_factory, "reference-kimi-k2-8spark")


@pytest.fixture(scope="module")
def kv_budget_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from serve_scenario(tmp_path_factory, "fault-kv-budget")


def serve_scenario(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """`python -m lab sim serve` of a scenario, 300 lab s per wall s; yields its inventory."""
    tmp = tmp_path_factory.mktemp("cli")
    scenario = yaml.safe_load(scenario_path(name).read_text())
    scenario["dilation"] = 300
    path = tmp / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    state = tmp / "state"
    proc = subprocess.Popen([sys.executable, "-m", "lab", "sim", "serve", "--scenario", str(path),
                             "--state-dir", str(state)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert re.match(r"labsim: \d+ nodes up", proc.stdout.readline())
    try:
        yield state / "inventory.yaml"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_facts_prints_every_node_of_the_simulated_lab(served_lab: Path) -> None:
    res = lab_cli("facts", "--inventory", str(served_lab))
    assert res.returncode == 0, res.stderr
    facts = json.loads(res.stdout)
    assert sorted(facts) == [f"spark-0{i}" for i in range(1, 9)]
    assert {f["gpus"][0]["compute_capability"] for f in facts.values()} == {"12.1"}


def test_launch_prints_one_json_line_and_stop_stops_it(served_lab: Path) -> None:
    config = REPO / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"
    res = lab_cli("launch", "--inventory", str(served_lab), "--config", str(config))
    assert res.returncode == 0, res.stderr
    line = json.loads(res.stdout.strip())
    assert line["endpoint"].startswith("http://127.0.0.1:")
    # LAB_MODEL.md section 5, out of box: mmap load, rendezvous stall, cold JIT.
    expected = 20 + 597 / 8 / 0.33 + 8 + 60 + 150 + 15 + 75 + 5
    assert line["cold_start_s"] == pytest.approx(expected, rel=0.05)
    res = lab_cli("stop", "--inventory", str(served_lab))
    assert res.returncode == 0, res.stderr
    assert all(v["stopped"] for v in json.loads(res.stdout).values())


def test_launch_admits_the_configuration_against_the_labs_own_catalog(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # A DeepSeek V3 lab holds DeepSeek V3, which the platform's default catalog does not.
    serving = serve_scenario(tmp_path_factory, "deepseek-v3-4spark")
    inventory = next(serving)
    try:
        config = REPO / "examples" / "configs" / "deepseek-v3-4spark.yaml"
        res = lab_cli("launch", "--inventory", str(inventory), "--config", str(config), "--warm")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout.strip())["endpoint"].startswith("http://127.0.0.1:")
        assert lab_cli("stop", "--inventory", str(inventory)).returncode == 0
    finally:
        next(serving, None)


def test_a_launch_that_fails_prints_the_engines_own_error_on_one_line(kv_budget_lab: Path) -> None:
    config = REPO / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"
    res = lab_cli("launch", "--inventory", str(kv_budget_lab), "--config", str(config))
    assert res.returncode == 1
    assert res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    # Not only "exited with code 1": vLLM's reason, with the context length that would fit.
    assert line.startswith("lab launch: spark-0")
    # vLLM 0.34.0's words (the `kv_budget_error` lines of its release table).
    assert ": the engine did not start: engine exited with code 1: ValueError: To serve at least one " \
           "request with the model's max seq len (262144)" in line
    assert re.search(r"the estimated maximum model length is \d+\.", line), line


def test_parse_log_prints_one_event_per_recognized_line() -> None:
    fixture = next(p for p in sorted(FIXTURES.glob("vllm*")) if p.is_file())
    res = lab_cli("parse-log", "--engine", "vllm", str(fixture))
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    assert events and all("kind" in e and "line" in e for e in events)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["facts", "--inventory", "/nonexistent/inventory.yaml"], "cannot read"),
        (["parse-log", "--engine", "vllm", "/nonexistent.log"], "no such log file"),
        (["parse-log", "--engine", "tgi", "x.log"], "invalid choice: 'tgi'"),
        (["launch", "--inventory", "x.yaml"], "the following arguments are required: --config"),
    ],
)
def test_errors_are_one_clear_line_and_a_nonzero_exit(args: list[str], message: str) -> None:
    res = lab_cli(*args)
    assert res.returncode != 0
    assert message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "Traceback" not in res.stderr
