"""Settings that take away the evidence a day reads (issue 37 item 4): accepted as the
customer's, run on the lab with the evidence on, and named in the report with what each
hides."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from lab.engines import normalize_config, render
from lab.engines.evidence import hidden_evidence, with_evidence_on
from tests.lab.engines.conftest import spark_nodes

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "configs"


def _config(name: str, extra: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    raw = copy.deepcopy(yaml.safe_load((EXAMPLES / name).read_text()))
    raw["extra_args"] = [*raw["extra_args"], *extra]
    raw["env"] = env or {}
    return normalize_config(raw)


def test_vllm_settings_that_hide_evidence_are_accepted_named_and_run_with_it_on() -> None:
    config = _config("kimi-k2-8spark-outofbox.yaml", ["--disable-log-stats"],
                     {"VLLM_LOGGING_LEVEL": "WARNING", "VLLM_CONFIGURE_LOGGING": "0"})
    hidden = hidden_evidence(config)
    assert [h["setting"] for h in hidden] == ["--disable-log-stats", "VLLM_LOGGING_LEVEL=WARNING",
                                              "VLLM_CONFIGURE_LOGGING=0"]
    assert "vllm: metric on /metrics" in hidden[0]["hides"]
    on = with_evidence_on(config)
    assert "--disable-log-stats" not in on["extra_args"] and on["env"] == {}
    assert hidden_evidence(on) == []
    argv = render(on, spark_nodes())[0]["argv"]
    assert "--disable-log-stats" not in argv and "--trust-remote-code" in argv
    # The customer's configuration itself is left as they wrote it (the tuned files keep it).
    assert "--disable-log-stats" in config["extra_args"]


def test_sglang_log_level_above_info_hides_its_batch_lines() -> None:
    quiet = _config("kimi-k2-8spark-sglang.yaml", ["--log-level", "warning"])
    assert [h["setting"] for h in hidden_evidence(quiet)] == ["--log-level warning"]
    assert "--log-level" not in with_evidence_on(quiet)["extra_args"]
    # DEBUG hides nothing: kept as written.
    chatty = _config("kimi-k2-8spark-sglang.yaml", ["--log-level", "debug"])
    assert hidden_evidence(chatty) == [] and with_evidence_on(chatty) == chatty


def test_a_configuration_without_such_settings_is_run_as_written() -> None:
    config = _config("kimi-k2-8spark-outofbox.yaml", ["--max-num-seqs", "8"], {"VLLM_LOGGING_LEVEL": "INFO"})
    assert hidden_evidence(config) == [] and with_evidence_on(config) == config
