"""Scenario files (`labsim.scenario/1`): what a simulated lab is made of, and its truth.

A scenario names the cluster (how many GB10 nodes, their hardware and network), the model
profile, the engine, and a `truth:` section that only the simulator reads: load rates and
durations, FP4 kernel dispatch, decode physics, speculative acceptance, how the server
counts tokens, and injected faults. LAB_MODEL.md sections 1-6 give every default and
section 8 the format; lab/scenarios/README.md documents the additions (`serving:`).

`load_scenario(path)` validates and fills every default, so the rest of the simulator
reads plain dicts without `.get(..., default)`. Any unknown or ill-typed field raises
`ScenarioError` naming the dotted field, the value and what would be accepted.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lab.engines.tables import modelled_versions

SCHEMA = "labsim.scenario/1"

# LAB_MODEL.md section 1, per node.
NODE_DEFAULTS: dict[str, Any] = {
    "mem_gib": 121.7,
    "cuda_free_gib": 102.0,
    "mem_bw_gbs": 273.0,
    "mem_bw_efficiency": 0.75,
    "cpu_cores": 20,
    "nvme_read_gbs": 6.0,
    "compute_capability": "12.1",
    "nics": {"mgmt": "enP7s7", "mgmt_gbps": 10.0, "data": ["enp1s0f0np0", "enP2p1s0f0np0"]},
    # Who the node's agent starts engines as (its node config); "root" is refused there.
    "engine_user": "diag",
    # The filesystem serving the model folder (the agent reads it from /proc/mounts): on
    # nfs, nfs4 or lustre vLLM's unset load strategy prefetches a checkpoint that fits.
    "model_fs": "ext4",
    # The fastsafetensors package's version on the node ("" when it is not installed):
    # SGLang does not depend on it and needs it for --load-format fastsafetensors.
    "fastsafetensors": "0.5.0",
}

NETWORK_DEFAULTS: dict[str, Any] = {
    "link_gbps": 100.0,
    "collective_latency_us": 120.0,
    "hop_latency_us": 30.0,
}

# LAB_MODEL.md section 2. kv_bytes_per_token is kept per KV cache dtype.
MODEL_PROFILES: dict[str, dict[str, Any]] = {
    "kimi-k2": {
        "name": "kimi-k2",
        "total_params_b": 1026.0,
        "active_params_b": 32.6,
        "layers": 61,
        "experts": 384,
        "experts_per_token": 8,
        "shared_experts": 1,
        "hidden": 7168,
        "vocab": 163840,
        "max_context": 262144,
        "kv_bytes_per_token": {"fp8": 35136, "bf16": 70272},
        "checkpoint_gb": 597.0,
        "decode_bytes_per_token_gb": 32.0,
        "mtp_heads": 0,
        # Where the lab holds it (LAB_MODEL.md sections 9 and 10): its hub id, its path in
        # the lab's models directory, whether it ships its own code (Kimi K2's tokenizer is
        # Moonshot's tiktoken wrapper), and the drafts the lab holds beside it.
        "id": "moonshotai/Kimi-K2-Instruct-0905",
        "path": "/models/kimi-k2",
        "remote_code": True,
        # The EAGLE-3 head is a config and weights the lab has read (no code of its own): it
        # loads under the model's --trust-remote-code.
        "drafts": [{"id": "AQ-MedAI/Kimi-K2-Instruct-eagle3", "path": "/models/kimi-k2-eagle3",
                    "method": "eagle3", "remote_code": True}],
    },
}
DRAFT_FIELDS = ("id", "path", "method")
# remote_code (optional, false when absent): the lab has reviewed the draft's own code.
DRAFT_OPTIONAL = ("remote_code",)

ENGINE_NAMES = ("vllm", "sglang")
# The modelled releases (lab/engines/releases); a scenario naming no version runs these.
ENGINE_DEFAULT_VERSIONS = {"vllm": "0.34.0", "sglang": "0.5.23"}

LOAD_DEFAULTS: dict[str, Any] = {
    "proc_start_s": 20.0,
    "mmap_read_gbs": 0.33,
    "nvme_read_gbs": None,  # filled from cluster.node.nvme_read_gbs
    "page_cache_gbs": 20.0,
    "rendezvous_s": 8.0,
    "jit_cold_s": 150.0,
    "jit_warm_s": 10.0,
    "kv_alloc_s": 15.0,
    "graph_capture_s": 75.0,
    "api_ready_s": 5.0,
    # `needs` None: derived from the node's own NIC names (rendezvous_needs).
    "rendezvous": {"needs": None, "stall_s": 60.0},
}

FP4_DEFAULTS: dict[str, Any] = {
    "default_backend": "flashinfer_cutlass",
    "broken": [],
    "degraded": [],
    "error_rate": 0.25,
    # Native FP4 backends run at 1.0 (a backend given no factor runs at 1.0 too), the
    # weight-only Marlin kernel slower.
    "speed": {"flashinfer_cutlass": 1.0, "cutlass": 1.0, "flashinfer_b12x": 1.0, "b12x": 1.0,
              "marlin": 1.15},
    # Backends the engine accepts but that cannot run NVFP4 on sm_121: the process ends at
    # model init with the engine's error (LAB_MODEL.md section 6).
    "unsupported": ["flashinfer_trtllm", "flashinfer_cutedsl", "triton", "deep_gemm"],
}

DECODE_DEFAULTS: dict[str, Any] = {
    "ep_imbalance": 2.0,
    "collectives_per_layer": 2,
    "step_overhead_ms": 8.0,
    "eager_penalty_ms": 12.0,
    "verify_growth": 0.2,
    "run_sigma": 0.03,
    "step_sigma": 0.05,
    "prefill_tps": 900.0,
}

SPECDEC_DEFAULTS: dict[str, Any] = {
    "draft_ms": {"eagle3": 2.5, "ngram": 0.3},
    "acceptance": {
        "eagle3": {"code": [0.86, 0.76, 0.66, 0.45, 0.34, 0.26, 0.2],
                   "prose": [0.75, 0.55, 0.40, 0.28, 0.2, 0.15, 0.1]},
        "ngram": {"code": [0.5, 0.35, 0.25, 0.18], "prose": [0.2, 0.1, 0.05, 0.03]},
    },
}

SERVER_COUNTS = ("emitted", "proposed", "emitted_busy")
WORKLOADS = ("code", "prose")

# An addition to LAB_MODEL.md section 8 (documented in lab/scenarios/README.md).
SERVING_DEFAULTS: dict[str, Any] = {"abort_on_disconnect": True, "log_interval_s": 10.0}

FAULT_KINDS = ("node_down", "engine_crash_after_s", "nic_degraded_gbps", "kv_budget", "clock_offset_s",
               "sampler_dies_after_s", "silent_hang_s")
# Faults that apply to every node unless they name one.
PER_NODE_FAULTS = ("nic_degraded_gbps", "clock_offset_s", "sampler_dies_after_s")

TOP_FIELDS = ("schema", "name", "seed", "dilation", "cluster", "model", "engine", "truth", "serving")
CLUSTER_FIELDS = ("nodes", "node", "network")
TRUTH_FIELDS = ("load", "fp4", "decode", "specdec", "server_counts", "faults")

# Numbers that must be strictly positive (rates, sizes); every other number must be >= 0.
_POSITIVE = {
    "mem_gib", "cuda_free_gib", "mem_bw_gbs", "mem_bw_efficiency", "cpu_cores", "nvme_read_gbs",
    "mgmt_gbps", "link_gbps", "total_params_b", "active_params_b", "layers", "experts",
    "experts_per_token", "hidden", "vocab", "max_context", "checkpoint_gb",
    "decode_bytes_per_token_gb", "mmap_read_gbs", "page_cache_gbs", "ep_imbalance", "prefill_tps",
    "log_interval_s", "fp8", "bf16",
}
# Fractions in [0, 1].
_FRACTION = {"mem_bw_efficiency", "error_rate"}


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names the field, value and what is accepted."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    dilation: float
    nodes: int
    node: dict[str, Any]
    network: dict[str, Any]
    model: dict[str, Any]
    engine: dict[str, Any]
    truth: dict[str, Any]
    serving: dict[str, Any]

    @property
    def node_names(self) -> list[str]:
        """spark-01, spark-02, ... in rank order; spark-01 is the head."""
        return [node_name(i) for i in range(self.nodes)]

    def faults(self, kind: str) -> list[dict[str, Any]]:
        """The injected faults of one kind, in file order."""
        return [f for f in self.truth["faults"] if kind in f]


def node_name(index: int) -> str:
    return f"spark-{index + 1:02d}"


# rdma-core names a RoCE device after its net device's predictable name: the `en` prefix
# and the `np<N>` port suffix dropped, `roce` in front (enp1s0f0np0 -> rocep1s0f0).
_PREDICTABLE_NET_NAME = re.compile(r"^en(?P<path>.+?)(?:np\d+)?$")


def rdma_device_names(net_devices: list[str]) -> list[str]:
    """The RDMA device of each data NIC, in the same order. A net device without a
    predictable name keeps the driver's own name (mlx5_0, mlx5_1, ...), as rdma-core does."""
    names = []
    for i, dev in enumerate(net_devices):
        m = _PREDICTABLE_NET_NAME.match(dev)
        names.append(f"roce{m.group('path')}" if m else f"mlx5_{i}")
    return names


