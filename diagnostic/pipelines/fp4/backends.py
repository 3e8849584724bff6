"""Which FP4 backend an engine runs, which ones it accepts, and how a choice is expressed.

The backend a run used is read from the engine's own log (`fp4_backend` events of
lab.engines.parse_log), never from the configuration. The backends an engine accepts
are learned from the engine: started with a backend name no engine has, it refuses and
lists the ones it supports, in its own words (the simulated engine's "Unknown NVFP4
backend 'x'; supported: a, b", vLLM's environment check "Invalid value 'x' for
VLLM_NVFP4_GEMM_BACKEND. Valid options: [...]", argparse's "invalid choice: 'x' (choose
from ...)"). That parser lives here rather than in lab/engines because it reads one
refusal, not a log stream. A chosen backend goes into the configuration the way the
customer's engine takes it: the `serving.moe_backend` / `serving.linear_backend` fields
(--moe-backend / --linear-backend, SGLang --moe-runner-backend / --fp4-gemm-backend),
removing any environment variable that pinned a backend.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

from lab.config import LINEAR_BACKENDS, MOE_BACKENDS
from lab.engines import parse_log

# No engine has a backend by this name: asking for it makes the engine list its own.
UNKNOWN_BACKEND = "diag_probe_no_such_backend"
DISCOVERY_ENV = "VLLM_NVFP4_GEMM_BACKEND"
# Environment variables through which a customer can pin an FP4 backend (LAB_MODEL.md 6).
PIN_ENV = ("VLLM_NVFP4_GEMM_BACKEND", "VLLM_USE_FLASHINFER_MOE_FP4")
FIELD_OF_LAYER = {"moe": "moe_backend", "linear": "linear_backend"}
# Lines with which an engine's log begins a start (vLLM's API server, SGLang's arguments).
_START_MARKERS = ("vLLM API server version", "server_args=ServerArgs(", "Launching vLLM")

_SUPPORTED = (
    re.compile(r"Unknown NVFP4 backend '[^']*'; supported: (?P<list>[\w ,.-]+)"),
    re.compile(r"Invalid value '[^']*' for VLLM_NVFP4_GEMM_BACKEND\. Valid options: \[(?P<list>[^\]]*)\]"),
    re.compile(r"invalid choice: '[^']*' \(choose from (?P<list>[^)]*)\)"),
)


def supported_from_error(text: str) -> list[str] | None:
    """The backend names an engine's refusal lists, in its order, or None when the text
    holds no such list."""
    for regex in _SUPPORTED:
        matches = list(regex.finditer(text))
        if matches:
            names = [n.strip().strip("'\"").lower() for n in matches[-1]["list"].split(",")]
            return list(dict.fromkeys(n for n in names if n and n != UNKNOWN_BACKEND))
    return None


def current_run(lines: list[str]) -> list[str]:
    """The lines of the log's last engine start (the log appends across starts)."""
    for i in range(len(lines) - 1, -1, -1):
        if any(marker in lines[i] for marker in _START_MARKERS):
            return lines[i:]
    return lines


def backend_events(engine: str, lines: Iterable[str]) -> list[dict[str, Any]]:
    """`fp4_backend` events, one per layer (the last the log gives for each)."""
    by_layer: dict[str, dict[str, Any]] = {}
    for event in parse_log(engine, lines):
        if event.get("kind") == "fp4_backend":
            by_layer[str(event.get("layer") or "moe")] = {
                "backend": event["backend"],
                "layer": event.get("layer") or "moe",
                "line": event.get("line"),
            }
    return list(by_layer.values())


def discovery_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration with every backend choice left to the environment variable, set
    to a name no engine has."""
    out = copy.deepcopy(dict(config))
    serving = dict(out.get("serving") or {})
    serving["moe_backend"] = "auto"
    serving["linear_backend"] = "auto"
    out["serving"] = serving
    env = {k: v for k, v in (out.get("env") or {}).items() if k not in PIN_ENV}
    env[DISCOVERY_ENV] = UNKNOWN_BACKEND
    out["env"] = env
    return out


def expressible(engine: str, layer: str, backend: str) -> bool:
    accepted = (MOE_BACKENDS if layer == "moe" else LINEAR_BACKENDS).get(engine, ())
    return backend in accepted and backend != "auto"


def declared_backends(engine: str, layers: Iterable[str]) -> list[str]:
    """The backend names the engine's flags accept for these layers (its argparse choices),
    for when the engine would not list them itself."""
    out: list[str] = []
    for layer in layers:
        table = MOE_BACKENDS if layer == "moe" else LINEAR_BACKENDS
        out.extend(b for b in table.get(engine, ()) if b != "auto")
    return list(dict.fromkeys(out))


def backend_changes(config: Mapping[str, Any], backend: str, layers: Iterable[str]) -> list[dict[str, Any]]:
    """The (path, from, to) triples that make the engine use `backend` for `layers`: the
    engine's flag for each layer, and every environment pin removed."""
    serving = config.get("serving") or {}
    env = config.get("env") or {}
    out = []
    for layer in layers:
        field = FIELD_OF_LAYER[layer]
        if serving.get(field) != backend:
            out.append({"path": f"serving.{field}", "from": serving.get(field), "to": backend})
    for name in PIN_ENV:
        if name in env:
            out.append({"path": f"env.{name}", "from": env[name], "to": None})
    return out


def flags_for(engine: str, config_changes: Iterable[Mapping[str, Any]]) -> list[str]:
    """The command-line flags the changes render as."""
    names = {
        "vllm": {"moe_backend": "--moe-backend", "linear_backend": "--linear-backend"},
        "sglang": {"moe_backend": "--moe-runner-backend", "linear_backend": "--fp4-gemm-backend"},
    }
    out: list[str] = []
    for c in config_changes:
        path = str(c["path"])
        if path.startswith("serving.") and c.get("to") not in (None, "auto"):
            flag = names.get(engine, {}).get(path.split(".", 1)[1])
            if flag:
                out += [flag, str(c["to"])]
    return out
