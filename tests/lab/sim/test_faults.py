"""Faults: the three look-alike load stalls are told apart from telemetry alone, and the
louder faults (kv_budget, engine crash, node down, degraded NIC) show as specified."""

from __future__ import annotations

import dataclasses
import re
import socket
import statistics
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import yaml

from lab.scenarios import scenario_path
from lab.sim.engine import EngineProcess
from lab.sim.lab import SimLab
from lab.sim.scenario import load_scenario
from tests.diagnostic.conftest import REFERENCE_CONFIG

from .conftest import launch, load_path_fixed, out_of_box, stop_all, wait_exit, wait_ready

MGMT = "enP7s7"
DATA = ("enp1s0f0np0", "enP2p1s0f0np0")


def classify(window: dict[str, list[dict[str, Any]]]) -> str:
    """Name the load fault a window of telemetry shows (node -> samples), from the samples
    alone: the rule a consultant applies to a stall (METHODOLOGY.md, loading triage)."""
    samples = [s for node in window.values() for s in node]
    mean = statistics.fmean
    disk = [s["disk_read_mbps"] for s in samples]
    compilers = mean(s["compilers"] for s in samples)
    user = mean(s["cpu"]["user"] for s in samples)
    system = mean(s["cpu"]["system"] for s in samples)
    data_nic = mean(s["net"][n]["rx_mbps"] for s in samples for n in DATA)
    if compilers >= 8 and user >= 80 and mean(disk) < 5:
        return "jit_compile"
    cached = [s["mem"]["cached_kib"] for s in next(iter(window.values()))]
    bursty = statistics.pstdev(disk) > 0.5 * mean(disk)
    if 50 < mean(disk) < 2000 and bursty and system >= 10 and cached[-1] > cached[0]:
        return "weights_io"
    mgmt_peaks = [max(s["net"][MGMT]["rx_mbps"] for s in node) for node in window.values()]
    quiet = user + system < 3 and mean(disk) < 1 and data_nic < 1 and compilers == 0
    if quiet and max(mgmt_peaks) > 0.25:
        return "rendezvous"
    return "none"


def window(lab: SimLab, start: float, end: float) -> dict[str, list[dict[str, Any]]]:
    return {name: node.telemetry_between(start, end) for name, node in lab.nodes.items()}


def phase_of(proc: EngineProcess, name: str) -> tuple[float, float]:
    p = next(p for p in proc.phases if p.name == name)
    return p.start, p.end


@pytest.fixture
def out_of_box_start(sim_lab: SimLab) -> EngineProcess:
    for node in sim_lab.nodes.values():
        node.drop_caches()
    return wait_ready(launch(sim_lab, out_of_box()))


def test_each_load_stall_is_named_from_its_telemetry(
        sim_lab: SimLab, out_of_box_start: EngineProcess) -> None:
    head = out_of_box_start
    found = {}
    for phase in ("weights_load", "rendezvous_wait", "jit", "graph_capture", "kv_alloc"):
        start, end = phase_of(head, phase)
        if phase == "rendezvous_wait":
            start = end - 55  # the stall itself, after the last node arrived
        found[phase] = classify(window(sim_lab, start + 2, end - 2))
    assert found == {"weights_load": "weights_io", "rendezvous_wait": "rendezvous", "jit": "jit_compile",
                     "graph_capture": "none", "kv_alloc": "none"}


def test_the_fixed_load_path_shows_none_of_the_three_signatures(sim_lab: SimLab) -> None:
    wait_ready(launch(sim_lab, load_path_fixed()))
    stop_all(sim_lab)
    head = wait_ready(launch(sim_lab, load_path_fixed()))
    for phase in ("weights_load", "jit", "distributed_init"):
        start, end = phase_of(head, phase)
        assert classify(window(sim_lab, start, end)) == "none", phase


def test_the_weights_io_signature_reads_about_the_mmap_rate_with_page_cache_doubling(
        sim_lab: SimLab, out_of_box_start: EngineProcess) -> None:
    start, end = phase_of(out_of_box_start, "weights_load")
    samples = sim_lab.head.telemetry_between(start, end)
    assert statistics.fmean(s["disk_read_mbps"] for s in samples) == pytest.approx(330, rel=0.15)
    grown_gib = (samples[-1]["mem"]["cached_kib"] - samples[0]["mem"]["cached_kib"]) / 1024**2
    assert grown_gib > 1.3 * 597 / 8 * 1e9 / 1024**3


