"""facts' network part (NICs with their IPv4 addresses and default route, RDMA devices
with their net device and port states) read by the real agent from a fake /sys and
/proc tree laid out as on a GB10 node, and from this machine's own."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from lab.agent import AgentResponseError, validate_response
from tests.lab.agent.conftest import run_agent

MGMT, DATA0, DATA1 = "enP7s7", "enp1s0f0np0", "enP2p1s0f0np0"


def route_hex(dotted: str) -> str:
    """An address as /proc/net/route prints it: the network-order bytes read as one
    native-endian word."""
    return f"{struct.unpack('=I', socket.inet_aton(dotted))[0]:08X}"


def route_line(nic: str, dest: str, gateway: str, flags: int, mask: str) -> str:
    return (f"{nic}\t{route_hex(dest)}\t{route_hex(gateway)}\t{flags:04X}\t0\t0\t0\t"
            f"{route_hex(mask)}\t0\t0\t0")


ROUTE_HEADER = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"

FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 10.100.0.0/24 2 0 2
        |-- 10.100.0.0
           /24 link UNICAST
        |-- 10.100.0.21
           /32 host LOCAL
        |-- 10.100.0.255
           /32 link BROADCAST
     +-- 10.101.0.0/16 2 0 2
        |-- 10.101.3.21
           /32 host LOCAL
     +-- 127.0.0.0/8 2 0 2
        |-- 127.0.0.1
           /32 host LOCAL
     +-- 192.168.1.0/24 2 0 2
        |-- 192.168.1.0
           /24 link UNICAST
        |-- 192.168.1.21
           /32 host LOCAL
        |-- 192.168.1.255
           /32 link BROADCAST
Local:
  +-- 0.0.0.0/0 3 0 5
     |-- 10.100.0.21
        /32 host LOCAL
     |-- 10.101.3.21
        /32 host LOCAL
     |-- 127.0.0.1
        /32 host LOCAL
     |-- 172.17.0.1
        /32 host LOCAL
     |-- 192.168.1.21
        /32 host LOCAL
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_nic(sys_root: Path, name: str, speed: str, operstate: str, mtu: int = 1500) -> None:
    base = sys_root / "class" / "net" / name
    write(base / "speed", f"{speed}\n")
    write(base / "operstate", f"{operstate}\n")
    write(base / "mtu", f"{mtu}\n")


def fake_rdma(sys_root: Path, name: str, net_device: str | None, states: dict[int, str | None]) -> None:
    base = sys_root / "class" / "infiniband" / name
    (base / "device" / "net").mkdir(parents=True)
    if net_device is not None:
        (base / "device" / "net" / net_device).mkdir()
    for port, state in states.items():
        (base / "ports" / str(port)).mkdir(parents=True)
        if state is not None:
            write(base / "ports" / str(port) / "state", f"{state}\n")


def spark_tree(root: Path) -> dict[str, str]:
    """A GB10 node's /sys and /proc: management NIC with the default route, two RoCE data
    NICs (one port down), docker's bridge, and an RDMA device with no net device."""
    sys_root, proc_root = root / "sys", root / "proc"
    fake_nic(sys_root, "lo", "0", "unknown", 65536)
    fake_nic(sys_root, MGMT, "10000", "up")
    fake_nic(sys_root, DATA0, "100000", "up")
    fake_nic(sys_root, DATA1, "100000", "up")
    fake_nic(sys_root, "docker0", "-1", "down")
    fake_rdma(sys_root, "rocep1s0f0", DATA0, {1: "4: ACTIVE"})
    fake_rdma(sys_root, "roceP2p1s0f0", DATA1, {1: "1: DOWN"})
    fake_rdma(sys_root, "mlx5_2", None, {2: None, 1: "7: SOMETHING_NEW"})
    write(proc_root / "meminfo", "MemTotal:       127592908 kB\nMemAvailable:   120000000 kB\n")
    write(proc_root / "net" / "fib_trie", FIB_TRIE)
    write(proc_root / "net" / "route", "\n".join([
        ROUTE_HEADER,
        route_line(MGMT, "0.0.0.0", "192.168.1.1", 0x3, "0.0.0.0"),
        route_line(MGMT, "192.168.1.0", "0.0.0.0", 0x1, "255.255.255.0"),
        route_line(DATA0, "10.100.0.0", "0.0.0.0", 0x1, "255.255.255.0"),
        route_line(DATA1, "10.101.0.0", "0.0.0.0", 0x1, "255.255.0.0"),
        route_line("docker0", "172.17.0.0", "0.0.0.0", 0x1, "255.255.0.0"),
        route_line("docker0", "0.0.0.0", "172.17.0.254", 0x2, "0.0.0.0"),  # not up: no route
    ]) + "\n")
    return {**os.environ, "LAB_AGENT_SYS_ROOT": str(sys_root), "LAB_AGENT_PROC_ROOT": str(proc_root)}


