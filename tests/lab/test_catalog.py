"""The lab's catalog: the file reads, the reference configurations are admitted by the
reference lab's, its paths are compared safely, and a malformed entry or profile is named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.catalog import (
    CATALOG_PATH,
    REFERENCE_CATALOG_PATH,
    CatalogError,
    KvBytes,
    clean_path,
    load_catalog,
    parse_catalog,
    reference_catalog,
)
from lab.config import ConfigError
from lab.engines import load_config_text, normalize_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "configs"


def test_the_reference_labs_catalog_is_versioned_and_names_the_reference_model() -> None:
    # With no path, load_catalog reads the reference lab's catalog (and only that file).
    catalog = load_catalog()
    assert CATALOG_PATH == REFERENCE_CATALOG_PATH and catalog.source == REFERENCE_CATALOG_PATH.resolve()
    assert reference_catalog() is catalog
    raw = yaml.safe_load(CATALOG_PATH.read_text())
    assert raw["schema"] == "lab.catalog/1"
    assert catalog.version == raw["version"]
    kimi = catalog.model("moonshotai/Kimi-K2-Instruct-0905")
    assert kimi is not None and kimi.path == "/models/kimi-k2"
    assert catalog.model("/models/kimi-k2/") is kimi  # a trailing slash names the same folder
    # Its profile is LAB_MODEL.md section 2's.
    assert kimi.profile is not None
    assert (kimi.profile.decode_bytes_per_token_gb, kimi.profile.checkpoint_gb, kimi.profile.layers,
            kimi.profile.kv_bytes_per_token) == (32.0, 597.0, 61, KvBytes(35136, 70272))


# The example configuration written for another lab than the reference one, and that lab's
# scenario (its catalog is the one the simulated lab writes for it).
OTHER_LABS = {"deepseek-v3-4spark.yaml": "deepseek-v3-4spark"}


def test_the_reference_configurations_are_admitted() -> None:
    examples = sorted(EXAMPLES.glob("*.yaml"))
    assert set(OTHER_LABS) <= {p.name for p in examples}
    for path in examples:
        if path.name in OTHER_LABS:
            continue
        load_config_text(path.read_text())
    for path in sorted(EXAMPLES.glob("*-command.txt")):
        normalize_config({"launch_command": path.read_text()})


@pytest.mark.parametrize("name", sorted(OTHER_LABS))
def test_an_example_for_another_lab_is_admitted_by_that_labs_catalog_only(name: str) -> None:
    from lab.scenarios import scenario_path
    from lab.sim.lab import scenario_catalog
    from lab.sim.scenario import load_scenario

    text = (EXAMPLES / name).read_text()
    # By the catalog its simulated lab writes, and by the example real lab's (which holds
    # both models) ...
    load_config_text(text, catalog=scenario_catalog(load_scenario(scenario_path(OTHER_LABS[name]))))
    load_config_text(text, catalog=load_catalog(ROOT / "examples" / "lab" / "catalog.yaml"))
    # ... and not by the reference lab's, which does not hold the model.
    with pytest.raises(ConfigError, match="is not a model this lab holds"):
        load_config_text(text)


def test_the_specdec_pipelines_draft_for_the_reference_model_is_held() -> None:
    # diagnostic/pipelines/specdec/drafts.yaml says which public drafts are worth trying;
    # the one it offers for the reference model must be one this lab can load.
    drafts = yaml.safe_load((ROOT / "diagnostic/pipelines/specdec/drafts.yaml").read_text())
    offered = [d["id"] for d in drafts["targets"]["moonshotai/Kimi-K2-Instruct-0905"]["eagle3"]]
    kimi = load_catalog().model("moonshotai/Kimi-K2-Instruct-0905")
    assert kimi is not None
    assert offered and all(kimi.draft(d, "eagle3") for d in offered)


@pytest.mark.parametrize(("path", "clean"), [
    ("/models/kimi-k2", "/models/kimi-k2"),
    ("/models//kimi-k2/", "/models/kimi-k2"),
    ("/models/./kimi-k2", "/models/kimi-k2"),
    ("//models/kimi-k2", "/models/kimi-k2"),
    ("/models/kimi-k2/../../etc", None),
    ("models/kimi-k2", None),
    ("", None),
])
def test_paths_are_compared_absolute_normalized_and_never_climbing(path: str,
                                                                   clean: str | None) -> None:
    assert clean_path(path) == clean


def test_only_files_below_the_models_directory_are_the_labs() -> None:
    catalog = load_catalog()
    assert catalog.holds_file("/models/kimi-k2/chat_template.jinja")
    for outside in ("/models", "/modelsX/t.jinja", "/models/../etc/passwd", "/tmp/t.jinja",
                    "t.jinja", "{{ x }}"):
        assert not catalog.holds_file(outside), outside


def minimal(**model: Any) -> dict[str, Any]:
    return {"schema": "lab.catalog/1", "version": "1", "models_dir": "/models",
            "models": [{"id": "a/b", "path": "/models/b", **model}]}


@pytest.mark.parametrize(("data", "says"), [
    ({"schema": "lab.catalog/2"}, "schema must be lab.catalog/1"),
    ({**minimal(), "version": ""}, "version must be a non-empty string"),
    ({**minimal(), "models": []}, "at least one model"),
    (minimal(path="/elsewhere/b"), "is outside /models"),
    (minimal(path="/models/../b"), "absolute, normalized path"),
    (minimal(remote_code="yes"), "remote_code must be true or false"),
    (minimal(drafts=[{"id": "d", "path": "/models/d"}]), "drafts[0].method"),
    (minimal(weights="/models/b"), "models[0].weights is not a field; accepted: id, path"),
    (minimal(profile=[]), "models[0] (a/b).profile must be a mapping"),
    (minimal(profile={"layer": 61}), "models[0] (a/b).profile.layer is not a field; accepted: "),
    (minimal(profile={"layers": 0}), "models[0] (a/b).profile.layers must be a whole number > 0, got 0"),
    (minimal(profile={"layers": 61.5}), "profile.layers must be a whole number > 0, got 61.5"),
    (minimal(profile={"mtp_heads": -1}), "profile.mtp_heads must be a whole number >= 0, got -1"),
    (minimal(profile={"checkpoint_gb": "big"}), "profile.checkpoint_gb must be a number > 0, got 'big'"),
    (minimal(profile={"decode_bytes_per_token_gb": True}),
     "profile.decode_bytes_per_token_gb must be a number"),
    (minimal(profile={"experts": 8, "experts_per_token": 9}),
     "profile.experts_per_token must be at most experts (8), got 9"),
    (minimal(profile={"total_params_b": 10, "active_params_b": 20}),
     "profile.active_params_b must be at most total_params_b (10), got 20"),
    (minimal(profile={"kv_bytes_per_token": {"fp8": 1}}), "profile.kv_bytes_per_token.bf16 is required"),
    (minimal(profile={"kv_bytes_per_token": "lots"}), "profile.kv_bytes_per_token must be bytes per token"),
    ({**minimal(), "models": [{"id": "a/b", "path": "/models/b"}, {"id": "A/B", "path": "/models/c"}]},
     "models[1] (A/B) names the same model as /models/b (a/b)"),
])
def test_a_malformed_catalog_names_the_entry(data: dict[str, Any], says: str) -> None:
    with pytest.raises(CatalogError) as info:
        parse_catalog(data)
    assert says in str(info.value)


def test_a_profile_may_give_only_what_the_lab_knows() -> None:
    catalog = parse_catalog(minimal(profile={"decode_bytes_per_token_gb": 20, "kv_bytes_per_token": 100}))
    profile = catalog.models[0].profile
    assert profile is not None
    assert profile.decode_bytes_per_token_gb == 20.0 and profile.kv_bytes_per_token == KvBytes(100, 200)
    assert profile.missing("checkpoint_gb", "decode_bytes_per_token_gb") == ["checkpoint_gb"]
    assert profile.weights_per_node_gb(4) is None
    # The document reads back equal, and a catalog without a profile is still one.
    assert parse_catalog(catalog.as_data()) == catalog
    assert parse_catalog(minimal()).models[0].profile is None


def test_a_catalog_file_is_read_again_when_it_changes_and_named_in_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(minimal()))
    assert load_catalog(path).models[0].id == "a/b"
    data = minimal()
    data["models"][0]["id"] = "a/other-model"
    path.write_text(yaml.safe_dump(data))
    assert load_catalog(path).models[0].id == "a/other-model"
    path.write_text("models: [")
    with pytest.raises(CatalogError, match=f"catalog {path}: not valid YAML"):
        load_catalog(path)
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog(tmp_path / "missing.yaml")


def test_served_finds_the_entry_by_path_or_id() -> None:
    catalog = parse_catalog({**minimal(), "models": [{"id": "a/b", "path": "/models/b"},
                                                     {"id": "c/d", "path": "/models/d"}]})
    assert catalog.served({"model": {"id": "x", "path": "/models/d"}}).id == "c/d"  # type: ignore[union-attr]
    assert catalog.served({"model": {"id": "a/b", "path": "/elsewhere"}}).id == "a/b"  # type: ignore[union-attr]
    assert catalog.served({"model": {"id": "x/y", "path": "/models/y"}}) is None
