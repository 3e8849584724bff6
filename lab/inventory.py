"""The lab inventory: which nodes exist, how to reach them, the lab's clock, and its catalog.

One YAML file (`lab.inventory/1`, see docs/lab-contracts.md) describes a lab, real or
simulated. It names the lab's catalog (`catalog: catalog.yaml`, relative to the inventory
file): the models the lab holds (lab.catalog). A real lab keeps the two side by side
(examples/lab/); a simulated lab writes both. Validation errors name the field and what
would be accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lab.catalog import Catalog, CatalogError, load_catalog

SCHEMA = "lab.inventory/1"

NODE_FIELDS = {
    "name", "host", "port", "user", "key_file", "role", "mgmt_nic", "data_nics",
    "data_addr", "model_dir", "cache_dir", "work_dir", "api_port", "python",
}
TOP_FIELDS = {"schema", "name", "time_dilation", "time_origin", "known_hosts", "catalog", "defaults", "nodes"}
ROLES = ("head", "worker")

DEFAULTS: dict[str, Any] = {
    "port": 22,
    # Not root: the account the agent runs as over SSH. Its engines then run unprivileged,
    # and drop-caches goes through one sudo rule (lab/agent/README.md, "Engine user").
    "user": "diag",
    "key_file": "~/.ssh/id_ed25519",
    "role": "worker",
    "mgmt_nic": "enP7s7",
    "data_nics": ["enp1s0f0np0", "enP2p1s0f0np0"],
    "model_dir": "/models/kimi-k2",
    "cache_dir": "/var/cache/diag",
    "work_dir": "/var/lib/diag",
    "api_port": 8000,
    "python": "python3",
}


class InventoryError(ValueError):
    """An inventory that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Node:
    name: str
    host: str
    port: int
    user: str
    key_file: Path
    role: str
    mgmt_nic: str
    data_nics: tuple[str, ...]
    data_addr: str
    model_dir: str
    cache_dir: str
    work_dir: str
    api_port: int
    python: str

    @property
    def agent_path(self) -> str:
        return f"{self.work_dir}/agent.py"

    @property
    def is_head(self) -> bool:
        return self.role == "head"


@dataclass(frozen=True)
class Inventory:
    name: str
    path: Path | None
    nodes: tuple[Node, ...]
    known_hosts: Path
    time_dilation: float
    time_origin: float
    # The lab's catalog file (`catalog:`), resolved against the inventory's folder.
    catalog_file: Path | None = None

    @property
    def catalog(self) -> Catalog:
        """The lab's catalog: the models this lab holds. An inventory that names none has
        none; it never stands in for another lab's (InventoryError says what to add)."""
        if self.catalog_file is None:
            raise InventoryError(
                f"catalog: inventory {self.name!r} names no catalog; a lab keeps its catalog "
                "(lab.catalog/1: the models in its models directory) beside its inventory and "
                "names it there, e.g. `catalog: catalog.yaml` (see examples/lab/)")
        try:
            catalog = load_catalog(self.catalog_file)
        except CatalogError as exc:
            raise InventoryError(f"catalog: {exc}") from exc
        # Read for this lab: a layout needing more nodes than it has is refused at admission.
        return dataclasses.replace(catalog, lab_nodes=len(self.nodes))

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.is_head)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node named {name!r} in inventory {self.name!r}")


def _require(cond: bool, field: str, problem: str) -> None:
    if not cond:
        raise InventoryError(f"{field}: {problem}")


def _str(value: Any, field: str) -> str:
    _require(isinstance(value, str) and value != "", field, f"must be a non-empty string, got {value!r}")
    return str(value)


def _int(value: Any, field: str, lo: int, hi: int) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
    _require(ok, field, f"must be an integer {lo}..{hi}, got {value!r}")
    return int(value)


def _number(value: Any, field: str, *, positive: bool) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and (value > 0 if positive else value >= 0)
    bound = "> 0" if positive else ">= 0"
    _require(ok, field, f"must be a number {bound}, got {value!r}")
    return float(value)


