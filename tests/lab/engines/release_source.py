"""The released packages' source, read (never imported) from the archives the engines were
downloaded as (out/engine-downloads/: the wheels a node installs), for the tests that
hold the platform to the lines it cites. Where the archives are absent (a fresh clone, CI)
those checks are skipped; the behaviour each test states is checked either way."""

from __future__ import annotations

import ast
import tarfile
import zipfile
from functools import cache
from pathlib import Path

import pytest

DOWNLOADS = Path(__file__).resolve().parents[3] / "out" / "engine-downloads"


@cache
def _text(engine: str, version: str, path: str) -> str | None:
    wheels = sorted(DOWNLOADS.glob(f"{engine}-{version}-*.whl"))
    if wheels:
        with zipfile.ZipFile(wheels[0]) as wheel:
            return wheel.read(path).decode()
    archive = DOWNLOADS / f"{engine}-{version}.tar.gz"  # what an older `make engine-tables` kept
    if not archive.is_file():
        return None
    with tarfile.open(archive) as tar:
        member = tar.extractfile(f"{engine}-{version}/{path}")
        return member.read().decode() if member is not None else None


def source(engine: str, version: str, path: str) -> str:
    """The text of `path` in the released package (pytest.skip when its archive is absent)."""
    text = _text(engine, version, path)
    if text is None:
        pytest.skip(f"{engine} {version}'s archive is not in {DOWNLOADS}")
    return text


def line(engine: str, version: str, path: str, number: int) -> str:
    """Line `number` (1-based) of `path` in the released package."""
    return source(engine, version, path).splitlines()[number - 1]


def class_node(engine: str, version: str, path: str, name: str) -> ast.ClassDef:
    """The class `name` of `path`, parsed (not run)."""
    tree = ast.parse(source(engine, version, path))
    found = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    assert found is not None, f"{path} has no class {name}"
    return found


def function_node(engine: str, version: str, path: str, name: str) -> ast.FunctionDef:
    """The top-level function `name` of `path`, parsed (not run)."""
    tree = ast.parse(source(engine, version, path))
    found = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    assert found is not None, f"{path} has no function {name}"
    return found
