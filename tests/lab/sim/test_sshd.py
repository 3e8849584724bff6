"""The simulated nodes' SSH servers, driven by the platform's own SSH layer (lab/ssh.py)
and a plain paramiko client: keys, commands, SFTP and its sandbox."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest

from lab.agent_push import agent_sha256, agent_source
from lab.inventory import Node, load_inventory
from lab.sim.lab import SimLab, write_ed25519_key
from lab.ssh import AuthError, NodeConnection, Unreachable

REPO = Path(__file__).resolve().parents[3]


def node_of(lab: SimLab, name: str = "spark-01") -> tuple[Node, Path]:
    inventory = load_inventory(lab.inventory_path)
    return inventory.node(name), inventory.known_hosts


def connect(lab: SimLab, name: str = "spark-01", **options: float) -> NodeConnection:
    node, known_hosts = node_of(lab, name)
    return NodeConnection(node, known_hosts, **options)


def sftp(lab: SimLab, name: str = "spark-01") -> tuple[paramiko.SSHClient, paramiko.SFTPClient]:
    node, known_hosts = node_of(lab, name)
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(node.host, port=node.port, username="root", key_filename=str(node.key_file),
                   allow_agent=False, look_for_keys=False, timeout=10)
    return client, client.open_sftp()


def push_agent(conn: NodeConnection) -> None:
    conn.makedirs(conn.node.work_dir)
    conn.put_bytes(agent_source(), conn.node.agent_path, mode=0o755)


def test_the_client_key_runs_the_uploaded_agent(sim_lab: SimLab) -> None:
    with connect(sim_lab) as conn:
        push_agent(conn)
        res = conn.run(["python3", conn.node.agent_path, "self-check", "--json"], timeout=20)
    assert res.exit_status == 0, res.err
    assert json.loads(res.out)["data"]["sha256"] == agent_sha256()


def test_another_key_is_refused(sim_lab: SimLab, tmp_path: Path) -> None:
    import dataclasses

    node, known_hosts = node_of(sim_lab)
    write_ed25519_key(tmp_path / "intruder")
    intruder = dataclasses.replace(node, key_file=tmp_path / "intruder")
    with pytest.raises(AuthError), NodeConnection(intruder, known_hosts, retries=1) as conn:
        conn.run(["true"], timeout=10)


def test_every_node_has_its_own_host_key_in_known_hosts(sim_lab: SimLab) -> None:
    lines = sim_lab.known_hosts_path.read_text().splitlines()
    assert len(lines) == 8 and len({line.split()[2] for line in lines}) == 8
    assert all(line.startswith("[127.0.0.1]:") and " ssh-ed25519 " in line for line in lines)


def test_a_command_other_than_the_agent_exits_127(sim_lab: SimLab) -> None:
    with connect(sim_lab) as conn:
        res = conn.run(["ls", "-l", "/"], timeout=20)
    assert res.exit_status == 127
    assert res.err == "sim: command not supported on a simulated node: ls -l /\n"


def test_the_agent_must_be_uploaded_before_it_runs(sim_lab: SimLab) -> None:
    with connect(sim_lab) as conn:
        res = conn.run(["python3", "/var/lib/diag/agent.py", "facts", "--json"], timeout=20)
    assert res.exit_status == 2
    assert "python3: can't open file '/var/lib/diag/agent.py'" in res.err


def test_sftp_refuses_paths_that_climb_out_of_the_node(sim_lab: SimLab) -> None:
    client, sftp_client = sftp(sim_lab)
    with client, sftp_client:
        with pytest.raises(PermissionError):
            sftp_client.open("/../../../etc/hostname")
        with pytest.raises(PermissionError):
            sftp_client.put(__file__, "/../escaped.py")
        with pytest.raises(OSError):
            sftp_client.symlink("/etc/passwd", "/var/lib/diag/passwd")
    assert not (sim_lab.state_dir / "nodes" / "escaped.py").exists()


def test_sftp_writes_renames_lists_and_removes_inside_the_sandbox(sim_lab: SimLab) -> None:
    client, s = sftp(sim_lab, "spark-02")
    with client, s:
        s.mkdir("/var/lib/diag/x")
        with s.open("/var/lib/diag/x/a.part", "wb") as fh:
            fh.write(b"hello")
        s.chmod("/var/lib/diag/x/a.part", 0o600)
        s.posix_rename("/var/lib/diag/x/a.part", "/var/lib/diag/x/a")
        assert s.listdir("/var/lib/diag/x") == ["a"]
        assert s.stat("/var/lib/diag/x/a").st_size == 5
        with s.open("/var/lib/diag/x/a", "ab") as fh:
            fh.write(b"!")
        with s.open("/var/lib/diag/x/a", "rb") as fh:
            assert fh.read() == b"hello!"
        s.remove("/var/lib/diag/x/a")
        s.rmdir("/var/lib/diag/x")
        with pytest.raises(FileNotFoundError):
            s.stat("/var/lib/diag/x")
    host = sim_lab.node("spark-02").host_path("/var/lib/diag")
    assert host.is_dir() and str(host).startswith(str(sim_lab.state_dir))


def test_large_output_is_streamed_whole(sim_lab: SimLab) -> None:
    log = sim_lab.head.host_path("/var/lib/diag/logs/big.log")
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"line {i:07d} " + "x" * 100 + "\n" for i in range(30000)))
    with connect(sim_lab) as conn:
        push_agent(conn)
        res = conn.run(["python3", conn.node.agent_path, "logs", "--file", "/var/lib/diag/logs/big.log",
                        "--since", "0", "--max", str(8 << 20), "--json"], timeout=60)
    assert res.exit_status == 0
    assert json.loads(res.out)["data"]["text"] == log.read_text()


def test_a_node_powered_off_refuses_connections(sim_lab: SimLab) -> None:
    sim_lab.set_node_down("spark-03")
    with pytest.raises(Unreachable), connect(sim_lab, "spark-03", retries=1) as conn:
        conn.run(["true"], timeout=10)
    sim_lab.set_node_down("spark-03", down=False)
    with connect(sim_lab, "spark-03") as conn:
        assert conn.run(["true"], timeout=10).exit_status == 127


def test_lab_facts_works_unchanged_against_the_simulated_lab(sim_lab: SimLab) -> None:
    res = subprocess.run([sys.executable, "-m", "lab", "facts", "--inventory", str(sim_lab.inventory_path)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    facts = json.loads(res.stdout)
    assert sorted(facts) == [f"spark-0{i}" for i in range(1, 9)]
    assert facts["spark-04"]["gpus"][0]["name"] == "NVIDIA GB10"
    calls = [json.loads(line) for line in sim_lab.calls_log_path.read_text().splitlines()]
    assert sorted(c["verb"] for c in calls) == ["facts"] * 8 + ["self-check"] * 8
