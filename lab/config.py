"""The customer configuration (`diagnostic.config/1`): its vocabulary and field checks.

A customer describes the cluster configuration they run as a structured mapping, a YAML
file, or a pasted launch command (`launch_command:`). This module holds what needs no
engine knowledge: the accepted values, `ConfigError`, the strict YAML reader, and
`normalize_fields`, which checks and fills every structured field (docs/lab-contracts.md
lists them). Defaults are what the engine does when a flag is not given, so a structured
configuration and the equivalent command normalize alike; the model defaults to the
reference Kimi K2 checkpoint. Errors name the field, the value and what would be accepted.

What needs the engines' flag tables (reading `launch_command`, checking `extra_args`
flags) is done by `lab.engines.normalize_config` and `lab.engines.load_config_text`, the
entry points callers use; they build on this module, which imports nothing from them.
No Django here: the portal, the CLI and the lab all use it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

SCHEMA = "diagnostic.config/1"

ENGINES = ("vllm", "sglang")
# A command line does not carry the engine version; these are the versions the lab's
# reference images run, used when a configuration does not say.
DEFAULT_ENGINE_VERSIONS = {"vllm": "0.29.1", "sglang": "0.5.6"}

QUANTIZATIONS = ("nvfp4", "mxfp4", "fp8", "int4", "bf16")
KV_CACHE_DTYPES = ("auto", "fp8", "bf16")
LOAD_FORMATS = ("auto", "safetensors", "fastsafetensors")
LOAD_STRATEGIES = ("lazy", "eager")
JIT_CACHES = ("ephemeral", "persisted")
# FP4 kernel overrides, per engine (vLLM --moe-backend/--linear-backend, SGLang
# --moe-runner-backend/--fp4-gemm-backend); "auto" leaves the engine's default rule.
MOE_BACKENDS = {
    "vllm": ("auto", "cutlass", "deep_gemm", "flashinfer_cutedsl", "flashinfer_cutlass",
             "flashinfer_trtllm", "marlin", "triton"),
    "sglang": ("auto", "cutlass", "deep_gemm", "flashinfer_cutedsl", "flashinfer_cutlass",
               "flashinfer_trtllm", "marlin", "triton", "triton_kernel"),
}
LINEAR_BACKENDS = {
    "vllm": ("auto", "cutlass", "flashinfer_cudnn", "flashinfer_cutlass", "flashinfer_trtllm",
             "marlin", "triton"),
    "sglang": ("auto", "flashinfer_cudnn", "flashinfer_cutlass", "flashinfer_trtllm"),
}
SPEC_METHODS = ("eagle3", "ngram", "mtp")
WORKLOADS = ("code", "prose")
REPORTED_FIELDS = ("decode_tps", "cold_start_s")

# The lab places JIT caches itself (serving.jit_cache); these names may not be set by hand.
JIT_CACHE_ENV = ("VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE")

MAX_TP = 64
MAX_PP = 64
MAX_NODES = 256
MAX_MODEL_LEN = 1 << 24
MAX_SPEC_TOKENS = 16

REFERENCE_MODEL = {
    "id": "moonshotai/Kimi-K2-Instruct-0905",
    "quantization": "nvfp4",
    "path": "/models/kimi-k2",
}
# Engine defaults for what a command line leaves out. max_model_len: the model's own
# context (Kimi K2: 256k); gpu_memory_utilization: vLLM's 0.9 (SGLang sizes its static
# fraction itself; 0.9 is its documented default).
SERVING_DEFAULTS: dict[str, Any] = {
    "max_model_len": 262144,
    "kv_cache_dtype": "auto",
    "gpu_memory_utilization": 0.9,
    "enforce_eager": False,
    "load_format": "auto",
    "safetensors_load_strategy": "lazy",
    "jit_cache": "ephemeral",
    "moe_backend": "auto",
    "linear_backend": "auto",
}
TOP_FIELDS = ("schema", "engine", "model", "cluster", "parallel", "serving", "speculative",
              "env", "extra_args", "workloads", "reported", "launch_command")
# What `launch_command` stands in for: a file giving both is ambiguous.
COMMAND_FIELDS = ("model", "parallel", "serving", "speculative", "env", "extra_args")

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(ValueError):
    """A configuration that cannot be used. `field` is the dotted path of the culprit."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem


def _fail(field: str, problem: str) -> ConfigError:
    return ConfigError(field, problem)


