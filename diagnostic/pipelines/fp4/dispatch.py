"""The FP4 dispatch table: known (engine, version, compute capability, backend) outcomes.

`dispatch_table.yaml` in this package lists what public reports say about FP4 kernel
backends on given hardware, each row with its source and date. `find_row` returns the row
that matches the backend an engine actually chose (read from its log, never from the
configuration). A row only says where to look first; the verdict comes from the checks.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

TABLE_PATH = Path(__file__).with_name("dispatch_table.yaml")
TABLE_SCHEMA = "diagnostic.fp4-dispatch/1"
STATUSES = ("bad", "degraded", "ok")
LAYERS = ("moe", "linear")
_COMPARISON = re.compile(r"^\s*(>=|<=|==|>|<)\s*(\d+(?:\.\d+)*)\s*$")
_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")


class DispatchTableError(ValueError):
    """The table file is malformed; the message names the row and field."""


@dataclass(frozen=True)
class DispatchTable:
    version: int
    sha256: str
    rows: tuple[dict[str, Any], ...]
    capabilities: tuple[dict[str, Any], ...] = ()


def release(version: str) -> tuple[int, ...] | None:
    """The numeric release part of a version string ('0.29.1rc2' -> (0, 29, 1))."""
    m = _RELEASE.match(str(version))
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def _padded(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def version_in(version: str, spec: str) -> bool:
    """Whether `version` satisfies every comparison of `spec` (">=0.25.0,<0.31")."""
    have = release(version)
    if have is None:
        return False
    for part in spec.split(","):
        if not part.strip():
            continue
        m = _COMPARISON.match(part)
        if not m:
            raise DispatchTableError(f"versions: cannot read {part!r}")
        a, b = _padded(have, tuple(int(p) for p in m.group(2).split(".")))
        op = m.group(1)
        ok = {">=": a >= b, "<=": a <= b, "==": a == b, ">": a > b, "<": a < b}[op]
        if not ok:
            return False
    return True


def _check_row(index: int, row: Any) -> dict[str, Any]:
    where = f"rows[{index}]"
    if not isinstance(row, dict):
        raise DispatchTableError(f"{where}: must be a mapping")
    for key in (
        "id",
        "engine",
        "versions",
        "compute_capability",
        "layer",
        "backend",
        "status",
        "claim",
        "sources",
        "recorded",
    ):
        if not row.get(key):
            raise DispatchTableError(f"{where}.{key}: missing")
    if row["status"] not in STATUSES:
        raise DispatchTableError(f"{where}.status: {row['status']!r} is not one of {STATUSES}")
    if row["layer"] not in LAYERS:
        raise DispatchTableError(f"{where}.layer: {row['layer']!r} is not one of {LAYERS}")
    version_in("0", str(row["versions"]))  # the range must at least parse
    for j, source in enumerate(row["sources"]):
        url = source.get("url") if isinstance(source, dict) else None
        if not isinstance(url, str) or not url.startswith("https://"):
            raise DispatchTableError(f"{where}.sources[{j}].url: a public https URL is needed")
    return dict(row)


@cache
def load_table(path: Path = TABLE_PATH) -> DispatchTable:
    raw = path.read_bytes()
    data = yaml.safe_load(raw)
    if not isinstance(data, dict) or data.get("schema") != TABLE_SCHEMA:
        raise DispatchTableError(f"{path.name}: schema must be {TABLE_SCHEMA}")
    rows = tuple(_check_row(i, r) for i, r in enumerate(data.get("rows") or []))
    caps = tuple(_check_capability(i, c) for i, c in enumerate(data.get("capabilities") or []))
    return DispatchTable(int(data.get("version", 0)), hashlib.sha256(raw).hexdigest(), rows, caps)


def _check_capability(index: int, entry: Any) -> dict[str, Any]:
    where = f"capabilities[{index}]"
    if not isinstance(entry, dict):
        raise DispatchTableError(f"{where}: must be a mapping")
    for key in ("id", "engine", "versions", "compute_capability", "sources", "recorded"):
        if not entry.get(key):
            raise DispatchTableError(f"{where}.{key}: missing")
    version_in("0", str(entry["versions"]))
    for layer in LAYERS:
        block = entry.get(layer)
        if block is None:
            continue
        if not isinstance(block, dict) or not isinstance(block.get("can"), list):
            raise DispatchTableError(f"{where}.{layer}.can: a list of backend names is needed")
        both = set(block["can"]) & set(block.get("cannot") or [])
        if both:
            raise DispatchTableError(f"{where}.{layer}: {sorted(both)} both can and cannot")
    for j, source in enumerate(entry["sources"]):
        url = source.get("url") if isinstance(source, dict) else None
        if not isinstance(url, str) or not url.startswith("https://"):
            raise DispatchTableError(f"{where}.sources[{j}].url: a public https URL is needed")
    return dict(entry)


def capability(*, engine: str, version: str, compute_capability: str | None, layer: str,
               table: DispatchTable | None = None) -> dict[str, Any] | None:
    """The table's capability block for `layer` on this engine version and device (with
    the entry's id and sources), or None when the table has none."""
    table = table or load_table()
    for entry in table.capabilities:
        if entry["engine"] == engine and compute_capability is not None \
                and str(entry["compute_capability"]) == str(compute_capability) \
                and version_in(version, str(entry["versions"])) and isinstance(entry.get(layer), dict):
            return {**entry[layer], "id": entry["id"], "sources": [s["url"] for s in entry["sources"]]}
    return None


