"""Inventory validation: errors name the field and what is accepted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.inventory import InventoryError, load_inventory, parse_inventory


def inv(**top: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "schema": "lab.inventory/1",
        "name": "t",
        "time_dilation": 30,
        "defaults": {"key_file": "id_ed25519"},
        "nodes": [
            {"name": "spark-01", "host": "10.0.0.1", "role": "head"},
            {"name": "spark-02", "host": "10.0.0.2", "port": 2222},
        ],
    }
    data.update(top)
    return data


def test_it_fills_defaults_and_resolves_paths_against_the_file(tmp_path: Path) -> None:
    parsed = parse_inventory(inv(), base=tmp_path)
    assert parsed.head.name == "spark-01"
    assert parsed.nodes[1].port == 2222
    assert parsed.nodes[0].port == 22
    assert parsed.nodes[0].key_file == tmp_path / "id_ed25519"
    assert parsed.known_hosts == tmp_path / "known_hosts"
    assert parsed.time_dilation == 30.0
    assert parsed.nodes[0].data_nics == ("enp1s0f0np0", "enP2p1s0f0np0")
    assert parsed.nodes[0].agent_path == "/var/lib/diag/agent.py"


def test_the_default_ssh_user_is_not_root(tmp_path: Path) -> None:
    # Customer configurations run on the nodes: by default the agent, and so every
    # engine it starts, runs as the unprivileged lab account (lab/agent/README.md).
    parsed = parse_inventory(inv(), base=tmp_path)
    assert {n.user for n in parsed.nodes} == {"diag"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema": "lab.inventory/2"}, "schema: must be 'lab.inventory/1'"),
        ({"colour": "red"}, "colour: unknown field"),
        ({"time_dilation": 0}, "time_dilation: must be a number > 0, got 0"),
        ({"time_dilation": "fast"}, "time_dilation: must be a number > 0, got 'fast'"),
        ({"nodes": []}, "nodes: must be a non-empty list"),
    ],
)
def test_it_names_the_field_of_a_bad_top_level_value(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(InventoryError) as info:
        parse_inventory(inv(**change), base=tmp_path)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"port": "ssh"}, "nodes[1].port: must be an integer 1..65535, got 'ssh'"),
        ({"port": 70000}, "nodes[1].port: must be an integer 1..65535"),
        ({"role": "boss"}, "nodes[1].role: must be one of head, worker, got 'boss'"),
        ({"gpu": 1}, "nodes[1].gpu: unknown field"),
        ({"data_nics": []}, "nodes[1].data_nics: must be a non-empty list"),
    ],
)
def test_it_names_the_node_field_that_is_wrong(tmp_path: Path, node: dict[str, Any], message: str) -> None:
    data = inv()
    data["nodes"][1].update(node)
    with pytest.raises(InventoryError) as info:
        parse_inventory(data, base=tmp_path)
    assert message in str(info.value)


def test_it_requires_exactly_one_head(tmp_path: Path) -> None:
    data = inv()
    data["nodes"][1]["role"] = "head"
    with pytest.raises(InventoryError, match="exactly one node must have role: head, found 2"):
        parse_inventory(data, base=tmp_path)


def test_it_refuses_duplicate_node_names(tmp_path: Path) -> None:
    data = inv()
    data["nodes"][1]["name"] = "spark-01"
    with pytest.raises(InventoryError, match="'spark-01' appears more than once"):
        parse_inventory(data, base=tmp_path)


def test_it_reports_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="cannot read"):
        load_inventory(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [unclosed\n")
    with pytest.raises(InventoryError, match="not valid YAML"):
        load_inventory(bad)


CATALOG = """schema: lab.catalog/1
version: "1"
models_dir: /models
models:
  - {id: org/model-a, path: /models/a}
  - {id: org/model-b, path: /models/b, profile: {decode_bytes_per_token_gb: 12.5}}
"""


def test_it_reads_the_catalog_it_names_beside_it(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "catalog.yaml").write_text(CATALOG)
    path = lab / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv(catalog="catalog.yaml")))
    inventory = load_inventory(path)
    assert inventory.catalog_file == lab / "catalog.yaml"
    # One lab, several models: each is held, with its own profile where it has one.
    a, b = inventory.catalog.model("org/model-a"), inventory.catalog.model("/models/b")
    assert a is not None and a.profile is None
    assert b is not None and b.profile is not None and b.profile.decode_bytes_per_token_gb == 12.5


def test_an_inventory_naming_no_catalog_has_none_and_says_what_to_add(tmp_path: Path) -> None:
    inventory = parse_inventory(inv(), base=tmp_path)
    assert inventory.catalog_file is None
    names = r"catalog: inventory 't' names no catalog.*`catalog: catalog.yaml`"
    with pytest.raises(InventoryError, match=names):
        _ = inventory.catalog


@pytest.mark.parametrize(("text", "says"), [
    (None, "cannot read"),
    ("schema: lab.catalog/1\nversion: '1'\nmodels_dir: /models\nmodels: [{id: a/b, path: /models/b, "
     "profile: {layers: many}}]\n", "models[0] (a/b).profile.layers must be a whole number > 0, got 'many'"),
])
def test_a_named_catalog_that_cannot_be_used_refuses_the_inventory(tmp_path: Path, text: str | None,
                                                                    says: str) -> None:
    if text is not None:
        (tmp_path / "catalog.yaml").write_text(text)
    with pytest.raises(InventoryError) as info:
        parse_inventory(inv(catalog="catalog.yaml"), base=tmp_path)
    assert str(info.value).startswith("catalog: ") and says in str(info.value)


def test_the_example_real_lab_keeps_its_catalog_beside_its_inventory() -> None:
    root = Path(__file__).resolve().parents[2] / "examples" / "lab"
    inventory = load_inventory(root / "inventory.yaml")
    assert inventory.catalog_file == (root / "catalog.yaml").resolve()
    held = {m.id for m in inventory.catalog.models}
    assert held == {"moonshotai/Kimi-K2-Instruct-0905", "nvidia/DeepSeek-V3-0324-FP4"}
    assert all(m.profile is not None and m.profile.decode_bytes_per_token_gb
               for m in inventory.catalog.models)