def _one_of(value: Any, field: str, accepted: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in accepted:
        raise _fail(field, f"{value!r} is not accepted; use one of {', '.join(accepted)}")
    return value


def _mapping(value: Any, field: str, accepted: tuple[str, ...]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(field, f"must be a mapping, got {type(value).__name__} {value!r}")
    for key in value:
        if key not in accepted:
            where = f"{field}.{key}" if field else str(key)
            raise _fail(where, f"unknown field; accepted: {', '.join(accepted)}")
    return value


def _text(value: Any, field: str) -> str:
    if isinstance(value, bool) or isinstance(value, int | float):
        raise _fail(field, f"{value!r} is a number; write it as a quoted string")
    if not isinstance(value, str) or not value.strip():
        raise _fail(field, f"must be a non-empty string, got {value!r}")
    if any(c in value for c in "\x00\n\r"):
        raise _fail(field, f"{value!r} contains a control character")
    return value


def _argument(value: Any, field: str) -> str:
    """A string that becomes a command-line argument: it must not read as a flag."""
    text = _text(value, field)
    if text.startswith("-"):
        raise _fail(field, f"{text!r} starts with '-', which an engine would read as a flag")
    return text


def _int(value: Any, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _fail(field, f"{value!r} is not accepted; use a whole number {lo}..{hi}")
    return int(value)


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(field, f"{value!r} is not accepted; use true or false")
    return value


def _positive(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise _fail(field, f"{value!r} is not accepted; use a number > 0")
    return float(value)


def _engine(raw: Any) -> dict[str, str]:
    data = _mapping(raw, "engine", ("name", "version"))
    name = _one_of(data.get("name", "vllm"), "engine.name", ENGINES)
    version = data.get("version", DEFAULT_ENGINE_VERSIONS[name])
    if isinstance(version, int | float) and not isinstance(version, bool):
        # YAML reads `version: 0.10` as the float 0.1: refuse rather than guess.
        raise _fail("engine.version", f"{version!r} is a number; quote it, e.g. \"{version}\"")
    return {"name": name, "version": _text(version, "engine.version")}


def _model(raw: Any) -> dict[str, str]:
    data = _mapping(raw, "model", ("id", "quantization", "path"))
    return {
        "id": _argument(data.get("id", REFERENCE_MODEL["id"]), "model.id"),
        "quantization": _one_of(data.get("quantization", REFERENCE_MODEL["quantization"]),
                                "model.quantization", QUANTIZATIONS),
        "path": _argument(data.get("path", REFERENCE_MODEL["path"]), "model.path"),
    }


def _parallel(raw: Any) -> dict[str, Any]:
    data = _mapping(raw, "parallel", ("tp", "pp", "expert_parallel"))
    return {
        "tp": _int(data.get("tp", 1), "parallel.tp", 1, MAX_TP),
        "pp": _int(data.get("pp", 1), "parallel.pp", 1, MAX_PP),
        "expert_parallel": _bool(data.get("expert_parallel", False), "parallel.expert_parallel"),
    }


def _cluster(raw: Any, parallel: Mapping[str, Any]) -> dict[str, Any]:
    data = _mapping(raw, "cluster", ("nodes", "node_type", "link_gbps"))
    used = parallel["tp"] * parallel["pp"]
    nodes = _int(data.get("nodes", used), "cluster.nodes", 1, MAX_NODES)
    if used > nodes:
        raise _fail("parallel", f"tp × pp = {parallel['tp']} × {parallel['pp']} = {used} nodes, "
                                f"but cluster.nodes is {nodes}; lower tp or pp, or raise cluster.nodes")
    node_type = _text(data.get("node_type", "dgx-spark"), "cluster.node_type")
    return {"nodes": nodes, "node_type": node_type,
            "link_gbps": _positive(data.get("link_gbps", 100), "cluster.link_gbps")}


def _serving(raw: Any, engine: str) -> dict[str, Any]:
    data = _mapping(raw, "serving", tuple(SERVING_DEFAULTS))
    merged = {**SERVING_DEFAULTS, **data}
    util = merged["gpu_memory_utilization"]
    if isinstance(util, bool) or not isinstance(util, int | float) or not 0 < util <= 1:
        raise _fail("serving.gpu_memory_utilization",
                    f"{util!r} is not accepted; use a fraction in (0, 1], e.g. 0.85")
    out = {
        "max_model_len": _int(merged["max_model_len"], "serving.max_model_len", 1, MAX_MODEL_LEN),
        "kv_cache_dtype": _one_of(merged["kv_cache_dtype"], "serving.kv_cache_dtype",
                                  KV_CACHE_DTYPES),
        "gpu_memory_utilization": float(util),
        "enforce_eager": _bool(merged["enforce_eager"], "serving.enforce_eager"),
        "load_format": _one_of(merged["load_format"], "serving.load_format", LOAD_FORMATS),
        "safetensors_load_strategy": _one_of(merged["safetensors_load_strategy"],
                                             "serving.safetensors_load_strategy", LOAD_STRATEGIES),
        "jit_cache": _one_of(merged["jit_cache"], "serving.jit_cache", JIT_CACHES),
        "moe_backend": _one_of(merged["moe_backend"], "serving.moe_backend", MOE_BACKENDS[engine]),
        "linear_backend": _one_of(merged["linear_backend"], "serving.linear_backend",
                                  LINEAR_BACKENDS[engine]),
    }
    if engine == "sglang" and out["safetensors_load_strategy"] != "lazy":
        raise _fail("serving.safetensors_load_strategy",
                    f"{out['safetensors_load_strategy']!r} is a vLLM option that SGLang does not "
                    "have; use lazy, or serving.load_format: fastsafetensors for a fast loader")
    return out


def _speculative(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    fields = ("method", "draft_model", "num_speculative_tokens", "prompt_lookup_max",
              "prompt_lookup_min")
    data = _mapping(raw, "speculative", fields)
    if data.get("method") == "none":
        if len(data) > 1:
            raise _fail("speculative", "method none takes no other fields; remove them")
        return None
    if "method" not in data:
        raise _fail("speculative.method", f"is required; use one of {', '.join(SPEC_METHODS)}, "
                                          "or speculative: null for none")
    method = _one_of(data["method"], "speculative.method", SPEC_METHODS)
    draft = data.get("draft_model")
    if method == "eagle3":
        if draft is None:
            raise _fail("speculative.draft_model",
                        "is required for eagle3, e.g. AQ-MedAI/Kimi-K2-Instruct-eagle3")
        draft = _argument(draft, "speculative.draft_model")
    elif draft is not None:
        raise _fail("speculative.draft_model",
                    f"{method} uses no draft model; remove speculative.draft_model")
    k = _int(data.get("num_speculative_tokens", 4), "speculative.num_speculative_tokens",
             1, MAX_SPEC_TOKENS)
    lookup: dict[str, int | None] = {}
    for name in ("prompt_lookup_max", "prompt_lookup_min"):
        value = data.get(name)
        if value is not None and method != "ngram":
            raise _fail(f"speculative.{name}", f"applies to ngram only; remove it for {method}")
        lookup[name] = None if value is None else _int(value, f"speculative.{name}", 1, 64)
    lo, hi = lookup["prompt_lookup_min"], lookup["prompt_lookup_max"]
    if lo is not None and hi is not None and lo > hi:
        raise _fail("speculative.prompt_lookup_min",
                    f"{lo} is above prompt_lookup_max {hi}; use a value <= {hi}")
    return {"method": method, "draft_model": draft, "num_speculative_tokens": k, **lookup}


def _env(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _fail("env", f"must be a mapping of variable names to values, got {raw!r}")
    out: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise _fail(f"env.{key}", "is not a valid environment variable name "
                                      "(letters, digits and _, not starting with a digit)")
        field = f"env.{key}"
        if key in JIT_CACHE_ENV:
            raise _fail(field, "the lab sets this from serving.jit_cache; use serving.jit_cache: "
                               "persisted (a kept cache) or ephemeral instead")
        if isinstance(value, bool):
            # Engines read boolean switches as 1/0 (VLLM_USE_FLASHINFER_MOE_FP4=1).
            out[key] = "1" if value else "0"
        elif isinstance(value, int | float):
            out[key] = str(value)
        elif isinstance(value, str):
            if any(c in value for c in "\x00\n\r"):
                raise _fail(field, f"{value!r} contains a control character")
            out[key] = value
        else:
            raise _fail(field, f"{value!r} is not accepted; use a string, number or true/false")
    return dict(sorted(out.items()))


def _extra_args(raw: Any) -> list[str]:
    """The shape only: which flags an engine takes is lab.engines' to check."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        raise _fail("extra_args", f"must be a list of strings (one per argv token), got {raw!r}")
    return list(raw)


def _workloads(raw: Any) -> list[str]:
    if raw is None:
        raw = list(WORKLOADS)
    if not isinstance(raw, list) or not raw:
        raise _fail("workloads", f"must be a non-empty list from {', '.join(WORKLOADS)}, got {raw!r}")
    for i, item in enumerate(raw):
        _one_of(item, f"workloads[{i}]", WORKLOADS)
    if len(set(raw)) != len(raw):
        raise _fail("workloads", f"{raw!r} names a workload twice")
    return [w for w in WORKLOADS if w in raw]


def _reported(raw: Any) -> dict[str, float] | None:
    if raw is None:
        return None
    data = _mapping(raw, "reported", REPORTED_FIELDS)
    return {k: _positive(v, f"reported.{k}") for k, v in data.items()}


def check_document(data: Any) -> Mapping[str, Any]:
    """`data` as a configuration document: a mapping of known top-level fields with the
    right schema (the fields themselves are checked by normalize_fields)."""
    if not isinstance(data, Mapping):
        raise _fail("config", f"must be a mapping, got {type(data).__name__}")
    _mapping(data, "", TOP_FIELDS)
    schema = data.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise _fail("schema", f"{schema!r} is not accepted; use {SCHEMA!r}")
    return data


def normalize_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """Check a structured configuration and return a new dict with every field of
    `diagnostic.config/1`. Normalizing a normalized config returns it unchanged.

    Not the whole normalization: `extra_args` is checked for its shape here, its flags by
    lab.engines, and a `launch_command` is refused (lab.engines.normalize_config reads it).
    """
    check_document(data)
    if "launch_command" in data:
        raise _fail("launch_command", "is read by lab.engines.normalize_config, not here")
    engine = _engine(data.get("engine"))
    parallel = _parallel(data.get("parallel"))
    config: dict[str, Any] = {
        "schema": SCHEMA,
        "engine": engine,
        "model": _model(data.get("model")),
        "cluster": _cluster(data.get("cluster"), parallel),
        "parallel": parallel,
        "serving": _serving(data.get("serving"), engine["name"]),
        "speculative": _speculative(data.get("speculative")),
        "env": _env(data.get("env")),
        "extra_args": _extra_args(data.get("extra_args")),
        "workloads": _workloads(data.get("workloads")),
    }
    reported = _reported(data.get("reported"))
    if reported is not None:
        config["reported"] = reported
    return config


def launch_command_text(data: Mapping[str, Any]) -> str:
    """The command of a configuration given as `launch_command`, which stands for the
    COMMAND_FIELDS: a document giving both is ambiguous."""
    both = [f for f in COMMAND_FIELDS if f in data]
    if both:
        raise _fail(both[0], "cannot be given together with launch_command, which sets it; "
                             "remove one of the two")
    command = data["launch_command"]
    if not isinstance(command, str) or not command.strip():
        raise _fail("launch_command", f"must be the launch command as a string, got {command!r}")
    return command


def with_command_fields(data: Mapping[str, Any], parsed: Mapping[str, Any]) -> dict[str, Any]:
    """A `launch_command` document rewritten as a structured one: the fields the parsed
    command set, plus what may sit beside it (`engine.version`, `cluster`, `workloads`,
    `reported`)."""
    engine = _mapping(data.get("engine"), "engine", ("name", "version"))
    name = parsed["engine"]["name"]
    if "name" in engine and engine["name"] != name:
        raise _fail("engine.name", f"{engine['name']!r} disagrees with launch_command, which "
                                   f"runs {name}; remove engine.name or fix it")
    rest = {k: data[k] for k in ("cluster", "workloads", "reported") if k in data}
    return {**parsed, **rest, "engine": {"name": name, **engine}}


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors, aliases (billion-laughs) and duplicate keys."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            mark = event.start_mark
            raise ConfigError("file", f"line {mark.line + 1}: YAML anchors and aliases (&, *) "
                                      "are not accepted; write the values out")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise ConfigError(str(key), f"appears twice (line {key_node.start_mark.line + 1}); "
                                            "keep one")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_config_text(text: str, *, max_bytes: int = 65536) -> Mapping[str, Any]:
    """Parse a YAML configuration (at most `max_bytes` of UTF-8) into its mapping, not yet
    normalized (lab.engines.load_config_text does both)."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > max_bytes:
        raise ConfigError("file", f"is {size} bytes; the limit is {max_bytes}")
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - _StrictLoader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError("file", f"not valid YAML ({where}{exc.problem})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError("file", f"not valid YAML ({exc})") from exc
    if not isinstance(data, Mapping):
        raise ConfigError("file", "must hold a YAML mapping (schema: diagnostic.config/1, "
                                  f"engine: ..., ...), got {type(data).__name__}")
    return data
