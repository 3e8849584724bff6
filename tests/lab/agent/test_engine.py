"""launch, status and stop: the engine runs detached, never through a shell, and stop
takes its whole process group. The engine is a stand-in `vllm` on the node's engine PATH
(tests.lab.agent.conftest.Node): the agent starts nothing else."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from tests.lab.agent.conftest import (
    ENGINE_ARGV,
    Node,
    proc_alive,
    read_pid_file,
    run_agent,
    wait_until,
    write_spec,
)

PRINT_ARGV_AND_ENV = (
    "import json, os, sys, time\n"
    "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(),\n"
    "                  'probe': os.environ.get('VLLM_API_KEY'), 'path': os.environ.get('PATH'),\n"
    "                  'env': sorted(os.environ)}),\n"
    "      flush=True)\n"
    "print('to stderr', file=sys.stderr, flush=True)\n"
    "time.sleep(60)\n"
)
# Text a shell would act on, as the values of the one flag whose rule takes any printable
# line (an API key; the platform puts its own key there, a hand-written spec may not).
HOSTILE = ["$(touch owned)", "; rm -rf ~ ; touch owned", "`touch owned`", "a b", "*", "'\""]
SERVE = ENGINE_ARGV[1:]  # what the stand-in sees after `vllm`


def _launch(work_dir: Path, argv: list[str] | None = None, **spec: object) -> dict:
    log = spec.pop("log_file", str(work_dir / "logs" / "engine.log"))
    path = write_spec(work_dir / "spec.json", argv or ENGINE_ARGV, str(log), **spec)  # type: ignore[arg-type]
    return run_agent("launch", "--spec", str(path), "--work-dir", str(work_dir)).data


def _spec_sha256(work_dir: Path) -> str:
    return hashlib.sha256((work_dir / "spec.json").read_bytes()).hexdigest()


def test_it_runs_the_argv_without_a_shell_and_adds_the_spec_env(node: Node) -> None:
    work_dir = node.work_dir
    node.behave(PRINT_ARGV_AND_ENV)
    data = _launch(work_dir, [*ENGINE_ARGV, "--api-key", *HOSTILE],
                   env={"VLLM_API_KEY": "$HOME is not expanded"})
    log = Path(data["log_file"])
    assert log == work_dir / "logs" / "engine.log"
    assert wait_until(lambda: log.exists() and "to stderr" in log.read_text())
    printed = json.loads(log.read_text().splitlines()[0])
    assert printed["argv"] == [*SERVE, "--api-key", *HOSTILE]
    assert printed["probe"] == "$HOME is not expanded"
    assert printed["path"] == f"{node.bin_dir}:/usr/local/bin:/usr/bin:/bin"  # the node's engine PATH
    assert printed["cwd"] == str(work_dir)  # no cwd in the spec: the work dir
    for place in (work_dir, Path.cwd(), Path.home(), Path(log).parent, node.root):
        assert not (place / "owned").exists()


def test_it_reports_the_pid_and_start_time_on_the_node_clock(work_dir: Path) -> None:
    before = time.time()
    data = _launch(work_dir)
    assert before <= data["started"] <= time.time()
    assert proc_alive(data["pid"])
    assert run_agent("status", "--work-dir", str(work_dir)).data == {
        "running": True, "pid": data["pid"], "exit_code": None, "spec_sha256": _spec_sha256(work_dir),
        "owner": None, "log_file": data["log_file"]}


def test_status_names_the_spec_the_engine_was_launched_from_by_the_hash_of_its_bytes(
    work_dir: Path,
) -> None:
    # Bytes a JSON round trip would not reproduce: the hash is of the file as read.
    spec = {"schema": "lab.launch/1", "engine": "vllm", "version": "0.34.0", "argv": ENGINE_ARGV,
            "env": {}, "log_file": "engine.log", "note": "caf\u00e9  "}
    raw = json.dumps(spec, indent=3).encode() + b"\n\n"
    path = work_dir / "spec.json"
    path.write_bytes(raw)
    run_agent("launch", "--spec", str(path), "--work-dir", str(work_dir))
    launched = hashlib.sha256(raw).hexdigest()
    assert run_agent("status", "--work-dir", str(work_dir)).data["spec_sha256"] == launched
    # The platform writes the next spec before the next launch: status still names the
    # spec the running engine was started from, and keeps naming it once it stopped.
    path.write_bytes(raw.replace(b"engine.log", b"engine2.log"))
    assert run_agent("status", "--work-dir", str(work_dir)).data["spec_sha256"] == launched
    run_agent("stop", "--work-dir", str(work_dir), "--grace", "1")
    status = run_agent("status", "--work-dir", str(work_dir)).data
    assert (status["running"], status["spec_sha256"]) == (False, launched)
    record = json.loads((work_dir / "engine.json").read_text())
    assert record["spec_sha256"] == launched


def test_each_launch_writes_its_own_log_and_uses_the_spec_cwd(node: Node) -> None:
    work_dir = node.work_dir
    log = work_dir / "engine.log"
    log.write_text("earlier start\n")
    (work_dir / "engine.log.1").write_text("the start before that\n")
    elsewhere = work_dir / "elsewhere"
    elsewhere.mkdir()
    node.behave("import os\nprint(os.getcwd())\n")
    _launch(work_dir, log_file="engine.log", cwd="elsewhere")
    assert wait_until(lambda: log.exists() and log.read_text().count("\n") == 1)
    # This launch's lines alone; the earlier launches' logs are kept beside it, oldest first.
    assert log.read_text() == f"{elsewhere}\n"
    assert (work_dir / "engine.log.2").read_text() == "earlier start\n"
    assert (work_dir / "engine.log.1").read_text() == "the start before that\n"


def test_the_launch_spec_owner_comes_back_in_status(work_dir: Path) -> None:
    owner = {"platform": "gb10-diag", "job": "8d0c5c1e"}
    _launch(work_dir, owner=owner)
    assert run_agent("status", "--work-dir", str(work_dir)).data["owner"] == owner
    run_agent("stop", "--work-dir", str(work_dir), "--grace", "1")


def test_an_owner_that_is_not_names_to_strings_is_refused(work_dir: Path) -> None:
    spec = {"schema": "lab.launch/1", "engine": "vllm", "version": "0.34.0", "argv": ENGINE_ARGV,
            "log_file": "engine.log", "owner": {"job": ["not", "a", "string"]}}
    path = work_dir / "spec.json"
    path.write_text(json.dumps(spec))
    answer = run_agent("launch", "--spec", str(path), "--work-dir", str(work_dir))
    assert answer.error["code"] == "invalid_spec"
    assert "spec.owner" in answer.error["message"]


def test_old_logs_beyond_the_limit_are_dropped(tmp_path: Path) -> None:
    from lab.agent import agent

    log = tmp_path / "engine.log"
    for n in range(1, 4):
        (tmp_path / f"engine.log.{n}").write_text(f"launch {n}\n")
    log.write_text("launch 4\n")
    assert agent.rotate_log(str(log), keep=2) == f"{log}.4"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.log.3", "engine.log.4"]
    assert agent.rotate_log(str(log), keep=2) is None, "no log, nothing to move"


def test_status_reports_the_exit_code_of_an_engine_that_ended(node: Node) -> None:
    work_dir = node.work_dir
    node.behave("import sys\nsys.exit(3)\n")
    data = _launch(work_dir)
    assert wait_until(lambda: run_agent("status", "--work-dir", str(work_dir)).data["exit_code"] == 3)
    assert run_agent("status", "--work-dir", str(work_dir)).data == {
        "running": False, "pid": data["pid"], "exit_code": 3, "spec_sha256": _spec_sha256(work_dir),
        "owner": None, "log_file": data["log_file"]}


def test_status_before_any_launch_knows_nothing(work_dir: Path) -> None:
    assert run_agent("status", "--work-dir", str(work_dir)).data == {
        "running": False, "pid": None, "exit_code": None, "spec_sha256": None, "owner": None,
        "log_file": None}


def test_stop_takes_the_whole_process_group(node: Node) -> None:
    work_dir = node.work_dir
    child_pid_file = work_dir / "child.pid"
    node.behave(
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(child_pid_file)!r}, 'w').write(str(c.pid))\n"
        "time.sleep(60)\n"
    )
    engine = _launch(work_dir)["pid"]
    grandchild = read_pid_file(child_pid_file)
    stopped = run_agent("stop", "--work-dir", str(work_dir)).data["stopped"]
    assert {engine, grandchild} <= set(stopped)
    assert not proc_alive(engine) and not proc_alive(grandchild)
    status = run_agent("status", "--work-dir", str(work_dir)).data
    assert status == {"running": False, "pid": engine, "exit_code": -15,  # killed by SIGTERM
                      "spec_sha256": _spec_sha256(work_dir), "owner": None,
                      "log_file": str(work_dir / "logs" / "engine.log")}


def test_stop_kills_an_engine_that_ignores_sigterm_after_the_grace_period(node: Node) -> None:
    work_dir = node.work_dir
    ready = work_dir / "ready"
    node.behave("import signal, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                f"open({str(ready)!r}, 'w').write('1')\n"
                "time.sleep(60)\n")
    engine = _launch(work_dir)["pid"]
    read_pid_file(ready)
    began = time.monotonic()
    stopped = run_agent("stop", "--work-dir", str(work_dir), "--grace", "1").data["stopped"]
    took = time.monotonic() - began
    assert engine in stopped
    assert not proc_alive(engine)
    assert took >= 1.0, took  # the grace was given before the kill


def test_stop_with_nothing_running_stops_nothing(work_dir: Path) -> None:
    assert run_agent("stop", "--work-dir", str(work_dir)).data == {"stopped": []}


def test_it_refuses_a_second_launch_while_an_engine_runs(work_dir: Path) -> None:
    first = _launch(work_dir)["pid"]
    path = write_spec(work_dir / "spec2.json", ENGINE_ARGV, "second.log")
    ans = run_agent("launch", "--spec", str(path), "--work-dir", str(work_dir))
    assert ans.exit_status == 1
    assert ans.error["code"] == "already_running"
    assert str(first) in ans.error["message"]
    assert proc_alive(first)


def test_it_reports_an_engine_that_cannot_be_started(node: Node) -> None:
    work_dir = node.work_dir
    (node.bin_dir / "vllm").unlink()
    path = write_spec(work_dir / "spec.json", ENGINE_ARGV, "engine.log")
    ans = run_agent("launch", "--spec", str(path), "--work-dir", str(work_dir))
    assert ans.exit_status == 1
    assert ans.error["code"] == "launch_failed"
    assert "'vllm'" in ans.error["message"]
    assert "not found on the engine PATH" in ans.error["message"]
    assert not (work_dir / "logs").exists(), "nothing is created for a launch that cannot start"


def test_it_names_the_spec_field_that_is_wrong(work_dir: Path) -> None:
    cases = {
        "argv": {"argv": "vllm serve /models/kimi-k2"},
        "argv[0]": {"argv": ["true"]},
        "env": {"env": {"NCCL_SOCKET_IFNAME": 1}},
        "schema": {"schema": "lab.launch/2"},
        "cwd": {"cwd": str(work_dir / "missing")},
        "version": {"version": "9.9.9"},
    }
    for field, change in cases.items():
        spec = {"schema": "lab.launch/1", "engine": "vllm", "version": "0.34.0", "argv": ENGINE_ARGV,
                "env": {}, "log_file": "x.log", **change}
        path = work_dir / f"{field}.json"
        path.write_text(json.dumps(spec))
        ans = run_agent("launch", "--spec", str(path), "--work-dir", str(work_dir))
        assert ans.error["code"] == "invalid_spec", field
        assert ans.error["message"].startswith(f"spec.{field}:"), ans.error["message"]


def test_it_says_when_the_spec_file_is_missing(work_dir: Path) -> None:
    ans = run_agent("launch", "--spec", str(work_dir / "nope.json"), "--work-dir", str(work_dir))
    assert ans.error["code"] == "not_found"
    assert "nope.json" in ans.error["message"]


def test_it_refuses_a_work_dir_that_does_not_exist(tmp_path: Path) -> None:
    path = write_spec(tmp_path / "spec.json", ENGINE_ARGV, "engine.log")
    missing = tmp_path / "no-such-dir"
    ans = run_agent("launch", "--spec", str(path), "--work-dir", str(missing))
    assert ans.error["code"] == "not_found"
    assert str(missing) in ans.error["message"]
    assert not missing.exists()
