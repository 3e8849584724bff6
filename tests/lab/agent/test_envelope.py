"""The agent's envelope: self-check, usage errors, exit statuses, and the schema itself."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab.agent import (
    AGENT_PATH,
    AgentResponseError,
    agent_schema,
    validate_response,
    validate_sample,
)
from lab.agent_push import agent_sha256, agent_source
from tests.lab.agent.conftest import agent_python, agent_python_version, run_agent, wait_until


def test_self_check_reports_the_sha256_of_the_file_it_runs_from(tmp_path: Path) -> None:
    copy = tmp_path / "agent.py"
    copy.write_bytes(AGENT_PATH.read_bytes() + b"\n# a different file\n")
    res = subprocess.run([agent_python(), str(copy), "self-check", "--json"],
                         capture_output=True, text=True, check=True)
    data = json.loads(res.stdout)["data"]
    assert data["sha256"] == hashlib.sha256(copy.read_bytes()).hexdigest()
    assert data["sha256"] != agent_sha256()
    assert data["python"] == agent_python_version()


def test_self_check_matches_what_the_platform_pushes() -> None:
    ans = run_agent("self-check")
    assert ans.exit_status == 0
    assert ans.data["sha256"] == agent_sha256() == hashlib.sha256(agent_source()).hexdigest()


def test_the_agent_imports_only_the_standard_library() -> None:
    # Nodes have a bare python3: run it with site-packages disabled and no repo on the path.
    res = subprocess.run([sys.executable, "-S", "-I", str(AGENT_PATH), "self-check", "--json"],
                         capture_output=True, text=True, cwd="/")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["ok"] is True


def test_it_refuses_an_unknown_verb_with_exit_2_naming_the_verbs() -> None:
    ans = run_agent("frobnicate")
    assert ans.exit_status == 2
    assert ans.envelope["verb"] == "frobnicate"
    assert ans.error["code"] == "usage"
    assert "'frobnicate'" in ans.error["message"]
    for verb in ("self-check", "facts", "sampler", "telemetry", "launch", "logs", "fp4-probe",
                 "mem-bw-probe"):
        assert verb in ans.error["message"]


def test_it_refuses_no_verb_at_all() -> None:
    ans = run_agent()
    assert ans.exit_status == 2
    assert ans.envelope["verb"] is None
    assert "no verb given" in ans.error["message"]


def test_it_names_a_missing_argument_and_the_verbs_usage() -> None:
    ans = run_agent("facts")
    assert ans.exit_status == 2
    assert ans.error["code"] == "usage"
    assert "--model-dir" in ans.error["message"]
    assert "usage: agent.py facts" in ans.error["message"]


def test_it_refuses_sampler_without_start_or_stop() -> None:
    ans = run_agent("sampler", "pause", "--out", "x")
    assert ans.exit_status == 2
    assert "expected start or stop, got 'pause'" in ans.error["message"]


@pytest.mark.parametrize("value", ["0", "-1", "abc", "inf"])
def test_it_refuses_a_sampler_interval_that_is_not_a_positive_number(value: str, tmp_path: Path) -> None:
    ans = run_agent("sampler", "start", "--out", str(tmp_path / "s.jsonl"), "--interval", value)
    assert ans.exit_status == 2
    assert "--interval" in ans.error["message"] and repr(value) in ans.error["message"]
    assert not (tmp_path / "s.jsonl.pid").exists()


def test_it_refuses_an_unknown_option() -> None:
    ans = run_agent("status", "--colour", "red")
    assert ans.exit_status == 2
    assert "unrecognized arguments: --colour red" in ans.error["message"]


def test_it_refuses_an_abbreviated_option() -> None:
    ans = run_agent("facts", "--model", "/tmp")
    assert ans.exit_status == 2


def test_without_json_flag_it_still_prints_one_json_object() -> None:
    res = subprocess.run([agent_python(), str(AGENT_PATH), "self-check"],
                         capture_output=True, text=True, check=True)
    assert res.stdout.count("\n") > 1  # indented for a person reading a terminal
    validate_response(json.loads(res.stdout))


def test_fp4_probe_is_unsupported_without_torch_and_cuda() -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU node: the probe's real path applies here")
    ans = run_agent("fp4-probe", "--backend", "flashinfer_cutlass", "--seed", "7")
    assert ans.exit_status == 1
    assert ans.error == {"code": "unsupported",
                         "message": "fp4-probe needs torch with a CUDA GPU; none here"}


def test_fp4_probe_requires_a_seed() -> None:
    ans = run_agent("fp4-probe", "--backend", "cutlass")
    assert ans.exit_status == 2
    assert "--seed" in ans.error["message"]


def _older_pythons() -> list[str]:
    found = []
    for pattern in ("/usr/bin/python3.8", "/usr/local/bin/python3.8",
                    os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")):
        found.extend(glob.glob(pattern))
    return found[:1]


@pytest.mark.parametrize("python", _older_pythons() or [None])
def test_it_runs_under_python_3_8(python: str | None, tmp_path: Path) -> None:
    if python is None:
        pytest.skip("no Python 3.8 interpreter on this machine")
    assert run_agent("self-check", python=python).data["python"].startswith("3.8.")
    facts = run_agent("facts", "--model-dir", str(tmp_path), python=python).data
    assert facts["model_dir"]["exists"] is True
    out = tmp_path / "s.jsonl"
    assert run_agent("sampler", "start", "--out", str(out), "--interval", "0.2",
                     python=python).exit_status == 0
    try:
        assert wait_until(lambda: out.exists() and out.read_text().count("\n") >= 1, 5)
    finally:
        assert run_agent("sampler", "stop", "--out", str(out), python=python).data["stopped"]


def test_the_schema_rejects_data_that_does_not_fit_its_verb() -> None:
    good = {"schema": "lab.agent/1", "verb": "status", "ok": True,
            "data": {"running": False, "pid": None, "exit_code": None, "spec_sha256": None}}
    validate_response(good)
    with pytest.raises(AgentResponseError, match="data"):
        validate_response({**good, "data": {"running": "no", "pid": None, "exit_code": None,
                                            "spec_sha256": None}})
    with pytest.raises(AgentResponseError, match="exit_code"):
        validate_response({**good, "data": {"running": True, "pid": 5, "exit_code": 0,
                                            "spec_sha256": "0" * 64}})
    with pytest.raises(AgentResponseError, match="spec_sha256"):
        validate_response({**good, "data": {"running": False, "pid": None, "exit_code": None}})
    with pytest.raises(AgentResponseError, match="spec_sha256"):
        validate_response({**good, "data": {"running": True, "pid": 5, "exit_code": None,
                                            "spec_sha256": "not a hash"}})
    with pytest.raises(AgentResponseError):
        validate_response({**good, "verb": "facts"})  # status data is not facts data
    with pytest.raises(AgentResponseError):
        validate_response({**good, "verb": "reboot"})  # ok answers come from known verbs
    with pytest.raises(AgentResponseError):
        validate_response({**good, "error": {"code": "internal", "message": "x"}})


def test_the_schema_rejects_an_error_without_a_known_code() -> None:
    bad = {"schema": "lab.agent/1", "verb": "facts", "ok": False,
           "error": {"code": "oops", "message": "x"}}
    with pytest.raises(AgentResponseError, match="code"):
        validate_response(bad)


def test_the_schema_describes_every_verb_and_the_sample() -> None:
    defs = agent_schema()["$defs"]
    assert set(defs["verb"]["enum"]) == {
        "self-check", "facts", "sampler start", "sampler stop", "telemetry", "launch", "stop",
        "status", "logs", "drop-caches", "fp4-probe", "mem-bw-probe"}
    with pytest.raises(AgentResponseError, match="gpu_util"):
        validate_sample({"t": 1.0, "cpu": {"user": 1, "system": 1, "iowait": 0, "idle": 98},
                         "mem": {"available_kib": 1, "cached_kib": 1, "swap_used_kib": 0},
                         "disk_read_mbps": 0, "net": {}, "compilers": 0, "gpu_util": 150})
