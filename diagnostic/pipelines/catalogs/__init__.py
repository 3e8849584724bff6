"""Published facts the diagnostic reasons with, as versioned data files with a small finder:
accelerator memory bandwidth (`hardware.yaml`). Each entry names its public source; nothing
here is measured on a lab. A model's sizes are the lab's to say: they are the `profile` of
its entry in the lab's catalog (lab.catalog), since each lab holds its own models."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml


class CatalogError(LookupError):
    """An accelerator the catalog does not list; the message names what it does list."""


@cache
def _load(name: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


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
