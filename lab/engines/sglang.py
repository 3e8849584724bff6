"""SGLang: configuration <-> `python3 -m sglang.launch_server` command line, and its logs.

Multi-node serving: every node runs the same command with `--nnodes N --node-rank R
--dist-init-addr HEAD:5000`; rank 0 serves the API. Expert parallelism is
`--ep-size` equal to the tensor-parallel size (older releases: `--enable-ep-moe`).
EAGLE-3 with k draft tokens is `--speculative-num-steps k --speculative-eagle-topk 1
--speculative-num-draft-tokens k+1` (a chain); n-gram is `--speculative-num-draft-tokens
k+1` with the match-window sizes as prompt_lookup_min/max. Flag names follow SGLang's
server arguments (docs/advanced_features/server_arguments.md); log formats follow
sglang/srt/managers/scheduler_metrics_mixin.py and model_runner.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, ClassVar

from lab.config import LINEAR_BACKENDS, LOAD_FORMATS, MOE_BACKENDS
from lab.engines.base import SGLANG_DIST_PORT, Engine, Flag, FlagTable, LaunchInfo
from lab.engines.logs import Event, LogLine, Matcher, number, shard_progress
from lab.inventory import Node

PROG = "launch_server.py"  # argparse's prog for `python -m sglang.launch_server`
KV_TO_FLAG = {"auto": "auto", "fp8": "fp8_e4m3", "bf16": "bf16"}
KV_FROM_FLAG = {"auto": "auto", "fp8_e4m3": "fp8", "bf16": "bf16", "bfloat16": "bf16"}
ALGORITHMS = {"EAGLE3": "eagle3", "NGRAM": "ngram", "NEXTN": "mtp"}
ALGORITHM_OF = {v: k for k, v in ALGORITHMS.items()}
SPEC_DESTS = ("spec_draft", "spec_steps", "spec_topk", "spec_draft_tokens", "spec_ngram_max",
              "spec_ngram_min")


def _passthrough(names: tuple[str, ...], kind: str = "str", loads: str = "") -> Flag:
    return Flag(names, "extra:" + names[0], kind, passthrough=True, loads=loads)


FLAGS = (
    Flag(("--model-path", "--model"), "model"),
    Flag(("--served-model-name",), "served_model_name"),
    Flag(("--tp-size", "--tensor-parallel-size", "--tp"), "tp", "int"),
    Flag(("--pp-size", "--pipeline-parallel-size"), "pp", "int"),
    Flag(("--ep-size", "--expert-parallel-size", "--ep"), "ep_size", "int"),
    Flag(("--enable-ep-moe",), "enable_ep_moe", "bool"),
    Flag(("--nnodes",), "nnodes", "int"),
    Flag(("--node-rank",), "node_rank", "int"),
    Flag(("--dist-init-addr", "--nccl-init-addr"), "dist_init_addr"),
    Flag(("--host",), "host"),
    Flag(("--port",), "port", "int"),
    Flag(("--context-length",), "max_model_len", "int"),
    Flag(("--kv-cache-dtype",), "kv_cache_dtype", choices=tuple(KV_FROM_FLAG)),
    Flag(("--mem-fraction-static",), "gpu_memory_utilization", "float"),
    Flag(("--disable-cuda-graph",), "enforce_eager", "bool"),
    Flag(("--load-format",), "load_format", choices=LOAD_FORMATS),
    Flag(("--moe-runner-backend",), "moe_backend", choices=MOE_BACKENDS["sglang"]),
    Flag(("--fp4-gemm-backend",), "linear_backend", choices=LINEAR_BACKENDS["sglang"]),
    Flag(("--speculative-algorithm",), "spec_algorithm", convert=str.upper, type_name="str",
         choices=tuple(ALGORITHMS)),
    Flag(("--speculative-draft-model-path", "--speculative-draft-model"), "spec_draft"),
    Flag(("--speculative-num-steps",), "spec_steps", "int"),
    Flag(("--speculative-eagle-topk",), "spec_topk", "int"),
    Flag(("--speculative-num-draft-tokens",), "spec_draft_tokens", "int"),
    Flag(("--speculative-ngram-max-match-window-size",), "spec_ngram_max", "int"),
    Flag(("--speculative-ngram-min-match-window-size",), "spec_ngram_min", "int"),
    _passthrough(("--trust-remote-code",), "bool", loads="remote_code"),
    _passthrough(("--dtype",)),
    _passthrough(("--quantization",)),
    _passthrough(("--max-running-requests",), "int"),
    _passthrough(("--chunked-prefill-size",), "int"),
    _passthrough(("--max-prefill-tokens",), "int"),
    _passthrough(("--schedule-policy",)),
    _passthrough(("--disable-radix-cache",), "bool"),
    _passthrough(("--cuda-graph-max-bs",), "int"),
    _passthrough(("--attention-backend",)),
    _passthrough(("--random-seed",), "int"),
    _passthrough(("--log-level",)),
    _passthrough(("--enable-metrics",), "bool"),
    # A secret (lab.config, "secrets"): masked where a configuration enters; the engine the
    # lab starts gets the lab's own key for the job in its place.
    _passthrough(("--api-key",)),
    _passthrough(("--chat-template",), loads="chat_template"),
    _passthrough(("--reasoning-parser",)),
    _passthrough(("--tool-call-parser",)),
    _passthrough(("--tokenizer-path",), loads="tokenizer"),
    _passthrough(("--decode-log-interval",), "int"),
    _passthrough(("--enable-torch-compile",), "bool"),
    _passthrough(("--page-size",), "int"),
    _passthrough(("--watchdog-timeout",), "float"),
    _passthrough(("--dist-timeout",), "int"),
    _passthrough(("--moe-a2a-backend",)),
    _passthrough(("--enable-mixed-chunk",), "bool"),
    _passthrough(("--enable-cache-report",), "bool"),
    _passthrough(("--download-dir",), loads="download_dir"),
)

SERVING_DESTS = ("max_model_len", "kv_cache_dtype", "gpu_memory_utilization", "enforce_eager",
                 "load_format", "moe_backend", "linear_backend")


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# -- log lines ---------------------------------------------------------------------------
def _find(pattern: str, text: str) -> str | None:
    m = re.search(pattern, text)
    return m[1] if m else None


def _int_or_none(text: str | None) -> int | None:
    return int(number(text)) if text is not None else None


def _batch(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    """'Decode batch. #running-req: 1, ..., gen throughput (token/s): 40.12, #queue-req: 0, '
    (newer releases: 'Decode batch, ...' with accept rate and cuda graph fields)."""
    m = re.match(r"(Decode|Prefill) batch(?: \[\d+\])?[.,]", message)
    if not m:
        return None
    phase = m[1].lower()
    gen = _find(r"gen throughput \(token/s\): ([\d,.]+)", message)
    prompt = _find(r"input throughput \(token/s\): ([\d,.]+)", message)
    stats: Event = {
        "kind": "stats",
        "phase": phase,
        "generation_tps": number(gen) if gen is not None else None,
        "prompt_tps": number(prompt) if prompt is not None else None,
        "running": _int_or_none(_find(r"#running-req: ([\d,]+)", message)),
        "waiting": _int_or_none(_find(r"#queue-req: ([\d,]+)", message)),
    }
    if (usage := _find(r"(?<![\w ])token usage: ([\d.]+)", message)) is not None:
        stats["token_usage"] = float(usage)
    if (graph := _find(r"cuda graph: (True|False)", message)) is not None:
        stats["cuda_graph"] = graph == "True"
    events = [stats]
    accept = _find(r"accept len: ([\d.]+)", message)
    if accept is not None:
        spec: Event = {"kind": "specdec", "accepted": None, "drafted": None,
                       "mean_acceptance_length": float(accept), "per_position": []}
        if (rate := _find(r"accept rate: ([\d.]+)", message)) is not None:
            spec["acceptance_rate"] = float(rate)
        events.append(spec)
    return events


def _load_begin(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    if message.startswith("Load weight begin"):
        state["load_begin_ts"] = line.ts
    return None


def _load_end(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    """'Load weight end. [elapsed=312.45 s, ]type=..., avail mem=... GB, mem usage=... GB.'"""
    if not re.match(r"(?:Load weight end|Rank \d+: load weight end)", message):
        return None
    elapsed = _find(r"elapsed=([\d.]+) s", message)
    seconds: float | None = number(elapsed) if elapsed else None
    begin = state.pop("load_begin_ts", None)
    if seconds is None and begin is not None and line.ts is not None:
        # Older releases log no duration: the begin and end stamps give it.
        seconds = line.ts - begin
    event: Event = {"kind": "weights_loaded", "seconds": seconds}
    if (usage := _find(r"mem usage=([\d.]+) GB", message)) is not None:
        event["memory_gb"] = float(usage)
    return [event]


def _graph_end(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    """'Capture cuda graph end. Time elapsed: 12.34 s' and the newer
    'Capture target decode CUDA graph end. elapsed=25.74 s, mem usage=2.66 GB'."""
    m = re.match(r"Capture (?:(?P<what>[\w ]+?) )?(?:cuda|CUDA) graph end\.?"
                 r"(?: Time elapsed: (?P<a>[\d.]+) s| elapsed=(?P<b>[\d.]+) s)?", message)
    if not m or not (m["a"] or m["b"]):
        return None
    event: Event = {"kind": "graph_capture", "seconds": number(m["a"] or m["b"])}
    if m["what"]:
        event["graph"] = m["what"].lower()
    if (usage := _find(r"mem usage=([\d.]+) GB", message)) is not None:
        event["memory_gb"] = float(usage)
    return [event]


def _startup_timings(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    """'Engine startup timings (s): load_weight=312.45, scheduler_e2e=361.83, ...'."""
    m = re.match(r"Engine startup timings \(s\):\s*(.*)", message)
    if not m:
        return None
    timings = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", m[1])}
    if not timings:
        return None
    seconds = timings.get("scheduler_e2e", max(timings.values()))
    return [{"kind": "engine_init", "seconds": seconds, "timings": timings}]


def _ready(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    if "The server is fired up and ready to roll" in message:
        return [{"kind": "api_ready"}]
    return None


def _moe_runner(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    """'Use flashinfer_trtllm as MoE runner backend on sm100 for DeepseekV3ForCausalLM'
    (the simulated lab words it 'Using ... as MoE runner backend for NVFP4')."""
    m = re.search(r"\b[Uu]s(?:e|ing) (\w+) as MoE runner backend", message)
    if not m:
        return None
    return [{"kind": "fp4_backend", "backend": m[1].lower(), "layer": "moe"}]


def _child_failed(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    if "Received sigquit from a child process" in message:
        return [{"kind": "error", "traceback": False, "message": message.strip()}]
    return None


LOG_MATCHERS: tuple[Matcher, ...] = (
    _batch,
    shard_progress,
    _load_begin,
    _load_end,
    _graph_end,
    _startup_timings,
    _ready,
    _moe_runner,
    _child_failed,
)


class Sglang(Engine):
    name = "sglang"
    table = FlagTable(PROG, FLAGS)
    dest_fields: ClassVar[Mapping[str, str]] = {
        "model": "model.path",
        "served_model_name": "model.id",
        "tp": "parallel.tp",
        "pp": "parallel.pp",
        "ep_size": "parallel.expert_parallel",
        "enable_ep_moe": "parallel.expert_parallel",
        **{dest: f"serving.{dest}" for dest in SERVING_DESTS},
        "spec_algorithm": "speculative",
        "spec_draft": "speculative.draft_model",
        "spec_steps": "speculative.num_speculative_tokens",
        "spec_topk": "speculative.num_speculative_tokens",
        "spec_draft_tokens": "speculative.num_speculative_tokens",
        "spec_ngram_max": "speculative.prompt_lookup_max",
        "spec_ngram_min": "speculative.prompt_lookup_min",
    }
    launch_dests = frozenset({"nnodes", "node_rank", "dist_init_addr", "host", "port"})
    log_matchers = LOG_MATCHERS

    def invocation(self, tokens: Sequence[str]) -> list[str] | None:
        if len(tokens) >= 3 and re.fullmatch(r"python[\d.]*", PurePosixPath(tokens[0]).name) \
                and tokens[1] == "-m" and tokens[2] == "sglang.launch_server":
            return list(tokens[3:])
        return None

    def argv(self, config: Mapping[str, Any], *, rank: int, nnodes: int, head: Node,
             node: Node) -> list[str]:
        par, srv, spec = config["parallel"], config["serving"], config["speculative"]
        argv = [node.python, "-m", "sglang.launch_server",
                "--model-path", config["model"]["path"],
                "--served-model-name", config["model"]["id"],
                "--tp", str(par["tp"]), "--pp-size", str(par["pp"])]
        if par["expert_parallel"]:
            argv += ["--ep-size", str(par["tp"])]
        if nnodes > 1:
            argv += ["--nnodes", str(nnodes), "--node-rank", str(rank),
                     "--dist-init-addr", _address(head.data_addr, SGLANG_DIST_PORT)]
        argv += ["--host", "0.0.0.0", "--port", str(head.api_port),  # noqa: S104 - serves the lab
                 "--context-length", str(srv["max_model_len"]),
                 "--kv-cache-dtype", KV_TO_FLAG[srv["kv_cache_dtype"]],
                 "--mem-fraction-static", repr(float(srv["gpu_memory_utilization"]))]
        if srv["enforce_eager"]:
            argv.append("--disable-cuda-graph")
        if srv["load_format"] != "auto":
            argv += ["--load-format", srv["load_format"]]
        if srv["moe_backend"] != "auto":
            argv += ["--moe-runner-backend", srv["moe_backend"]]
        if srv["linear_backend"] != "auto":
            argv += ["--fp4-gemm-backend", srv["linear_backend"]]
        if spec is not None:
            k = spec["num_speculative_tokens"]
            argv += ["--speculative-algorithm", ALGORITHM_OF[spec["method"]]]
            if spec["method"] == "eagle3":
                argv += ["--speculative-draft-model-path", spec["draft_model"]]
            if spec["method"] in ("eagle3", "mtp"):
                argv += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1"]
            argv += ["--speculative-num-draft-tokens", str(k + 1)]
            if spec.get("prompt_lookup_max") is not None:
                argv += ["--speculative-ngram-max-match-window-size", str(spec["prompt_lookup_max"])]
            if spec.get("prompt_lookup_min") is not None:
                argv += ["--speculative-ngram-min-match-window-size", str(spec["prompt_lookup_min"])]
        return argv + list(config["extra_args"])

    def _speculative(self, v: Mapping[str, Any]) -> dict[str, Any] | None:
        algorithm = v.get("spec_algorithm")
        given = [d for d in SPEC_DESTS if d in v]
        if algorithm is None:
            if given:
                flag = self.flag_of(given[0])
                raise self.table.error(flag, f"argument {flag}: needs --speculative-algorithm")
            return None
        method = ALGORITHMS[algorithm]
        steps, tokens = v.get("spec_steps"), v.get("spec_draft_tokens")
        spec: dict[str, Any] = {"method": method}
        if method == "ngram":
            for dest in ("spec_steps", "spec_topk", "spec_draft"):
                if dest in v:
                    flag = self.flag_of(dest)
                    raise self.table.error(flag, f"argument {flag}: does not apply to NGRAM")
            if tokens is None:
                raise self.table.error("--speculative-num-draft-tokens",
                                       "argument --speculative-num-draft-tokens: is required "
                                       "with --speculative-algorithm NGRAM")
            if tokens < 2:
                raise self.table.error("--speculative-num-draft-tokens",
                                       f"argument --speculative-num-draft-tokens: {tokens} is "
                                       "too few; it counts the verified token plus k >= 1 drafts")
            spec["num_speculative_tokens"] = tokens - 1
            if "spec_ngram_max" in v:
                spec["prompt_lookup_max"] = v["spec_ngram_max"]
            if "spec_ngram_min" in v:
                spec["prompt_lookup_min"] = v["spec_ngram_min"]
            return spec
        for dest in ("spec_ngram_max", "spec_ngram_min"):
            if dest in v:
                flag = self.flag_of(dest)
                raise self.table.error(flag, f"argument {flag}: applies to NGRAM only")
        if v.get("spec_topk", 1) != 1:
            raise self.table.error("--speculative-eagle-topk",
                                   "argument --speculative-eagle-topk: only 1 (chain drafting) "
                                   f"is modelled, got {v['spec_topk']}")
        if steps is not None:
            k = steps
        elif tokens is not None:
            k = tokens - 1
        else:
            raise self.table.error("--speculative-num-steps",
                                   "argument --speculative-num-steps: is required with "
                                   f"--speculative-algorithm {algorithm}")
        if tokens is not None and tokens != k + 1:
            raise self.table.error("--speculative-num-draft-tokens",
                                   f"argument --speculative-num-draft-tokens: {tokens} does not "
                                   f"match --speculative-num-steps {k} with top-k 1; use {k + 1}")
        spec["num_speculative_tokens"] = k
        if method == "eagle3" and "spec_draft" not in v:
            raise self.table.error("--speculative-draft-model-path",
                                   "argument --speculative-draft-model-path: is required with "
                                   "--speculative-algorithm EAGLE3")
        if "spec_draft" in v:
            spec["draft_model"] = v["spec_draft"]
        return spec

    def flag_of(self, dest: str) -> str:
        return next(f.canonical for f in self.table.flags if f.dest == dest)

    def read_args(self, args: Sequence[str]) -> tuple[dict[str, Any], LaunchInfo]:
        parsed = self.table.parse(args)
        v = parsed.values
        if "model" not in v:
            raise self.table.error("--model-path", "the following arguments are required: "
                                                   "--model-path")
        tp = v.get("tp", 1)
        ep_size = v.get("ep_size")
        if ep_size is None:
            expert_parallel = v.get("enable_ep_moe", False)
        elif ep_size in (1, tp):
            expert_parallel = ep_size == tp
        else:
            raise self.table.error("--ep-size", f"argument --ep-size: {ep_size} with --tp-size "
                                                f"{tp} is not modelled; use {tp} (or 1 for none)")
        serving = {dest: v[dest] for dest in SERVING_DESTS if dest in v}
        if "kv_cache_dtype" in serving:
            serving["kv_cache_dtype"] = KV_FROM_FLAG[serving["kv_cache_dtype"]]
        raw: dict[str, Any] = {
            "engine": {"name": self.name},
            "model": {"path": v["model"], "id": v.get("served_model_name", v["model"])},
            "parallel": {"tp": tp, "pp": v.get("pp", 1), "expert_parallel": expert_parallel},
            "serving": serving,
            "speculative": self._speculative(v),
            "extra_args": parsed.passthrough,
        }
        master_addr: str | None = None
        master_port: int | None = None
        if "dist_init_addr" in v:
            host, sep, port = v["dist_init_addr"].rpartition(":")
            if not sep or not port.isdigit():
                raise self.table.error("--dist-init-addr",
                                       f"argument --dist-init-addr: {v['dist_init_addr']!r} is "
                                       "not HOST:PORT")
            master_addr, master_port = host.strip("[]"), int(port)
        node_rank = v.get("node_rank", 0)
        info = LaunchInfo(node_rank=node_rank, nnodes=v.get("nnodes", 1), headless=node_rank > 0,
                          host=v.get("host", "127.0.0.1"), port=v.get("port", 30000),
                          master_addr=master_addr, master_port=master_port)
        return raw, info
