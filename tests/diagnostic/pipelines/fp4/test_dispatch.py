"""The dispatch table: every row sourced and dated, and the finder's matching rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnostic.pipelines.fp4.dispatch import (
    DispatchTableError,
    dispatch_label,
    find_row,
    load_table,
    version_in,
)


def test_every_row_has_a_public_source_and_a_date() -> None:
    table = load_table()
    assert table.rows and len(table.sha256) == 64
    urls = {s["url"] for row in table.rows for s in row["sources"]}
    for number in (
        "vllm-project/vllm/issues/40357",
        "vllm-project/vllm/issues/48898",
        "flashinfer-ai/flashinfer/issues/2577",
    ):
        assert any(u.endswith(number) for u in urls)
    for row in table.rows:
        assert row["recorded"] and row["claim"]
        assert all(s["url"].startswith("https://github.com/") for s in row["sources"])


def test_version_ranges() -> None:
    assert version_in("0.29.1", ">=0.25.0")
    assert version_in("0.25.1rc2", ">=0.25.1,<0.26")
    assert not version_in("0.24.9", ">=0.25.0")
    assert not version_in("0.30", ">=0.25.0,<0.30")
    assert version_in("1.0", "==1.0.0")
    assert not version_in("nightly", ">=0.1")
    with pytest.raises(DispatchTableError):
        version_in("1.0", "~=1.0")


def test_the_finder_matches_engine_version_capability_and_backend() -> None:
    row = find_row(
        engine="vllm", version="0.29.1", compute_capability="12.1", backend="flashinfer_cutlass", layer="moe"
    )
    assert row is not None and row["status"] == "bad" and dispatch_label(row) == "known bad"
    # Same backend on another GPU, another engine, or an older version: the table is silent.
    assert (
        find_row(engine="vllm", version="0.29.1", compute_capability="10.0", backend="flashinfer_cutlass")
        is None
    )
    assert (
        find_row(engine="sglang", version="0.5.6", compute_capability="12.1", backend="flashinfer_cutlass")
        is None
    )
    assert (
        find_row(engine="vllm", version="0.20.0", compute_capability="12.1", backend="flashinfer_cutlass")
        is None
    )
    assert find_row(engine="vllm", version="0.29.1", compute_capability="12.1", backend="cutlass") is None
    assert dispatch_label(None) == "no entry"
    # Without the layer, a row of either layer matches; with it, only that layer's.
    assert find_row(engine="vllm", version="0.25.1", compute_capability="12.0", backend="cutlass") is not None
    assert (
        find_row(engine="vllm", version="0.25.1", compute_capability="12.0", backend="cutlass", layer="moe")
        is None
    )


def test_a_row_without_a_source_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "schema: diagnostic.fp4-dispatch/1\nversion: 1\nrows:\n"
        "  - {id: x, engine: vllm, versions: '>=0', compute_capability: '12.1', layer: moe,\n"
        "     backend: b, status: bad, claim: c, recorded: '2026-01-01', sources: [{url: 'nope'}]}\n"
    )
    with pytest.raises(DispatchTableError, match="public https URL"):
        load_table(path)
