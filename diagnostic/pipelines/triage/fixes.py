"""The change that removes each loading fault, derived from the lab's own facts and the
engine's own options, never from constants (METHODOLOGY.md, "Fixes come from the lab's
facts").

- weights I/O: a loader that reads the checkpoint sequentially; which fields carry one is
  the engine's business, so each candidate is checked against the configuration rules
  (`lab.engines.normalize_config`) and the first the engine accepts is used.
- JIT compile: `serving.jit_cache: persisted`, a cache directory that survives restarts.
- rendezvous: `NCCL_SOCKET_IFNAME` = the NIC holding the default route (the management
  network NCCL bootstraps over), `GLOO_SOCKET_IFNAME` = the same interface (both engines
  open gloo CPU groups beside NCCL's, and gloo otherwise binds whatever the host name
  resolves to), and `NCCL_IB_HCA` = the RDMA devices whose net device is a data NIC and
  whose port is ACTIVE, as every node's facts name them. Never `VLLM_HOST_IP`: it pins
  one address, and one address cannot be right on every node of a launch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diagnostic.pipelines.changes import Change, apply_changes, change, get_path
from diagnostic.pipelines.triage.frames import NicRoles
from diagnostic.pipelines.triage.signatures import JIT_COMPILE, RENDEZVOUS, WEIGHTS_IO
from lab.config import ConfigError

# Sequential loaders in order of preference: a vLLM-only strategy that needs no extra
# package first, then the fastsafetensors format (an extra package on the node).
LOADER_CANDIDATES: tuple[tuple[str, Any, str], ...] = (
    ("serving.safetensors_load_strategy", "eager", "an eager safetensors loader"),
    ("serving.load_format", "fastsafetensors", "the fastsafetensors loader"),
)
# Interfaces that are never a data path (loopback, container bridges).
_VIRTUAL_PREFIXES = ("lo", "docker", "veth", "virbr", "br-", "cni", "flannel")


class FixUnavailable(Exception):
    """The lab's facts do not say what the change should be; the message says what is missing."""


@dataclass
class Fix:
    cause: str
    changes: list[Change]
    label: str  # the step's name in the waterfall
    note: str = ""
    # Further candidates to try if the engine refuses this one at launch.
    alternatives: list[Fix] = field(default_factory=list)
    # What the change does to the launch on this lab (the engine's own flags and the
    # environment it renders), filled in once the change is launched.
    flags: list[str] = field(default_factory=list)
    env: dict[str, str | None] = field(default_factory=dict)

    def finding_change(self) -> dict[str, Any]:
        """The `change` mapping a finding carries."""
        config = {c["path"]: {"from": c["from"], "to": c["to"]} for c in self.changes}
        out: dict[str, Any] = {"config": config}
        if self.flags:
            out["flags"] = list(self.flags)
        env = {c["path"].split(".", 1)[1]: c["to"] for c in self.changes if c["path"].startswith("env.")}
        env.update(self.env)
        if env:
            out["env"] = env
        if self.note:
            out["note"] = self.note
        return out


