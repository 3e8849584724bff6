"""vLLM: configuration <-> `vllm serve` command line, and vLLM's log lines.

Multi-node serving is vLLM's multiprocessing mode: every node runs `vllm serve` with the
same arguments plus `--nnodes N --node-rank R --master-addr HEAD --master-port 29500`;
rank 0 serves the API, the others add `--headless`. Which flags a version has, their
choices and how they are read come from its table (lab.engines.argv); this module says
only which flag carries which configuration field. The FP4 backends are chosen by
`--moe-backend` and `--linear-backend` (LAB_MODEL.md section 6), whose choices are the
version's. Log formats are those the tables quote (`lines`), from vllm/v1/metrics/loggers.py,
vllm/v1/spec_decode/metrics.py and the startup code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, ClassVar

from lab.config import LOAD_FORMATS, ConfigError, shown
from lab.engines.argv import EngineException, NotReproduced, ReleaseParser
from lab.engines.base import MASTER_PORT, Engine, EngineArgError, LaunchInfo, shown_label
from lab.engines.logs import Event, LogLine, Matcher, normalize_backend, number, shard_progress
from lab.inventory import Node

KV_TO_FLAG = {"auto": "auto", "fp8": "fp8", "bf16": "bfloat16"}
KV_FROM_FLAG = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8", "bfloat16": "bf16"}
SPEC_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")
SPEC_METHODS_FROM_JSON = {"eagle3": "eagle3", "ngram": "ngram", "[ngram]": "ngram",
                          "mtp": "mtp", "deepseek_mtp": "mtp"}
# serving.max_model_len cannot hold vLLM's `auto` (fit the length to memory, read as -1):
# such a flag travels in extra_args as written.
AUTO_LENGTH = -1


# The keyword arguments SpeculativeConfig takes in each modelled release: its dataclass fields
# less those with init=False (vllm/config/speculative.py; 0.29.0 class at line 374, fields at
# lines 377-590; 0.34.0 class at line 449, fields at lines 452-711, custom_method at line 479
# with init=False). vLLM builds it as SpeculativeConfig(**speculative_config)
# (vllm/engine/arg_utils.py 0.29.0 line 1952, 0.34.0 line 2172) after turning every `-` in
# the keys into `_` (0.29.0 lines 1939-1941, 0.34.0 lines 2159-2161); the class is a pydantic
# dataclass that forbids extra fields (vllm/config/utils.py `config`, ConfigDict(extra=
# "forbid")), so any other key ends the start with pydantic's ValidationError.
SPECULATIVE_CONFIG_KEYS: dict[str, frozenset[str]] = {
    "0.29.0": frozenset((
        "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
        "tensor_parallel_size", "quantization", "moe_backend", "attention_backend", "kv_cache_dtype",
        "max_model_len", "revision", "code_revision", "index_share_for_mtp_iteration",
        "disable_padded_drafter_batch", "use_local_argmax_reduction", "use_heterogeneous_vocab",
        "prompt_lookup_max", "prompt_lookup_min", "parallel_drafting", "target_model_config",
        "target_parallel_config", "num_speculative_tokens_per_batch_size", "draft_model_config",
        "draft_parallel_config", "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
        "suffix_decoding_min_token_prob", "draft_load_config", "rejection_sample_method",
        "synthetic_acceptance_rates", "synthetic_acceptance_length", "enable_adaptive_verification",
        "draft_sample_method", "dspark_draft_topk")),
    "0.34.0": frozenset((
        "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
        "draft_decode_context_parallel_size", "tensor_parallel_size", "quantization", "moe_backend",
        "attention_backend", "kv_cache_dtype", "max_model_len", "revision", "code_revision",
        "index_share_for_mtp_iteration", "disable_eagle_block_drop", "disable_lookahead_block_hashes",
        "draft_lm_head_quantization", "use_local_argmax_reduction", "prompt_lookup_max",
        "prompt_lookup_min", "parallel_drafting", "target_model_config", "target_parallel_config",
        "num_speculative_tokens_per_batch_size", "draft_model_config", "draft_parallel_config",
        "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
        "suffix_decoding_corpus_tokens", "suffix_decoding_max_spec_factor",
        "suffix_decoding_min_token_prob", "draft_load_config", "rejection_sample_method",
        "synthetic_acceptance_rates", "synthetic_acceptance_length", "enable_adaptive_verification",
        "draft_sample_method", "dspark_draft_topk", "xpress_topc", "speculator_options",
        "fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")),
}
# How a pydantic ValidationError is printed: the exception's module and name, the count, and
# per error the location (in backticks when it holds a `.`), the message, and the input's
# repr cut to 50 bytes (its first 25 and last 24, whole characters only). Pydantic >= 2.12
# (vLLM's requirements/common.txt) also prints a line "For further information visit
# https://errors.pydantic.dev/<pydantic version>/v/unexpected_keyword_argument", which
# depends on the pydantic installed beside vLLM and is left out.
VALIDATION_ERROR = "pydantic_core._pydantic_core.ValidationError"


def _pydantic_repr(value: Any) -> str:
    text = repr(value)
    if len(text.encode()) <= 50:
        return text
    head, size = "", 0
    for ch in text:
        size += len(ch.encode())
        if size > 25:
            break
        head += ch
    tail, size = "", 0
    for ch in reversed(text):
        size += len(ch.encode())
        if size > 24:
            break
        tail = ch + tail
    return f"{head}...{tail}"


def _unexpected_keywords(spec: Mapping[str, Any], unknown: Sequence[str]) -> str:
    """pydantic's ValidationError text for keyword arguments SpeculativeConfig lacks."""
    count = len(unknown)
    lines = [f"{count} validation error{'s' if count != 1 else ''} for SpeculativeConfig"]
    for key in unknown:
        value = spec[key]
        lines += [f"`{key}`" if "." in key else key,
                  "  Unexpected keyword argument [type=unexpected_keyword_argument, "
                  f"input_value={_pydantic_repr(value)}, input_type={type(value).__name__}]"]
    return "\n".join(lines)


