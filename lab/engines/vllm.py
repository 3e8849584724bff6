"""vLLM: configuration <-> `vllm serve` command line, and vLLM's log lines.

Multi-node serving is vLLM's multiprocessing mode: every node runs `vllm serve` with the
same arguments plus `--nnodes N --node-rank R --master-addr HEAD --master-port 29500`;
rank 0 serves the API, the others add `--headless`. Flag names follow vLLM's
`EngineArgs` (vllm/engine/arg_utils.py, vllm/config/parallel.py, vllm/config/load.py);
the FP4 overrides `--moe-backend` and `--linear-backend` follow LAB_MODEL.md section 6.
Log formats follow vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py and the
startup lines quoted in tests/lab/engines/fixtures/.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import PurePosixPath
from typing import Any, ClassVar

from lab.config import LINEAR_BACKENDS, LOAD_FORMATS, LOAD_STRATEGIES, MOE_BACKENDS, shown
from lab.engines.base import (
    MASTER_PORT,
    Engine,
    EngineArgError,
    Flag,
    FlagTable,
    LaunchInfo,
)
from lab.engines.logs import Event, LogLine, Matcher, normalize_backend, number, shard_progress
from lab.inventory import Node

PROG = "vllm serve"
KV_TO_FLAG = {"auto": "auto", "fp8": "fp8", "bf16": "bfloat16"}
KV_FROM_FLAG = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8", "bfloat16": "bf16"}
SPEC_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")
SPEC_METHODS_FROM_JSON = {"eagle3": "eagle3", "ngram": "ngram", "[ngram]": "ngram",
                          "mtp": "mtp", "deepseek_mtp": "mtp"}
_HUMAN_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
                "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_int(text: str) -> int:
    """vLLM's --max-model-len: 262144, 256K (×1024) or 262.144k (×1000)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)", text.strip())
    if not m:
        raise ValueError(text)
    try:
        value = Decimal(m[1]) * _HUMAN_SCALE[m[2]]
    except InvalidOperation as exc:
        raise ValueError(text) from exc
    if value != value.to_integral_value():
        raise ValueError(text)
    return int(value)


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(text[:60]) from None  # nested past the interpreter's limit
    if not isinstance(value, dict):
        raise ValueError(text)
    return value


def _passthrough(names: tuple[str, ...], kind: str = "str", choices: tuple[str, ...] = (),
                 loads: str = "") -> Flag:
    return Flag(names, "extra:" + names[0], kind, choices=choices, passthrough=True, loads=loads)


