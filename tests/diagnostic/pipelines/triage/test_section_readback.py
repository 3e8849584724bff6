"""The triage's cold_start section read back by the stages after it: the customer's true cold
starts (the waterfall's baseline, else reproduce's start) and the starts with every fix."""

from __future__ import annotations

from diagnostic.pipelines.triage.section import ColdStartSection, customer_cold_starts

TRIAGE = {"sections": {"cold_start": {
    "before_s": 560.0, "proved": ["load.weights_io"], "after_samples_s": [150, 151.5],
    "waterfall": [{"step": "yours", "mode": "baseline", "samples_s": [561, 559.5]},
                  {"step": "1", "mode": "cumulative", "samples_s": [300.0]}],
}}}


def test_the_customers_starts_are_the_waterfalls_baseline() -> None:
    assert customer_cold_starts(TRIAGE, {"cold_start_s": 570.0}) == [561.0, 559.5]


def test_without_a_triage_the_customers_start_is_reproduces() -> None:
    assert customer_cold_starts(None, {"cold_start_s": 570.0}) == [570.0]
    assert customer_cold_starts({"sections": {}}, {"cold_start_s": 570}) == [570.0]
    assert customer_cold_starts(None, {}) == []


def test_the_section_says_what_was_proved_and_the_starts_after() -> None:
    section = ColdStartSection(TRIAGE)
    assert section and section.proved == ["load.weights_io"]
    assert section.after_samples() == [150.0, 151.5]
    empty = ColdStartSection({"sections": {"cold_start": None}})
    assert not empty and empty.proved is None
    assert empty.after_samples() == [] and empty.baseline_samples() == []
