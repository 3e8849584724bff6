"""A lab's catalog: which models, drafts and files the lab holds in its models directory.

A catalog file (`lab.catalog/1`, versioned) belongs to its lab: a real lab keeps it beside
its inventory, which names it (`catalog: catalog.yaml`, lab.inventory); a simulated lab
writes one for its scenario's model (lab.sim.lab). It lists the served models with their
paths, the drafts each may speculate with, whether the lab has reviewed the model's own
code (`remote_code`), and optionally the model's `profile`: the published sizes
(LAB_MODEL.md section 2) the diagnostic reasons with (its memory roofline, its memory
checks). lab.engines holds a configuration to the catalog of the lab it runs on, refusing
one that would make a node load something that lab did not place there.

`load_catalog(path)` reads a lab's file. With no path it reads the reference lab's
(`lab/catalog.yaml`, the in-house eight-Spark lab the demo simulates): only for what names
no lab at all; where a lab is known, its own catalog is used and nothing falls back to this
one. No Django, no engine knowledge.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

SCHEMA = "lab.catalog/1"
# The reference lab's catalog (see the module docstring); not the catalog of every lab.
REFERENCE_CATALOG_PATH = Path(__file__).with_name("catalog.yaml")
CATALOG_PATH = REFERENCE_CATALOG_PATH

ENTRY_FIELDS = ("id", "path", "remote_code", "drafts", "profile")
DRAFT_FIELDS = ("id", "path", "method", "remote_code")
# LAB_MODEL.md section 2: whole counts (mtp_heads and shared_experts may be 0) ...
PROFILE_COUNTS = ("layers", "experts", "experts_per_token", "shared_experts", "hidden", "vocab",
                  "max_context", "mtp_heads")
PROFILE_MAY_BE_ZERO = ("shared_experts", "mtp_heads")
# ... and sizes (billions of parameters, gigabytes).
PROFILE_SIZES = ("total_params_b", "active_params_b", "checkpoint_gb", "decode_bytes_per_token_gb")
KV_DTYPES = ("fp8", "bf16")
PROFILE_FIELDS = (*PROFILE_SIZES[:2], *PROFILE_COUNTS, "kv_bytes_per_token", *PROFILE_SIZES[2:], "source")


class CatalogError(ValueError):
    """The catalog file is malformed; the message names the entry and the field."""


def clean_path(value: str) -> str | None:
    """`value` as an absolute, normalized POSIX path; None for a relative path or one that
    climbs with `..` (refused even where it would land back inside)."""
    if not value.startswith("/") or ".." in value.split("/"):
        return None
    cleaned = posixpath.normpath(value)
    return "/" + cleaned.lstrip("/")


@dataclass(frozen=True)
class KvBytes:
    """Bytes of KV cache one token takes, per KV cache dtype."""

    fp8: int
    bf16: int

    def __getitem__(self, dtype: str) -> int:
        if dtype not in KV_DTYPES:
            raise KeyError(dtype)
        return int(getattr(self, dtype))

    def as_dict(self) -> dict[str, int]:
        return {"fp8": self.fp8, "bf16": self.bf16}


@dataclass(frozen=True)
class ModelProfile:
    """A model's published sizes (LAB_MODEL.md section 2). Every field is optional: a lab
    writes what it knows, and what needs an absent figure says so instead of guessing.
    `kv_bytes_per_token` is per KV cache dtype (fp8, bf16); `source` says where the figures
    come from (a model card, a config.json)."""

    total_params_b: float | None = None
    active_params_b: float | None = None
    layers: int | None = None
    experts: int | None = None
    experts_per_token: int | None = None
    shared_experts: int | None = None
    hidden: int | None = None
    vocab: int | None = None
    max_context: int | None = None
    kv_bytes_per_token: KvBytes | None = None
    checkpoint_gb: float | None = None
    decode_bytes_per_token_gb: float | None = None
    mtp_heads: int | None = None
    source: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields given, as a catalog file writes them."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value.as_dict() if isinstance(value, KvBytes) else value
        return out

    def missing(self, *names: str) -> list[str]:
        """Which of `names` this profile does not give."""
        return [name for name in names if getattr(self, name) is None]

    def weights_per_node_gb(self, nodes: int) -> float | None:
        """The checkpoint's share of one node when it is spread over `nodes` (section 2)."""
        if self.checkpoint_gb is None or nodes < 1:
            return None
        return self.checkpoint_gb / nodes


@dataclass(frozen=True)
class Draft:
    id: str
    path: str
    method: str
    # Whether the lab has read the code this folder would run with --trust-remote-code
    # (drafts are loaded under the served model's trust setting).
    remote_code: bool = False

    def named(self, name: str) -> bool:
        return name.casefold() == self.id.casefold() or clean_path(name) == self.path


