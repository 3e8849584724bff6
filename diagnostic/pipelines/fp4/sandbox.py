"""Running a model's generated code against a canary's tests, away from the worker.

Generated code is never executed in the worker process. Each run is a fresh
`sys.executable -I` subprocess (isolated: no user site, no PYTHON* variables) in its own
scratch directory, with a CPU-time and address-space limit, a cap on the size of files it
may write, a wall-clock timeout after which its whole process group is killed, a bare
environment, and an audit hook installed before the candidate code runs that refuses
network sockets, new processes, native-code loading and any file write, rename or removal
outside the scratch directory. Audit hooks are not a security boundary against hostile
code; with the rlimits, the scratch directory and the kill they are enough for what a
model writes when asked for a small function.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CPU_SECONDS = 5
ADDRESS_SPACE_BYTES = 512 * 1024 * 1024
FILE_SIZE_BYTES = 1024 * 1024
WALL_SECONDS = 10.0
RESULT_MARK = "FP4-CANARY-RESULT "

# The runner: installs the audit hook, then runs the candidate and the tests in one
# namespace; its last stdout line is the result. It reads its inputs from files in the
# scratch directory, which is its working directory.
RUNNER = (
    r'''
import json, os, sys

SCRATCH = os.path.realpath(os.getcwd())
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                "os.symlink", "os.link", "os.truncate", "os.utime", "shutil.rmtree",
                "shutil.move", "shutil.copyfile", "os.replace", "os.removexattr", "os.setxattr"}
_REFUSED_PREFIXES = ("socket.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn",
                     "ctypes.", "pty.", "os.fork", "os.forkpty", "os.kill", "os.killpg")
_REFUSED = {"os.system", "os.startfile", "_posixsubprocess.fork_exec", "mmap.__new__",
            "os.chdir", "os.fchdir", "os.chroot", "resource.setrlimit", "sys.setrecursionlimit"}


def _inside(path):
    if isinstance(path, int):
        return True  # an already-open descriptor: its open was checked
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    full = os.path.realpath(os.path.join(SCRATCH, os.fspath(path)))
    return full == SCRATCH or full.startswith(SCRATCH + os.sep)


def _hook(event, args):
    if event in _REFUSED or event.startswith(_REFUSED_PREFIXES):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open":
        path, mode, flags = (list(args) + [None, None, None])[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                  (isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writing and path is not None and not _inside(path):
            raise PermissionError(f"sandbox: writing {path!r} outside the scratch directory")
    elif event in _PATH_EVENTS:
        for arg in args[:2]:
            if isinstance(arg, (str, bytes, os.PathLike)) and not _inside(arg):
                raise PermissionError(f"sandbox: {event} on {arg!r} outside the scratch directory")
    elif event == "import" and args and str(args[0]).split(".")[0] in ("ctypes", "_ctypes", "cffi"):
        raise PermissionError(f"sandbox: importing {args[0]} is not allowed")


import resource

with open("limits.json", encoding="utf-8") as fh:
    limits = json.load(fh)
# Limits first: from here on the process cannot raise them (the hook refuses setrlimit).
resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
resource.setrlimit(resource.RLIMIT_AS, (limits["address_space"], limits["address_space"]))
resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size"], limits["file_size"]))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
with open("candidate.py", encoding="utf-8") as fh:
    candidate = fh.read()
with open("tests.json", encoding="utf-8") as fh:
    tests = json.load(fh)
sys.addaudithook(_hook)

result = {"loaded": False, "passed": 0, "failed": [], "error": None}
namespace = {"__name__": "candidate"}
try:
    exec(compile(candidate, "candidate.py", "exec"), namespace)
    result["loaded"] = True
except BaseException as exc:
    result["error"] = f"{type(exc).__name__}: {exc}"[:300]
if result["loaded"]:
    for test in tests:
        try:
            exec(compile(test, "test", "exec"), namespace)
            result["passed"] += 1
        except BaseException as exc:
            result["failed"].append({"test": test, "error": f"{type(exc).__name__}: {exc}"[:300]})
print()
print("'''
    + RESULT_MARK
    + r"""" + json.dumps(result), flush=True)
"""
)


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    tests: int
    tests_passed: int
    outcome: str  # passed | failed | error | killed | timeout
    detail: str
    wall_s: float

    def as_dict(self) -> dict[str, object]:
        return {
            "passed": self.passed,
            "tests": self.tests,
            "tests_passed": self.tests_passed,
            "outcome": self.outcome,
            "detail": self.detail,
            "wall_s": round(self.wall_s, 3),
        }


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_tests(
    code: str,
    tests: list[str],
    *,
    cpu_s: int = CPU_SECONDS,
    address_space: int = ADDRESS_SPACE_BYTES,
    wall_s: float = WALL_SECONDS,
    scratch_parent: str | Path | None = None,
) -> SandboxResult:
    """Run `code`, then each test statement, in a sandboxed subprocess; passed only when the
    code loads and every test passes. The scratch directory is removed afterwards."""
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="fp4-canary-", dir=scratch_parent))
    try:
        (scratch / "candidate.py").write_text(code, encoding="utf-8")
        (scratch / "tests.json").write_text(json.dumps(tests), encoding="utf-8")
        (scratch / "runner.py").write_text(RUNNER, encoding="utf-8")
        # The runner sets its own limits before it reads the candidate: no preexec_fn,
        # which is unsafe in a worker that runs threads.
        (scratch / "limits.json").write_text(
            json.dumps({"cpu_s": cpu_s, "address_space": address_space, "file_size": FILE_SIZE_BYTES})
        )
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(scratch), "TMPDIR": str(scratch)}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "runner.py"],
            cwd=scratch,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=wall_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return SandboxResult(
                False, len(tests), 0, "timeout", f"killed after {wall_s:g} s wall", time.monotonic() - started
            )
        finally:
            # Whatever the candidate left running in its group goes with it.
            _kill_group(proc)
        elapsed = time.monotonic() - started
        if proc.returncode < 0:
            name = signal.Signals(-proc.returncode).name
            return SandboxResult(
                False,
                len(tests),
                0,
                "killed",
                f"killed by {name} (CPU limit {cpu_s} s, memory limit {address_space >> 20} MiB)",
                elapsed,
            )
        line = next((ln for ln in reversed(out.splitlines()) if ln.startswith(RESULT_MARK)), None)
        if line is None:
            tail = (err or out).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            return SandboxResult(False, len(tests), 0, "error", tail[0][:300], elapsed)
        result = json.loads(line[len(RESULT_MARK) :])
        if not result["loaded"]:
            return SandboxResult(False, len(tests), 0, "error", str(result["error"]), elapsed)
        passed = int(result["passed"])
        failed = result["failed"]
        detail = "" if not failed else f"{failed[0]['test']}: {failed[0]['error']}"
        ok = passed == len(tests) and not failed
        return SandboxResult(ok, len(tests), passed, "passed" if ok else "failed", detail, elapsed)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
