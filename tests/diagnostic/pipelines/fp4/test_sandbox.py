"""The sandbox that runs generated code: limits, kills, and nothing touched outside."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnostic.pipelines.fp4 import canaries as cn
from diagnostic.pipelines.fp4.sandbox import run_tests

TESTS = ["assert add(2, 3) == 5"]


def test_correct_code_passes_and_the_scratch_directory_is_removed(tmp_path: Path) -> None:
    got = run_tests("def add(a, b):\n    return a + b", TESTS, scratch_parent=tmp_path)
    assert got.passed and got.outcome == "passed"
    assert list(tmp_path.iterdir()) == []


def test_an_infinite_loop_is_killed_and_counts_as_a_failure(tmp_path: Path) -> None:
    got = run_tests(
        "def add(a, b):\n    while True:\n        pass\nadd(1, 2)",
        TESTS,
        cpu_s=1,
        wall_s=5,
        scratch_parent=tmp_path,
    )
    assert not got.passed and got.outcome == "killed" and "SIGXCPU" in got.detail
    assert got.wall_s < 5


def test_a_sleeper_is_killed_at_the_wall_timeout(tmp_path: Path) -> None:
    got = run_tests("import time\ntime.sleep(60)", TESTS, wall_s=1.0, scratch_parent=tmp_path)
    assert not got.passed and got.outcome == "timeout" and got.wall_s < 5
    assert list(tmp_path.iterdir()) == []


def test_writes_and_removals_outside_the_scratch_directory_are_refused(tmp_path: Path) -> None:
    victim = tmp_path / "keep.txt"
    victim.write_text("original")
    outside = tmp_path / "new.txt"
    scratch_parent = tmp_path / "s"
    scratch_parent.mkdir()
    got = run_tests(f"open({str(outside)!r}, 'w').write('x')\n", TESTS, scratch_parent=scratch_parent)
    assert not got.passed and "outside the scratch directory" in got.detail
    for attack in (
        f"import os\nos.remove({str(victim)!r})",
        f"import os\nos.rename({str(victim)!r}, 'x')",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
        f"open({str(victim)!r}, 'a').write('y')",
        f"import pathlib\npathlib.Path({str(victim)!r}).write_text('z')",
    ):
        assert not run_tests(attack, TESTS, scratch_parent=scratch_parent).passed, attack
    assert not outside.exists()
    assert victim.read_text() == "original"
    assert list(scratch_parent.iterdir()) == []
    # Inside its own directory the candidate may write.
    assert run_tests("open('scratch.txt', 'w').write('ok')\ndef add(a, b):\n    return a + b", TESTS).passed


@pytest.mark.parametrize(
    "code",
    [
        "import socket\nsocket.socket()",
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nos.system('true')",
        "import os\nos.fork()",
        "import ctypes",
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))",
        "x = bytearray(1 << 31)",
    ],
)
def test_network_processes_native_code_and_big_allocations_are_refused(code: str) -> None:
    got = run_tests(code + "\ndef add(a, b):\n    return a + b", TESTS)
    assert not got.passed and got.outcome == "error"


def test_a_code_canary_whose_answer_loops_forever_fails_without_harm() -> None:
    canary = next(c for c in cn.load_canaries().canaries if c.id == "code-add")
    reply = "```python\ndef add(a, b):\n    while True:\n        a += b\n```"
    got = cn.check(canary, reply, run_code=lambda code, tests: run_tests(code, tests, cpu_s=1, wall_s=5))
    assert not got.passed and got.sandbox and got.sandbox["outcome"] in ("killed", "timeout")