def rendezvous_needs(nics: Mapping[str, Any]) -> dict[str, str]:
    """What NCCL needs unless a scenario says otherwise (LAB_MODEL.md section 1): its
    bootstrap socket on the management NIC, and the data NICs' RDMA devices."""
    return {"NCCL_SOCKET_IFNAME": str(nics["mgmt"]),
            "NCCL_IB_HCA": ",".join(rdma_device_names(list(nics["data"])))}


# -- field checks -----------------------------------------------------------------------


def _fail(field: str, value: Any, accepted: str) -> ScenarioError:
    return ScenarioError(field, f"got {value!r}; accepted: {accepted}")


def _unknown(field: str, accepted: Any) -> ScenarioError:
    return ScenarioError(field, f"unknown field; accepted: {', '.join(sorted(accepted))}")


def _key(path: str) -> str:
    return path.rsplit(".", 1)[-1].split("[", 1)[0]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: Any, path: str, *, integer: bool = False) -> float | int:
    key = _key(path)
    if integer:
        if not (isinstance(value, int) and not isinstance(value, bool)):
            raise _fail(path, value, "an integer")
    elif not _is_number(value):
        raise _fail(path, value, "a number")
    if key in _FRACTION and not 0 <= value <= 1:
        raise _fail(path, value, "a number from 0 to 1")
    if key in _POSITIVE and value <= 0:
        raise _fail(path, value, "a number > 0")
    if value < 0:
        raise _fail(path, value, "a number >= 0")
    return int(value) if integer else float(value)