def test_the_late_node_alone_retries_on_the_management_nic(
        sim_lab: SimLab, out_of_box_start: EngineProcess) -> None:
    _, end = phase_of(out_of_box_start, "rendezvous_wait")
    peaks = {name: max(s["net"][MGMT]["rx_mbps"] for s in samples)
             for name, samples in window(sim_lab, end - 55, end - 1).items()}
    busy = [name for name, peak in peaks.items() if peak > 0.25]
    assert len(busy) == 1 and busy[0] != "spark-01"


def test_a_kv_budget_fault_fails_startup_at_kv_allocation(make_lab: Callable[..., SimLab]) -> None:
    lab = make_lab("fault-kv-budget")
    procs = launch(lab, out_of_box())
    assert wait_exit(procs[0]) == 1
    text = procs[0].log_path.read_text()
    assert re.search(r"ValueError: To serve at least one request with the model's max seq len \(\d+\), "
                     r"\([\d.]+ GiB KV cache is needed, which is larger than the available KV cache "
                     r"memory", text)
    assert "Traceback (most recent call last):" in text
    assert "Graph capturing" not in text
    assert lab.head.status()["exit_code"] == 1


def test_the_length_a_kv_budget_refusal_names_fits_on_the_same_lab(make_lab: Callable[..., SimLab]) -> None:
    # The fault is a fixed amount of memory: the engine's estimate is a length that starts.
    lab = make_lab("fault-kv-budget")
    procs = launch(lab, out_of_box())
    assert wait_exit(procs[0]) == 1
    match = re.search(r"estimated maximum model length is (\d+)", procs[0].log_path.read_text())
    assert match is not None
    fits = int(match[1])
    assert 0 < fits < 262144
    stop_all(lab)
    config = out_of_box()
    config["serving"]["max_model_len"] = fits
    head = wait_ready(launch(lab, config))
    assert "GPU KV cache size:" in head.log_path.read_text()
    assert lab.head.status()["exit_code"] is None


def test_an_engine_crash_ends_serving_with_a_traceback(make_lab: Callable[..., SimLab]) -> None:
    lab = make_lab("fault-engine-crash")
    procs = launch(lab, out_of_box())
    head = wait_ready(procs)
    url = f"http://127.0.0.1:{lab.api_port}/health"
    assert httpx.get(url, trust_env=False).status_code == 200
    assert wait_exit(head) == 1
    assert lab.clock.now() >= head.ready_at + 900  # type: ignore[operator]
    text = head.log_path.read_text()
    assert "EngineCore encountered a fatal error" in text and "illegal memory access" in text
    with pytest.raises(httpx.HTTPError):
        httpx.get(url, trust_env=False, timeout=2)
    assert all(wait_exit(p) == 1 for p in procs[1:])


def test_a_node_down_refuses_ssh_while_the_others_answer(make_lab: Callable[..., SimLab]) -> None:
    lab = make_lab("fault-node-down")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", lab.servers["spark-05"].port), timeout=2)
    with socket.create_connection(("127.0.0.1", lab.servers["spark-04"].port), timeout=2) as s:
        assert s.recv(7) == b"SSH-2.0"


def test_a_degraded_nic_reports_its_speed_on_that_node_only(make_lab: Callable[..., SimLab]) -> None:
    lab = make_lab("fault-nic-degraded")
    speeds = {name: {n["name"]: n["speed_mbps"] for n in node.facts("/models/kimi-k2")["nics"]}
              for name, node in lab.nodes.items()}
    assert speeds["spark-03"] == {"enP7s7": 10000, "enp1s0f0np0": 25000, "enP2p1s0f0np0": 25000}
    assert speeds["spark-04"]["enp1s0f0np0"] == 100000


def test_a_bf16_kv_cache_at_full_context_does_not_fit_even_without_the_fault(sim_lab: SimLab) -> None:
    config = out_of_box()
    config["serving"]["kv_cache_dtype"] = "auto"
    procs = launch(sim_lab, config)
    assert wait_exit(procs[0]) == 1
    text = procs[0].log_path.read_text()
    assert "KV cache is needed, which is larger than the available KV cache memory" in text