@dataclass(frozen=True)
class CatalogModel:
    id: str
    path: str
    remote_code: bool
    drafts: tuple[Draft, ...]
    profile: ModelProfile | None = None

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
    # The file it was read from (None when built from data).
    source: Path | None = None
    # How many nodes the lab has (its inventory's, or its scenario's for a simulated lab),
    # when the catalog was read for a known lab: admission refuses a layout needing more.
    lab_nodes: int | None = None

    def model(self, name: str) -> CatalogModel | None:
        return next((m for m in self.models if m.named(name)), None)

    def served(self, config: Mapping[str, Any]) -> CatalogModel | None:
        """The entry a configuration serves: the model its model.path names, else its
        model.id (None when the lab holds neither)."""
        model = config.get("model") or {}
        for name in (model.get("path"), model.get("id")):
            if isinstance(name, str) and name:
                found = self.model(name)
                if found is not None:
                    return found
        return None

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

    def folder_of(self, path: str) -> tuple[CatalogModel, Draft | None] | None:
        """The catalog entry whose folder holds `path` (or that `path` names): a model, or
        one of its drafts with the model it is listed under; None when no entry's folder
        holds it (another folder of the models directory is not an entry)."""
        cleaned = clean_path(path)
        for model in self.models:
            for draft in model.drafts:
                inside = cleaned is not None and cleaned.startswith(draft.path.rstrip("/") + "/")
                if draft.named(path) or inside:
                    return model, draft
        owner = self.owner_of(path)
        return (owner, None) if owner is not None else None

    def describe(self) -> str:
        return ", ".join(m.describe() for m in self.models)

    def as_data(self) -> dict[str, Any]:
        """The catalog as its file holds it (parse_catalog reads it back equal)."""
        models = []
        for m in self.models:
            entry: dict[str, Any] = {"id": m.id, "path": m.path, "remote_code": m.remote_code,
                                     "drafts": [{"id": d.id, "path": d.path, "method": d.method,
                                                 "remote_code": d.remote_code}
                                                for d in m.drafts]}
            if m.profile is not None:
                entry["profile"] = m.profile.as_dict()
            models.append(entry)
        data: dict[str, Any] = {"schema": SCHEMA, "version": self.version,
                                "models_dir": self.models_dir, "models": models}
        if self.lab_nodes is not None:
            data["lab_nodes"] = self.lab_nodes
        return data


