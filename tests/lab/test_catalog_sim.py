"""A simulated lab's catalog is its own: written beside its inventory from its scenario's
model (LAB_MODEL.md section 10), with that model's profile, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from lab.catalog import KvBytes
from lab.inventory import load_inventory
from lab.scenarios import scenario_path
from lab.sim.lab import SimLab, scenario_catalog
from lab.sim.scenario import load_scenario

DEEPSEEK = scenario_path("deepseek-v3-4spark")
REFERENCE = scenario_path("reference-kimi-k2-8spark")


def test_the_four_node_lab_writes_a_catalog_of_its_own_model(tmp_path: Path) -> None:
    with SimLab(DEEPSEEK, tmp_path / "lab") as sim:
        inventory = load_inventory(sim.inventory_path)
        assert len(inventory.nodes) == 4
        assert inventory.catalog_file == sim.catalog_path == tmp_path / "lab" / "catalog.yaml"
        raw = yaml.safe_load(sim.catalog_path.read_text())
        assert raw["schema"] == "lab.catalog/1"
        catalog = inventory.catalog
        assert [m.id for m in catalog.models] == ["nvidia/DeepSeek-V3-0324-FP4"]
        model = catalog.models[0]
        assert (model.path, model.remote_code, model.drafts) == ("/models/deepseek-v3-fp4", False, ())
        assert catalog.model("moonshotai/Kimi-K2-Instruct-0905") is None
        profile = model.profile
        assert profile is not None
        assert (profile.total_params_b, profile.active_params_b, profile.layers, profile.experts,
                profile.experts_per_token, profile.shared_experts, profile.hidden, profile.vocab,
                profile.max_context, profile.mtp_heads) == (671, 37, 61, 256, 8, 1, 7168, 129280, 163840, 1)
        assert profile.kv_bytes_per_token == KvBytes(576 * 61, 2 * 576 * 61)
        assert profile.checkpoint_gb == 387 and profile.decode_bytes_per_token_gb == 21.9
        # The nodes keep the model where the catalog says, in the shape of its checkpoint.
        assert {n.model_dir for n in inventory.nodes} == {"/models/deepseek-v3-fp4"}
        config = json.loads((sim.head.host_path("/models/deepseek-v3-fp4") / "config.json").read_text())
        assert (config["model_type"], config["n_routed_experts"], config["num_nextn_predict_layers"],
                config["vocab_size"]) == ("deepseek_v3", 256, 1, 129280)
        assert not sim.head.host_path("/models/kimi-k2").exists()


def test_the_reference_lab_holds_kimi_k2_and_its_eagle3_draft_at_the_catalogs_paths(tmp_path: Path) -> None:
    with SimLab(REFERENCE, tmp_path / "lab") as sim:
        catalog = load_inventory(sim.inventory_path).catalog
        kimi = catalog.model("moonshotai/Kimi-K2-Instruct-0905")
        assert kimi is not None and kimi.remote_code and kimi.path == "/models/kimi-k2"
        draft = kimi.draft("AQ-MedAI/Kimi-K2-Instruct-eagle3", "eagle3")
        assert draft is not None and draft.path == "/models/kimi-k2-eagle3"
        for node in sim.nodes.values():
            assert (node.host_path(draft.path) / "config.json").is_file()
            assert (node.host_path(kimi.path) / "tokenizer.json").is_file()
        assert kimi.profile is not None and kimi.profile.decode_bytes_per_token_gb == 32.0


def test_labs_with_different_models_have_different_catalogs(tmp_path: Path) -> None:
    kimi = scenario_catalog(load_scenario(REFERENCE))
    deepseek = scenario_catalog(load_scenario(DEEPSEEK))
    assert kimi.version != deepseek.version
    assert kimi.model("nvidia/DeepSeek-V3-0324-FP4") is None
    assert deepseek.model("/models/kimi-k2") is None
    # A scenario's own model mapping: its id, path and drafts are what the lab holds.
    text = yaml.safe_load(REFERENCE.read_text())
    text["name"] = "own-model"
    text["model"] = {"name": "small-moe", "id": "org/Small-MoE", "path": "/models/small-moe",
                     "remote_code": False, "drafts": [{"id": "org/Small-MoE-eagle3",
                                                       "path": "/models/small-moe-eagle3",
                                                       "method": "eagle3"}],
                     "decode_bytes_per_token_gb": 4.0, "checkpoint_gb": 60}
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(text))
    own = scenario_catalog(load_scenario(path))
    model = own.model("org/Small-MoE")
    assert model is not None and model.path == "/models/small-moe"
    assert [d.path for d in model.drafts] == ["/models/small-moe-eagle3"]
    assert model.profile is not None and model.profile.checkpoint_gb == 60
