"""The simulated nodes' SSH servers: one paramiko server per node on a loopback port.

Each node has its own ed25519 host key and accepts only the lab's client key. It runs
exec requests of one shape -- `<python> <work_dir>/agent.py VERB ARGS --json`, the node
agent the platform uploaded by SFTP -- and serves SFTP over the node's sandbox. Anything
else (shells, ptys, other commands) is refused the way a locked-down node would, so the
platform's SSH code meets real host-key checks, real authentication and real channels.
"""

from __future__ import annotations

import logging
import os
import posixpath
import shlex
import socket
import threading
import time
from pathlib import Path
from typing import Any

import paramiko
from paramiko.common import (
    AUTH_FAILED,
    AUTH_SUCCESSFUL,
    OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED,
    OPEN_SUCCEEDED,
)
from paramiko.sftp import (
    SFTP_FAILURE,
    SFTP_NO_SUCH_FILE,
    SFTP_OK,
    SFTP_OP_UNSUPPORTED,
    SFTP_PERMISSION_DENIED,
)

from lab.sim.node import AgentResult, SandboxError, SimNode

log = logging.getLogger(__name__)

CLIENT_CLOSE_WAIT_S = 30.0
OUTPUT_CHUNK = 32 * 1024


def run_command(node: SimNode, command: str) -> AgentResult:
    """What the node answers to an exec request's command line."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        return AgentResult(127, "", f"sim: cannot parse the command line ({exc}): {command}\n")
    if len(argv) >= 2 and posixpath.basename(argv[0]).startswith("python") and argv[1].endswith(".py"):
        script = argv[1]
        try:
            present = node.host_path(script).is_file()
        except SandboxError:
            present = False
        if not present:
            # What python3 itself prints, with its exit status 2.
            return AgentResult(2, "", f"{argv[0]}: can't open file '{script}': "
                                      "[Errno 2] No such file or directory\n")
        if posixpath.basename(script) == "agent.py":
            return node.run_agent(script, argv[2:])
    return AgentResult(127, "", f"sim: command not supported on a simulated node: {command}\n")


class _Interface(paramiko.ServerInterface):
    def __init__(self, server: NodeSSHServer) -> None:
        self.server = server
        self.node = server.node

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        if key.get_name() == self.server.client_key.get_name() and \
                key.asbytes() == self.server.client_key.asbytes():
            return AUTH_SUCCESSFUL
        return AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return OPEN_SUCCEEDED
        return OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        text = command.decode("utf-8", errors="replace")
        threading.Thread(target=self.server.exec_on, args=(channel, text),
                         name=f"sshd-{self.node.name}-exec", daemon=True).start()
        return True

    def check_channel_shell_request(self, channel: paramiko.Channel) -> bool:
        return False

    def check_channel_pty_request(self, *args: Any) -> bool:
        return False

    def check_channel_subsystem_request(self, channel: paramiko.Channel, name: str) -> bool:
        return bool(name == "sftp" and super().check_channel_subsystem_request(channel, name))


class _Handle(paramiko.SFTPHandle):
    def __init__(self, fh: Any, flags: int, path: Path) -> None:
        super().__init__(flags)
        self.readfile = fh
        self.writefile = fh
        self.path = path

    def stat(self) -> paramiko.SFTPAttributes | int:
        try:
            return paramiko.SFTPAttributes.from_stat(os.fstat(self.readfile.fileno()))
        except OSError as exc:
            return _errno(exc)

    def chattr(self, attr: paramiko.SFTPAttributes) -> int:
        return _chattr(self.path, attr)


def _errno(exc: OSError) -> int:
    return paramiko.SFTPServer.convert_errno(exc.errno) if exc.errno else SFTP_FAILURE


def _chattr(path: Path, attr: paramiko.SFTPAttributes) -> int:
    """chmod, utime and truncate; ownership changes are ignored (everything is root's)."""
    try:
        if attr.st_mode is not None:
            os.chmod(path, attr.st_mode & 0o7777)
        if attr.st_atime is not None and attr.st_mtime is not None:
            os.utime(path, (attr.st_atime, attr.st_mtime))
        if attr.st_size is not None:
            with path.open("r+b") as fh:
                fh.truncate(attr.st_size)
    except OSError as exc:
        return _errno(exc)
    return SFTP_OK


class SandboxSFTP(paramiko.SFTPServerInterface):
    """SFTP over a node's sandbox: absolute node paths, no way out of the node's root."""

    def __init__(self, server: _Interface, *args: Any, **kwargs: Any) -> None:
        super().__init__(server, *args, **kwargs)
        self.node = server.node

    def _path(self, path: str) -> Path:
        return self.node.host_path(path)

    def _guard(self, op: Any, *args: Any) -> Any:
        try:
            return op(*args)
        except SandboxError:
            return SFTP_PERMISSION_DENIED
        except FileNotFoundError:
            return SFTP_NO_SUCH_FILE
        except OSError as exc:
            return _errno(exc)

    def canonicalize(self, path: str) -> str:
        full = path if path.startswith("/") else posixpath.join("/root", path)
        return posixpath.normpath(full).replace("//", "/")

    def list_folder(self, path: str) -> list[paramiko.SFTPAttributes] | int:
        def op() -> list[paramiko.SFTPAttributes]:
            folder = self._path(path)
            out = []
            for name in sorted(os.listdir(folder)):
                attr = paramiko.SFTPAttributes.from_stat(os.lstat(folder / name))
                attr.filename = name
                out.append(attr)
            return out

        result: list[paramiko.SFTPAttributes] | int = self._guard(op)
        return result

    def stat(self, path: str) -> paramiko.SFTPAttributes | int:
        result: paramiko.SFTPAttributes | int = self._guard(
            lambda: paramiko.SFTPAttributes.from_stat(os.stat(self._path(path))))
        return result

    def lstat(self, path: str) -> paramiko.SFTPAttributes | int:
        result: paramiko.SFTPAttributes | int = self._guard(
            lambda: paramiko.SFTPAttributes.from_stat(os.lstat(self._path(path))))
        return result

    def open(self, path: str, flags: int, attr: paramiko.SFTPAttributes) -> paramiko.SFTPHandle | int:
        def op() -> paramiko.SFTPHandle:
            host = self._path(path)
            mode = attr.st_mode & 0o777 if attr is not None and attr.st_mode is not None else 0o644
            fd = os.open(host, flags | getattr(os, "O_BINARY", 0), mode)
            if flags & os.O_WRONLY:
                fmode = "ab" if flags & os.O_APPEND else "wb"
            elif flags & os.O_RDWR:
                fmode = "a+b" if flags & os.O_APPEND else "r+b"
            else:
                fmode = "rb"
            return _Handle(os.fdopen(fd, fmode), flags, host)

        result: paramiko.SFTPHandle | int = self._guard(op)
        return result

    def _do(self, op: Any, *paths: str) -> int:
        """Run a filesystem call on sandbox paths; SFTP_OK or the error code."""
        def call() -> int:
            op(*(self._path(p) for p in paths))
            return SFTP_OK

        result: int = self._guard(call)
        return result

    def remove(self, path: str) -> int:
        return self._do(os.remove, path)

    def rename(self, oldpath: str, newpath: str) -> int:
        def op() -> int:
            src, dst = self._path(oldpath), self._path(newpath)
            if dst.exists():  # SFTP v3 rename does not overwrite
                return SFTP_FAILURE
            os.rename(src, dst)
            return SFTP_OK

        result: int = self._guard(op)
        return result

    def posix_rename(self, oldpath: str, newpath: str) -> int:
        return self._do(os.replace, oldpath, newpath)

    def mkdir(self, path: str, attr: paramiko.SFTPAttributes) -> int:
        return self._do(os.mkdir, path)

    def rmdir(self, path: str) -> int:
        return self._do(os.rmdir, path)

    def chattr(self, path: str, attr: paramiko.SFTPAttributes) -> int:
        def op() -> int:
            return _chattr(self._path(path), attr)

        result: int = self._guard(op)
        return result

    def symlink(self, target_path: str, path: str) -> int:
        # A link could point out of the sandbox; simulated nodes have no need for them.
        return SFTP_OP_UNSUPPORTED

    def readlink(self, path: str) -> str | int:
        return SFTP_OP_UNSUPPORTED


class NodeSSHServer:
    """A node's SSH endpoint on 127.0.0.1; `stop()` makes its port refuse connections."""

    def __init__(self, node: SimNode, host_key: paramiko.PKey, client_key: paramiko.PKey,
                 port: int = 0) -> None:
        self.node = node
        self.host_key = host_key
        self.client_key = client_key
        self._requested_port = port
        self.port = 0
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._transports: list[paramiko.Transport] = []
        self._lock = threading.Lock()

    def start(self) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # A restart (a node powered back on) keeps the port the inventory names.
        sock.bind(("127.0.0.1", self.port or self._requested_port))
        sock.listen(32)
        sock.settimeout(0.2)
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        self._stopping.clear()
        self._thread = threading.Thread(target=self._accept_loop, name=f"sshd-{self.node.name}", daemon=True)
        self._thread.start()
        return self.port

    @property
    def listening(self) -> bool:
        return self._sock is not None

    def stop(self) -> None:
        """Close the listener and every open connection."""
        self._stopping.set()
        if self._sock is not None:
            # shutdown() wakes the blocked accept() at once; close() alone would not.
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        with self._lock:
            transports, self._transports = self._transports, []
        for t in transports:
            t.close()

    def _accept_loop(self) -> None:
        sock = self._sock
        while sock is not None and not self._stopping.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name=f"sshd-{self.node.name}-conn",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        transport = paramiko.Transport(conn)
        transport.add_server_key(self.host_key)
        transport.set_subsystem_handler("sftp", paramiko.SFTPServer, SandboxSFTP)
        with self._lock:
            if self._stopping.is_set():
                transport.close()
                return
            self._transports = [t for t in self._transports if t.is_active()]
            self._transports.append(transport)
        try:
            transport.start_server(server=_Interface(self))
        except (paramiko.SSHException, EOFError, OSError) as exc:
            log.debug("sshd %s: negotiation failed: %s", self.node.name, exc)
            transport.close()

    def exec_on(self, channel: paramiko.Channel, command: str) -> None:
        try:
            result = run_command(self.node, command)
            out = result.stdout.encode("utf-8")
            err = result.stderr.encode("utf-8")
            for i in range(0, len(out), OUTPUT_CHUNK):
                channel.sendall(out[i:i + OUTPUT_CHUNK])
            if err:
                channel.sendall_stderr(err)
            channel.send_exit_status(result.exit_status)
            channel.shutdown_write()
            # The client closes the channel once it has read everything. Closing it from
            # here could overtake our reply to its exec request, which it would read as a
            # failed command; so only a client that went quiet is cut off.
            deadline = time.monotonic() + CLIENT_CLOSE_WAIT_S
            while not channel.closed and time.monotonic() < deadline:
                time.sleep(0.005)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            log.debug("sshd %s: exec channel lost: %s", self.node.name, exc)
        finally:
            channel.close()
