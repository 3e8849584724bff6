"""Submitted configurations: normalized by lab.config; errors name the field."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ValidationError

from diagnostic.bookings.configs import form_text, normalize_submission, submit_configuration
from diagnostic.bookings.models import ClusterConfiguration
from tests.diagnostic.conftest import REFERENCE_CONFIG

COMMAND = (REFERENCE_CONFIG.parent / "kimi-k2-8spark-outofbox-command.txt").read_text()


def messages(exc: pytest.ExceptionInfo[ValidationError]) -> str:
    return " ".join(exc.value.messages)


@pytest.mark.django_db
def test_a_yaml_submission_is_stored_verbatim_with_its_normalized_form() -> None:
    text = REFERENCE_CONFIG.read_text()
    config = submit_configuration(raw_text=text, source="yaml")
    config.refresh_from_db()
    assert config.raw_text == text
    assert config.normalized["schema"] == "diagnostic.config/1"
    assert config.normalized["parallel"] == {"tp": 8, "pp": 1, "expert_parallel": True}


def test_a_wrong_value_is_reported_with_its_field() -> None:
    text = REFERENCE_CONFIG.read_text().replace("tp: 8", "tp: eight")
    with pytest.raises(ValidationError) as caught:
        normalize_submission(text, "yaml")
    assert "parallel.tp" in messages(caught)
    assert caught.value.error_dict.keys() == {"raw_text"}


def test_an_unknown_field_is_reported_by_name() -> None:
    text = REFERENCE_CONFIG.read_text().replace("kv_cache_dtype: fp8", "kv_cache_dtyp: fp8")
    with pytest.raises(ValidationError) as caught:
        normalize_submission(text, "yaml")
    assert "kv_cache_dtyp" in messages(caught)


def test_yaml_aliases_are_refused() -> None:
    text = "schema: diagnostic.config/1\nbase: &b {tp: 8}\nparallel: *b\n"
    with pytest.raises(ValidationError) as caught:
        normalize_submission(text, "yaml")
    assert "aliases" in messages(caught)


def test_oversized_yaml_is_refused_before_parsing() -> None:
    text = REFERENCE_CONFIG.read_text() + "#" * 70_000
    with pytest.raises(ValidationError) as caught:
        normalize_submission(text, "yaml")
    assert "limit" in messages(caught)


def test_a_pasted_launch_command_normalizes_like_the_structured_file() -> None:
    from_command = normalize_submission(COMMAND, "command")
    from_yaml = normalize_submission(REFERENCE_CONFIG.read_text(), "yaml")
    assert from_command["parallel"] == from_yaml["parallel"]
    assert from_command["speculative"] == from_yaml["speculative"]


def test_an_unparseable_command_names_the_token() -> None:
    with pytest.raises(ValidationError) as caught:
        normalize_submission("vllm serve /models/kimi-k2 --tensor-parallel-size 8 --frobnicate", "command")
    assert "--frobnicate" in messages(caught)


def test_form_fields_are_normalized_and_kept_as_json() -> None:
    fields = {"parallel": {"tp": 4, "pp": 2}, "cluster": {"nodes": 8}}
    normalized = normalize_submission(form_text(fields), "form")
    assert normalized["parallel"]["pp"] == 2
    assert json.loads(form_text(fields)) == fields


def test_form_data_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ValidationError, match="JSON object"):
        normalize_submission("[1, 2]", "form")


def test_an_unknown_source_lists_the_accepted_ones() -> None:
    with pytest.raises(ValidationError) as caught:
        normalize_submission("x: 1", "email")
    assert "accepted: form, yaml, command" in messages(caught)


@pytest.mark.django_db
def test_a_rejected_submission_stores_nothing() -> None:
    with pytest.raises(ValidationError):
        submit_configuration(raw_text="schema: diagnostic.config/1\nparallel: {tp: 0}\n", source="yaml")
    assert ClusterConfiguration.objects.count() == 0


@pytest.mark.parametrize("raw", ['{"parallel": {"tp": ' + "9" * 5000 + "}}", "[" * 100000,
                                 '{"cluster": {"link_gbps": Infinity}}'])
def test_form_data_beyond_the_json_decoders_limits_is_a_field_error(raw: str) -> None:
    with pytest.raises(ValidationError) as info:
        normalize_submission(raw, ClusterConfiguration.Source.FORM)
    assert "raw_text" in info.value.message_dict