def launch_difference(before: Mapping[str, Any],
                      after: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The arguments `after`'s launch spec adds to `before`'s, and the variables it sets
    differently (None: removed)."""
    old_argv = list(before.get("argv") or [])
    flags = [tok for tok in after.get("argv") or [] if tok not in old_argv]
    old_env, new_env = dict(before.get("env") or {}), dict(after.get("env") or {})
    env: dict[str, Any] = {k: v for k, v in new_env.items() if old_env.get(k) != v}
    env.update({k: None for k in old_env if k not in new_env})
    return flags, env


def nic_roles(facts: Mapping[str, Any]) -> NicRoles:
    """A node's management and data NICs from its facts: the default route's NIC is the
    management one; the data NICs are the net devices of its RDMA devices (without RDMA
    facts, every other physical NIC)."""
    nics = [n for n in facts.get("nics") or [] if isinstance(n, Mapping) and n.get("name")]
    mgmt = tuple(str(n["name"]) for n in nics if n.get("default_route"))
    rdma_nets = {str(net) for dev in facts.get("rdma") or [] if isinstance(dev, Mapping)
                 for net in _net_devices(dev)}
    if rdma_nets:
        data = tuple(str(n["name"]) for n in nics
                     if str(n["name"]) in rdma_nets and str(n["name"]) not in mgmt)
    else:
        data = tuple(str(n["name"]) for n in nics
                     if str(n["name"]) not in mgmt and not str(n["name"]).startswith(_VIRTUAL_PREFIXES))
    return NicRoles(mgmt=mgmt, data=data)


def _net_devices(device: Mapping[str, Any]) -> list[str]:
    net = device.get("net_device")
    if isinstance(net, str):
        return [net]
    if isinstance(net, list):
        return [str(n) for n in net]
    return []


def _active(device: Mapping[str, Any]) -> bool:
    ports = device.get("ports") or []
    return any("ACTIVE" in str(p.get("state", "")).upper() for p in ports if isinstance(p, Mapping))


def nccl_names(facts: Mapping[str, Mapping[str, Any]], nodes: Sequence[str]) -> dict[str, str]:
    """NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME (the same interfaces) and NCCL_IB_HCA for
    `nodes`, from their facts. Nodes that name things differently get the union (NCCL and
    gloo take comma-separated interface lists)."""
    sockets: list[str] = []
    hcas: list[str] = []
    missing: list[str] = []
    for name in nodes:
        node = facts.get(name)
        if not isinstance(node, Mapping):
            missing.append(f"{name}: no facts")
            continue
        roles = nic_roles(node)
        if not roles.mgmt:
            missing.append(f"{name}: no NIC holds the default route")
        sockets += [m for m in roles.mgmt if m not in sockets]
        order = {nic: i for i, nic in enumerate(roles.data)}
        devices = [d for d in node.get("rdma") or [] if isinstance(d, Mapping) and _active(d)
                   and any(n in order for n in _net_devices(d))]
        if not devices:
            missing.append(f"{name}: no RDMA device with an ACTIVE port on a data NIC")
        devices.sort(key=lambda d: min(order[n] for n in _net_devices(d) if n in order))
        hcas += [str(d["name"]) for d in devices if str(d["name"]) not in hcas]
    if missing:
        raise FixUnavailable("; ".join(missing))
    socket = ",".join(sockets)
    return {"NCCL_SOCKET_IFNAME": socket, "GLOO_SOCKET_IFNAME": socket, "NCCL_IB_HCA": ",".join(hcas)}


def _accepted(config: Mapping[str, Any], changes: list[Change]) -> bool:
    try:
        apply_changes(config, changes)
    except (ConfigError, ValueError):
        return False
    return True


def loader_fix(config: Mapping[str, Any]) -> Fix:
    fixes = []
    for path, value, label in LOADER_CANDIDATES:
        current = get_path(config, path)
        if current == value:
            continue
        changes = [change(path, current, value, finding=WEIGHTS_IO,
                          why="reads the checkpoint sequentially instead of page fault by page fault")]
        if _accepted(config, changes):
            fixes.append(Fix(WEIGHTS_IO, changes, label,
                             note="The loader reads each shard in large sequential reads; the page cache "
                                  "no longer fills with twice the weights."))
    if not fixes:
        raise FixUnavailable(f"no sequential loader that {config['engine']['name']} accepts is left to try")
    first, *rest = fixes
    first.alternatives = rest
    return first


def jit_fix(config: Mapping[str, Any]) -> Fix:
    current = get_path(config, "serving.jit_cache")
    if current == "persisted":
        raise FixUnavailable("the JIT cache is already kept; the compile is the first start's")
    changes = [change("serving.jit_cache", current, "persisted", finding=JIT_COMPILE,
                      why="compiled kernels are kept between starts")]
    return Fix(JIT_COMPILE, changes, "persisted JIT cache",
               note="Keep the engine's cache directories on a volume that survives container restarts "
                    "(VLLM_CACHE_ROOT, FlashInfer's workspace); the first start after the change still "
                    "compiles.")


def _same_setting(var: str, current: Any, wanted: str) -> bool:
    """Whether the configuration already sets `var` as the fix would: NCCL reads
    NCCL_IB_HCA as a list of devices, so their order and spacing do not matter."""
    if current is None:
        return False
    if var == "NCCL_IB_HCA":
        return sorted(d.strip() for d in str(current).split(",") if d.strip()) == \
            sorted(d.strip() for d in wanted.split(",") if d.strip())
    return str(current) == wanted


def rendezvous_fix(config: Mapping[str, Any], facts: Mapping[str, Mapping[str, Any]],
                   nodes: Sequence[str]) -> Fix:
    names = nccl_names(facts, nodes)
    env = config.get("env") or {}
    changes = [change(f"env.{var}", env.get(var), value, finding=RENDEZVOUS,
                      why="the interfaces this lab's nodes have")
               for var, value in names.items() if not _same_setting(var, env.get(var), value)]
    if not changes:
        raise FixUnavailable("the NCCL and gloo variables already name this lab's interfaces")
    return Fix(RENDEZVOUS, changes, "data-path NCCL interfaces",
               note="Set on every node, the headless workers included.")


def derive(cause: str, config: Mapping[str, Any], facts: Mapping[str, Mapping[str, Any]],
           nodes: Sequence[str]) -> Fix:
    if cause == WEIGHTS_IO:
        return loader_fix(config)
    if cause == JIT_COMPILE:
        return jit_fix(config)
    if cause == RENDEZVOUS:
        return rendezvous_fix(config, facts, nodes)
    raise FixUnavailable(f"no fix is known for {cause}")
