"""The changes the triage derives: NCCL names from the nodes' own facts, the loader the
engine accepts, the JIT cache; never a constant."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from diagnostic.pipelines.triage import fixes
from lab.engines import normalize_config

from .labs import OUT_OF_BOX


def node_facts(mgmt: str, data: list[str], devices: list[tuple[str, str, str]]) -> dict[str, Any]:
    """Facts in the agent's shape: NICs with addresses and the default route, RDMA devices."""
    nics = [{"name": mgmt, "speed_mbps": 10000, "mtu": 1500, "operstate": "up", "ipv4": ["10.0.0.5"],
             "default_route": True}]
    nics += [{"name": n, "speed_mbps": 100000, "mtu": 9000, "operstate": "up", "ipv4": [f"192.168.{i}.5"],
              "default_route": False} for i, n in enumerate(data)]
    nics.append({"name": "docker0", "speed_mbps": None, "mtu": 1500, "operstate": "up",
                 "ipv4": ["172.17.0.1"], "default_route": False})
    rdma = [{"name": name, "net_device": net, "ports": [{"port": 1, "state": state}]}
            for name, net, state in devices]
    return {"nics": nics, "rdma": rdma}


def config(engine: str = "vllm") -> dict[str, Any]:
    raw = copy.deepcopy(yaml.safe_load(OUT_OF_BOX.read_text()))
    raw["engine"] = {"name": engine}
    if engine == "sglang":
        raw["speculative"] = None
    return normalize_config(raw)


def test_nccl_names_come_from_each_nodes_facts_in_nic_order() -> None:
    facts = {n: node_facts("eno1", ["ens2f0np0", "ens2f1np1"],
                           [("mlx5_1", "ens2f1np1", "4: ACTIVE"), ("mlx5_0", "ens2f0np0", "4: ACTIVE")])
             for n in ("a", "b")}
    assert fixes.nccl_names(facts, ["a", "b"]) == {"NCCL_SOCKET_IFNAME": "eno1", "GLOO_SOCKET_IFNAME": "eno1",
                                                   "NCCL_IB_HCA": "mlx5_0,mlx5_1"}
    roles = fixes.nic_roles(facts["a"])
    assert roles.mgmt == ("eno1",) and roles.data == ("ens2f0np0", "ens2f1np1")


def test_a_port_that_is_down_is_left_out_and_no_device_at_all_is_said() -> None:
    facts = {"a": node_facts("eno1", ["p1", "p2"], [("r1", "p1", "4: ACTIVE"), ("r2", "p2", "1: DOWN")])}
    assert fixes.nccl_names(facts, ["a"])["NCCL_IB_HCA"] == "r1"
    facts["b"] = node_facts("eno1", ["p1"], [("r1", "p1", "1: DOWN")])
    with pytest.raises(fixes.FixUnavailable, match="b: no RDMA device with an ACTIVE port"):
        fixes.nccl_names(facts, ["a", "b"])


def test_nodes_that_name_their_nics_differently_get_the_union() -> None:
    facts = {"a": node_facts("eno1", ["p1"], [("r1", "p1", "4: ACTIVE")]),
             "b": node_facts("eno2", ["q1"], [("s1", "q1", "4: ACTIVE")])}
    assert fixes.nccl_names(facts, ["a", "b"]) == {"NCCL_SOCKET_IFNAME": "eno1,eno2",
                                                   "GLOO_SOCKET_IFNAME": "eno1,eno2", "NCCL_IB_HCA": "r1,s1"}


def test_the_rendezvous_fix_names_gloo_beside_nccl_and_never_pins_a_host_ip() -> None:
    """Both engines open gloo CPU groups beside NCCL's: the fix names the same interface for
    gloo, and never VLLM_HOST_IP (one address cannot be right on every node)."""
    facts = {n: node_facts("enP7s7", ["enp1s0f0np0"], [("rocep1s0f0", "enp1s0f0np0", "4: ACTIVE")])
             for n in ("a", "b")}
    fix = fixes.rendezvous_fix(config(), facts, ["a", "b"])
    env = {c["path"]: c["to"] for c in fix.changes}
    assert env == {"env.NCCL_SOCKET_IFNAME": "enP7s7", "env.GLOO_SOCKET_IFNAME": "enP7s7",
                   "env.NCCL_IB_HCA": "rocep1s0f0"}
    assert not any("HOST_IP" in path for path in env)


def test_facts_without_a_default_route_give_no_guess() -> None:
    facts = {"a": node_facts("eno1", ["p1"], [("r1", "p1", "4: ACTIVE")])}
    facts["a"]["nics"][0]["default_route"] = False
    with pytest.raises(fixes.FixUnavailable, match="no NIC holds the default route"):
        fixes.rendezvous_fix(config(), facts, ["a"])


def test_the_loader_is_one_the_engine_accepts() -> None:
    vllm = fixes.loader_fix(config("vllm"))
    assert [(c["path"], c["to"]) for c in vllm.changes] == [("serving.safetensors_load_strategy", "eager")]
    assert [(c["path"], c["to"]) for c in vllm.alternatives[0].changes] == [("serving.load_format",
                                                                              "fastsafetensors")]
    sglang = fixes.loader_fix(config("sglang"))  # SGLang has no eager strategy
    assert [(c["path"], c["to"]) for c in sglang.changes] == [("serving.load_format", "fastsafetensors")]


def test_a_kept_jit_cache_has_no_jit_fix_and_the_change_carries_the_launch() -> None:
    fix = fixes.jit_fix(config())
    after = {"argv": ["vllm", "serve"], "env": {"VLLM_CACHE_ROOT": "/c/vllm"}}
    fix.flags, fix.env = fixes.launch_difference({"argv": ["vllm", "serve"], "env": {}}, after)
    change = fix.finding_change()
    assert change["config"] == {"serving.jit_cache": {"from": "ephemeral", "to": "persisted"}}
    assert change["env"] == {"VLLM_CACHE_ROOT": "/c/vllm"} and "flags" not in change
    kept = config()
    kept["serving"]["jit_cache"] = "persisted"
    with pytest.raises(fixes.FixUnavailable):
        fixes.jit_fix(kept)
