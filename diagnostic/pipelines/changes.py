"""Changes to a customer's configuration that a pipeline has proved, and how they compose.

A change is a plain JSON mapping, so that it travels in a stage's result and in findings.json:
`{"path": "serving.load_format", "from": "auto", "to": "fastsafetensors", "finding": "load.weights_io"}`.
`path` is a dotted field of `diagnostic.config/1`; under `env` the last part is the variable's
name, and `to: null` removes that variable. Each stage works on the customer's configuration with
every earlier stage's changes applied, and the tuned configuration is all of them composed.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from lab.catalog import Catalog
from lab.engines import normalize_config, renormalize

Change = dict[str, Any]


class ChangeError(ValueError):
    """A change that does not name a field of the configuration."""


def change(path: str, before: Any, after: Any, *, finding: str, why: str = "") -> Change:
    """One change, in the shape results and findings carry."""
    out: Change = {
        "path": path, "from": copy.deepcopy(before), "to": copy.deepcopy(after), "finding": finding,
    }
    if why:
        out["why"] = why
    return out


def get_path(config: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path, or None where a part is absent."""
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def apply_changes(config: Mapping[str, Any], changes: Iterable[Mapping[str, Any]], *,
                  catalog: Catalog | None = None) -> dict[str, Any]:
    """`config` with every change applied in order, normalized again (a change may make another
    field's default differ, e.g. a speculative method that takes no draft model). With the
    lab's `catalog`, also admitted by it; without, the catalog check is left to `render`,
    which admits every launch against the lab's catalog before a node sees it."""
    out: dict[str, Any] = copy.deepcopy(dict(config))
    for item in changes:
        path = str(item.get("path") or "")
        parts = path.split(".")
        if not path or any(not p for p in parts):
            raise ChangeError(f"change path: a dotted configuration field is needed, got {path!r}")
        node: dict[str, Any] = out
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = {}
                node[part] = child
            if not isinstance(child, dict):
                raise ChangeError(f"change path {path!r}: {part!r} is not a section of the configuration")
            node = child
        leaf = parts[-1]
        value = copy.deepcopy(item.get("to"))
        if value is None and parts[0] == "env":
            node.pop(leaf, None)
        else:
            node[leaf] = value
    # A launch command the customer pasted was parsed into the structured fields already;
    # the normalized form never carries it, so re-normalizing sees only fields.
    return normalize_config(out, catalog=catalog) if catalog is not None else renormalize(out)