FLAGS = (
    Flag(("--model",), "model"),
    Flag(("--served-model-name",), "served_model_name"),
    Flag(("--tensor-parallel-size", "-tp"), "tp", "int"),
    Flag(("--pipeline-parallel-size", "-pp"), "pp", "int"),
    Flag(("--enable-expert-parallel", "-ep"), "expert_parallel", "optbool"),
    Flag(("--nnodes", "-n"), "nnodes", "int"),
    Flag(("--node-rank", "-r"), "node_rank", "int"),
    Flag(("--master-addr",), "master_addr"),
    Flag(("--master-port",), "master_port", "int"),
    Flag(("--headless",), "headless", "bool"),
    Flag(("--host",), "host"),
    Flag(("--port",), "port", "int"),
    Flag(("--max-model-len",), "max_model_len", convert=human_int, type_name="human_readable_int"),
    Flag(("--kv-cache-dtype",), "kv_cache_dtype", choices=tuple(KV_FROM_FLAG)),
    Flag(("--gpu-memory-utilization",), "gpu_memory_utilization", "float"),
    Flag(("--enforce-eager",), "enforce_eager", "optbool"),
    Flag(("--load-format",), "load_format", choices=LOAD_FORMATS),
    Flag(("--safetensors-load-strategy",), "safetensors_load_strategy", choices=LOAD_STRATEGIES),
    Flag(("--moe-backend",), "moe_backend", choices=MOE_BACKENDS["vllm"]),
    Flag(("--linear-backend",), "linear_backend", choices=LINEAR_BACKENDS["vllm"]),
    Flag(("--speculative-config",), "speculative_config", convert=json_object, type_name="JSON"),
    # Known flags that do not change what the diagnostic measures: kept in extra_args.
    _passthrough(("--trust-remote-code",), "bool", loads="remote_code"),
    _passthrough(("--dtype",), choices=("auto", "half", "float16", "bfloat16", "float", "float32")),
    _passthrough(("--quantization", "-q")),
    _passthrough(("--max-num-seqs",), "int"),
    _passthrough(("--max-num-batched-tokens",), "int"),
    _passthrough(("--enable-prefix-caching",), "optbool"),
    _passthrough(("--enable-chunked-prefill",), "optbool"),
    _passthrough(("--async-scheduling",), "optbool"),
    _passthrough(("--block-size",), "int"),
    _passthrough(("--swap-space",), "float"),
    _passthrough(("--seed",), "int"),
    _passthrough(("--tokenizer",), loads="tokenizer"),
    _passthrough(("--tokenizer-mode",)),
    _passthrough(("--chat-template",), loads="chat_template"),
    _passthrough(("--generation-config",), loads="generation_config"),
    _passthrough(("--download-dir",), loads="download_dir"),
    _passthrough(("--enable-auto-tool-choice",), "bool"),
    _passthrough(("--tool-call-parser",)),
    _passthrough(("--reasoning-parser",)),
    # A secret (lab.config, "secrets"): masked where a configuration enters; the engine the
    # lab starts gets the lab's own key for the job in its place (and VLLM_API_KEY, which it overrides).
    _passthrough(("--api-key",)),
    _passthrough(("--disable-log-requests",), "bool"),
    _passthrough(("--enable-log-requests",), "optbool"),
    _passthrough(("--disable-log-stats",), "bool"),
    _passthrough(("--disable-uvicorn-access-log",), "bool"),
    _passthrough(("--uvicorn-log-level",)),
    _passthrough(("--max-log-len",), "int"),
    _passthrough(("--disable-custom-all-reduce",), "bool"),
    _passthrough(("--max-cudagraph-capture-size",), "int"),
    _passthrough(("--compilation-config",), loads="compilation_config"),
    _passthrough(("--enable-eplb",), "bool"),
    _passthrough(("--all2all-backend",)),
    _passthrough(("--attention-backend",)),
    _passthrough(("--enable-force-include-usage",), "bool"),
)

SERVING_DESTS = ("max_model_len", "kv_cache_dtype", "gpu_memory_utilization", "enforce_eager",
                 "load_format", "safetensors_load_strategy", "moe_backend", "linear_backend")


def _speculative_from_json(spec: Mapping[str, Any]) -> dict[str, Any]:
    flag = "--speculative-config"
    for key in spec:
        if key not in SPEC_KEYS:
            raise EngineArgError(flag, f"argument {flag}: key {shown(key)} is not supported; "
                                       f"accepted: {', '.join(SPEC_KEYS)}", PROG)
    method = spec.get("method")
    if method is None and spec.get("model") in ("ngram", "[ngram]"):
        method = "ngram"  # older vLLM named the n-gram proposer through "model"
    if method not in SPEC_METHODS_FROM_JSON:
        raise EngineArgError(flag, f"argument {flag}: method {shown(method)} is not supported; "
                                   "use one of eagle3, ngram, mtp", PROG)
    out: dict[str, Any] = {"method": SPEC_METHODS_FROM_JSON[method]}
    if "num_speculative_tokens" not in spec:
        raise EngineArgError(flag, f"argument {flag}: num_speculative_tokens is required", PROG)
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
    if (kv := _find(r"GPU KV cache usage: ([\d,.]+)%", message)) is not None:
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
    m = re.search(r"Starting vLLM API server(?: \d+)? on (\S+)", message)
    return [{"kind": "api_ready", "url": m[1].rstrip(",.")}] if m else None


