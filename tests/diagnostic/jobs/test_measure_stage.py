"""The measure stage's reading of the engine's acceptance, for the roofline."""

from __future__ import annotations

from typing import Any

import pytest

from diagnostic.jobs.stages.measure import mean_acceptance_length
from diagnostic.pipelines.measure import claim as claims

NGRAM = {"speculative": {"method": "ngram", "num_speculative_tokens": 4}}


def test_the_acceptance_is_per_draft_from_vllms_drafts_counter() -> None:
    """n-gram often proposes fewer than k tokens: 300 drafts proposed 900 tokens, not 1200.
    1 + k x accepted / drafted would read 1 + 4 x 450 / 900 = 3.0; per draft it is 2.5."""
    runs = [{"metrics": {"drafts": 100.0, "accepted": 150.0, "drafted": 300.0}},
            {"metrics": {"drafts": 200.0, "accepted": 300.0, "drafted": 600.0}}]
    workload: dict[str, Any] = {
        "server_claim": {"metrics": {"accepted": 450.0, "drafted": 900.0}},
        "draft_acceptance": claims.draft_acceptance([], [], runs=runs),
    }
    assert mean_acceptance_length(NGRAM, workload) == pytest.approx(2.5)


def test_sglangs_accept_len_is_taken_as_it_says() -> None:
    workload = {"draft_acceptance": {"source": "log", "drafts": None, "mean_acceptance_length": 3.1}}
    assert mean_acceptance_length(NGRAM, workload) == pytest.approx(3.1)


def test_without_speculation_or_the_engines_word_there_is_none() -> None:
    said = {"draft_acceptance": {"mean_acceptance_length": 3.0}}
    assert mean_acceptance_length({"speculative": None}, said) is None
    assert mean_acceptance_length(NGRAM, {"draft_acceptance": None}) is None
    assert mean_acceptance_length(NGRAM, {}) is None
