"""Settings that take away the evidence a day reads, as the releases implement them.

A customer may serve with the engine's statistics or INFO lines off; their configuration
is accepted as written (the flag lists hold these settings), but the lab runs it with the
evidence on, and the report says which of their settings hides what from them:

- vLLM `--disable-log-stats`: AsyncLLM is built with log_stats false, so no stat logger
  exists (v1/engine/async_llm.py): no periodic stats line, no SpecDecoding line and no
  `vllm:` metric on /metrics (v1/metrics/loggers.py).
- vLLM `VLLM_LOGGING_LEVEL` above INFO: vLLM's logger drops every INFO line, its stats and
  start-up lines among them (vllm/logger.py).
- vLLM `VLLM_CONFIGURE_LOGGING=0`: vLLM configures no handler of its own (vllm/logger.py
  _configure_vllm_root_logger), so its INFO lines reach no output.
- SGLang `--log-level` above info: its INFO lines (the Decode batch and Prefill batch
  lines, the weights' and graphs' lines) are not written.

`hidden_evidence(config)` lists the settings a configuration has, with what each hides;
`with_evidence_on(config)` is the configuration as the lab runs it. Nothing else is
changed: the tuned configuration keeps the customer's settings.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

_QUIET_LEVELS = ("WARNING", "ERROR", "CRITICAL")

_VLLM_STATS = ("the engine's periodic stats lines, its SpecDecoding lines and every vllm: metric on "
               "/metrics (no stat logger is built)")
_VLLM_INFO = ("every INFO line of vLLM: the stats and SpecDecoding lines and the start-up lines that "
              "time each phase of a cold start")
_SGLANG_INFO = ("every INFO line of SGLang: its Decode batch and Prefill batch lines and the start-up "
                "lines that time the weights and the graphs")


def hidden_evidence(config: Mapping[str, Any]) -> list[dict[str, str]]:
    """[{setting, hides}] for each setting of `config` that takes away evidence."""
    engine = (config.get("engine") or {}).get("name")
    args = [str(a) for a in config.get("extra_args") or []]
    env = {str(k): str(v) for k, v in (config.get("env") or {}).items()}
    found: list[dict[str, str]] = []
    if engine == "vllm":
        if "--disable-log-stats" in args:
            found.append({"setting": "--disable-log-stats", "hides": _VLLM_STATS})
        level = env.get("VLLM_LOGGING_LEVEL", "").upper()
        if level in _QUIET_LEVELS:
            found.append({"setting": f"VLLM_LOGGING_LEVEL={level}", "hides": _VLLM_INFO})
        if env.get("VLLM_CONFIGURE_LOGGING") == "0":
            found.append({"setting": "VLLM_CONFIGURE_LOGGING=0", "hides": _VLLM_INFO})
    elif engine == "sglang":
        sglang_level = _sglang_level(args)
        if sglang_level is not None and sglang_level.upper() in _QUIET_LEVELS:
            found.append({"setting": f"--log-level {sglang_level}", "hides": _SGLANG_INFO})
    return found


def _sglang_level(args: list[str]) -> str | None:
    level = None
    for i, word in enumerate(args):
        if word == "--log-level" and i + 1 < len(args):
            level = args[i + 1]
        elif word.startswith("--log-level="):
            level = word.partition("=")[2]
    return level


def with_evidence_on(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` as the lab runs it: every setting hidden_evidence names taken out."""
    out = copy.deepcopy(dict(config))
    if not hidden_evidence(out):
        return out
    args = [str(a) for a in out.get("extra_args") or []]
    kept: list[str] = []
    skip = False
    for i, word in enumerate(args):
        if skip:
            skip = False
            continue
        if word == "--disable-log-stats" or word.startswith("--log-level="):
            continue
        if word == "--log-level" and i + 1 < len(args):
            skip = True
            continue
        kept.append(word)
    out["extra_args"] = kept
    env = dict(out.get("env") or {})
    if str(env.get("VLLM_LOGGING_LEVEL", "")).upper() in _QUIET_LEVELS:
        env.pop("VLLM_LOGGING_LEVEL")
    if str(env.get("VLLM_CONFIGURE_LOGGING")) == "0":
        env.pop("VLLM_CONFIGURE_LOGGING")
    out["env"] = env
    return out