def can_run(backend: str, block: dict[str, Any] | None) -> tuple[bool, str]:
    """Whether the table lets `backend` be tried on the device, and why not."""
    if block is None:
        return True, ""
    if backend in (block.get("cannot") or []):
        return False, f"cannot run NVFP4 on this device (dispatch table {block['id']})"
    if backend not in block["can"]:
        return False, f"not an NVFP4 path on this device (dispatch table {block['id']})"
    return True, ""


def default_backend(*, engine: str, version: str, compute_capability: str | None, layer: str,
                    table: DispatchTable | None = None) -> str | None:
    """The backend the version's default rule picks for `layer` on the device, when the
    table records it (what ran when the flag says auto and the log names none)."""
    block = capability(engine=engine, version=version, compute_capability=compute_capability,
                       layer=layer, table=table)
    value = (block or {}).get("default")
    return str(value) if value else None


def find_row(
    *,
    engine: str,
    version: str,
    compute_capability: str | None,
    backend: str,
    layer: str | None = None,
    table: DispatchTable | None = None,
) -> dict[str, Any] | None:
    """The row for this backend on this engine version and GPU, or None when the table has
    nothing to say. A row for another layer of the same backend still matches when the
    log did not say which layer the backend serves."""
    table = table or load_table()
    matches = [
        row
        for row in table.rows
        if row["engine"] == engine
        and row["backend"] == backend
        and compute_capability is not None
        and str(row["compute_capability"]) == str(compute_capability)
        and version_in(version, str(row["versions"]))
        and (layer is None or row["layer"] == layer)
    ]
    if not matches:
        return None
    # A bad row outranks a degraded one, which outranks ok: look first where it hurts.
    return min(matches, key=lambda r: STATUSES.index(r["status"]))


def row_summary(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fields of a row that findings.json carries."""
    if row is None:
        return None
    return {
        "id": row["id"],
        "engine": row["engine"],
        "versions": row["versions"],
        "compute_capability": str(row["compute_capability"]),
        "layer": row["layer"],
        "backend": row["backend"],
        "status": row["status"],
        "claim": " ".join(str(row["claim"]).split()),
        "sources": [s["url"] for s in row["sources"]],
        "reported": row.get("reported"),
        "recorded": row.get("recorded"),
    }


def dispatch_label(row: dict[str, Any] | None) -> str:
    """What the report's "Dispatch table" column says for a backend."""
    if row is None:
        return "no entry"
    return {"bad": "known bad", "degraded": "known degraded", "ok": "known ok"}[row["status"]]
