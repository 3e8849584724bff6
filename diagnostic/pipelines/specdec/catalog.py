"""The lab's draft catalog: which public draft models exist for a target model.

EAGLE-3 is only worth trying where a draft trained for the target exists. The catalog is a
versioned data file (`drafts.yaml`) in this package; each draft names its public source.
A model id matches case-insensitively; a local path matches by its last part, so that a
configuration naming `/models/Kimi-K2-Instruct-0905` finds the same entry as the hub id.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

CATALOG_SCHEMA = "diagnostic.draft-catalog/1"


class CatalogError(ValueError):
    """The catalog file is malformed; the message names the entry."""


@dataclass(frozen=True)
class Draft:
    id: str
    method: str
    source: str
    note: str = ""

    def describe(self) -> dict[str, str]:
        out = {"id": self.id, "method": self.method, "source": self.source}
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class DraftCatalog:
    version: str
    targets: dict[str, tuple[Draft, ...]]

    def drafts_for(self, model_id: str, method: str = "eagle3") -> list[Draft]:
        """The catalog's drafts of `method` for a target model id (empty when it has none):
        the hub id itself, else the entry whose model name (the id's last part) matches."""
        wanted = str(model_id).strip().strip("/").lower()
        name = wanted.rsplit("/", 1)[-1]
        exact = [t for t in self.targets if t.lower() == wanted]
        by_name = [t for t in self.targets if t.lower().rsplit("/", 1)[-1] == name]
        for target in exact or by_name[:1]:
            return [d for d in self.targets[target] if d.method == method]
        return []


def parse_catalog(data: Any) -> DraftCatalog:
    if not isinstance(data, dict) or data.get("schema") != CATALOG_SCHEMA:
        raise CatalogError(f"draft catalog: schema must be {CATALOG_SCHEMA}")
    version = data.get("version")
    if not isinstance(version, str) or not version:
        raise CatalogError("draft catalog: version is required")
    targets: dict[str, tuple[Draft, ...]] = {}
    for target, methods in (data.get("targets") or {}).items():
        if not isinstance(methods, dict):
            raise CatalogError(f"draft catalog: {target}: a mapping of method -> drafts is needed")
        drafts = []
        for method, entries in methods.items():
            for entry in entries or []:
                if not isinstance(entry, dict) or not entry.get("id") or not entry.get("source"):
                    raise CatalogError(f"draft catalog: {target}.{method}: each draft needs id and source")
                drafts.append(
                    Draft(str(entry["id"]), str(method), str(entry["source"]), str(entry.get("note", "")))
                )
        targets[str(target)] = tuple(drafts)
    return DraftCatalog(version, targets)


@lru_cache(maxsize=1)
def load_catalog() -> DraftCatalog:
    """The catalog shipped with the package."""
    text = resources.files(__package__).joinpath("drafts.yaml").read_text(encoding="utf-8")
    return parse_catalog(yaml.safe_load(text))
