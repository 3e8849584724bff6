"""Proved configuration changes compose onto the customer's configuration."""

import pytest

from diagnostic.pipelines.changes import ChangeError, apply_changes, change, get_path
from lab.engines import normalize_config

CUSTOMER = normalize_config({
    "parallel": {"tp": 8},
    "speculative": {"method": "eagle3", "draft_model": "AQ-MedAI/Kimi-K2-Instruct-eagle3",
                    "num_speculative_tokens": 4},
    "env": {"VLLM_USE_DEEP_GEMM": "1"},
})


def test_it_applies_changes_in_order_and_keeps_the_original():
    changes = [
        change("serving.load_format", "auto", "fastsafetensors", finding="load.weights_io"),
        change("env.NCCL_SOCKET_IFNAME", None, "eth9", finding="load.rendezvous"),
        change("serving.load_format", "fastsafetensors", "safetensors", finding="load.weights_io"),
    ]
    tuned = apply_changes(CUSTOMER, changes)
    assert tuned["serving"]["load_format"] == "safetensors"
    assert tuned["env"]["NCCL_SOCKET_IFNAME"] == "eth9"
    assert CUSTOMER["serving"]["load_format"] == "auto"
    assert "NCCL_SOCKET_IFNAME" not in CUSTOMER["env"]


def test_it_removes_an_env_variable_set_to_null():
    tuned = apply_changes(CUSTOMER, [change("env.VLLM_USE_DEEP_GEMM", "1", None, finding="fp4.x")])
    assert "VLLM_USE_DEEP_GEMM" not in tuned["env"]


def test_it_renormalizes_a_whole_section_change():
    tuned = apply_changes(CUSTOMER, [change("speculative", CUSTOMER["speculative"],
                                            {"method": "ngram", "num_speculative_tokens": 2},
                                            finding="specdec.suboptimal")])
    assert tuned["speculative"]["method"] == "ngram"
    assert tuned["speculative"]["draft_model"] is None
    assert get_path(tuned, "speculative.num_speculative_tokens") == 2


def test_it_refuses_a_path_through_a_value():
    with pytest.raises(ChangeError, match=r"serving\.load_format\.x"):
        apply_changes(CUSTOMER, [{"path": "serving.load_format.x", "to": 1}])


def test_a_change_that_makes_the_configuration_invalid_is_a_config_error():
    from lab.config import ConfigError

    with pytest.raises(ConfigError, match=r"serving\.load_format"):
        apply_changes(CUSTOMER, [{"path": "serving.load_format", "to": "bogus"}])