def _speculative_keys(written: Mapping[str, Any], parser: ReleaseParser) -> dict[str, Any]:
    """--speculative-config's object as the release builds SpeculativeConfig from it: keys with
    `-` read with `_`; a key the release's SpeculativeConfig does not take is refused in the
    release's words (EngineException: pydantic's ValidationError); a key it takes that the lab
    does not model is refused in the lab's (NotReproduced)."""
    flag = "--speculative-config"
    spec = {str(k).replace("-", "_"): v for k, v in written.items()}
    known = SPECULATIVE_CONFIG_KEYS.get(parser.version)
    if known is not None:
        unknown = [k for k in spec if k not in known]
        if unknown:
            raise EngineException(flag, VALIDATION_ERROR, _unexpected_keywords(spec, unknown),
                                  parser.prog)
    for key in spec:
        if key not in SPEC_KEYS:
            raise NotReproduced(flag, f"{flag}: {shown(key)} is a key of "
                                      f"{shown_label('vllm', parser.version)}'s SpeculativeConfig "
                                      "that the lab does not reproduce (it models only "
                                      f"{', '.join(SPEC_KEYS)}); remove it", parser.prog)
    return spec


def _speculative_from_json(written: Mapping[str, Any], parser: ReleaseParser) -> dict[str, Any]:
    flag = "--speculative-config"
    prog = parser.prog
    spec = _speculative_keys(written, parser)
    method = spec.get("method")
    if method is None and spec.get("model") in ("ngram", "[ngram]"):
        method = "ngram"  # older vLLM named the n-gram proposer through "model"
    if method not in SPEC_METHODS_FROM_JSON:
        raise EngineArgError(flag, f"argument {flag}: method {shown(method)} is not modelled; "
                                   "use one of eagle3, ngram, mtp", prog)
    out: dict[str, Any] = {"method": SPEC_METHODS_FROM_JSON[method]}
    if "num_speculative_tokens" not in spec:
        raise EngineArgError(flag, f"argument {flag}: num_speculative_tokens is required", prog)
    out["num_speculative_tokens"] = spec["num_speculative_tokens"]
    if out["method"] == "eagle3":
        out["draft_model"] = spec.get("model")
    for key in ("prompt_lookup_max", "prompt_lookup_min"):
        if spec.get(key) is not None:
            out[key] = spec[key]
    return out