def test_sglang_starts_with_a_kv_pool_shorter_than_its_context_and_says_so(
        make_lab: Callable[..., SimLab]) -> None:
    """SGLang 0.5.23 sizes its pool from memory, not from the context: bf16 at 262,144 tokens
    starts, its capacity line names the shorter pool, and tp_worker.py's warning follows."""
    import yaml

    from tests.diagnostic.conftest import REFERENCE_CONFIG

    lab = make_lab("reference-kimi-k2-8spark-sglang")
    config = yaml.safe_load((REFERENCE_CONFIG.parent / "kimi-k2-8spark-sglang.yaml").read_text())
    config["serving"]["kv_cache_dtype"] = "auto"
    head = wait_ready(launch(lab, config))
    text = head.log_path.read_text()
    allocated = re.search(r"KV Cache is allocated\. dtype: torch.bfloat16, #tokens: (\d+)", text)
    warned = re.search(r"KV pool holds (\d+) tokens, fewer than --context-length 262144\. One full-length "
                       r"request cannot fit", text)
    assert allocated is not None and warned is not None and allocated[1] == warned[1]
    assert 200_000 < int(warned[1]) < 262144
    assert lab.head.status()["exit_code"] is None


def test_a_skewed_node_reports_everything_by_its_own_clock(make_lab: Callable[..., SimLab]) -> None:
    import dataclasses
    import datetime

    from lab.scenarios import scenario_path
    from lab.sim.scenario import load_scenario

    reference = load_scenario(scenario_path("reference-kimi-k2-8spark"))
    skewed = dataclasses.replace(reference, truth={
        **reference.truth, "faults": [{"clock_offset_s": 3600.0, "node": "spark-03"}]})
    lab = make_lab(skewed)
    node, other = lab.node("spark-03"), lab.node("spark-02")
    before = lab.clock.now()
    ahead, agreeing = node.facts("/models/kimi-k2")["time"], other.facts("/models/kimi-k2")["time"]
    after = lab.clock.now()
    assert before + 3600 <= ahead <= after + 3600 and before <= agreeing <= after
    procs = launch(lab, load_path_fixed())
    wait_ready(procs)
    ranks = {p.node.name: p for p in procs}
    # The simulation runs on lab time; what the node says is read off its skewed clock.
    started = ranks["spark-03"].started
    stamps = [line.split("]", 1)[0] for line in ranks["spark-03"].log_path.read_text().splitlines()
              if line.startswith("INFO ")]
    year = datetime.datetime.fromtimestamp(started + 3600, datetime.UTC).year
    first = datetime.datetime.strptime(f"{year}-{stamps[0][5:19]}", "%Y-%m-%d %H:%M:%S").replace(
        tzinfo=datetime.UTC).timestamp()
    assert abs(first - (started + 3600)) < 120
    samples = node.telemetry_between(started, started + 5)
    assert [s["t"] for s in samples] == [t + 3600 for t in range(int(started) + 1, int(started) + 6)]
    assert other.telemetry_between(started, started + 1)[0]["t"] == int(started) + 1


def test_sglangs_fast_loader_on_a_node_without_fastsafetensors_fails_at_the_first_read(
        make_lab: Callable[..., SimLab]) -> None:
    """SGLang does not depend on fastsafetensors: --load-format fastsafetensors on a node
    without it starts, says it begins loading, and its iterator raises ImportError with the
    release's words (model_loader/weight_utils.py); the facts said so beforehand."""
    base = load_scenario(scenario_path("reference-kimi-k2-8spark-sglang"))
    lab = make_lab(dataclasses.replace(base, node={**base.node, "fastsafetensors": ""}))
    config = yaml.safe_load((REFERENCE_CONFIG.parent / "kimi-k2-8spark-sglang.yaml").read_text())
    config["serving"]["load_format"] = "fastsafetensors"
    head = launch(lab, config)[0]
    assert wait_exit(head) != 0
    text = head.log_path.read_text()
    assert text.index("Load weight begin.") < text.index(
        "ImportError: Please install fastsafetensors via `pip install fastsafetensors`")
    assert "Received sigquit from a child process" in text
