"""The checks an engine makes on a combination of flags when it starts, made at intake.

A flag's own type, choices and range are the version's list's (lab.flag_policy); some
refusals only come once the engine builds its configuration from several flags, minutes
into a cold start on eight nodes. Those the modelled releases make on flags a
configuration may pass are repeated here, in the release's own words, so that intake
refuses them before a lab day is spent:

- vLLM 0.29.0 and 0.34.0, SchedulerConfig.verify_max_model_len (vllm/config/scheduler.py):
  max_num_batched_tokens must be at least max_num_seqs, and at least max_model_len when
  chunked prefill is off; 0.34.0 also holds max_num_active_seqs to max_num_seqs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab.config import ConfigError
from lab.engines.base import Engine


def _vllm(config: Mapping[str, Any], values: Mapping[str, Any]) -> str | None:
    seqs = values.get("max_num_seqs")
    tokens = values.get("max_num_batched_tokens")
    active = values.get("max_num_active_seqs")
    chunked = values.get("enable_chunked_prefill")
    length = config["serving"]["max_model_len"]
    if tokens is not None and chunked is False and tokens < length:
        return (f"max_num_batched_tokens ({tokens}) is smaller than max_model_len ({length}). This "
                "effectively limits the maximum sequence length to max_num_batched_tokens and makes "
                "vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease "
                "max_model_len.")
    if tokens is not None and seqs is not None and tokens < seqs:
        return (f"max_num_batched_tokens ({tokens}) must be greater than or equal to max_num_seqs "
                f"({seqs}).")
    if active is not None and seqs is not None and active > seqs:
        return f"max_num_active_seqs ({active}) cannot be greater than max_num_seqs ({seqs})."
    return None


CHECKS = {"vllm": _vllm}


def check_startup(config: Mapping[str, Any], engine: Engine) -> None:
    """ConfigError (extra_args, in the engine's words) for a combination of flags the
    configuration's release refuses when it starts."""
    check = CHECKS.get(engine.name)
    if check is None:
        return
    parser = engine.parser(config["engine"]["version"])
    values = parser.parse(config["extra_args"], partial=True).values()
    problem = check(config, values)
    if problem is not None:
        where = f"{engine.name} {config['engine']['version']}"
        raise ConfigError("extra_args", f"{where} refuses to start with these flags: {problem}")
