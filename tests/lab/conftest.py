"""A real OpenSSH server on loopback, for the SSH layer's tests.

Each test that asks for `sshd` gets Debian's sshd on a free port, with its own host key,
a client key it accepts, and a known_hosts file naming it, so the tests exercise real
host-key checking, real authentication and a real shell on the far side.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab.inventory import Inventory, parse_inventory
from tests.conftest import service_missing, sshd_binary

SSHD = sshd_binary()  # None without openssh-server (or with SSHD_PATH naming no executable)
ENGINE_PATH = "/usr/local/bin:/usr/bin:/bin"


def engine_user() -> str:
    """Who the tests' engines run as: the user running the tests, or, when that is root,
    `nobody` (the agent never starts an engine as root)."""
    return "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name


def engine_python() -> str:
    """An interpreter the engine user can run for the stand-in engines (the tests' own may
    live in a home only root can enter)."""
    if os.geteuid() == 0:
        for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
            if os.access(candidate, os.X_OK):
                return candidate
    return sys.executable


def public_dir(prefix: str) -> Path:
    """A folder the engine user can enter (pytest's temporary folders are private to the
    user running the tests); the caller removes it."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path


def write_agent_config(path: Path, engine_path: str = ENGINE_PATH,
                       cache_dir: Path | None = None, models_dir: Path | None = None) -> Path:
    """The node config (lab/agent/README.md) for agents these tests run: the engine runs
    as `engine_user()`, never as root. `cache_dir` and `models_dir` are the node's cache
    volume and models directory (the inventory's), when not the defaults."""
    config: dict[str, str] = {"engine_user": engine_user(), "engine_path": engine_path}
    if cache_dir is not None:
        config["cache_dir"] = str(cache_dir)
    if models_dir is not None:
        config["models_dir"] = str(models_dir)
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(autouse=True, scope="session")
def agent_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every agent the tests start in a subprocess reads this node config."""
    path = write_agent_config(tmp_path_factory.mktemp("agent-config") / "agent.json")
    before = os.environ.get("LAB_AGENT_CONFIG")
    os.environ["LAB_AGENT_CONFIG"] = str(path)
    yield path
    if before is None:
        os.environ.pop("LAB_AGENT_CONFIG", None)
    else:
        os.environ["LAB_AGENT_CONFIG"] = before


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path, kind: str = "ed25519") -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)


@dataclass
class Sshd:
    root: Path
    port: int
    host_key: Path
    client_key: Path
    known_hosts: Path
    bin_dir: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cfg = self.root / "sshd_config"
        cfg.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.host_key}",
                    f"AuthorizedKeysFile {self.root}/authorized_keys",
                    f"PidFile {self.root}/sshd.pid",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "UsePAM no",
                    "StrictModes no",
                    "Subsystem sftp internal-sftp",
                    f"SetEnv PATH={self.bin_dir}:{ENGINE_PATH} "
                    f"LAB_AGENT_CONFIG={self.root / 'agent.json'}",
                    "LogLevel ERROR",
                ]
            )
            + "\n"
        )
        Path("/run/sshd").mkdir(exist_ok=True)
        assert SSHD is not None
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                    raise RuntimeError(f"sshd exited: {err}") from None
                time.sleep(0.05)
        raise RuntimeError("sshd did not start listening within 10 s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
        self.proc = None

    def kill_sessions(self) -> None:
        """Drop every open connection (the per-connection sshd children), keep listening."""
        if self.proc is None:
            return
        # Every process below the listener: the per-connection monitor, its unprivileged
        # child that holds the socket, and the commands, so the TCP connection really ends.
        victims: list[int] = []
        parents = [self.proc.pid]
        while parents:
            out = subprocess.run(["pgrep", "-P", ",".join(map(str, parents))], capture_output=True, text=True)
            parents = [int(p) for p in out.stdout.split()]
            victims += parents
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def inventory(self, **node: object) -> Inventory:
        data = {
            "schema": "lab.inventory/1",
            "name": "sshd-test",
            "catalog": str(Path(__file__).resolve().parents[2] / "lab" / "catalog.yaml"),
            "known_hosts": str(self.known_hosts),
            "nodes": [
                {
                    "name": "node-a",
                    "host": "127.0.0.1",
                    "port": self.port,
                    "user": os.environ.get("USER") or "root",
                    "key_file": str(self.client_key),
                    "role": "head",
                    "work_dir": str(self.root / "work"),
                    "model_dir": str(self.root / "models"),
                    "cache_dir": str(self.root / "cache"),
                    **node,
                }
            ],
        }
        return parse_inventory(data, base=self.root)


@pytest.fixture
def sshd() -> Iterator[Sshd]:
    if SSHD is None:
        service_missing("sshd (Debian's openssh-server) is not installed")
    # In a folder the engine user can enter: the node's bin, work and models directories
    # are below it, and its engines run as that user.
    root = public_dir("diag-sshd-")
    try:
        yield from _sshd(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _sshd(root: Path) -> Iterator[Sshd]:
    (root / "bin").mkdir()
    (root / "bin").chmod(0o755)
    work = root / "work"
    work.mkdir()
    work.chmod(0o777)  # the stand-in engines write what they saw there
    host_key = root / "host_ed25519"
    client_key = root / "client_ed25519"
    keygen(host_key)
    keygen(client_key)
    (root / "authorized_keys").write_text((client_key.with_suffix(".pub")).read_text())
    port = free_port()
    host_pub = host_key.with_suffix(".pub").read_text().split()
    known_hosts = root / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    server = Sshd(root, port, host_key, client_key, known_hosts, root / "bin")
    # The node's engines are found on its fixed engine PATH, which holds the test's bin; its
    # launches name the model by the catalog's path (/models/...), the default models_dir.
    write_agent_config(root / "agent.json", f"{server.bin_dir}:{ENGINE_PATH}", root / "cache")
    server.start()
    try:
        yield server
    finally:
        server.stop()