_FP4 = (
    # Simulated lab and similar: "Using FlashInferCutlass backend for NVFP4 MoE".
    re.compile(r"Using (?P<name>[\w-]+) backend for NVFP4 (?P<layer>MoE|GEMM|[Ll]inear)"),
    # vLLM >= 0.11: "Using 'MARLIN' NvFp4 MoE backend out of potential backends: [...]".
    re.compile(r"Using '(?P<name>[\w-]+)' NvFp4 (?P<layer>MoE|GEMM|[Ll]inear) backend"),
    # "Using CutlassNvFp4LinearKernel for NVFP4 GEMM".
    re.compile(r"Using (?P<name>\w+?LinearKernel) for NVFP4 (?P<layer>GEMM)"),
)


def _fp4_backend(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    for regex in _FP4:
        if m := regex.search(message):
            layer = "moe" if m["layer"] == "MoE" else "linear"
            return [{"kind": "fp4_backend", "backend": normalize_backend(m["name"]),
                     "layer": layer}]
    if "Weight-only FP4 compression will be used leveraging the Marlin kernel" in message:
        return [{"kind": "fp4_backend", "backend": "marlin", "layer": "linear"}]
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
                          r"([\d.]+) (?:seconds|s)(?: \(compilation: ([\d.]+) s\))?",
           extra=(("compilation_s", 2),)),
    _api_ready,
    _fp4_backend,
    _kv_budget,
)
ERROR_MATCHERS: tuple[Matcher, ...] = (_kv_budget,)


class Vllm(Engine):
    name = "vllm"
    table = FlagTable(PROG, FLAGS, underscores=True)
    dest_fields: ClassVar[Mapping[str, str]] = {
        "model": "model.path",
        "served_model_name": "model.id",
        "tp": "parallel.tp",
        "pp": "parallel.pp",
        "expert_parallel": "parallel.expert_parallel",
        **{dest: f"serving.{dest}" for dest in SERVING_DESTS},
        "speculative_config": "speculative",
    }
    launch_dests = frozenset({"nnodes", "node_rank", "master_addr", "master_port", "headless",
                              "host", "port"})
    log_matchers = LOG_MATCHERS
    error_matchers = ERROR_MATCHERS

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
        if srv["safetensors_load_strategy"] != "lazy":
            argv += ["--safetensors-load-strategy", srv["safetensors_load_strategy"]]
        if srv["moe_backend"] != "auto":
            argv += ["--moe-backend", srv["moe_backend"]]
        if srv["linear_backend"] != "auto":
            argv += ["--linear-backend", srv["linear_backend"]]
        if spec is not None:
            argv += ["--speculative-config", _speculative_json(spec)]
        return argv + list(config["extra_args"])

    def read_args(self, args: Sequence[str]) -> tuple[dict[str, Any], LaunchInfo]:
        parsed = self.table.parse(args, max_positionals=1)
        v = parsed.values
        # `vllm serve MODEL` wins over --model, as in vLLM's serve command.
        model = parsed.positionals[0] if parsed.positionals else v.get("model")
        if model is None:
            raise self.table.error("model", "the following arguments are required: model_tag "
                                            "(vllm serve MODEL ...)")
        serving = {dest: v[dest] for dest in SERVING_DESTS if dest in v}
        if "kv_cache_dtype" in serving:
            serving["kv_cache_dtype"] = KV_FROM_FLAG[serving["kv_cache_dtype"]]
        raw: dict[str, Any] = {
            "engine": {"name": self.name},
            "model": {"path": model, "id": v.get("served_model_name", model)},
            "parallel": {"tp": v.get("tp", 1), "pp": v.get("pp", 1),
                         "expert_parallel": v.get("expert_parallel", False)},
            "serving": serving,
            "speculative": (_speculative_from_json(v["speculative_config"])
                            if "speculative_config" in v else None),
            "extra_args": parsed.passthrough,
        }
        info = LaunchInfo(node_rank=v.get("node_rank", 0), nnodes=v.get("nnodes", 1),
                          headless=v.get("headless", False), host=v.get("host", "0.0.0.0"),  # noqa: S104
                          port=v.get("port", 8000), master_addr=v.get("master_addr"),
                          master_port=v.get("master_port"))
        return raw, info
