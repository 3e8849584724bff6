"""Published facts the diagnostic reasons with, as versioned data files with a small finder:
model sizes (`models.yaml`) and accelerator memory bandwidth (`hardware.yaml`). Each entry
names its public source; nothing here is measured on a lab."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml


class CatalogError(LookupError):
    """A model or accelerator the catalog does not list; the message names what it does list."""


@cache
def _load(name: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def model_profile(model_id: str) -> dict[str, Any]:
    """The published sizes of a model, by its repository id (or one of its aliases)."""
    models = _load("models.yaml")["models"]
    for entry in models:
        if model_id == entry["id"] or model_id in entry.get("aliases", []):
            return dict(entry)
    known = ", ".join(e["id"] for e in models)
    raise CatalogError(f"model {model_id!r} is not in the model catalog; it lists {known}")


def accelerator(gpu_name: str) -> dict[str, Any]:
    """Memory figures of an accelerator, by the name the node's driver reports."""
    entries = _load("hardware.yaml")["accelerators"]
    for entry in entries:
        if gpu_name == entry["name"] or gpu_name in entry.get("aliases", []):
            return dict(entry)
    known = ", ".join(e["name"] for e in entries)
    raise CatalogError(f"accelerator {gpu_name!r} is not in the hardware catalog; it lists {known}")


def catalog_version(name: str) -> str:
    return str(_load(name)["version"])