def _string(value: Any, path: str, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(path, value, "one of " + ", ".join(choices) if choices else "a non-empty string")
    if choices and value not in choices:
        raise _fail(path, value, "one of " + ", ".join(choices))
    return value


def _mapping(value: Any, path: str, what: str = "a mapping") -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise _fail(path, value, what)
    return value


def _string_list(value: Any, path: str) -> list[str]:
    if not isinstance(value, list):
        raise _fail(path, value, "a list of names")
    return [_string(v, f"{path}[{i}]") for i, v in enumerate(value)]


Handler = Callable[[Any, Any, str], Any]


def _version_or_absent(_default: Any, value: Any, path: str) -> str:
    """A package version, or "" for a package the node does not have."""
    if value == "":
        return ""
    return _string(value, path)


def _merge(defaults: Mapping[str, Any], given: Any, path: str,
           special: Mapping[str, Handler] | None = None) -> dict[str, Any]:
    """Defaults overlaid with `given`, each value checked against its default's type."""
    out = copy.deepcopy(dict(defaults))
    if given is None:
        return out
    given = _mapping(given, path, "a mapping with fields " + ", ".join(sorted(defaults)))
    special = special or {}
    for key, value in given.items():
        field = f"{path}.{key}" if path else str(key)
        if key not in defaults:
            raise _unknown(field, defaults)
        if key in special:
            out[key] = special[key](defaults[key], value, field)
        else:
            out[key] = _like(defaults[key], value, field)
    return out


def _like(default: Any, value: Any, path: str) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise _fail(path, value, "true or false")
        return value
    if isinstance(default, int):
        return _number(value, path, integer=True)
    if isinstance(default, float) or default is None:
        return _number(value, path)
    if isinstance(default, str):
        return _string(value, path)
    if isinstance(default, list):
        return _string_list(value, path)
    if isinstance(default, dict):
        return _merge(default, value, path)
    raise AssertionError(f"no type rule for {path}")


def _number_table(default: Any, value: Any, path: str) -> dict[str, float]:
    """A table of name -> number (speeds, draft costs); given entries add to the defaults."""
    table = _mapping(value, path, "a mapping of name: number")
    out = dict(default)
    for name, number in table.items():
        out[_string(name, path)] = _number(number, f"{path}.{name}")
        if path.endswith("speed") and out[name] <= 0:
            raise _fail(f"{path}.{name}", number, "a speed factor > 0")
    return out


def _needs(default: Any, value: Any, path: str) -> dict[str, str]:
    """The environment the rendezvous needs; a given mapping replaces the default whole."""
    table = _mapping(value, path, "a mapping of VARIABLE: value")
    out: dict[str, str] = {}
    for name, v in table.items():
        if not isinstance(v, str | int) or isinstance(v, bool):
            raise _fail(f"{path}.{name}", v, "a string")
        out[_string(name, path)] = str(v)
    return out


def _acceptance_list(value: Any, path: str) -> list[float]:
    if not isinstance(value, list):
        raise _fail(path, value, "a list of per-position acceptance rates from 0 to 1")
    out = []
    for i, v in enumerate(value):
        if not _is_number(v) or not 0 <= v <= 1:
            raise _fail(f"{path}[{i}]", v, "a number from 0 to 1")
        out.append(float(v))
    return out


def _acceptance(default: Any, value: Any, path: str) -> dict[str, dict[str, list[float]]]:
    table = _mapping(value, path, "a mapping of method: {code: [...], prose: [...]}")
    out = copy.deepcopy(default)
    for method, per_workload in table.items():
        mpath = f"{path}.{method}"
        entry = _mapping(per_workload, mpath, "a mapping with fields code, prose")
        merged = dict(out.get(method, {"code": [], "prose": []}))
        for workload, rates in entry.items():
            if workload not in WORKLOADS:
                raise _unknown(f"{mpath}.{workload}", WORKLOADS)
            merged[workload] = _acceptance_list(rates, f"{mpath}.{workload}")
        out[_string(method, path)] = merged
    return out


def _kv_bytes(default: Any, value: Any, path: str) -> dict[str, int]:
    """A number means bytes per token at fp8 (bf16 twice that), or a mapping {fp8, bf16}."""
    if _is_number(value):
        fp8 = int(_number(value, f"{path}.fp8"))
        return {"fp8": fp8, "bf16": 2 * fp8}
    return {k: int(v) for k, v in _merge(default, value, path).items()}


def _nics(default: Any, value: Any, path: str) -> dict[str, Any]:
    out = _merge(default, value, path)
    if not out["data"]:
        raise _fail(f"{path}.data", out["data"], "a non-empty list of interface names")
    return out


def _drafts(default: Any, value: Any, path: str) -> list[dict[str, Any]]:
    """The drafts the lab holds beside the model: [{id, path, method}]; a given list
    replaces the profile's whole."""
    if not isinstance(value, list):
        raise _fail(path, value, "a list of {id, path, method}")
    out = []
    for i, item in enumerate(value):
        dpath = f"{path}[{i}]"
        entry = _mapping(item, dpath, "a mapping with fields " + ", ".join(DRAFT_FIELDS))
        for key in entry:
            if key not in DRAFT_FIELDS + DRAFT_OPTIONAL:
                raise _unknown(f"{dpath}.{key}", DRAFT_FIELDS + DRAFT_OPTIONAL)
        for key in DRAFT_FIELDS:
            if key not in entry:
                raise ScenarioError(f"{dpath}.{key}", "is required")
        draft: dict[str, Any] = {key: _string(entry[key], f"{dpath}.{key}") for key in DRAFT_FIELDS}
        reviewed = entry.get("remote_code", False)
        if not isinstance(reviewed, bool):
            raise _fail(f"{dpath}.remote_code", reviewed, "true or false")
        draft["remote_code"] = reviewed
        if not draft["path"].startswith("/"):
            raise _fail(f"{dpath}.path", draft["path"], "an absolute path in the lab's models directory")
        out.append(draft)
    return out


def _model(value: Any, path: str) -> dict[str, Any]:
    if value is None:
        return copy.deepcopy(MODEL_PROFILES["kimi-k2"])
    if isinstance(value, str):
        if value not in MODEL_PROFILES:
            raise _fail(path, value, "a built-in profile (" + ", ".join(MODEL_PROFILES)
                        + ") or a mapping of the model fields")
        return copy.deepcopy(MODEL_PROFILES[value])
    table = _mapping(value, path, "a built-in profile name or a mapping of the model fields")
    base = MODEL_PROFILES["kimi-k2"]
    if "name" in table and table["name"] in MODEL_PROFILES:
        base = MODEL_PROFILES[table["name"]]
    model = _merge(base, table, path, {"kv_bytes_per_token": _kv_bytes, "drafts": _drafts})
    if not model["path"].startswith("/"):
        raise _fail(f"{path}.path", model["path"], "an absolute path in the lab's models directory")
    if model["experts_per_token"] > model["experts"]:
        raise _fail(f"{path}.experts_per_token", model["experts_per_token"],
                    f"at most experts ({model['experts']})")
    return model


def _engine(value: Any, path: str) -> dict[str, Any]:
    table = {} if value is None else _mapping(value, path, "a mapping with fields name, version")
    for key in table:
        if key not in ("name", "version"):
            raise _unknown(f"{path}.{key}", ("name", "version"))
    name = _string(table.get("name", "vllm"), f"{path}.name", ENGINE_NAMES)
    version = table.get("version", ENGINE_DEFAULT_VERSIONS[name])
    modelled = modelled_versions(name)
    if isinstance(version, int | float) and not isinstance(version, bool):
        raise _fail(f"{path}.version", version,
                    f'a version string in quotes, e.g. "{ENGINE_DEFAULT_VERSIONS[name]}"')
    # The node's installed version is the scenario's: only a modelled release has the
    # flags, lines and metrics the simulated engine speaks.
    return {"name": name, "version": _string(version, f"{path}.version", modelled)}


def _faults(value: Any, path: str, node_names: list[str]) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(path, value, "a list of faults, e.g. [{node_down: spark-05}]")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        fpath = f"{path}[{i}]"
        item = _mapping(item, fpath, "a mapping with one of " + ", ".join(FAULT_KINDS))
        kinds = [k for k in item if k in FAULT_KINDS]
        if len(kinds) != 1:
            raise _fail(fpath, item, "exactly one of " + ", ".join(FAULT_KINDS))
        kind = kinds[0]
        allowed = {kind, "node"} if kind in PER_NODE_FAULTS else {kind}
        for key in item:
            if key not in allowed:
                raise _unknown(f"{fpath}.{key}", allowed)
        raw = item[kind]
        kpath = f"{fpath}.{kind}"
        fault: dict[str, Any]
        if kind == "node_down":
            fault = {kind: _string(raw, kpath, tuple(node_names))}
        elif kind == "engine_crash_after_s":
            fault = {kind: _number(raw, kpath)}
        elif kind == "nic_degraded_gbps":
            gbps = _number(raw, kpath)
            if gbps <= 0:
                raise _fail(kpath, raw, "a link speed in Gbps > 0")
            fault = {kind: gbps}
        elif kind in ("sampler_dies_after_s", "silent_hang_s"):
            seconds = _number(raw, kpath)
            if seconds <= 0:
                raise _fail(kpath, raw, "lab seconds > 0")
            fault = {kind: seconds}
        elif kind == "clock_offset_s":
            # How far the node's clock is ahead of lab time (behind when negative).
            if not _is_number(raw):
                raise _fail(kpath, raw, "a number of lab seconds (negative: the clock is behind)")
            fault = {kind: float(raw)}
        elif kind == "kv_budget":
            # true: the KV cache gets KV_BUDGET_FRACTION of what the model's native context
            # needs; a number: that many GiB of KV cache per rank.
            if raw is not True and not (_is_number(raw) and raw > 0):
                raise _fail(kpath, raw, "true or GiB of KV cache per rank > 0")
            fault = {kind: True if raw is True else float(raw)}
        else:
            if raw is not True:
                raise _fail(kpath, raw, "true")
            fault = {kind: True}
        if kind in PER_NODE_FAULTS and "node" in item:
            fault["node"] = _string(item["node"], f"{fpath}.node", tuple(node_names))
        out.append(fault)
    return out


def _truth(value: Any, node: dict[str, Any], node_names: list[str]) -> dict[str, Any]:
    table = {} if value is None else _mapping(value, "truth", "a mapping")
    for key in table:
        if key not in TRUTH_FIELDS:
            raise _unknown(f"truth.{key}", TRUTH_FIELDS)
    load = _merge(LOAD_DEFAULTS, table.get("load"), "truth.load", {
        "rendezvous": lambda d, v, p: _merge(d, v, p, {"needs": _needs}),
    })
    if load["nvme_read_gbs"] is None:
        load["nvme_read_gbs"] = node["nvme_read_gbs"]
    if load["rendezvous"]["needs"] is None:
        load["rendezvous"]["needs"] = rendezvous_needs(node["nics"])
    fp4 = _merge(FP4_DEFAULTS, table.get("fp4"), "truth.fp4", {"speed": _number_table})
    known = tuple(fp4["speed"])
    _string(fp4["default_backend"], "truth.fp4.default_backend", known)
    if fp4["default_backend"] in fp4["unsupported"]:
        raise _fail("truth.fp4.default_backend", fp4["default_backend"],
                    "a backend not in truth.fp4.unsupported (the default rule picks one that runs)")
    for listed in ("broken", "degraded"):
        for i, name in enumerate(fp4[listed]):
            _string(name, f"truth.fp4.{listed}[{i}]", known)
    decode = _merge(DECODE_DEFAULTS, table.get("decode"), "truth.decode")
    specdec = _merge(SPECDEC_DEFAULTS, table.get("specdec"), "truth.specdec",
                     {"draft_ms": _number_table, "acceptance": _acceptance})
    server_counts = _string(table.get("server_counts", "emitted"), "truth.server_counts",
                            SERVER_COUNTS)
    if server_counts != "emitted":
        # The modelled releases count honestly: vLLM adds each step's new tokens
        # (len(new_token_ids): the accepted drafts and the bonus token, v1/metrics/stats.py)
        # over the interval's wall time; SGLang counts accepted drafts plus one per step
        # (managers/utils.py). Every scenario runs a modelled release (LAB_MODEL.md section 4).
        raise _fail("truth.server_counts", server_counts,
                    "emitted: the modelled releases count the tokens each step emits over the "
                    "interval's wall time; proposed and emitted_busy describe foreign endpoints, "
                    "which no scenario serves")
    faults = _faults(table.get("faults"), "truth.faults", node_names)
    return {"load": load, "fp4": fp4, "decode": decode, "specdec": specdec,
            "server_counts": server_counts, "faults": faults}


def parse_scenario(data: Any) -> Scenario:
    """Validate a decoded scenario mapping and fill every default."""
    data = _mapping(data, "scenario", "a YAML mapping")
    for key in data:
        if key not in TOP_FIELDS:
            raise _unknown(str(key), TOP_FIELDS)
    if data.get("schema") != SCHEMA:
        raise _fail("schema", data.get("schema"), repr(SCHEMA))
    name = _string(data.get("name", "labsim"), "name")
    seed = int(_number(data.get("seed", 0), "seed", integer=True))
    dilation = float(_number(data.get("dilation", 1.0), "dilation"))
    if dilation <= 0:
        raise _fail("dilation", data["dilation"], "lab seconds per wall second, a number > 0")
    cluster = {} if data.get("cluster") is None else _mapping(data["cluster"], "cluster")
    for key in cluster:
        if key not in CLUSTER_FIELDS:
            raise _unknown(f"cluster.{key}", CLUSTER_FIELDS)
    nodes = int(_number(cluster.get("nodes", 8), "cluster.nodes", integer=True))
    if not 1 <= nodes <= 99:
        raise _fail("cluster.nodes", nodes, "an integer from 1 to 99")
    node = _merge(NODE_DEFAULTS, cluster.get("node"), "cluster.node",
                  {"nics": _nics, "fastsafetensors": _version_or_absent})
    network = _merge(NETWORK_DEFAULTS, cluster.get("network"), "cluster.network")
    names = [node_name(i) for i in range(nodes)]
    return Scenario(
        name=name,
        seed=seed,
        dilation=dilation,
        nodes=nodes,
        node=node,
        network=network,
        model=_model(data.get("model"), "model"),
        engine=_engine(data.get("engine"), "engine"),
        truth=_truth(data.get("truth"), node, names),
        serving=_merge(SERVING_DEFAULTS, data.get("serving"), "serving"),
    )


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ScenarioError("scenario", f"cannot read {p} ({exc.strerror})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError("scenario", f"{p} is not valid YAML ({exc})") from exc
    try:
        return parse_scenario(data)
    except ScenarioError as exc:
        raise ScenarioError(exc.field, f"{exc.problem} (in {p})") from exc
