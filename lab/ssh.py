"""Every remote command and file copy the platform makes goes through this module.

It is the only place that imports paramiko. Host keys are checked against the lab's
`known_hosts` (an unknown or changed key is refused, never learned); commands are
argv lists quoted here, so nothing a customer wrote is ever interpreted by a shell;
every call has its own deadline; output is drained while the command runs, because
waiting for the exit status first deadlocks once the channel window fills.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import io
import logging
import secrets
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import paramiko

from lab.inventory import Inventory, Node

log = logging.getLogger(__name__)

T = TypeVar("T")


class SSHError(Exception):
    """A remote operation that failed; the message names the node."""

    transient = False

    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"{node}: {message}")
        self.node = node


class HostKeyError(SSHError):
    """The node offered a host key that known_hosts does not hold (unknown or changed)."""

    def __init__(self, node: str, host: str, fingerprint: str, *, changed: bool) -> None:
        what = "CHANGED host key" if changed else "unknown host key"
        super().__init__(
            node,
            f"refused {what} for {host}, offered {fingerprint}; if the node was reinstalled, "
            "verify the fingerprint out of band and update the inventory's known_hosts",
        )
        self.host = host
        self.fingerprint = fingerprint
        self.changed = changed


class AuthError(SSHError):
    """The node refused our key."""


class Unreachable(SSHError):
    """The node could not be reached (refused, reset, timed out), even after retries."""

    transient = True


class CommandTimeout(SSHError):
    """A command did not finish before its deadline; the channel was closed."""

    transient = True


@dataclass(frozen=True)
class Result:
    node: str
    argv: tuple[str, ...]
    exit_status: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _RefuseUnknownKeys(paramiko.MissingHostKeyPolicy):
    def __init__(self, node: str) -> None:
        self.node = node

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise HostKeyError(self.node, hostname, fingerprint(key), changed=False)


# Failures worth another try: the node may be rebooting, the network hiccuped.
_TRANSIENT = (
    ConnectionRefusedError,
    ConnectionResetError,
    ConnectionAbortedError,
    TimeoutError,
    socket.timeout,
    EOFError,
    paramiko.ssh_exception.NoValidConnectionsError,
)


# What a healthy node answers about a path (SFTP status errors arrive as OSError): no
# retry will change it, and it says nothing about the network.
_PATH_ERRNOS = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.EEXIST, errno.ENOTDIR, errno.EISDIR,
                errno.ENOSPC}


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, (paramiko.AuthenticationException, paramiko.BadHostKeyException, HostKeyError)):
        return False
    if isinstance(exc, OSError) and exc.errno in _PATH_ERRNOS:
        return False
    if isinstance(exc, _TRANSIENT):
        return True
    # paramiko reports a peer that closed during the handshake as a bare SSHException.
    if isinstance(exc, paramiko.SSHException):
        text = str(exc).lower()
        return any(s in text for s in ("banner", "reset", "closed", "eof", "timeout", "not active"))
    return isinstance(exc, OSError)


class NodeConnection:
    """One node's SSH connection, opened lazily and reopened when it drops."""

    def __init__(
        self,
        node: Node,
        known_hosts: Path,
        *,
        connect_timeout: float = 10.0,
        keepalive_s: int = 15,
        retries: int = 4,
        backoff_s: float = 0.5,
    ) -> None:
        self.node = node
        self.known_hosts = Path(known_hosts)
        self.connect_timeout = connect_timeout
        self.keepalive_s = keepalive_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    # -- connection -------------------------------------------------------------
    def _open(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if not self.known_hosts.exists():
            raise HostKeyError(self.node.name, self.node.host, "(no known_hosts file)", changed=False)
        client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(_RefuseUnknownKeys(self.node.name))
        try:
            client.connect(
                self.node.host,
                port=self.node.port,
                username=self.node.user,
                key_filename=str(self.node.key_file),
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                allow_agent=False,
                look_for_keys=False,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(self.node.name, self.node.host, fingerprint(exc.key), changed=True) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            raise AuthError(self.node.name, f"key {self.node.key_file} refused for user "
                            f"{self.node.user}: {exc}") from exc
        except BaseException:
            client.close()
            raise
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(self.keepalive_s)
        return client

    def _with_retries(self, what: str, op: Callable[[], T]) -> T:
        delay = self.backoff_s
        for attempt in range(1, self.retries + 1):
            try:
                return op()
            except SSHError:
                raise
            except Exception as exc:
                if not _is_transient(exc):
                    raise SSHError(self.node.name, f"{what} failed: {exc}") from exc
                self._drop()
                if attempt == self.retries:
                    raise Unreachable(
                        self.node.name,
                        f"{what} failed after {attempt} attempts "
                        f"({self.node.host}:{self.node.port}): {exc or type(exc).__name__}",
                    ) from exc
                log.info("ssh %s: %s failed (%s); retrying in %.1fs", self.node.name, what, exc, delay)
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            if self._client is not None:
                transport = self._client.get_transport()
                if transport is not None and transport.is_active():
                    return transport
                self._drop_locked()
            self._client = self._open()
            transport = self._client.get_transport()
            assert transport is not None
            return transport

    def _drop_locked(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _drop(self) -> None:
        with self._lock:
            self._drop_locked()

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> NodeConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commands -----------------------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: bytes | None = None,
        on_output: Callable[[str, bytes], None] | None = None,
        idempotent: bool = True,
    ) -> Result:
        """Run argv on the node (quoted, no shell interpretation) within `timeout` seconds.

        A connection that dropped before the command started is reopened and the
        command sent again; after it started, only an `idempotent` command is.
        `on_output(stream, data)` receives output as it arrives ("stdout"/"stderr").
        """
        if not argv:
            raise ValueError("argv must not be empty")
        command = shlex.join(argv)
        started = {"sent": False}

        def attempt() -> Result:
            started["sent"] = False
            transport = self._transport()
            channel = transport.open_session(timeout=self.connect_timeout)
            try:
                channel.exec_command(command)
                started["sent"] = True
                return self._drain(channel, tuple(argv), timeout, stdin, on_output)
            finally:
                channel.close()

        if idempotent:
            return self._with_retries(f"running {argv[0]!r}", attempt)

        def first_send_only() -> Result:
            try:
                return attempt()
            except Exception as exc:
                if started["sent"] and _is_transient(exc):
                    # The command may have run; don't run it twice.
                    raise SSHError(self.node.name, f"connection lost while running {argv[0]!r}: "
                                   f"{exc}") from exc
                raise

        return self._with_retries(f"running {argv[0]!r}", first_send_only)

    def _drain(
        self,
        channel: paramiko.Channel,
        argv: tuple[str, ...],
        timeout: float,
        stdin: bytes | None,
        on_output: Callable[[str, bytes], None] | None,
    ) -> Result:
        deadline = time.monotonic() + timeout
        out = io.BytesIO()
        err = io.BytesIO()
        if stdin is not None:
            channel.sendall(stdin)
        channel.shutdown_write()
        channel.setblocking(False)
        while True:
            progressed = False
            while channel.recv_ready():
                data = channel.recv(65536)
                if not data:
                    break
                out.write(data)
                progressed = True
                if on_output:
                    on_output("stdout", data)
            while channel.recv_stderr_ready():
                data = channel.recv_stderr(65536)
                if not data:
                    break
                err.write(data)
                progressed = True
                if on_output:
                    on_output("stderr", data)
            drained = not channel.recv_ready() and not channel.recv_stderr_ready()
            # paramiko's exit_status_ready() is also true for a channel that merely closed,
            # as every channel does when the connection drops: only a real exit status
            # (0 or more; paramiko leaves -1 otherwise) means the command finished.
            exited = channel.status_event.is_set() and channel.exit_status >= 0
            if exited and drained and (channel.eof_received or channel.closed):
                break
            if channel.closed and drained and not exited:
                # Closed without an exit status: either the connection dropped (paramiko
                # closes the channels just before it marks the transport inactive, so give
                # it a moment) or the command was killed by a signal (paramiko ignores
                # exit-signal), which is reported as exit status -1.
                transport = channel.get_transport()
                settle = time.monotonic() + 1.0
                while transport is not None and transport.is_active() and time.monotonic() < settle:
                    time.sleep(0.02)
                if transport is None or not transport.is_active():
                    raise EOFError("connection dropped while the command ran")
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(
                    self.node.name, f"{shlex.join(argv)[:120]} did not finish within {timeout:g} s"
                )
            transport = channel.get_transport()
            if transport is None or not transport.is_active():
                raise EOFError("connection dropped while the command ran")
            if not progressed:
                select.select([channel], [], [], min(remaining, 0.5))
        return Result(self.node.name, argv, channel.recv_exit_status(), out.getvalue(), err.getvalue())

    # -- files --------------------------------------------------------------------
    def _sftp(self, what: str, op: Callable[[paramiko.SFTPClient], T]) -> T:
        def attempt() -> T:
            transport = self._transport()
            sftp = paramiko.SFTPClient.from_transport(transport)
            if sftp is None:
                raise EOFError("could not open an SFTP channel")
            try:
                sftp.get_channel().settimeout(max(self.connect_timeout, 30.0))  # type: ignore[union-attr]
                return op(sftp)
            finally:
                sftp.close()

        return self._with_retries(what, attempt)

    def makedirs(self, *remote_dirs: str) -> None:
        """Create each folder and its parents, in one SFTP session. A folder that is already
        there costs one round trip (its own stat), not one per path component: on a
        simulated lab every round trip is stretched by the dilation into lab time."""
        def make(sftp: paramiko.SFTPClient, remote_dir: str) -> None:
            try:
                sftp.stat(remote_dir)
                return
            except FileNotFoundError:
                pass
            path = ""
            for part in [p for p in remote_dir.split("/") if p]:
                path += "/" + part
                try:
                    sftp.stat(path)
                except FileNotFoundError:
                    sftp.mkdir(path)

        def op(sftp: paramiko.SFTPClient) -> None:
            for remote_dir in remote_dirs:
                make(sftp, remote_dir)

        self._sftp(f"creating {', '.join(remote_dirs)}", op)

    def put_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o644) -> None:
        def op(sftp: paramiko.SFTPClient) -> None:
            # A name of its own: two sessions writing the same file at once (a job pushing
            # the agent while the lab-health poll does) must not rename each other's part.
            tmp = f"{remote_path}.{secrets.token_hex(6)}.part"
            with sftp.open(tmp, "wb") as fh:
                fh.write(data)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, remote_path)

        self._sftp(f"writing {remote_path}", op)

    def get_bytes(self, remote_path: str) -> bytes:
        def op(sftp: paramiko.SFTPClient) -> bytes:
            with sftp.open(remote_path, "rb") as fh:
                return fh.read()

        return self._sftp(f"reading {remote_path}", op)

class LabSSH:
    """Connections to every node of an inventory, and the same command on many at once."""

    def __init__(self, inventory: Inventory, **options: float) -> None:
        self.inventory = inventory
        self.connections = {
            n.name: NodeConnection(n, inventory.known_hosts, **options)  # type: ignore[arg-type]
            for n in inventory.nodes
        }

    def __getitem__(self, name: str) -> NodeConnection:
        return self.connections[name]

    def each(
        self, fn: Callable[[NodeConnection], T], nodes: Iterable[str] | None = None
    ) -> dict[str, T | Exception]:
        """Call fn on each node's connection concurrently; exceptions are returned, not raised."""
        names = list(nodes) if nodes is not None else list(self.connections)

        def call(name: str) -> T | Exception:
            try:
                return fn(self.connections[name])
            except Exception as exc:
                return exc

        with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            return dict(zip(names, pool.map(call, names), strict=True))

    def run_all(
        self, argv: Sequence[str], *, timeout: float, nodes: Iterable[str] | None = None
    ) -> dict[str, Result | Exception]:
        return self.each(lambda c: c.run(argv, timeout=timeout), nodes)

    def close(self) -> None:
        for conn in self.connections.values():
            conn.close()