def _speculative_json(spec: Mapping[str, Any]) -> str:
    out: dict[str, Any] = {"method": spec["method"]}
    if spec["method"] == "eagle3":
        out["model"] = spec["draft_model"]
    out["num_speculative_tokens"] = spec["num_speculative_tokens"]
    for key in ("prompt_lookup_max", "prompt_lookup_min"):
        if spec.get(key) is not None:
            out[key] = spec[key]
    return json.dumps(out)


# -- log lines ---------------------------------------------------------------------------
_STATS = re.compile(r"Avg prompt throughput:\s*([\d,.]+) tokens/s,\s*"
                    r"Avg generation throughput:\s*([\d,.]+) tokens/s")


def _find(pattern: str, text: str) -> str | None:
    m = re.search(pattern, text)
    return m[1] if m else None


def _stats(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    m = _STATS.search(message)
    if not m:
        return None
    event: Event = {"kind": "stats", "prompt_tps": number(m[1]), "generation_tps": number(m[2])}
    running = _find(r"Running: ([\d,]+) reqs", message)
    # Older vLLM (V0) says Pending where V1 says Waiting.
    waiting = _find(r"(?:Waiting|Pending): ([\d,]+) reqs", message)
    event["running"] = int(number(running)) if running is not None else None
    event["waiting"] = int(number(waiting)) if waiting is not None else None
    if (kv := _find(r"KV cache usage: ([\d,.]+)%", message)) is not None:
        event["kv_cache_usage_pct"] = number(kv)
    if (hit := _find(r"Prefix cache hit rate: ([\d,.]+)%", message)) is not None:
        event["prefix_cache_hit_pct"] = number(hit)
    if (engine := _find(r"^Engine (\d+):", message)) is not None:
        event["engine"] = int(engine)
    return [event]


def _specdec(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    if "SpecDecoding metrics:" not in message:
        return None
    accepted = _find(r"\bAccepted: ([\d,]+) tokens", message)
    drafted = _find(r"\bDrafted: ([\d,]+) tokens", message)
    mean = _find(r"Mean acceptance length: ([\d,.]+)", message)
    positions = _find(r"Per-position acceptance rate: ((?:[\d.]+(?:, )?)+)", message)
    rate = _find(r"Avg Draft acceptance rate: ([\d,.]+)%", message)
    event: Event = {
        "kind": "specdec",
        "accepted": int(number(accepted)) if accepted else None,
        "drafted": int(number(drafted)) if drafted else None,
        "mean_acceptance_length": number(mean) if mean else None,
        "per_position": [float(p) for p in positions.replace(",", " ").split()] if positions else [],
    }
    if rate:
        event["acceptance_rate"] = number(rate) / 100
    return [event]


def _specdec_v0(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    """vLLM V0 (<= 0.7): 'Speculative metrics: Draft acceptance rate: 0.731, ...'."""
    if "Speculative metrics:" not in message:
        return None
    k = _find(r"Number of speculative tokens: (\d+)", message)
    accepted = _find(r"Number of accepted tokens: ([\d,]+)", message)
    # Some releases printed "Number of draft tokens tokens:"; accept both.
    drafted = _find(r"Number of draft tokens(?: tokens)?: ([\d,]+)", message)
    emitted = _find(r"Number of emitted tokens(?: tokens)?: ([\d,]+)", message)
    rate = _find(r"Draft acceptance rate: ([\d.]+)", message)
    efficiency = _find(r"System efficiency: ([\d.]+)", message)
    event: Event = {
        "kind": "specdec",
        "accepted": int(number(accepted)) if accepted else None,
        "drafted": int(number(drafted)) if drafted else None,
        "mean_acceptance_length": None,
        "per_position": [],
    }
    if k and drafted and emitted and int(k) > 0 and number(drafted) > 0:
        # V0 logs no mean; tokens emitted per verification step is the same quantity.
        event["mean_acceptance_length"] = round(number(emitted) / (number(drafted) / int(k)), 4)
    if emitted:
        event["emitted"] = int(number(emitted))
    if k:
        event["num_speculative_tokens"] = int(k)
    if rate:
        event["acceptance_rate"] = float(rate)
    if efficiency:
        event["system_efficiency"] = float(efficiency)
    return [event]


def _timed(kind: str, pattern: str, *, seconds: int = 1, memory: int | None = None,
           extra: tuple[tuple[str, int], ...] = ()) -> Matcher:
    """A matcher for '<phase> took N seconds'-style lines (group numbers of the figures)."""
    regex = re.compile(pattern)

    def match(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
        m = regex.search(message)
        if not m:
            return None
        event: Event = {"kind": kind, "seconds": number(m[seconds])}
        if memory is not None and m[memory]:
            event["memory_gib"] = number(m[memory])
        for name, group in extra:
            if m[group]:
                event[name] = number(m[group])
        return [event]

    return match


def _model_loaded_v0(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    m = re.search(r"Loading model weights took ([\d.]+) GB(?: and ([\d.]+) seconds)?", message)
    if not m or not m[2]:
        return None
    return [{"kind": "model_loaded", "seconds": number(m[2]), "memory_gib": number(m[1])}]


def _api_ready(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    """'Starting vLLM server on http://0.0.0.0:8000' (the modelled releases; older ones
    wrote 'Starting vLLM API server 0 on ...')."""
    m = re.search(r"^Starting vLLM (?:API )?server(?: \d+)? on (\S+)", message)
    return [{"kind": "api_ready", "url": m[1].rstrip(",.")}] if m else None


# The MoE oracle's line: 0.29 'Using 'FLASHINFER_CUTLASS' NvFp4 MoE backend out of potential
# backends: [...]', 0.34 'Using FLASHINFER_CUTLASS NvFp4 MoE backend out of potential
# backends: [...]' (its format, 'Using {backend.value} {self.name} MoE {lora}backend
# {available}.', serves every quantization's oracle: only NvFp4 is an FP4 backend).
_MOE_QUOTED = re.compile(r"^Using '(?P<name>[\w-]+)' NvFp4 MoE (?:LoRA )?backend")
_MOE_BARE = re.compile(r"^Using (?P<name>[\w-]+) NvFp4 MoE (?:LoRA )?backend")
# 'Using FlashInferCutlassNvFp4LinearKernel for NVFP4 GEMM'.
_LINEAR = re.compile(r"^Using (?P<name>[\w-]+) for NVFP4 GEMM")
# The release that writes each form of the MoE line (parse_log's `version`).
MOE_LINE_QUOTED = {"0.29.0": True, "0.34.0": False}


def linear_kernel_choice(kernel: str, version: str | None) -> str | None:
    """The --linear-backend choice that covers the NVFP4 linear kernel class `kernel` in
    `version` (its table's `nvfp4_linear_kernels`, the release's _LINEAR_BACKEND_KERNEL_MAP:
    FlashInferCuteDslNvFp4LinearKernel -> flashinfer_cutedsl, the W4A16 variants -> their
    backend's); any modelled version's when None. None when no choice covers it."""
    from lab.engines.tables import modelled_versions, release

    versions = [version] if version else list(modelled_versions("vllm"))
    for v in versions:
        try:
            found = (release("vllm", v).get("nvfp4_linear_kernels") or {}).get(kernel)
        except LookupError:
            continue
        if found:
            return str(found)
    return None


def _fp4_backend(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    quoted = MOE_LINE_QUOTED.get(state.get("version") or "")
    regexes = [r for r, q in ((_MOE_QUOTED, True), (_MOE_BARE, False)) if quoted in (None, q)]
    for regex in regexes:
        if m := regex.search(message):
            return [{"kind": "fp4_backend", "backend": normalize_backend(m["name"]),
                     "layer": "moe"}]
    if m := _LINEAR.search(message):
        choice = linear_kernel_choice(m["name"], state.get("version"))
        event: Event = {"kind": "fp4_backend", "layer": "linear",
                        "backend": choice or normalize_backend(m["name"])}
        if choice is None:
            # A kernel the release picks only automatically (no --linear-backend choice
            # covers it, e.g. 0.34.0's HummingHadamardNvFp4LinearKernel).
            event["selectable"] = False
        return [event]
    if "Weight-only FP4 compression will be used leveraging the Marlin kernel" in message:
        return [{"kind": "fp4_backend", "backend": "marlin", "layer": "linear"}]
    return None


def _unknown_env(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    """'Unknown vLLM environment variable detected: VLLM_USE_FLASHINFER_MOE_FP4': a variable
    this release does not read, ignored."""
    m = re.search(r"Unknown vLLM environment variable detected: (\S+)", message)
    return [{"kind": "unknown_env", "name": m[1]}] if m else None


def _kv_cache(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    """'Available KV cache memory: 12.5 GiB' and 'GPU KV cache size: 123,456 tokens, ...'."""
    if m := re.search(r"^Available KV cache memory: ([\d.,]+) GiB", message):
        return [{"kind": "kv_cache", "available_gib": number(m[1])}]
    if m := re.search(r"^(?:\w+ )?KV cache size: ([\d,]+) tokens", message):
        return [{"kind": "kv_cache", "tokens": int(number(m[1]))}]
    return None


# vLLM's refusal to start when one request of max_model_len does not fit the KV cache, in
# its V1 wording ("To serve at least one request with the models's max seq len (262144),
# (24.0 GiB KV cache is needed, which is larger than the available KV cache memory (3.18
# GiB). Based on the available memory, the estimated maximum model length is 34736. ...",
# vllm-project/vllm#34076; without the estimate before it was added, #16118) and its V0
# wording ("The model's max seq len (32768) is larger than the maximum number of tokens
# that can be stored in KV cache (7344)", #2418). The message usually ends a traceback.
_KV_V1 = re.compile(
    r"max seq len \((\d+)\),\s*\(?([\d.]+) GiB KV cache is needed, which is larger than the "
    r"available KV cache memory \(([\d.]+) GiB\)(?:.*?estimated maximum model length is (\d+))?",
    re.IGNORECASE,
)
_KV_V0 = re.compile(
    r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in "
    r"KV cache \((\d+)\)",
    re.IGNORECASE,
)


def _kv_budget(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    """The configured length, the KV memory needed and available (GiB), and the longest
    length that fits; a figure the wording does not give is null."""
    if m := _KV_V1.search(message):
        return [{"kind": "kv_budget", "max_model_len": int(m[1]), "kv_needed_gib": float(m[2]),
                 "kv_available_gib": float(m[3]),
                 "estimated_max_model_len": int(m[4]) if m[4] else None}]
    if m := _KV_V0.search(message):
        return [{"kind": "kv_budget", "max_model_len": int(m[1]), "kv_needed_gib": None,
                 "kv_available_gib": None, "estimated_max_model_len": int(m[2])}]
    return None


LOG_MATCHERS: tuple[Matcher, ...] = (
    _stats,
    _specdec,
    _specdec_v0,
    shard_progress,
    _timed("weights_loaded", r"Loading weights took ([\d.]+) seconds"),
    _timed("model_loaded", r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds",
           seconds=2, memory=1),
    _model_loaded_v0,
    _timed("compile", r"torch\.compile (?:takes|took) ([\d.]+) s in total"),
    _timed("graph_capture", r"Graph capturing finished in ([\d.]+) secs?(?:, took ([\d.]+) GiB)?",
           memory=2),
    _timed("engine_init", r"init engine \(profile, create kv cache, warmup model\) took "
                          r"([\d.]+) (?:seconds|s)(?: \(compilation: ([\d.]+) s)?",
           extra=(("compilation_s", 2),)),
    _api_ready,
    _fp4_backend,
    _unknown_env,
    _kv_cache,
    _kv_budget,
)
ERROR_MATCHERS: tuple[Matcher, ...] = (_kv_budget,)

# Configuration field -> the flag that carries it (every modelled release has these).
FIELD_FLAGS = {
    "model.path": "--model",
    "model.id": "--served-model-name",
    "parallel.tp": "--tensor-parallel-size",
    "parallel.pp": "--pipeline-parallel-size",
    "parallel.expert_parallel": "--enable-expert-parallel",
    "serving.max_model_len": "--max-model-len",
    "serving.kv_cache_dtype": "--kv-cache-dtype",
    "serving.gpu_memory_utilization": "--gpu-memory-utilization",
    "serving.enforce_eager": "--enforce-eager",
    "serving.load_format": "--load-format",
    "serving.safetensors_load_strategy": "--safetensors-load-strategy",
    "serving.moe_backend": "--moe-backend",
    "serving.linear_backend": "--linear-backend",
    "speculative": "--speculative-config",
}
# vLLM's shorthands for fields of --speculative-config (SpeculativeConfig's method, model
# and num_speculative_tokens), which it merges into that configuration.
SPEC_SHORTHANDS = {"--spec-method": "method", "--spec-model": "model",
                   "--spec-tokens": "num_speculative_tokens"}
LAUNCH_FLAGS = ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless",
                "--host", "--port")


class Vllm(Engine):
    name = "vllm"
    field_flags: ClassVar[Mapping[str, str]] = FIELD_FLAGS
    launch_flags = LAUNCH_FLAGS
    log_matchers = LOG_MATCHERS
    error_matchers = ERROR_MATCHERS

    def modelled_dests(self, parser: Any) -> dict[str, str]:
        out = super().modelled_dests(parser)
        for flag in SPEC_SHORTHANDS:
            option = parser.option(flag)
            if option is not None:
                out[option.dest] = "speculative"
        return out

    def invocation(self, tokens: Sequence[str]) -> list[str] | None:
        if not tokens:
            return None
        program = PurePosixPath(tokens[0]).name
        if program == "vllm" and tokens[1:2] == ["serve"]:
            return list(tokens[2:])
        if re.fullmatch(r"python[\d.]*", program) and tokens[1:2] == ["-m"]:
            if tokens[2:3] == ["vllm.entrypoints.openai.api_server"]:
                return list(tokens[3:])
            if tokens[2:4] == ["vllm.entrypoints.cli.main", "serve"]:
                return list(tokens[4:])
        return None

    def check_config(self, config: dict[str, Any]) -> dict[str, Any]:
        version = config["engine"]["version"]
        parser = self.parser(version)
        serving = dict(config["serving"])
        for name in ("moe_backend", "linear_backend", "safetensors_load_strategy"):
            flag = FIELD_FLAGS[f"serving.{name}"]
            if serving[name] is not None:  # an unset load strategy is the release's default
                serving[name] = self._choice(parser, flag, f"serving.{name}", serving[name])
        if serving["load_format"] not in LOAD_FORMATS:
            raise ConfigError("serving.load_format", f"{shown(serving['load_format'])} is not "
                                                     f"modelled; use one of {', '.join(LOAD_FORMATS)}")
        return {**config, "serving": serving}

    def _choice(self, parser: Any, flag: str, config_field: str, value: str) -> str:
        """`value` as the version's `flag` reads it (its converter, then its choices)."""
        option = parser.option(flag)
        if option is None:
            if value == "auto":
                return value
            leave = "leave it unset" if config_field == "serving.safetensors_load_strategy" else "use auto"
            raise ConfigError(config_field, f"vllm {parser.version} has no {flag}; {leave}")
        try:
            converted = option.convert(value)
        except (TypeError, ValueError):
            converted = value
        accepted = [str(c) for c in option.choices or () if c is not None]
        if option.choices is not None and converted not in option.choices:
            raise ConfigError(config_field, f"{shown(value)} is not a choice of {flag} in vllm "
                                            f"{parser.version}; use one of {', '.join(accepted)}")
        if not isinstance(converted, str):
            raise ConfigError(config_field, f"{shown(value)} is not accepted; use one of "
                                            f"{', '.join(accepted)}")
        return converted

    def argv(self, config: Mapping[str, Any], *, rank: int, nnodes: int, head: Node,
             node: Node) -> list[str]:
        par, srv, spec = config["parallel"], config["serving"], config["speculative"]
        argv = ["vllm", "serve", config["model"]["path"],
                "--served-model-name", config["model"]["id"],
                "--tensor-parallel-size", str(par["tp"]),
                "--pipeline-parallel-size", str(par["pp"])]
        if par["expert_parallel"]:
            argv.append("--enable-expert-parallel")
        if nnodes > 1:
            argv += ["--nnodes", str(nnodes), "--node-rank", str(rank),
                     "--master-addr", head.data_addr, "--master-port", str(MASTER_PORT)]
            if rank > 0:
                argv.append("--headless")
        argv += ["--host", "0.0.0.0", "--port", str(head.api_port),  # noqa: S104 - serves the lab
                 "--max-model-len", str(srv["max_model_len"]),
                 "--kv-cache-dtype", KV_TO_FLAG[srv["kv_cache_dtype"]],
                 "--gpu-memory-utilization", repr(float(srv["gpu_memory_utilization"]))]
        if srv["enforce_eager"]:
            argv.append("--enforce-eager")
        if srv["load_format"] != "auto":
            argv += ["--load-format", srv["load_format"]]
        if srv["safetensors_load_strategy"] is not None:  # an explicit lazy is passed: it differs
            argv += ["--safetensors-load-strategy", srv["safetensors_load_strategy"]]
        for name in ("moe_backend", "linear_backend"):
            if srv[name] != "auto":
                argv += [FIELD_FLAGS[f"serving.{name}"], srv[name]]
        if spec is not None:
            argv += ["--speculative-config", _speculative_json(spec)]
        return argv + list(config["extra_args"])

    def read_args(self, args: Sequence[str], version: str) -> tuple[dict[str, Any], LaunchInfo]:
        parser = self.parser(version)
        parsed = parser.parse(args)
        modelled = self.modelled_dests(parser)
        launch = self.launch_dests(parser)
        values: dict[str, Any] = {}
        passthrough: list[str] = []
        shorthand = {o.dest: key for o, key in ((parser.option(f), k) for f, k in
                                                 SPEC_SHORTHANDS.items()) if o is not None}
        spec_parts: dict[str, Any] = {}
        for given in parsed.given:
            dest = given.option.dest
            if dest in shorthand:
                spec_parts[shorthand[dest]] = given.value
            elif dest == "max_model_len" and given.value == AUTO_LENGTH:
                values.pop("serving.max_model_len", None)
                passthrough.extend(given.tokens)
            elif dest in modelled:
                values[modelled[dest]] = given.value
            elif dest in launch:
                values[dest] = given.value
            else:
                passthrough.extend(given.tokens)
        # `vllm serve MODEL` wins over --model, as in vLLM's serve command.
        model = parsed.positionals.get("model_tag") or values.get("model.path")
        if model is None:
            raise parser.error("model_tag", "the following arguments are required: model_tag "
                                            "(vllm serve MODEL ...)")
        served = values.get("model.id")
        if isinstance(served, list):
            if len(served) > 1:
                raise parser.error("--served-model-name", "argument --served-model-name: "
                                   f"{len(served)} names are not modelled; give one")
            served = served[0] if served else None
        serving = {f.split(".", 1)[1]: v for f, v in values.items() if f.startswith("serving.")}
        if "kv_cache_dtype" in serving:
            kv = serving["kv_cache_dtype"]
            if kv not in KV_FROM_FLAG:
                raise parser.error("--kv-cache-dtype", f"argument --kv-cache-dtype: {kv!r} is "
                                   f"not modelled; use one of {', '.join(KV_FROM_FLAG)}")
            serving["kv_cache_dtype"] = KV_FROM_FLAG[kv]
        spec = values.get("speculative")
        if spec_parts:
            spec = {**(spec if isinstance(spec, dict) else {}),
                    **{k: v for k, v in spec_parts.items() if v is not None}}
        raw: dict[str, Any] = {
            "engine": {"name": self.name, "version": parser.version},
            "model": {"path": model, "id": served or model},
            "parallel": {"tp": values.get("parallel.tp", 1), "pp": values.get("parallel.pp", 1),
                         "expert_parallel": values.get("parallel.expert_parallel", False)},
            "serving": serving,
            "speculative": (_speculative_from_json(spec, parser) if isinstance(spec, dict)
                            else None),
            "extra_args": passthrough,
        }
        if spec is not None and not isinstance(spec, dict):
            raise parser.error("--speculative-config", "argument --speculative-config: "
                               f"{shown(spec)} is not a JSON object")
        info = LaunchInfo(node_rank=values.get("node_rank", 0),
                          nnodes=values.get("nnodes", 1),
                          headless=values.get("headless", False),
                          host=values.get("host", "0.0.0.0"),  # noqa: S104
                          port=values.get("port", 8000), master_addr=values.get("master_addr"),
                          master_port=values.get("master_port"))
        return raw, info
