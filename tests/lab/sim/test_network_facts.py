"""The simulated nodes' network facts (LAB_MODEL.md section 1) and the rendezvous they
explain: each NIC's IPv4 addresses and default route, the RDMA devices named by
rdma-core's rule, and NCCL variables that end the stall only when they name this lab's
own devices -- so a lab whose NICs are named differently needs different values."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from lab.agent import validate_response
from lab.scenarios import scenario_path
from lab.session import LabSession
from lab.sim.engine import EngineProcess
from lab.sim.lab import SimLab
from lab.sim.node import SimNode
from lab.sim.scenario import ScenarioError, load_scenario, parse_scenario, rdma_device_names

from .conftest import launch, load_path_fixed, stop_all, wait_ready

AGENT = "/var/lib/diag/agent.py"
STALL_S = 60
JITTER_S = 2.0
RENAMED = {"mgmt": "eno1", "data": ["enp3s0f0np0", "enp4s0f1np1"], "rdma": ["rocep3s0f0", "rocep4s0f1"]}


def facts_of(node: SimNode) -> dict[str, Any]:
    answer = json.loads(node.run_agent(AGENT, ["facts", "--model-dir", "/models/kimi-k2", "--json"]).stdout)
    validate_response(answer)
    assert answer["ok"], answer
    return dict(answer["data"])


def nccl_env_from_facts(facts: dict[str, Any]) -> dict[str, str]:
    """What the loading triage reads off a node: NCCL's bootstrap socket on the interface
    holding the default route, and the RDMA devices whose net device carries an address."""
    mgmt = next(n["name"] for n in facts["nics"] if n["default_route"])
    addressed = {n["name"] for n in facts["nics"] if n["ipv4"] and not n["default_route"]}
    hcas = [d["name"] for d in facts["rdma"] if d["net_device"] in addressed]
    return {"NCCL_SOCKET_IFNAME": mgmt, "NCCL_IB_HCA": ",".join(hcas)}


def rendezvous_wait_s(head: EngineProcess) -> float:
    return next(p.seconds for p in head.phases if p.name == "rendezvous_wait")


def cold_start(lab: SimLab, config: dict[str, Any]) -> EngineProcess:
    stop_all(lab)
    for node in lab.nodes.values():
        node.drop_caches()
    return wait_ready(launch(lab, config))


def late_nodes(lab: SimLab) -> list[str]:
    """The node the others waited for: its own rendezvous phase was the stalled one."""
    out = []
    for node in lab.nodes.values():
        proc = node.processes[-1]
        if proc.group is not None and proc.rank == proc.group.late_rank and any(
                p.name == "rendezvous_wait" and p.seconds >= STALL_S for p in proc.phases):
            out.append(node.name)
    return sorted(out)


# -- the naming rule and the scenario's default ------------------------------------------------


def test_rdma_devices_take_rdma_cores_name_for_their_net_device() -> None:
    assert rdma_device_names(["enp1s0f0np0", "enP2p1s0f0np0", "enp4s0f1np1"]) == [
        "rocep1s0f0", "roceP2p1s0f0", "rocep4s0f1"]
    # No predictable name to derive from: the driver's own numbering stays.
    assert rdma_device_names(["enp3s0f0np0", "eth2"]) == ["rocep3s0f0", "mlx5_1"]


def test_the_rendezvous_needs_follow_the_scenarios_own_nic_names() -> None:
    s = load_scenario(scenario_path("renamed-nics"))
    assert s.node["nics"]["mgmt"] == RENAMED["mgmt"] and s.node["nics"]["data"] == RENAMED["data"]
    assert s.truth["load"]["rendezvous"] == {
        "needs": {"NCCL_SOCKET_IFNAME": "eno1", "NCCL_IB_HCA": "rocep3s0f0,rocep4s0f1"}, "stall_s": 60.0}


def test_needs_a_scenario_gives_win_over_the_derived_ones() -> None:
    data = yaml.safe_load(scenario_path("renamed-nics").read_text())
    data["truth"]["load"]["rendezvous"]["needs"] = {"NCCL_IB_HCA": "mlx5_0"}
    assert parse_scenario(data).truth["load"]["rendezvous"]["needs"] == {"NCCL_IB_HCA": "mlx5_0"}
    data["truth"]["load"]["rendezvous"]["needs"] = "eno1"
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data)
    assert info.value.field == "truth.load.rendezvous.needs"


# -- facts -------------------------------------------------------------------------------------


def test_reference_facts_put_the_default_route_on_the_management_nic_and_rdma_on_the_data_nics(
        sim_lab: SimLab) -> None:
    facts = facts_of(sim_lab.node("spark-03"))
    # Listed by name, as the real agent lists /sys/class/net.
    assert [(n["name"], n["default_route"]) for n in facts["nics"]] == [
        ("enP2p1s0f0np0", False), ("enP7s7", True), ("enp1s0f0np0", False)]
    assert sorted((d["name"], d["net_device"]) for d in facts["rdma"]) == [
        ("roceP2p1s0f0", "enP2p1s0f0np0"), ("rocep1s0f0", "enp1s0f0np0")]
    assert all(d["ports"] == [{"port": 1, "state": "ACTIVE"}] for d in facts["rdma"])


def test_addresses_are_made_up_but_consistent_across_calls_and_nodes(sim_lab: SimLab) -> None:
    per_node = {name: facts_of(node)["nics"] for name, node in sim_lab.nodes.items()}
    assert facts_of(sim_lab.node("spark-05"))["nics"] == per_node["spark-05"]
    every = [a for nics in per_node.values() for n in nics for a in n["ipv4"]]
    assert len(every) == len(set(every)) == 8 * 3  # one address per NIC, none shared
    for position in range(3):  # the same NIC of every node sits on one subnet
        subnets = {nics[position]["ipv4"][0].rsplit(".", 1)[0] for nics in per_node.values()}
        assert len(subnets) == 1
    assert len({nics[i]["ipv4"][0].rsplit(".", 1)[0] for nics in per_node.values() for i in range(3)}) == 3


def test_facts_over_ssh_show_a_renamed_labs_own_devices(make_lab: Callable[..., SimLab]) -> None:
    lab = make_lab("renamed-nics")
    with LabSession.open(lab.inventory_path) as session:
        facts = session.facts()
    assert sorted(facts) == lab.scenario.node_names
    for answer in facts.values():
        validate_response({"schema": "lab.agent/1", "verb": "facts", "ok": True, "data": answer})
        assert [n["name"] for n in answer["nics"]] == sorted([RENAMED["mgmt"], *RENAMED["data"]])
        assert [n["name"] for n in answer["nics"] if n["default_route"]] == [RENAMED["mgmt"]]
        assert sorted(d["name"] for d in answer["rdma"]) == RENAMED["rdma"]
        assert {d["net_device"] for d in answer["rdma"]} == set(RENAMED["data"])
        assert not {"enP7s7", "enp1s0f0np0", "rocep1s0f0"} & set(json.dumps(answer).split('"'))


# -- the rendezvous ------------------------------------------------------------------------------


def test_the_reference_labs_nccl_values_still_stall_a_renamed_lab(make_lab: Callable[..., SimLab]) -> None:
    lab = make_lab("renamed-nics")
    head = cold_start(lab, load_path_fixed(nccl=True))  # enP7s7 and rocep1s0f0,roceP2p1s0f0
    assert rendezvous_wait_s(head) >= STALL_S
    assert len(late_nodes(lab)) == 1


def test_nccl_values_read_off_the_renamed_labs_facts_end_the_stall(make_lab: Callable[..., SimLab]) -> None:
    lab = make_lab("renamed-nics")
    env = nccl_env_from_facts(facts_of(lab.node("spark-02")))
    assert env == {"NCCL_SOCKET_IFNAME": "eno1", "NCCL_IB_HCA": "rocep3s0f0,rocep4s0f1"}
    config = copy.deepcopy(load_path_fixed(nccl=False))
    config["env"] = env
    head = cold_start(lab, config)
    assert head.group is not None
    spread = max(m.started for m in head.group.members.values()) - head.started
    assert rendezvous_wait_s(head) <= spread + JITTER_S
    assert late_nodes(lab) == []


def test_on_the_reference_lab_its_facts_give_the_devices_it_needs_in_any_order(sim_lab: SimLab) -> None:
    env = nccl_env_from_facts(facts_of(sim_lab.head))
    # The facts list devices by name; NCCL takes NCCL_IB_HCA as a list, in any order.
    assert env == {"NCCL_SOCKET_IFNAME": "enP7s7", "NCCL_IB_HCA": "roceP2p1s0f0,rocep1s0f0"}
    config = copy.deepcopy(load_path_fixed(nccl=False))
    config["env"] = env
    head = cold_start(sim_lab, config)
    assert head.group is not None
    spread = max(m.started for m in head.group.members.values()) - head.started
    assert rendezvous_wait_s(head) <= spread + JITTER_S
    assert late_nodes(sim_lab) == []


def test_naming_only_one_of_the_data_nics_rdma_devices_still_stalls(sim_lab: SimLab) -> None:
    config = copy.deepcopy(load_path_fixed(nccl=False))
    config["env"] = {"NCCL_SOCKET_IFNAME": "enP7s7", "NCCL_IB_HCA": "rocep1s0f0"}
    head = cold_start(sim_lab, config)
    assert rendezvous_wait_s(head) >= STALL_S