@pytest.fixture(scope="module")
def spark_facts(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("node")
    return run_agent("facts", "--model-dir", str(root), env=spark_tree(root)).data


def test_it_reads_each_nic_from_the_sys_tree_it_is_pointed_at(spark_facts: dict) -> None:
    by_name = {n["name"]: n for n in spark_facts["nics"]}
    assert sorted(by_name) == sorted([MGMT, DATA0, DATA1, "docker0"])
    assert (by_name[MGMT]["speed_mbps"], by_name[DATA0]["speed_mbps"]) == (10000, 100000)
    assert by_name["docker0"]["speed_mbps"] is None and by_name["docker0"]["operstate"] == "down"
    assert spark_facts["mem_total_kib"] == 127592908


def test_it_puts_each_local_address_on_the_nic_whose_connected_route_holds_it(spark_facts: dict) -> None:
    ipv4 = {n["name"]: n["ipv4"] for n in spark_facts["nics"]}
    assert ipv4 == {MGMT: ["192.168.1.21/24"], DATA0: ["10.100.0.21/24"], DATA1: ["10.101.3.21/16"],
                    "docker0": ["172.17.0.1/16"]}


def test_only_the_management_nic_holds_the_default_route(spark_facts: dict) -> None:
    assert [n["name"] for n in spark_facts["nics"] if n["default_route"]] == [MGMT]


def test_it_lists_the_rdma_devices_with_their_net_device_and_port_states(spark_facts: dict) -> None:
    assert spark_facts["rdma"] == [
        {"name": "mlx5_2", "net_device": None, "ports": [{"port": 1, "state": "unknown"},
                                                         {"port": 2, "state": "unknown"}]},
        {"name": "roceP2p1s0f0", "net_device": DATA1, "ports": [{"port": 1, "state": "DOWN"}]},
        {"name": "rocep1s0f0", "net_device": DATA0, "ports": [{"port": 1, "state": "ACTIVE"}]},
    ]


def test_a_node_without_routes_addresses_or_rdma_reports_empty_lists(tmp_path: Path) -> None:
    fake_nic(tmp_path / "sys", "eth0", "1000", "up")
    (tmp_path / "proc").mkdir()
    env = {**os.environ, "LAB_AGENT_SYS_ROOT": str(tmp_path / "sys"),
           "LAB_AGENT_PROC_ROOT": str(tmp_path / "proc")}
    data = run_agent("facts", "--model-dir", str(tmp_path), env=env).data
    assert data["nics"] == [{"name": "eth0", "speed_mbps": 1000, "mtu": 1500, "operstate": "up",
                             "ipv4": [], "default_route": False}]
    assert data["rdma"] == []


def _kernel_ipv4() -> dict[str, list[str]]:
    """This machine's addresses as `ip` reports them, read here independently of the agent."""
    ip = shutil.which("ip")
    if ip is None:
        pytest.skip("no `ip` command on this machine")
    links = json.loads(subprocess.run([ip, "-j", "-4", "addr", "show"], capture_output=True, text=True,
                                      check=True).stdout)
    return {link["ifname"]: [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])]
            for link in links if link.get("addr_info")}


def _default_route_nics() -> set[str]:
    nics = set()
    for line in Path("/proc/net/route").read_text().splitlines()[1:]:
        f = line.split()
        if int(f[1], 16) == 0 and int(f[7], 16) == 0 and int(f[3], 16) & 1:
            nics.add(f[0])
    return nics


@pytest.mark.parametrize("with_ip_command", [True, False], ids=["ip", "fib_trie"])
def test_on_this_machine_addresses_and_default_route_match_the_kernel(
        with_ip_command: bool, tmp_path: Path) -> None:
    expected = _kernel_ipv4()
    env = None
    if not with_ip_command:  # a PATH without `ip`: the agent falls back to /proc/net/fib_trie
        (tmp_path / "bin").mkdir()
        env = {**os.environ, "PATH": str(tmp_path / "bin")}
    data = run_agent("facts", "--model-dir", str(tmp_path), env=env).data
    for nic in data["nics"]:
        assert nic["ipv4"] == expected.get(nic["name"], []), nic
    assert {n["name"] for n in data["nics"] if n["default_route"]} == _default_route_nics() - {"lo"}


def test_the_schema_rejects_a_nic_without_its_addresses_and_an_unknown_port_state(spark_facts: dict) -> None:
    good = {"schema": "lab.agent/1", "verb": "facts", "ok": True, "data": spark_facts}
    validate_response(good)
    nic = {k: v for k, v in spark_facts["nics"][0].items() if k != "ipv4"}
    with pytest.raises(AgentResponseError, match="ipv4"):
        validate_response({**good, "data": {**spark_facts, "nics": [nic]}})
    device = {"name": "rocep1s0f0", "net_device": DATA0, "ports": [{"port": 1, "state": "4: ACTIVE"}]}
    with pytest.raises(AgentResponseError, match="rdma"):
        validate_response({**good, "data": {**spark_facts, "rdma": [device]}})
