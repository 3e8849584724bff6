"""The lab's catalog: the file reads, the reference configurations are admitted by it, and
its paths are compared safely."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.catalog import CATALOG_PATH, CatalogError, clean_path, load_catalog, parse_catalog
from lab.engines import load_config_text, normalize_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "configs"


def test_the_shipped_catalog_is_versioned_and_names_the_reference_model() -> None:
    catalog = load_catalog()
    raw = yaml.safe_load(CATALOG_PATH.read_text())
    assert raw["schema"] == "lab.catalog/1"
    assert catalog.version == raw["version"]
    kimi = catalog.model("moonshotai/Kimi-K2-Instruct-0905")
    assert kimi is not None and kimi.path == "/models/kimi-k2"
    assert catalog.model("/models/kimi-k2/") is kimi  # a trailing slash names the same folder


def test_the_reference_configurations_are_admitted() -> None:
    for path in sorted(EXAMPLES.glob("*.yaml")):
        load_config_text(path.read_text())
    for path in sorted(EXAMPLES.glob("*-command.txt")):
        normalize_config({"launch_command": path.read_text()})


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
])
def test_a_malformed_catalog_names_the_entry(data: dict[str, Any], says: str) -> None:
    with pytest.raises(CatalogError) as info:
        parse_catalog(data)
    assert says in str(info.value)