class _Reader:
    """Checks one catalog document; every message starts with `name` (the file)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def fail(self, where: str, problem: str) -> CatalogError:
        return CatalogError(f"{self.name}: {where} {problem}")

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, f"must be a non-empty string, got {value!r}")
        return value

    def path(self, value: Any, where: str) -> str:
        text = self.text(value, where)
        cleaned = clean_path(text)
        if cleaned != text:
            raise self.fail(where, f"must be an absolute, normalized path, got {text!r}")
        return cleaned

    def mapping(self, value: Any, where: str, accepted: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a mapping, got {type(value).__name__}")
        unknown = sorted(str(k) for k in value if k not in accepted)
        if unknown:
            raise self.fail(f"{where}.{unknown[0]}", f"is not a field; accepted: {', '.join(accepted)}")
        return value

    def count(self, value: Any, where: str, *, zero: bool) -> int:
        ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if zero else value > 0)
        if not ok:
            raise self.fail(where, f"must be a whole number {'>= 0' if zero else '> 0'}, got {value!r}")
        return int(value)

    def size(self, value: Any, where: str) -> float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and math.isfinite(value) and value > 0
        if not ok:
            raise self.fail(where, f"must be a number > 0, got {value!r}")
        return float(value)

    def kv_bytes(self, value: Any, where: str) -> KvBytes:
        """A number is bytes per token at fp8 (bf16 twice that), or a mapping {fp8, bf16}."""
        if isinstance(value, dict):
            table = self.mapping(value, where, KV_DTYPES)
            absent = [d for d in KV_DTYPES if d not in table]
            if absent:
                raise self.fail(f"{where}.{absent[0]}", "is required (bytes per token at that KV dtype)")
            return KvBytes(*(self.count(table[d], f"{where}.{d}", zero=False) for d in KV_DTYPES))
        if isinstance(value, int | float) and not isinstance(value, bool):
            fp8 = self.count(value, where, zero=False)
            return KvBytes(fp8, 2 * fp8)
        raise self.fail(where, f"must be bytes per token (at fp8) or a mapping {{fp8, bf16}}, got {value!r}")

    def profile(self, value: Any, where: str) -> ModelProfile:
        table = self.mapping(value, where, PROFILE_FIELDS)
        given: dict[str, Any] = {}
        for name, raw in table.items():
            at = f"{where}.{name}"
            if name in PROFILE_COUNTS:
                given[name] = self.count(raw, at, zero=name in PROFILE_MAY_BE_ZERO)
            elif name in PROFILE_SIZES:
                given[name] = self.size(raw, at)
            elif name == "kv_bytes_per_token":
                given[name] = self.kv_bytes(raw, at)
            else:
                given[name] = self.text(raw, at)
        profile = ModelProfile(**given)
        if (profile.experts is not None and profile.experts_per_token is not None
                and profile.experts_per_token > profile.experts):
            raise self.fail(f"{where}.experts_per_token",
                            f"must be at most experts ({profile.experts}), got {profile.experts_per_token}")
        if (profile.total_params_b is not None and profile.active_params_b is not None
                and profile.active_params_b > profile.total_params_b):
            raise self.fail(f"{where}.active_params_b",
                            f"must be at most total_params_b ({profile.total_params_b:g}), "
                            f"got {profile.active_params_b:g}")
        return profile

    def entry(self, raw: Any, index: int, models_dir: str) -> CatalogModel:
        where = f"models[{index}]"
        entry = self.mapping(raw, where, ENTRY_FIELDS)
        model_id = self.text(entry.get("id"), f"{where}.id")
        where = f"models[{index}] ({model_id})"
        path = self.path(entry.get("path"), f"{where}.path")
        if not path.startswith(models_dir + "/"):
            raise self.fail(f"{where}.path", f"{path!r} is outside {models_dir}")
        remote_code = entry.get("remote_code", False)
        if not isinstance(remote_code, bool):
            raise self.fail(f"{where}.remote_code", "must be true or false")
        raw_drafts = entry.get("drafts") or []
        if not isinstance(raw_drafts, list):
            raise self.fail(f"{where}.drafts", "must be a list of {id, path, method}")
        drafts = []
        for j, d in enumerate(raw_drafts):
            dwhere = f"{where}.drafts[{j}]"
            d = self.mapping(d, dwhere, DRAFT_FIELDS)
            reviewed = d.get("remote_code", False)
            if not isinstance(reviewed, bool):
                raise self.fail(f"{dwhere}.remote_code", "must be true or false")
            drafts.append(Draft(self.text(d.get("id"), f"{dwhere}.id"),
                                self.path(d.get("path"), f"{dwhere}.path"),
                                self.text(d.get("method"), f"{dwhere}.method"), reviewed))
        profile = None
        if entry.get("profile") is not None:
            profile = self.profile(entry["profile"], f"{where}.profile")
        return CatalogModel(model_id, path, remote_code, tuple(drafts), profile)


def parse_catalog(data: Any, *, source: Path | None = None) -> Catalog:
    """Validate a decoded catalog document; CatalogError names the entry and field."""
    reader = _Reader(f"catalog {source}" if source is not None else "catalog")
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise CatalogError(f"{reader.name}: schema must be {SCHEMA}")
    fields = ("schema", "version", "models_dir", "models", "lab_nodes")
    unknown = sorted(str(k) for k in data if k not in fields)
    if unknown:
        raise reader.fail(unknown[0], f"is not a field; accepted: {', '.join(fields)}")
    lab_nodes = data.get("lab_nodes")
    if lab_nodes is not None and (isinstance(lab_nodes, bool) or not isinstance(lab_nodes, int)
                                  or lab_nodes < 1):
        raise reader.fail("lab_nodes", "must be a whole number of nodes, at least 1")
    version = reader.text(data.get("version"), "version")
    models_dir = reader.path(data.get("models_dir"), "models_dir")
    raw_models = data.get("models") or []
    if not isinstance(raw_models, list):
        raise reader.fail("models", "must be a list of models")
    models = [reader.entry(raw, i, models_dir) for i, raw in enumerate(raw_models)]
    if not models:
        raise CatalogError(f"{reader.name}: models must list at least one model")
    for i, model in enumerate(models):
        twin = next((m for m in models[:i] if m.named(model.id) or m.named(model.path)), None)
        if twin is not None:
            raise reader.fail(f"models[{i}] ({model.id})",
                              f"names the same model as {twin.describe()}; list each model once")
    return Catalog(version, models_dir, tuple(models), source, lab_nodes)


@lru_cache(maxsize=32)
def _read(path: Path, _mtime_ns: int, _size: int) -> Catalog:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise CatalogError(f"catalog {path}: not valid YAML ({exc})") from exc
    return parse_catalog(data, source=path)


def load_catalog(path: str | Path | None = None) -> Catalog:
    """A lab's catalog file, read once (again when the file changes). With no path, the
    reference lab's (lab/catalog.yaml): for what names no lab; a known lab's catalog is the
    one its inventory names (lab.inventory.Inventory.catalog)."""
    file = Path(path if path is not None else REFERENCE_CATALOG_PATH).expanduser().resolve()
    try:
        stat = file.stat()
    except OSError as exc:
        raise CatalogError(f"catalog {file}: cannot read ({exc.strerror})") from exc
    return _read(file, stat.st_mtime_ns, stat.st_size)


def reference_catalog() -> Catalog:
    """The reference lab's catalog (lab/catalog.yaml)."""
    return load_catalog(REFERENCE_CATALOG_PATH)
