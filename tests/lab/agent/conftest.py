"""Runs the real agent.py as a subprocess, the way the platform runs it on a node, and
checks every answer against lab/agent/schema.json before a test looks at it. The agent run
is the one the platform pushes (lab.agent_push.agent_source: agent.py with the lab's environment
policy written in), copied once per test process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab.agent import validate_response
from lab.agent_push import agent_source
from tests.lab.conftest import ENGINE_PATH, engine_python, public_dir, write_agent_config


@dataclass
class Answer:
    exit_status: int
    envelope: dict[str, Any]
    stderr: str

    @property
    def data(self) -> dict[str, Any]:
        assert self.envelope["ok"], self.envelope
        return self.envelope["data"]

    @property
    def error(self) -> dict[str, str]:
        assert not self.envelope["ok"], self.envelope
        return self.envelope["error"]


def agent_python() -> str:
    """The interpreter that runs the agent: LAB_AGENT_PYTHON when set, so the agent's
    tests can run under the oldest Python it supports (README.md), else this one."""
    return os.environ.get("LAB_AGENT_PYTHON") or sys.executable


def agent_python_version() -> str:
    """The version of agent_python(), as the agent reports it (platform.python_version)."""
    return subprocess.run([agent_python(), "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True).stdout.strip()


_PUSHED: list[Path] = []


def pushed_agent() -> Path:
    """agent.py as the platform pushes it (with the environment policy), in a folder of
    its own: what run_agent runs."""
    if not _PUSHED:
        path = Path(tempfile.mkdtemp(prefix="diag-pushed-agent-")) / "agent.py"
        path.write_bytes(agent_source())
        path.chmod(0o755)
        _PUSHED.append(path)
    return _PUSHED[0]


def run_agent(*args: str, env: dict[str, str] | None = None, python: str | None = None,
              timeout: float = 60) -> Answer:
    res = subprocess.run([python or agent_python(), str(pushed_agent()), *args, "--json"],
                         capture_output=True, text=True, timeout=timeout, env=env)
    lines = res.stdout.splitlines()
    assert len(lines) == 1, f"expected one JSON line, got {res.stdout!r} (stderr {res.stderr!r})"
    envelope = json.loads(lines[0])
    validate_response(envelope)
    return Answer(res.returncode, envelope, res.stderr)


@pytest.fixture
def agent() -> Callable[..., Answer]:
    return run_agent


def proc_alive(pid: int) -> bool:
    """Read independently of the agent: a pid is alive unless gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# The engine a spec may start: the release's entry point and the served model (the lab's
# flag policy refuses any other program); ENGINE_BEHAVIOUR says what the stand-in does.
ENGINE_ARGV = ["vllm", "serve", "/models/kimi-k2"]
ENGINE_BEHAVIOUR = "engine.py"
FAKE_VLLM = "#!/bin/sh\nexec {python} {root}/{behaviour} \"$@\"\n"


@dataclass
class Node:
    """A node for one test: a folder the engine user can enter, holding the work dir, a
    bin/ with a stand-in `vllm` on the node's engine PATH, and the node config."""

    root: Path
    work_dir: Path
    bin_dir: Path
    config: Path

    def behave(self, code: str) -> None:
        """What the stand-in engine does (Python; sys.argv[1:] is its argv after `vllm`)."""
        (self.root / ENGINE_BEHAVIOUR).write_text(code)
        (self.root / ENGINE_BEHAVIOUR).chmod(0o644)


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    root = public_dir("diag-agent-")
    wd = root / "work"
    wd.mkdir()
    wd.chmod(0o777)  # the stand-in engine, run as the engine user, writes there
    bin_dir = root / "bin"
    bin_dir.mkdir()
    vllm = bin_dir / "vllm"
    vllm.write_text(FAKE_VLLM.format(python=engine_python(), root=root, behaviour=ENGINE_BEHAVIOUR))
    vllm.chmod(0o755)
    config = write_agent_config(root / "agent.json", f"{bin_dir}:{ENGINE_PATH}")
    monkeypatch.setenv("LAB_AGENT_CONFIG", str(config))
    here = Node(root, wd, bin_dir, config)
    here.behave("import time\ntime.sleep(60)\n")
    try:
        yield here
    finally:
        run_agent("stop", "--work-dir", str(wd), "--grace", "1")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def work_dir(node: Node) -> Path:
    """A node work dir; whatever engine a test launched there is stopped afterwards."""
    return node.work_dir


def write_spec(path: Path, argv: Sequence[str], log_file: str, env: dict[str, str] | None = None,
               **extra: Any) -> Path:
    spec = {"schema": "lab.launch/1", "engine": "vllm", "version": "0.34.0", "node": "spark-01",
            "role": "head", "rank": 0, "argv": list(argv), "env": env or {}, "log_file": log_file, **extra}
    path.write_text(json.dumps(spec))
    return path


def read_pid_file(path: Path, timeout: float = 10.0) -> int:
    assert wait_until(lambda: path.exists() and path.read_text().strip() != "", timeout), path
    return int(path.read_text())

