"""The deployed setting's launch flags, rendered as the session launches them: admitted by
the lab's catalog (which the inventory names), the model and its draft named by the
catalog's paths whatever the nodes' default model directory."""

from __future__ import annotations

from pathlib import Path

import yaml

from diagnostic.pipelines.specdec.pipeline import launch_syntax, speculative_flags
from lab.engines import normalize_config
from lab.inventory import parse_inventory
from lab.session import LabSession

REPO = Path(__file__).resolve().parents[4]
CONFIG = REPO / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"


def lab(model_dir: str) -> LabSession:
    nodes = [
        {"name": f"spark-{i:02d}", "host": f"10.0.0.{i}", "role": "head" if i == 1 else "worker"}
        for i in range(1, 9)
    ]
    defaults = {"model_dir": model_dir, "key_file": "id"}
    data = {"schema": "lab.inventory/1", "defaults": defaults, "nodes": nodes,
            "catalog": str(REPO / "lab" / "catalog.yaml")}
    return LabSession(parse_inventory(data, base=Path("/tmp")))


def test_flags_render_on_a_lab_whose_weights_live_elsewhere() -> None:
    config = normalize_config(yaml.safe_load(CONFIG.read_text()))
    assert config["model"]["path"] != "/srv/weights/kimi-k2-0905"
    flags = speculative_flags(lab("/srv/weights/kimi-k2-0905"), config)
    assert flags[0] == "--speculative-config"
    assert '"num_speculative_tokens": 4' in flags[1] or '"num_speculative_tokens":4' in flags[1]
    assert "eagle3" in launch_syntax(lab("/srv/weights/kimi-k2-0905"), config)


def test_no_speculation_has_no_flags() -> None:
    raw = yaml.safe_load(CONFIG.read_text())
    raw["speculative"] = None
    config = normalize_config(raw)
    assert speculative_flags(lab("/data/models/k2"), config) == []
