"""The workloads: enough prompts, fixed parameters, and each prompt on the right side of the rule."""

from __future__ import annotations

import pytest

from diagnostic.pipelines.workloads import (
    CODE_WORDS,
    WorkloadError,
    classify_prompt,
    load_workload,
    parse_workload,
)


@pytest.mark.parametrize("name", ["code", "prose"])
def test_each_workload_has_fifteen_prompts_two_warmups_and_a_version(name: str) -> None:
    w = load_workload(name)
    assert len(w.prompts) >= 15
    assert len(w.warmup) == 2
    assert isinstance(w.version, int) and w.version >= 1
    assert len(set(w.prompts)) == len(w.prompts)


@pytest.mark.parametrize("name", ["code", "prose"])
def test_request_parameters_are_the_fixed_protocol(name: str) -> None:
    r = load_workload(name).request
    assert r["temperature"] == 0
    assert r["max_tokens"] == 512
    assert r["ignore_eos"] is True
    assert r["stream"] is True
    assert r["stream_options"] == {"include_usage": True}


def test_every_code_prompt_is_classified_as_code() -> None:
    w = load_workload("code")
    for prompt in (*w.warmup, *w.prompts):
        assert classify_prompt(prompt) == "code", prompt


def test_no_prose_prompt_contains_a_code_word_even_inside_a_longer_word() -> None:
    w = load_workload("prose")
    for prompt in (*w.warmup, *w.prompts):
        lowered = prompt.lower()
        assert "```" not in prompt
        hits = [word for word in CODE_WORDS if word.lower() in lowered]
        assert hits == [], f"{prompt!r} contains {hits}"
        assert classify_prompt(prompt) == "prose"


def test_the_simulated_model_classifies_the_workloads_the_same_way() -> None:
    text = pytest.importorskip("lab.sim.text")
    for name in ("code", "prose"):
        w = load_workload(name)
        assert {text.classify_prompt(p) for p in (*w.warmup, *w.prompts)} == {name}


def test_classification_follows_the_rule_on_edge_cases() -> None:
    assert classify_prompt("Explain this:\n```\nx = 1\n```") == "code"
    assert classify_prompt("Fix the BUG please") == "code"
    assert classify_prompt("Describe a classic novel") == "prose"  # 'classic' is not the word 'class'


def test_a_malformed_workload_names_the_field() -> None:
    with pytest.raises(WorkloadError, match="prompts"):
        parse_workload(
            {
                "schema": "diagnostic.workload/1",
                "name": "x",
                "version": 1,
                "request": {},
                "warmup": [],
                "prompts": "not a list",
            }
        )
    with pytest.raises(WorkloadError, match="not one of"):
        load_workload("poetry")


def test_the_digest_changes_when_a_prompt_changes() -> None:
    w = load_workload("code")
    changed = parse_workload(
        {
            "schema": "diagnostic.workload/1",
            "name": w.name,
            "version": w.version,
            "request": w.request,
            "warmup": list(w.warmup),
            "prompts": [*w.prompts[:-1], "Write a function."],
        }
    )
    assert changed.digest != w.digest
