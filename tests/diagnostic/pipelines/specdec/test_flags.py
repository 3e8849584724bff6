"""The deployed setting's launch flags on a lab whose weights directory is not the catalog's
model path (a real lab's inventory names its own): the configuration keeps the catalog path
that admission checks, and the lab's directory goes in as render's model_dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from diagnostic.pipelines.specdec.pipeline import launch_syntax, speculative_flags
from lab.engines import normalize_config
from lab.inventory import Inventory, Node, parse_inventory

REPO = Path(__file__).resolve().parents[4]
CONFIG = REPO / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"


class Lab:
    """What speculative_flags reads of a session: the inventory and the nodes a config uses."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory

    def nodes_for(self, config: Any) -> list[Node]:
        return list(self.inventory.nodes)[: int(config["parallel"]["tp"]) * int(config["parallel"]["pp"])]


def lab(model_dir: str) -> Lab:
    nodes = [
        {"name": f"spark-{i:02d}", "host": f"10.0.0.{i}", "role": "head" if i == 1 else "worker"}
        for i in range(1, 9)
    ]
    defaults = {"model_dir": model_dir, "key_file": "id"}
    data = {"schema": "lab.inventory/1", "defaults": defaults, "nodes": nodes}
    return Lab(parse_inventory(data, base=Path("/tmp")))


def test_flags_render_on_a_lab_whose_weights_live_elsewhere() -> None:
    config = normalize_config(yaml.safe_load(CONFIG.read_text()))
    assert config["model"]["path"] != "/srv/weights/kimi-k2-0905"
    flags = speculative_flags(lab("/srv/weights/kimi-k2-0905"), config)  # type: ignore[arg-type]
    assert flags[0] == "--speculative-config"
    assert '"num_speculative_tokens": 4' in flags[1] or '"num_speculative_tokens":4' in flags[1]
    assert "eagle3" in launch_syntax(lab("/srv/weights/kimi-k2-0905"), config)  # type: ignore[arg-type]


def test_no_speculation_has_no_flags() -> None:
    raw = yaml.safe_load(CONFIG.read_text())
    raw["speculative"] = None
    config = normalize_config(raw)
    assert speculative_flags(lab("/data/models/k2"), config) == []  # type: ignore[arg-type]
