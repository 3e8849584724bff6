"""The modelled engine releases as data: what each version's package says about its flags,
environment variables, log lines and metrics.

The tables live in lab/engines/releases/<engine>-<version>.json; `python -m
enginetables.extract ENGINE==VERSION` writes them from the released package (the format
is described there) and `make engine-tables` checks them against the registry. This
module only reads them: `modelled_versions("vllm")`, `release("vllm", "0.34.0")`, and
`flag(table, "-tp")` to find a flag by any of its option strings. A table is shared
between callers: read it, do not change it.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

RELEASES_DIR = Path(__file__).resolve().parent / "releases"
_NAME = re.compile(r"^(?P<engine>[a-z]+)-(?P<version>\d[\w.+-]*)\.json$")


def _version_key(version: str) -> tuple[tuple[int, str], ...]:
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"[.+-]", version))


@cache
def _index(directory: Path) -> dict[str, tuple[str, ...]]:
    found: dict[str, list[str]] = {}
    for path in directory.glob("*.json"):
        m = _NAME.match(path.name)
        if m:
            found.setdefault(m["engine"], []).append(m["version"])
    return {engine: tuple(sorted(versions, key=_version_key)) for engine, versions in found.items()}


def modelled_versions(engine: str, *, directory: Path = RELEASES_DIR) -> tuple[str, ...]:
    """The versions of `engine` that have a table, oldest first (empty if none)."""
    return _index(directory).get(engine, ())


@cache
def _load(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


def release(engine: str, version: str, *, directory: Path = RELEASES_DIR) -> dict[str, Any]:
    """The table of `engine` `version`; LookupError naming the modelled versions if there
    is none."""
    if version not in modelled_versions(engine, directory=directory):
        known = ", ".join(modelled_versions(engine, directory=directory)) or "none"
        raise LookupError(f"{engine} {version} is not a modelled release; modelled: {known}")
    table = _load(directory / f"{engine}-{version}.json")
    if table.get("engine") != engine or table.get("version") != version:
        raise LookupError(f"{engine}-{version}.json holds {table.get('engine')} "
                          f"{table.get('version')}")
    return table


def flag(table: dict[str, Any], option: str) -> dict[str, Any] | None:
    """The flag entry that `option` (any of its option strings, --no- forms included)
    names in `table`, or None when the release has no such option."""
    for entry in table["flags"].values():
        if option in entry["option_strings"]:
            return dict(entry)
    return None
