"""The lab's catalog: which models, drafts and files the lab holds in its models directory.

`lab/catalog.yaml` (versioned, `lab.catalog/1`) lists the served models with their paths,
the drafts each may speculate with, and whether the lab has reviewed the model's own code
(`remote_code`). This module reads it and answers lookups; lab.engines uses it to refuse a
configuration that would make a node load something the lab did not place there. No
Django, no engine knowledge.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

SCHEMA = "lab.catalog/1"
CATALOG_PATH = Path(__file__).with_name("catalog.yaml")


class CatalogError(ValueError):
    """The catalog file is malformed; the message names the entry."""


def clean_path(value: str) -> str | None:
    """`value` as an absolute, normalized POSIX path; None for a relative path or one that
    climbs with `..` (refused even where it would land back inside)."""
    if not value.startswith("/") or ".." in value.split("/"):
        return None
    cleaned = posixpath.normpath(value)
    return "/" + cleaned.lstrip("/")


@dataclass(frozen=True)
class Draft:
    id: str
    path: str
    method: str

    def named(self, name: str) -> bool:
        return name.casefold() == self.id.casefold() or clean_path(name) == self.path


@dataclass(frozen=True)
class CatalogModel:
    id: str
    path: str
    remote_code: bool
    drafts: tuple[Draft, ...]

    def named(self, name: str) -> bool:
        """Whether a configuration's model.path names this model: its path in the models
        directory, or its id (the hub name of the same checkpoint)."""
        return name.casefold() == self.id.casefold() or clean_path(name) == self.path

    def draft(self, name: str, method: str) -> Draft | None:
        return next((d for d in self.drafts if d.method == method and d.named(name)), None)

    def describe(self) -> str:
        return f"{self.path} ({self.id})"


@dataclass(frozen=True)
class Catalog:
    version: str
    models_dir: str
    models: tuple[CatalogModel, ...]

    def model(self, name: str) -> CatalogModel | None:
        return next((m for m in self.models if m.named(name)), None)

    def holds_file(self, path: str) -> bool:
        """Whether `path` lies in the lab's models directory (lexically: the lab owns what
        is below it, links included)."""
        cleaned = clean_path(path)
        return cleaned is not None and cleaned.startswith(self.models_dir.rstrip("/") + "/")

    def owner_of(self, path: str) -> CatalogModel | None:
        """The catalog model whose folder holds `path` (or that `path` names), if any."""
        named = self.model(path)
        if named is not None:
            return named
        cleaned = clean_path(path)
        if cleaned is None:
            return None
        return next((m for m in self.models if cleaned.startswith(m.path.rstrip("/") + "/")), None)

    def describe(self) -> str:
        return ", ".join(m.describe() for m in self.models)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CatalogError(f"catalog: {where} must be a non-empty string, got {value!r}")
    return value


def _path(value: Any, where: str) -> str:
    text = _text(value, where)
    cleaned = clean_path(text)
    if cleaned != text:
        raise CatalogError(f"catalog: {where} must be an absolute, normalized path, got {text!r}")
    return cleaned


def parse_catalog(data: Any) -> Catalog:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise CatalogError(f"catalog: schema must be {SCHEMA}")
    version = _text(data.get("version"), "version")
    models_dir = _path(data.get("models_dir"), "models_dir")
    models = []
    for i, entry in enumerate(data.get("models") or []):
        where = f"models[{i}]"
        if not isinstance(entry, dict):
            raise CatalogError(f"catalog: {where} must be a mapping")
        path = _path(entry.get("path"), f"{where}.path")
        if not path.startswith(models_dir + "/"):
            raise CatalogError(f"catalog: {where}.path {path!r} is outside {models_dir}")
        remote_code = entry.get("remote_code", False)
        if not isinstance(remote_code, bool):
            raise CatalogError(f"catalog: {where}.remote_code must be true or false")
        drafts = []
        for j, d in enumerate(entry.get("drafts") or []):
            dwhere = f"{where}.drafts[{j}]"
            if not isinstance(d, dict):
                raise CatalogError(f"catalog: {dwhere} must be a mapping")
            drafts.append(Draft(_text(d.get("id"), f"{dwhere}.id"),
                                _path(d.get("path"), f"{dwhere}.path"),
                                _text(d.get("method"), f"{dwhere}.method")))
        models.append(CatalogModel(_text(entry.get("id"), f"{where}.id"), path, remote_code,
                                   tuple(drafts)))
    if not models:
        raise CatalogError("catalog: models must list at least one model")
    return Catalog(version, models_dir, tuple(models))


@lru_cache(maxsize=4)
def load_catalog(path: Path = CATALOG_PATH) -> Catalog:
    """The catalog file (lab/catalog.yaml unless told), read once."""
    return parse_catalog(yaml.safe_load(path.read_text()))
