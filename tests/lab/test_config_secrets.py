"""Secrets in a configuration (lab.config, "secrets"): each kind a customer can hand over is
found and masked (`••••` and at most the last four characters), a refusal never quotes one
back, and an engine decides whether it authenticates as vLLM and SGLang do.

Each test is an attack: the input carrying the secret, and what the platform does with it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.config import (
    SECRET_MASK,
    ConfigError,
    config_secrets,
    engine_api_keys,
    mask_config,
    mask_secret,
    mask_text,
    shown,
)
from lab.engines import normalize_config, parse_command

REPO = Path(__file__).resolve().parents[2]
REFERENCE_CONFIG = REPO / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"

KEY = "sk-live-4f9c2b7e11d04a6e8c3b5a9d7e1f0c2b"
ENV_KEY = "sk-env-0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e"
REFERENCE = normalize_config(yaml.safe_load(REFERENCE_CONFIG.read_text()))


def with_(**fields: Any) -> dict[str, Any]:
    config = copy.deepcopy(REFERENCE)
    config.update(fields)
    return normalize_config(config)


def stored(**fields: Any) -> dict[str, Any]:
    """A configuration as a record may hold it without today's intake: one stored before
    the environment became an exact list (lab/env_policy.yaml refuses these variables and
    values now). Masking does not depend on intake having refused them."""
    config = copy.deepcopy(REFERENCE)
    config.update(fields)
    return config


# (what carries the secret, the configuration, the secret, where its mask must be)
CARRIERS: list[tuple[str, dict[str, Any], str, Any]] = [
    ("--api-key VALUE", with_(extra_args=["--api-key", KEY]), KEY,
     lambda c: c["extra_args"][1]),
    ("--api-key=VALUE", with_(extra_args=[f"--api-key={KEY}"]), KEY,
     lambda c: c["extra_args"][0].partition("=")[2]),
    ("--api_key VALUE (vLLM's underscores)", with_(extra_args=["--api_key", KEY]), KEY,
     lambda c: c["extra_args"][1]),
    ("VLLM_API_KEY", with_(env={"VLLM_API_KEY": ENV_KEY}), ENV_KEY,
     lambda c: c["env"]["VLLM_API_KEY"]),
    ("a credential variable", stored(env={"SGLANG_S3_SECRET_ACCESS_KEY": ENV_KEY}), ENV_KEY,
     lambda c: c["env"]["SGLANG_S3_SECRET_ACCESS_KEY"]),
    ("a token in a URL's userinfo", stored(env={"NCCL_DEBUG_SUBSYS": f"https://ci:{KEY}@mirror.example/x"}),
     KEY, lambda c: c["env"]["NCCL_DEBUG_SUBSYS"].split(":")[2].split("@")[0]),
    ("a token in a URL's query", stored(env={"NCCL_DEBUG_SUBSYS": f"https://mirror.example/x?token={KEY}&v=1"}),
     KEY, lambda c: c["env"]["NCCL_DEBUG_SUBSYS"].split("token=")[1].split("&")[0]),
]


@pytest.mark.parametrize(("carrier", "config", "secret", "where"), CARRIERS, ids=[c[0] for c in CARRIERS])
def test_every_kind_of_secret_is_found_and_masked(carrier: str, config: dict[str, Any], secret: str,
                                                  where: Any) -> None:
    assert secret in json.dumps(config)  # normalization itself keeps values as given
    assert config_secrets(config) == [secret]
    masked = mask_config(config)
    assert secret not in json.dumps(masked, ensure_ascii=False)
    assert where(masked) == SECRET_MASK + secret[-4:]
    assert mask_config(masked) == masked  # idempotent: a stored configuration stays as it is
    assert config_secrets(masked) == []
    # Nothing else moves: masking touches the secret only.
    assert {k: v for k, v in masked.items() if k not in ("env", "extra_args")} == \
        {k: v for k, v in config.items() if k not in ("env", "extra_args")}


def test_a_short_secret_shows_no_characters_and_no_key_is_no_secret() -> None:
    assert mask_secret("abc123") == SECRET_MASK  # its last four would be most of it
    assert mask_secret(KEY) == SECRET_MASK + KEY[-4:]
    assert mask_secret("") == ""  # --api-key "" turns nothing on in either engine
    assert mask_secret(SECRET_MASK + "abcd") == SECRET_MASK + "abcd"


def test_harmless_names_that_look_alike_are_left_alone() -> None:
    config = stored(env={"SGLANG_USE_AITER_FP8_PER_TOKEN": "1", "CUDA_IPC_FEATURE_COPY_EVENT_KEY": "7",
                         "VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE": "4096"},
                   extra_args=["--max-num-batched-tokens", "8192", "--tokenizer-mode", "auto"])
    assert mask_config(config) == config
    assert config_secrets(config) == []


def test_a_refused_value_is_never_quoted_back() -> None:
    # A control character in the key: refused with its field, the key not repeated.
    for document in ({**REFERENCE, "extra_args": ["--api-key", KEY + "\n"]},
                     {**REFERENCE, "extra_args": [f"--api-key={KEY}\x1b"]},
                     {**REFERENCE, "env": {"VLLM_API_KEY": ENV_KEY + "\x00"}}):
        with pytest.raises(ConfigError) as refused:
            normalize_config(document)
        assert "control character" in str(refused.value)
        assert KEY not in str(refused.value) and ENV_KEY not in str(refused.value)
        assert SECRET_MASK in str(refused.value)
    # A flag the diagnostic does not take, holding a password: named, the value masked.
    with pytest.raises(ConfigError) as refused:
        parse_command(f"python3 -m sglang.launch_server --model-path /models/kimi-k2 "
                      f"--ssl-keyfile-password={KEY}")
    assert "--ssl-keyfile-password" in str(refused.value) and KEY not in str(refused.value)


def test_free_text_is_masked_as_engines_print_secrets() -> None:
    # SGLang logs its ServerArgs whole; a header, a command line, a URL.
    line = (f"server_args=ServerArgs(model_path='/models/kimi-k2', api_key='{KEY}', port=30000) "
            f"curl -H 'Authorization: Bearer {KEY}' https://u:{ENV_KEY}@h/x vllm serve m --api-key {KEY}")
    masked = mask_text(line)
    assert KEY not in masked and ENV_KEY not in masked
    assert masked.count(SECRET_MASK) == 4
    assert "model_path='/models/kimi-k2'" in masked and "port=30000" in masked
    assert KEY not in shown(f"--api-key={KEY}")
    # A log line without any goes through as it is.
    stats = "Avg prompt throughput: 12.0 tokens/s, Avg generation throughput: 25.9 tokens/s"
    assert mask_text(stats) is stats


@pytest.mark.parametrize(("engine", "args", "env", "keys"), [
    ("vllm", ["--api-key", "a" * 16], {}, ["a" * 16]),
    ("vllm", [], {"VLLM_API_KEY": "e" * 16}, ["e" * 16]),
    ("vllm", ["--api-key", "a" * 16], {"VLLM_API_KEY": "e" * 16}, ["a" * 16]),  # the flag wins
    ("vllm", ["--api-key", ""], {}, []),
    ("sglang", ["--api-key", "a" * 16], {}, ["a" * 16]),
    ("sglang", [], {"VLLM_API_KEY": "e" * 16}, []),  # SGLang reads no variable
    ("vllm", [], {}, []),
])
def test_the_engines_decide_authentication_as_they_do(engine: str, args: list[str], env: dict[str, str],
                                                      keys: list[str]) -> None:
    assert engine_api_keys({"engine": {"name": engine}, "extra_args": args, "env": env}) == keys
