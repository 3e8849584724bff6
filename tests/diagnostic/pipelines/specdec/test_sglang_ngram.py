"""n-gram on SGLang as its releases take it, and EAGLE-3 drafts by the lab's own path."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from diagnostic.pipelines.specdec.pipeline import (
    SGLANG_NGRAM_FLAG,
    lab_draft,
    ngram_note,
    speculative_block,
)
from diagnostic.pipelines.specdec.search import Setting
from lab.catalog import Catalog, parse_catalog, reference_catalog
from lab.engines.tables import flag, release


def test_sglang_ngram_is_tuned_by_its_draft_tree_size_where_the_version_has_it() -> None:
    for version in ("0.5.12", "0.5.23"):
        table = release("sglang", version)
        assert flag(table, SGLANG_NGRAM_FLAG) is not None
        # The match-window flags the platform once rendered are gone from these releases.
        assert flag(table, "--speculative-ngram-max-match-window-size") is None
        assert ngram_note("sglang", version) is None
    assert ngram_note("vllm", "0.34.0") is None
    assert "not tried" in str(ngram_note("sglang", "0.5.6"))  # no table: not a modelled release


def test_the_customers_match_window_is_kept_on_vllm_and_dropped_on_sglang() -> None:
    customer = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5,
                "prompt_lookup_min": 2, "draft_model": None}
    on_vllm = speculative_block(Setting("ngram", 3), None, customer, engine="vllm")
    assert (on_vllm["prompt_lookup_max"], on_vllm["prompt_lookup_min"]) == (5, 2)
    on_sglang = speculative_block(Setting("ngram", 3), None, customer, engine="sglang")
    assert on_sglang["prompt_lookup_max"] is None and on_sglang["prompt_lookup_min"] is None
    assert on_sglang["num_speculative_tokens"] == 3


def _session(catalog: Catalog) -> Any:
    return cast(Any, SimpleNamespace(inventory=SimpleNamespace(catalog=catalog)))


def test_a_public_draft_is_named_by_the_labs_copy() -> None:
    reference = reference_catalog()
    path = lab_draft(_session(reference), "moonshotai/Kimi-K2-Instruct-0905",
                     "AQ-MedAI/Kimi-K2-Instruct-eagle3")
    [held] = reference.model("moonshotai/Kimi-K2-Instruct-0905").drafts  # type: ignore[union-attr]
    assert path is not None and path == held.path and path.startswith(reference.models_dir + "/")
    # The model may be named by its path in the lab too.
    assert lab_draft(_session(reference), "/models/kimi-k2", "AQ-MedAI/Kimi-K2-Instruct-eagle3") == held.path
    assert lab_draft(_session(reference), "moonshotai/Kimi-K2-Instruct-0905", "someone/other-eagle3") is None
    assert lab_draft(_session(reference), "no/such-model", "AQ-MedAI/Kimi-K2-Instruct-eagle3") is None


def test_the_draft_path_is_the_labs_own_not_the_reference_labs() -> None:
    """Another lab keeps its copy elsewhere, or holds none: its own catalog decides."""
    elsewhere = parse_catalog({
        "schema": "lab.catalog/1", "version": "1", "models_dir": "/srv/weights",
        "models": [{"id": "moonshotai/Kimi-K2-Instruct-0905", "path": "/srv/weights/kimi",
                    "remote_code": True,
                    "drafts": [{"id": "AQ-MedAI/Kimi-K2-Instruct-eagle3", "path": "/srv/weights/k2-draft",
                                "method": "eagle3"}]}],
    })
    assert lab_draft(_session(elsewhere), "moonshotai/Kimi-K2-Instruct-0905",
                     "AQ-MedAI/Kimi-K2-Instruct-eagle3") == "/srv/weights/k2-draft"
    without = parse_catalog({
        "schema": "lab.catalog/1", "version": "1", "models_dir": "/models",
        "models": [{"id": "moonshotai/Kimi-K2-Instruct-0905", "path": "/models/kimi-k2",
                    "remote_code": True}],
    })
    assert lab_draft(_session(without), "moonshotai/Kimi-K2-Instruct-0905",
                     "AQ-MedAI/Kimi-K2-Instruct-eagle3") is None
