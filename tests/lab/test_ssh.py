"""lab/ssh.py against a real OpenSSH server on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lab.ssh import AuthError, CommandTimeout, HostKeyError, LabSSH, NodeConnection, SSHError

from .conftest import Sshd, keygen

pytestmark = pytest.mark.ssh
PY = sys.executable


def connect(sshd: Sshd, **options: float) -> NodeConnection:
    inv = sshd.inventory()
    return NodeConnection(inv.nodes[0], inv.known_hosts, **options)


def test_it_runs_a_command_and_captures_status_and_both_streams(sshd: Sshd) -> None:
    with connect(sshd) as conn:
        res = conn.run([PY, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                       timeout=20)
    assert res.exit_status == 3
    assert res.out == "out\n"
    assert res.err == "err\n"


def test_it_refuses_a_changed_host_key_naming_host_and_fingerprint(sshd: Sshd, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    keygen(other)
    pub = other.with_suffix(".pub").read_text().split()
    sshd.known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {pub[0]} {pub[1]}\n")
    offered = subprocess.run(["ssh-keygen", "-lf", str(sshd.host_key.with_suffix(".pub"))],
                             capture_output=True, text=True, check=True).stdout.split()[1]
    with connect(sshd) as conn, pytest.raises(HostKeyError) as info:
        conn.run(["true"], timeout=10)
    assert info.value.changed
    assert "127.0.0.1" in str(info.value)
    assert offered in str(info.value)


def test_it_refuses_an_unknown_host(sshd: Sshd) -> None:
    sshd.known_hosts.write_text("")
    started = time.monotonic()
    with connect(sshd) as conn, pytest.raises(HostKeyError) as info:
        conn.run(["true"], timeout=10)
    assert not info.value.changed
    assert "unknown host key" in str(info.value)
    assert time.monotonic() - started < 5, "a host-key refusal must not be retried"


def test_it_does_not_retry_a_refused_key(sshd: Sshd, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    keygen(stranger)
    inv = sshd.inventory(key_file=str(stranger))
    started = time.monotonic()
    with NodeConnection(inv.nodes[0], inv.known_hosts, backoff_s=2.0) as conn, \
            pytest.raises(AuthError):
        conn.run(["true"], timeout=10)
    assert time.monotonic() - started < 2.0


def test_it_times_out_a_command_that_hangs(sshd: Sshd) -> None:
    with connect(sshd) as conn:
        started = time.monotonic()
        with pytest.raises(CommandTimeout) as info:
            conn.run(["sleep", "30"], timeout=1.0, idempotent=False)
        assert time.monotonic() - started < 5
        assert "did not finish within 1 s" in str(info.value)
        # The connection stays usable for the next command.
        assert conn.run(["echo", "still here"], timeout=10).out == "still here\n"


def test_it_reconnects_after_the_connection_dropped(sshd: Sshd) -> None:
    with connect(sshd) as conn:
        assert conn.run(["echo", "one"], timeout=10).ok
        sshd.kill_sessions()
        time.sleep(0.2)
        assert conn.run(["echo", "two"], timeout=10).out == "two\n"


def test_it_retries_a_refused_connection_until_the_node_is_back(sshd: Sshd) -> None:
    sshd.stop()
    restart = threading.Timer(1.0, sshd.start)
    restart.start()
    try:
        with connect(sshd, backoff_s=0.4, retries=6) as conn:
            assert conn.run(["echo", "back"], timeout=10).out == "back\n"
    finally:
        restart.join()


def test_it_gives_up_on_an_unreachable_node_with_a_clear_error(sshd: Sshd) -> None:
    sshd.stop()
    with connect(sshd, backoff_s=0.05, retries=3) as conn, pytest.raises(SSHError) as info:
        conn.run(["true"], timeout=5)
    assert info.value.transient
    assert "after 3 attempts" in str(info.value)


def test_it_neither_hangs_nor_loses_20_mib_of_output(sshd: Sshd) -> None:
    size = 20 * 1024 * 1024
    script = (
        "import sys\n"
        "chunk = bytes(range(256)) * 4096\n"
        f"for i in range({size} // len(chunk)):\n"
        "    sys.stdout.buffer.write(chunk)\n"
        "    if i % 8 == 0: sys.stderr.write('progress %d\\n' % i)\n"
    )
    with connect(sshd) as conn:
        res = conn.run([PY, "-c", script], timeout=120)
    assert res.ok, res.err[-500:]
    assert len(res.stdout) == size
    assert res.stdout == bytes(range(256)) * 4096 * (size // (256 * 4096))
    assert res.err.count("progress") == len(range(0, size // (256 * 4096), 8))


def test_hostile_values_arrive_as_one_literal_argument_and_run_nothing(sshd: Sshd) -> None:
    marker = sshd.root / "owned"
    hostile = ["$(touch owned)", f"; touch {marker}", "`touch owned`", "a b 'c' \"d\"", "~", "*"]
    with connect(sshd) as conn:
        res = conn.run([PY, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *hostile],
                       timeout=20)
    assert json.loads(res.out) == hostile
    assert not marker.exists()
    assert not (Path.home() / "owned").exists()


def test_it_streams_output_as_it_arrives(sshd: Sshd) -> None:
    seen: list[tuple[float, bytes]] = []
    script = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)\n"
    with connect(sshd) as conn:
        conn.run([PY, "-c", script], timeout=20, on_output=lambda s, d: seen.append((time.monotonic(), d)))
    assert b"".join(d for _, d in seen) == b"0\n1\n2\n"
    assert seen[-1][0] - seen[0][0] > 0.4, "output should arrive while the command runs"


def test_it_copies_files_both_ways(sshd: Sshd) -> None:
    data = bytes(range(256)) * 1000
    remote = str(sshd.root / "work" / "sub" / "spec.json")
    with connect(sshd) as conn:
        conn.makedirs(str(sshd.root / "work" / "sub"))
        conn.put_bytes(data, remote, mode=0o600)
        assert conn.get_bytes(remote) == data
    assert Path(remote).read_bytes() == data
    assert Path(remote).stat().st_mode & 0o777 == 0o600


def test_it_creates_several_folders_in_one_call_and_again_without_error(sshd: Sshd) -> None:
    first, second = sshd.root / "work" / "a" / "b", sshd.root / "work" / "logs"
    with connect(sshd) as conn:
        conn.makedirs(str(first), str(second))
        assert first.is_dir() and second.is_dir()
        (first / "kept").write_text("x")
        conn.makedirs(str(first), str(second))  # already there: nothing changes
    assert (first / "kept").read_text() == "x"


def test_it_runs_the_same_command_on_all_nodes_concurrently(sshd: Sshd) -> None:
    inv = sshd.inventory()
    lab = LabSSH(inv)
    try:
        started = time.monotonic()
        results = lab.run_all([PY, "-c", "import time; time.sleep(0.5); print('ok')"], timeout=20)
        assert time.monotonic() - started < 5
        res = results["node-a"]
        assert not isinstance(res, Exception) and res.out == "ok\n"
    finally:
        lab.close()


DROPPED_MID_COMMAND = "import sys, time\nprint('partial', flush=True)\ntime.sleep(2)\nprint('done')\n"


def test_a_connection_lost_mid_command_is_retried_when_the_command_is_idempotent(sshd: Sshd) -> None:
    with connect(sshd, backoff_s=0.2) as conn:
        assert conn.run(["true"], timeout=10).ok
        dropper = threading.Timer(0.8, sshd.kill_sessions)
        dropper.start()
        try:
            res = conn.run([PY, "-c", DROPPED_MID_COMMAND], timeout=30)
        finally:
            dropper.join()
    assert (res.exit_status, res.out) == (0, "partial\ndone\n")


def test_a_connection_lost_mid_command_is_an_error_not_a_result_when_not_idempotent(sshd: Sshd) -> None:
    with connect(sshd, backoff_s=0.2) as conn:
        assert conn.run(["true"], timeout=10).ok
        dropper = threading.Timer(0.8, sshd.kill_sessions)
        dropper.start()
        try:
            with pytest.raises(SSHError, match="connection lost while running"):
                conn.run([PY, "-c", DROPPED_MID_COMMAND], timeout=30, idempotent=False)
        finally:
            dropper.join()


def test_a_missing_remote_file_is_reported_at_once_and_not_as_an_unreachable_node(sshd: Sshd) -> None:
    with connect(sshd, backoff_s=1.0) as conn:
        started = time.monotonic()
        with pytest.raises(SSHError) as info:
            conn.get_bytes(str(sshd.root / "no-such-file"))
    assert not info.value.transient
    assert time.monotonic() - started < 1.0, "a path error must not be retried"
