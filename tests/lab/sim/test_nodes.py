"""The simulated nodes' agent verbs: the real agent's envelope and data (schema.json),
GB10 facts, the sandbox, telemetry timing, page cache and the FP4 probe."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from lab.agent import validate_response, validate_sample
from lab.scenarios import scenario_path
from lab.sim.lab import SimLab
from lab.sim.node import SandboxError, SimNode
from lab.sim.scenario import load_scenario

from .conftest import launch, out_of_box, stop_all, wait_exit, wait_ready

AGENT = "/var/lib/diag/agent.py"


def put_agent(node: SimNode, text: str = 'AGENT_VERSION = "1.0.0"\n') -> None:
    path = node.host_path(AGENT)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def agent(node: SimNode, *args: str, validate: bool = True) -> tuple[int, dict[str, Any]]:
    """Run a verb; its answer checked against schema.json (long telemetry answers are
    checked on every tenth sample: validating thousands of samples takes seconds)."""
    result = node.run_agent(AGENT, [*args, "--json"])
    answer = json.loads(result.stdout)
    if validate:
        checked = answer
        if answer.get("ok") and "samples" in answer.get("data", {}):
            checked = {**answer, "data": {**answer["data"], "samples": answer["data"]["samples"][::10]}}
        validate_response(checked)
    return result.exit_status, answer


def data(node: SimNode, *args: str, validate: bool = True) -> dict[str, Any]:
    status, answer = agent(node, *args, validate=validate)
    assert status == 0 and answer["ok"], answer
    return dict(answer["data"])


def test_self_check_hashes_the_uploaded_agent(sim_lab: SimLab) -> None:
    import hashlib

    node = sim_lab.head
    put_agent(node, 'AGENT_VERSION = "9.9"\nprint()\n')
    got = data(node, "self-check")
    assert got["sha256"] == hashlib.sha256(b'AGENT_VERSION = "9.9"\nprint()\n').hexdigest()
    assert got["version"] == "9.9"


def test_facts_describe_a_gb10_node(sim_lab: SimLab) -> None:
    facts = data(sim_lab.node("spark-02"), "facts", "--model-dir", "/models/kimi-k2")
    assert facts["host"] == "spark-02" and facts["arch"] == "aarch64" and facts["cpu_count"] == 20
    assert facts["mem_total_kib"] == round(121.7 * 1024 * 1024)
    assert facts["gpus"] == [{"name": "NVIDIA GB10", "compute_capability": "12.1", "driver": "580.95.05",
                              "memory_total_mib": None}]
    assert {n["name"]: n["speed_mbps"] for n in facts["nics"]} == {
        "enP7s7": 10000, "enp1s0f0np0": 100000, "enP2p1s0f0np0": 100000}
    assert facts["model_dir"]["exists"] is True and facts["model_dir"]["free_bytes"] > 0
    assert facts["engines"] == {"vllm": "0.34.0", "sglang": "0.5.23"}
    assert facts["model_dir"]["fs_type"] == "ext4"
    assert facts["loaders"] == {"fastsafetensors": "0.5.0"}
    assert abs(facts["time"] - sim_lab.clock.now()) < 60


def test_facts_name_a_network_model_folder_and_a_missing_loader(make_lab: Callable[..., SimLab]) -> None:
    base = load_scenario(scenario_path("reference-kimi-k2-8spark"))
    lab = make_lab(dataclasses.replace(base, node={**base.node, "model_fs": "lustre", "fastsafetensors": ""}))
    facts = data(lab.node("spark-03"), "facts", "--model-dir", "/models/kimi-k2")
    assert facts["model_dir"]["fs_type"] == "lustre"
    assert facts["loaders"] == {"fastsafetensors": None}


def test_facts_of_a_missing_model_dir_say_so(sim_lab: SimLab) -> None:
    facts = data(sim_lab.head, "facts", "--model-dir", "/models/other")
    assert facts["model_dir"]["exists"] is False and facts["model_dir"]["free_bytes"] is None
    assert facts["model_dir"]["fs_type"] is None


def test_the_model_dir_holds_a_tokenizer_a_config_and_a_64_shard_index(sim_lab: SimLab) -> None:
    model_dir = sim_lab.head.host_path("/models/kimi-k2")
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 64
    assert json.loads((model_dir / "config.json").read_text())["num_hidden_layers"] == 61
    assert json.loads((model_dir / "tokenizer.json").read_text())["model"]["type"] == "BPE"


def test_a_usage_error_exits_2_with_an_error_envelope(sim_lab: SimLab) -> None:
    status, answer = agent(sim_lab.head, "logs", "--file", "/x")
    assert status == 2 and answer["error"]["code"] == "usage" and "--since" in answer["error"]["message"]
    status, answer = agent(sim_lab.head, "dance")
    assert status == 2 and answer["verb"] == "dance"


def test_agent_paths_cannot_climb_out_of_the_node(sim_lab: SimLab) -> None:
    status, answer = agent(sim_lab.head, "logs", "--file", "/../../etc/passwd", "--since", "0")
    assert status == 1 and answer["error"]["code"] == "not_permitted"
    with pytest.raises(SandboxError):
        sim_lab.head.host_path("/var/../../x")
    assert sim_lab.head.host_path("/var/lib/../log") == sim_lab.head.root / "var" / "log"


def test_every_verb_answers_in_the_agent_schema(sim_lab: SimLab) -> None:
    node = sim_lab.head
    out = "/var/lib/diag/telemetry/samples.jsonl"
    data(node, "sampler", "start", "--out", out)
    data(node, "drop-caches")
    data(node, "status")
    data(node, "stop")
    data(node, "fp4-probe", "--backend", "cutlass", "--seed", "1")
    procs = launch(sim_lab, out_of_box())
    wait_ready(procs)
    assert data(node, "status")["running"] is True
    log = data(node, "logs", "--file", "/var/lib/diag/logs/engine.log", "--since", "0", "--max", "300")
    assert log["next_offset"] <= 300 and log["size"] > 300
    tel = data(node, "telemetry", "--out", out, "--since", "0")
    assert tel["running"] is True and len(tel["samples"]) > 500
    for sample in tel["samples"][::97]:
        validate_sample(sample)
    assert data(node, "sampler", "stop", "--out", out) == {"stopped": True}
    stopped = data(node, "stop")["stopped"]
    assert stopped == [procs[0].pid]
    assert data(node, "status") == {"running": False, "pid": procs[0].pid, "exit_code": -15,
                                    "spec_sha256": procs[0].spec_sha256, "owner": None,
                                    "log_file": "/var/lib/diag/logs/engine.log"}


def test_launch_reads_the_spec_file_and_refuses_a_second_engine(sim_lab: SimLab) -> None:
    import hashlib

    from lab.engines import render
    from lab.inventory import load_inventory

    spec = render(out_of_box(), load_inventory(sim_lab.inventory_path).nodes)[0]
    node = sim_lab.head
    assert data(node, "status") == {"running": False, "pid": None, "exit_code": None, "spec_sha256": None,
                                    "owner": None, "log_file": None}
    node.host_path("/var/lib/diag/launch").mkdir(parents=True)
    raw = json.dumps(spec).encode()
    node.host_path("/var/lib/diag/launch/spec.json").write_bytes(raw)
    first = data(node, "launch", "--spec", "/var/lib/diag/launch/spec.json")
    assert first["log_file"] == "/var/lib/diag/logs/engine.log"
    # Like the real agent: status names the spec by the hash of the file's bytes as read.
    assert data(node, "status")["spec_sha256"] == hashlib.sha256(raw).hexdigest()
    status, answer = agent(node, "launch", "--spec", "/var/lib/diag/launch/spec.json")
    assert status == 1 and answer["error"]["code"] == "already_running"
    node.host_path("/var/lib/diag/launch/bad.json").write_text(json.dumps({**spec, "schema": "x"}))
    stop_all(sim_lab)
    status, answer = agent(node, "launch", "--spec", "/var/lib/diag/launch/bad.json")
    assert answer["error"]["code"] == "invalid_spec" and "spec.schema" in answer["error"]["message"]
    # Like the real agent: a variable a configuration may not set makes the spec invalid.
    hostile = {**spec, "env": {**spec["env"], "LD_PRELOAD": "/tmp/x.so"}}
    node.host_path("/var/lib/diag/launch/env.json").write_text(json.dumps(hostile))
    status, answer = agent(node, "launch", "--spec", "/var/lib/diag/launch/env.json")
    assert answer["error"]["code"] == "invalid_spec"
    assert answer["error"]["message"].startswith("spec.env.LD_PRELOAD:")
    # ... and so do a flag off the release's list, another program, a log outside the work dir.
    for name, change, field in (
            ("hooks", {"argv": [*spec["argv"], "--worker-extension-cls", "evil.W"]},
             f"spec.argv[{len(spec['argv'])}]: '--worker-extension-cls' is not a flag"),
            ("shell", {"argv": ["/bin/sh", "-c", "id"]}, "spec.argv[0]:"),
            ("log", {"log_file": "/etc/cron.d/x"}, "spec.log_file:")):
        node.host_path(f"/var/lib/diag/launch/{name}.json").write_text(json.dumps({**spec, **change}))
        status, answer = agent(node, "launch", "--spec", f"/var/lib/diag/launch/{name}.json")
        assert answer["error"]["code"] == "invalid_spec"
        assert answer["error"]["message"].startswith(field), answer["error"]["message"]


def test_telemetry_is_sampled_each_lab_second_only_while_the_sampler_runs(sim_lab: SimLab) -> None:
    node = sim_lab.head
    out = "/var/lib/diag/t.jsonl"
    assert data(node, "telemetry", "--out", out, "--since", "0") == {"samples": [], "running": False}
    data(node, "sampler", "start", "--out", out, "--interval", "0.001")
    node.clock.sleep(30)
    data(node, "sampler", "stop", "--out", out)
    stopped_at = node.clock.now()
    node.clock.sleep(30)
    samples = data(node, "telemetry", "--out", out, "--since", "0")["samples"]
    times = [s["t"] for s in samples]
    assert len(times) >= 25 and all(b - a == 1.0 for a, b in itertools.pairwise(times))
    assert times[-1] <= stopped_at
    later = data(node, "telemetry", "--out", out, "--since", str(times[10]))["samples"]
    assert [s["t"] for s in later] == times[11:]
    lines = node.host_path(out).read_text().splitlines()
    assert [json.loads(line)["t"] for line in lines] == times


def test_drop_caches_empties_the_page_cache_of_weights(sim_lab: SimLab) -> None:
    procs = launch(sim_lab, out_of_box())
    wait_ready(procs)
    stop_all(sim_lab)
    answer = data(sim_lab.head, "drop-caches")
    assert answer["mem_cached_kib_before"] > 50 * 1024 * 1024
    assert answer["mem_cached_kib_after"] < 2 * 1024 * 1024
    assert sim_lab.head.weights_cached_gb == 0


def reference_output(probe: dict[str, Any]) -> np.ndarray:
    a = probe["a_fp4"]
    values = np.array(a["values"])
    scales = np.repeat(np.array(a["block_scales"]), a["block_size"], axis=1)
    return (values * scales * a["global_scale"]) @ np.array(probe["b"]).T


@pytest.mark.parametrize(("backend", "correct"), [("cutlass", True), ("marlin", True),
                                                  ("reference", True), ("flashinfer_cutlass", False)])
def test_the_fp4_probe_differs_from_a_reference_only_for_a_broken_backend(
        sim_lab: SimLab, backend: str, correct: bool) -> None:
    probe = data(sim_lab.head, "fp4-probe", "--backend", backend, "--seed", "3", validate=False)
    assert (probe["m"], probe["n"], probe["k"]) == (128, 128, 128)
    out = np.array(probe["output"])
    ref = reference_output(probe)
    error = np.abs(out - ref).max() / np.abs(ref).max()
    assert (error < 1e-9) == correct, error


def test_an_unknown_fp4_backend_is_unsupported(sim_lab: SimLab) -> None:
    status, answer = agent(sim_lab.head, "fp4-probe", "--backend", "warp", "--seed", "1")
    assert status == 1 and answer["error"]["code"] == "unsupported"
    assert "cutlass" in answer["error"]["message"]


def test_every_agent_call_is_logged_with_node_verb_and_lab_time(sim_lab: SimLab) -> None:
    data(sim_lab.node("spark-03"), "status")
    agent(sim_lab.node("spark-04"), "facts")
    calls = [json.loads(line) for line in sim_lab.calls_log_path.read_text().splitlines()]
    assert [(c["node"], c["verb"], c["exit"]) for c in calls] == [("spark-03", "status", 0),
                                                                  ("spark-04", "facts", 2)]
    assert abs(calls[0]["t"] - sim_lab.clock.now()) < 120


def test_a_killed_engine_reports_its_signal_as_a_negative_exit_code(sim_lab: SimLab) -> None:
    procs = launch(sim_lab, out_of_box())
    stop_all(sim_lab)
    assert wait_exit(procs[0]) == -15


def test_the_simulated_lab_is_reached_as_an_unprivileged_user(sim_lab: SimLab) -> None:
    from lab.inventory import load_inventory

    # As a real lab should be set up (lab/agent/README.md): the SSH user is not root.
    assert {n.user for n in load_inventory(sim_lab.inventory_path).nodes} == {"diag"}
