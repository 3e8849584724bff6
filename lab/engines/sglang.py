"""SGLang: configuration <-> `python3 -m sglang.launch_server` command line, and its logs.

Multi-node serving: every node runs the same command with `--nnodes N --node-rank R
--dist-init-addr HEAD:5000`; rank 0 serves the API. Expert parallelism is `--ep-size`
equal to the tensor-parallel size. EAGLE-3 with k draft tokens is `--speculative-num-steps
k --speculative-eagle-topk 1 --speculative-num-draft-tokens k+1` (a chain); SGLang's
n-gram drafting is a tree whose size is `--speculative-num-draft-tokens` (k+1 here), tuned
by its own `--speculative-ngram-*` flags (which travel in extra_args): no modelled release
has the match-window flags that prompt_lookup_min/max would need. The lab always renders
`--enable-metrics` (SGLang serves /metrics only with it). Which flags a version has, their
choices and how they are read come from its table (lab.engines.argv); log formats are the
ones the tables quote (scheduler metrics mixin, model runner, cuda graph runners).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, ClassVar

from lab.config import LOAD_FORMATS, ConfigError, shown
from lab.engines.argv import ReleaseParser
from lab.engines.base import SGLANG_DIST_PORT, Engine, LaunchInfo
from lab.engines.logs import Event, LogLine, Matcher, number, shard_progress
from lab.inventory import Node

KV_TO_FLAG = {"auto": "auto", "fp8": "fp8_e4m3", "bf16": "bf16"}
KV_FROM_FLAG = {"auto": "auto", "fp8_e4m3": "fp8", "bf16": "bf16", "bfloat16": "bf16"}
ALGORITHMS = {"EAGLE3": "eagle3", "NGRAM": "ngram", "NEXTN": "mtp"}
ALGORITHM_OF = {v: k for k, v in ALGORITHMS.items()}
METRICS_FLAG = "--enable-metrics"
SPEC_FLAGS = ("--speculative-draft-model-path", "--speculative-num-steps",
              "--speculative-eagle-topk", "--speculative-num-draft-tokens")


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# -- log lines ---------------------------------------------------------------------------
def _find(pattern: str, text: str) -> str | None:
    m = re.search(pattern, text)
    return m[1] if m else None


def _int_or_none(text: str | None) -> int | None:
    return int(number(text)) if text is not None else None


def _batch(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    """'Decode batch{iter_msg}, #running-req: N, {token usage}accept len: 2.91, accept rate:
    0.48, cuda graph: True, gen throughput (token/s): 40.12, #queue-req: 0' and the Prefill
    line (the fields as the tables quote them; the graph label is the release's own)."""
    m = re.match(r"(Decode|Prefill) batch[^,]*,", message)
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
    if (usage := _find(r"(?:^|, |#token: [\d,]+, )token usage: ([\d.]+)", message)) is not None:
        stats["token_usage"] = float(usage)
    elif (usage := _find(r"full token usage: ([\d.]+)", message)) is not None:
        stats["token_usage"] = float(usage)
    if (graph := _find(r"graph: (True|False)", message)) is not None:
        stats["cuda_graph"] = graph == "True"
    events = [stats]
    accept = _find(r"(?<!block )accept len: ([\d.]+)", message)
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
    """'Load weight end. elapsed=312.45 s, type=..., avail mem=... GB, mem usage=... GB.'
    (0.5.23 also writes 'Load weight end. Committed real weights after CUDA graph capture
    ...' when weights load behind the capture: not a weights-load time)."""
    if not re.match(r"(?:Load weight end|Rank \d+: load weight end)", message) or \
            "Committed real weights" in message:
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
    """'Capture draft cuda graph end. Time elapsed: 12.34 s. mem usage=...' (0.5.12) and
    'Capture decode CUDA graph end. elapsed=25.74 s, mem usage=2.66 GB, ...' (0.5.17+; the
    draft extend one with 'step=N, ' first)."""
    m = re.match(r"Capture (?:(?P<what>.+?) )?(?:cuda|CUDA) graph end\.?"
                 r"(?:.*?(?:Time elapsed: |elapsed=)(?P<s>[\d.]+) s)?", message)
    if not m or not m["s"]:
        return None
    event: Event = {"kind": "graph_capture", "seconds": number(m["s"])}
    if m["what"]:
        event["graph"] = m["what"].lower()
    if (usage := _find(r"mem usage=([\d.]+) GB", message)) is not None:
        event["memory_gb"] = float(usage)
    return [event]


def _kv_cache(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    """'KV Cache is allocated. #tokens: N, ...' (0.5.12) / '... KV cache allocated. dtype:
    ..., #tokens: N, KV size: X GB' (0.5.23)."""
    if not re.search(r"KV Cache is allocated\.|(?<!draft )KV cache allocated\.", message):
        return None
    event: Event = {"kind": "kv_cache"}
    if (tokens := _find(r"#tokens: ([\d,]+)", message)) is not None:
        event["tokens"] = int(number(tokens))
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
    _kv_cache,
    _startup_timings,
    _ready,
    _moe_runner,
    _child_failed,
)

FIELD_FLAGS = {
    "model.path": "--model-path",
    "model.id": "--served-model-name",
    "parallel.tp": "--tp-size",
    "parallel.pp": "--pp-size",
    "parallel.expert_parallel": "--ep-size",
    "serving.max_model_len": "--context-length",
    "serving.kv_cache_dtype": "--kv-cache-dtype",
    "serving.gpu_memory_utilization": "--mem-fraction-static",
    "serving.enforce_eager": "--disable-cuda-graph",
    "serving.load_format": "--load-format",
    "serving.moe_backend": "--moe-runner-backend",
    "serving.linear_backend": "--fp4-gemm-backend",
    "speculative": "--speculative-algorithm",
    "speculative.draft_model": "--speculative-draft-model-path",
    "speculative.num_speculative_tokens": "--speculative-num-draft-tokens",
}
# Flags read with the speculative fields that carry no field of their own.
_SPEC_STEPS = ("--speculative-num-steps", "--speculative-eagle-topk")
LAUNCH_FLAGS = ("--nnodes", "--node-rank", "--dist-init-addr", "--host", "--port")


class Sglang(Engine):
    name = "sglang"
    field_flags: ClassVar[Mapping[str, str]] = FIELD_FLAGS
    launch_flags = LAUNCH_FLAGS
    log_matchers = LOG_MATCHERS

    def invocation(self, tokens: Sequence[str]) -> list[str] | None:
        if len(tokens) >= 3 and re.fullmatch(r"python[\d.]*", PurePosixPath(tokens[0]).name) \
                and tokens[1] == "-m" and tokens[2] == "sglang.launch_server":
            return list(tokens[3:])
        if len(tokens) >= 2 and PurePosixPath(tokens[0]).name == "sglang" and tokens[1] == "serve":
            return list(tokens[2:])
        return None

    def modelled_dests(self, parser: ReleaseParser) -> dict[str, str]:
        out = super().modelled_dests(parser)
        for flag in _SPEC_STEPS:
            option = parser.option(flag)
            if option is not None:
                out[option.dest] = "speculative.num_speculative_tokens"
        return out

    def check_config(self, config: dict[str, Any]) -> dict[str, Any]:
        version = config["engine"]["version"]
        parser = self.parser(version)
        serving = dict(config["serving"])
        where = f"sglang {version}"
        for name in ("moe_backend", "linear_backend"):
            flag = FIELD_FLAGS[f"serving.{name}"]
            option = parser.option(flag)
            value = serving[name]
            if option is None:
                if value != "auto":
                    raise ConfigError(f"serving.{name}", f"{where} has no {flag}; use auto")
                continue
            if option.choices is not None and value not in option.choices:
                raise ConfigError(f"serving.{name}", f"{shown(value)} is not a choice of {flag} in "
                                                     f"{where}; use one of "
                                                     f"{', '.join(map(str, option.choices))}")
        # serving.safetensors_load_strategy: lab.config's _load_strategy reads lazy as unset for
        # SGLang and refuses the rest before any engine check runs.
        load = parser.option("--load-format")
        if serving["load_format"] not in LOAD_FORMATS or (
                load is not None and load.choices is not None
                and serving["load_format"] not in load.choices):
            raise ConfigError("serving.load_format", f"{shown(serving['load_format'])} is not "
                                                     f"accepted by {where}; use auto or safetensors")
        spec = config["speculative"]
        if spec is not None:
            for key in ("prompt_lookup_max", "prompt_lookup_min"):
                if spec.get(key) is not None:
                    raise ConfigError(f"speculative.{key}",
                                      f"{where} has no n-gram match-window flags (its n-gram "
                                      "drafting is a tree, tuned by --speculative-ngram-* flags "
                                      "in extra_args); remove it")
        return config

    def argv(self, config: Mapping[str, Any], *, rank: int, nnodes: int, head: Node,
             node: Node) -> list[str]:
        par, srv, spec = config["parallel"], config["serving"], config["speculative"]
        argv = [node.python, "-m", "sglang.launch_server",
                "--model-path", config["model"]["path"],
                "--served-model-name", config["model"]["id"],
                "--tp-size", str(par["tp"]), "--pp-size", str(par["pp"])]
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
        for name in ("moe_backend", "linear_backend"):
            if srv[name] != "auto":
                argv += [FIELD_FLAGS[f"serving.{name}"], srv[name]]
        if spec is not None:
            k = spec["num_speculative_tokens"]
            argv += ["--speculative-algorithm", ALGORITHM_OF[spec["method"]]]
            if spec["method"] == "eagle3":
                argv += ["--speculative-draft-model-path", spec["draft_model"]]
            if spec["method"] in ("eagle3", "mtp"):
                argv += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1"]
            argv += ["--speculative-num-draft-tokens", str(k + 1)]
        return argv + list(config["extra_args"])

    def _speculative(self, parser: ReleaseParser, v: Mapping[str, Any]) -> dict[str, Any] | None:
        def dest(flag: str) -> str:
            option = parser.option(flag)
            return option.dest if option is not None else flag

        def error(flag: str, problem: str) -> Exception:
            return parser.error(flag, f"argument {flag}: {problem}")

        algorithm = v.get(dest("--speculative-algorithm"))
        given = [f for f in SPEC_FLAGS if dest(f) in v]
        if algorithm is None:
            if given:
                raise error(given[0], "needs --speculative-algorithm")
            return None
        name = str(algorithm).upper()
        if name not in ALGORITHMS:
            raise error("--speculative-algorithm", f"{algorithm!r} is not modelled; use one of "
                                                   f"{', '.join(ALGORITHMS)}")
        method = ALGORITHMS[name]
        steps = v.get(dest("--speculative-num-steps"))
        tokens = v.get(dest("--speculative-num-draft-tokens"))
        topk = v.get(dest("--speculative-eagle-topk"))
        draft = v.get(dest("--speculative-draft-model-path"))
        spec: dict[str, Any] = {"method": method}
        if method == "ngram":
            for flag, value in (("--speculative-num-steps", steps),
                                ("--speculative-eagle-topk", topk),
                                ("--speculative-draft-model-path", draft)):
                if value is not None:
                    raise error(flag, "does not apply to NGRAM")
            if tokens is None:
                raise error("--speculative-num-draft-tokens",
                            "is required with --speculative-algorithm NGRAM")
            if tokens < 2:
                raise error("--speculative-num-draft-tokens",
                            f"{tokens} is too few; it counts the verified token plus k >= 1 drafts")
            spec["num_speculative_tokens"] = tokens - 1
            return spec
        if (topk if topk is not None else 1) != 1:
            raise error("--speculative-eagle-topk", f"only 1 (chain drafting) is modelled, got {topk}")
        if steps is not None:
            k = steps
        elif tokens is not None:
            k = tokens - 1
        else:
            raise error("--speculative-num-steps", f"is required with --speculative-algorithm {name}")
        if tokens is not None and tokens != k + 1:
            raise error("--speculative-num-draft-tokens",
                        f"{tokens} does not match --speculative-num-steps {k} with top-k 1; use {k + 1}")
        spec["num_speculative_tokens"] = k
        if method == "eagle3" and draft is None:
            raise error("--speculative-draft-model-path",
                        "is required with --speculative-algorithm EAGLE3")
        if draft is not None:
            spec["draft_model"] = draft
        return spec

    def read_args(self, args: Sequence[str], version: str) -> tuple[dict[str, Any], LaunchInfo]:
        parser = self.parser(version)
        parsed = parser.parse(args)
        spec_dests = {o.dest for o in (parser.option(f) for f in
                                       ("--speculative-algorithm", *SPEC_FLAGS)) if o is not None}
        modelled = self.modelled_dests(parser)
        launch = self.launch_dests(parser)
        v: dict[str, Any] = {}
        passthrough: list[str] = []
        for given in parsed.given:
            d = given.option.dest
            if d in modelled or d in launch or d in spec_dests:
                v[d] = given.value
            else:
                passthrough.extend(given.tokens)

        def get(flag: str, default: Any = None) -> Any:
            option = parser.option(flag)
            return v.get(option.dest, default) if option is not None else default

        model = get("--model-path")
        tp = get("--tp-size", 1)
        ep_size = get("--ep-size")
        if ep_size is None or ep_size in (1, tp):
            expert_parallel = ep_size == tp and ep_size is not None
        else:
            raise parser.error("--ep-size", f"argument --ep-size: {ep_size} with --tp-size {tp} "
                                            f"is not modelled; use {tp} (or 1 for none)")
        serving: dict[str, Any] = {}
        for flag_field, flag in FIELD_FLAGS.items():
            if flag_field.startswith("serving.") and get(flag) is not None:
                serving[flag_field.split(".", 1)[1]] = get(flag)
        if "kv_cache_dtype" in serving:
            kv = serving["kv_cache_dtype"]
            if kv not in KV_FROM_FLAG:
                raise parser.error("--kv-cache-dtype", f"argument --kv-cache-dtype: {kv!r} is "
                                   f"not modelled; use one of {', '.join(KV_FROM_FLAG)}")
            serving["kv_cache_dtype"] = KV_FROM_FLAG[kv]
        raw: dict[str, Any] = {
            "engine": {"name": self.name, "version": parser.version},
            "model": {"path": model, "id": get("--served-model-name") or model},
            "parallel": {"tp": tp, "pp": get("--pp-size", 1), "expert_parallel": expert_parallel},
            "serving": serving,
            "speculative": self._speculative(parser, v),
            "extra_args": passthrough,
        }
        master_addr: str | None = None
        master_port: int | None = None
        if (dist := get("--dist-init-addr")) is not None:
            host, sep, port = dist.rpartition(":")
            if not sep or not port.isdigit():
                raise parser.error("--dist-init-addr", f"argument --dist-init-addr: {dist!r} is "
                                                       "not HOST:PORT")
            master_addr, master_port = host.strip("[]"), int(port)
        node_rank = get("--node-rank", 0)
        info = LaunchInfo(node_rank=node_rank, nnodes=get("--nnodes", 1), headless=node_rank > 0,
                          host=get("--host", "127.0.0.1"), port=get("--port", 30000),
                          master_addr=master_addr, master_port=master_port)
        return raw, info