def _node(raw: Any, index: int, defaults: Mapping[str, Any], base: Path) -> Node:
    where = f"nodes[{index}]"
    _require(isinstance(raw, dict), where, f"must be a mapping, got {type(raw).__name__}")
    unknown = sorted(set(raw) - NODE_FIELDS)
    _require(not unknown, f"{where}.{unknown[0] if unknown else ''}",
             f"unknown field; accepted: {', '.join(sorted(NODE_FIELDS))}")
    merged = {**DEFAULTS, **defaults, **raw}
    for required in ("name", "host"):
        _require(required in raw, f"{where}.{required}", "is required")
    name = _str(merged["name"], f"{where}.name")
    role = merged["role"]
    _require(role in ROLES, f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
    nics = merged["data_nics"]
    _require(isinstance(nics, list) and bool(nics) and all(isinstance(n, str) and n for n in nics),
             f"{where}.data_nics", f"must be a non-empty list of interface names, got {nics!r}")
    key = Path(_str(merged["key_file"], f"{where}.key_file")).expanduser()
    if not key.is_absolute():
        key = base / key
    host = _str(merged["host"], f"{where}.host")
    return Node(
        name=name,
        host=host,
        port=_int(merged["port"], f"{where}.port", 1, 65535),
        user=_str(merged["user"], f"{where}.user"),
        key_file=key,
        role=role,
        mgmt_nic=_str(merged["mgmt_nic"], f"{where}.mgmt_nic"),
        data_nics=tuple(nics),
        data_addr=_str(merged.get("data_addr", host), f"{where}.data_addr"),
        model_dir=_str(merged["model_dir"], f"{where}.model_dir"),
        cache_dir=_str(merged["cache_dir"], f"{where}.cache_dir"),
        work_dir=_str(merged["work_dir"], f"{where}.work_dir"),
        api_port=_int(merged["api_port"], f"{where}.api_port", 1, 65535),
        python=_str(merged["python"], f"{where}.python"),
    )


def parse_inventory(data: Any, *, base: Path, path: Path | None = None) -> Inventory:
    """Validate a decoded inventory mapping; relative paths resolve against `base`."""
    _require(isinstance(data, dict), "inventory", "must be a YAML mapping")
    unknown = sorted(set(data) - TOP_FIELDS)
    _require(not unknown, unknown[0] if unknown else "",
             f"unknown field; accepted: {', '.join(sorted(TOP_FIELDS))}")
    _require(data.get("schema") == SCHEMA, "schema", f"must be {SCHEMA!r}, got {data.get('schema')!r}")
    defaults = data.get("defaults", {}) or {}
    _require(isinstance(defaults, dict), "defaults", "must be a mapping")
    bad = sorted(set(defaults) - (NODE_FIELDS - {"name", "host"}))
    _require(not bad, f"defaults.{bad[0] if bad else ''}", "unknown node field")
    raw_nodes = data.get("nodes")
    _require(isinstance(raw_nodes, list) and bool(raw_nodes), "nodes", "must be a non-empty list")
    nodes = tuple(_node(raw, i, defaults, base) for i, raw in enumerate(raw_nodes))
    names = [n.name for n in nodes]
    dup = next((n for n in names if names.count(n) > 1), None)
    _require(dup is None, "nodes", f"node name {dup!r} appears more than once")
    heads = [n.name for n in nodes if n.is_head]
    _require(len(heads) == 1, "nodes", f"exactly one node must have role: head, found {len(heads)}")
    kh = Path(_str(data.get("known_hosts", "known_hosts"), "known_hosts")).expanduser()
    if not kh.is_absolute():
        kh = base / kh
    catalog_file = None
    if data.get("catalog") is not None:
        catalog_file = Path(_str(data["catalog"], "catalog")).expanduser()
        if not catalog_file.is_absolute():
            catalog_file = base / catalog_file
        try:
            load_catalog(catalog_file)  # a lab whose catalog cannot be read is refused now
        except CatalogError as exc:
            raise InventoryError(f"catalog: {exc}") from exc
    return Inventory(
        name=_str(data.get("name", "lab"), "name"),
        path=path,
        nodes=nodes,
        known_hosts=kh,
        time_dilation=_number(data.get("time_dilation", 1), "time_dilation", positive=True),
        time_origin=_number(data.get("time_origin", 0), "time_origin", positive=False),
        catalog_file=catalog_file,
    )


def load_inventory(path: str | Path) -> Inventory:
    """Read and validate an inventory file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InventoryError(f"inventory {p}: cannot read ({exc.strerror})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InventoryError(f"inventory {p}: not valid YAML ({exc})") from exc
    return parse_inventory(data, base=p.resolve().parent, path=p)
