"""Which FP4 backend an engine runs, which ones it accepts, and how a choice is expressed.

The backend a run used is read from the engine's own log (`fp4_backend` events of
lab.engines.parse_log) where the version logs it (vLLM: its MoE line, quoted in 0.29 and
unquoted in 0.34, and its linear kernel's class name); where it does not (SGLang on GB10
logs no backend line) it follows from the flags and the version's default rule
(`dispatch.default_backend`), and the record says so. The backends an engine accepts are
learned from the engine itself, at no cold start: started with a name no version has for
its backend flag (vLLM `--moe-backend` / `--linear-backend`, SGLang `--moe-runner-backend`
/ `--fp4-gemm-backend` where the version has it), it stops at argument parsing within
seconds with argparse's `invalid choice: ... (choose from ...)` (Python 3.12 lists the
names bare, older releases quoted). A chosen backend goes into the configuration the way
the customer's engine takes it: the `serving.moe_backend` / `serving.linear_backend`
fields. Environment variables choose no backend in the modelled versions
(VLLM_NVFP4_GEMM_BACKEND, VLLM_USE_FLASHINFER_MOE_FP4, VLLM_FLASHINFER_MOE_BACKEND are
read by none: vLLM warns and ignores them); a customer's pin is noted and removed.

Between backends that are equally fast and correct, the stage prefers the one the version's
own default rule would consider first: vLLM's MoE line ends with the backends its rule
considered on the device, in its order (`out of potential backends: [...]`), which
`preference_order` reads; the dispatch table's capability order (taken from the same
rule's source) stands in where the log gives no list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lab.engines import BACKEND_FLAGS, field_flag, parse_log
from lab.engines.logs import normalize_backend
from lab.engines.tables import flag as table_flag
from lab.engines.tables import release

# No version has a backend by this name: asking for it makes argparse list the real ones.
UNKNOWN_BACKEND = "diag_probe_no_such_backend"
# Variables a customer may believe pin an FP4 backend; no modelled version reads them.
# Intake refuses them (lab/env_policy.yaml `superseded`: "vLLM 0.34.0 does not read
# VLLM_NVFP4_GEMM_BACKEND; the FP4 linear backend is chosen by --linear-backend"); the stage
# still notes and removes one that a configuration stored before that refusal carries.
PIN_ENV = ("VLLM_NVFP4_GEMM_BACKEND", "VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_FLASHINFER_MOE_BACKEND")
FIELD_OF_LAYER = {"moe": "moe_backend", "linear": "linear_backend"}
# The end of vLLM's MoE oracle line: the backends its default rule considered, in its order
# ("... out of potential backends: ['FLASHINFER_CUTLASS', 'VLLM_CUTLASS', ...]").
_POTENTIAL = re.compile(r"out of potential backends: \[(?P<list>[^\]]*)\]")

# argparse: "argument --moe-backend: invalid choice: 'x' (choose from a, b, c)" (3.12+)
# or "... (choose from 'a', 'b', 'c')" (before 3.12).
_INVALID_CHOICE = re.compile(r"argument (?P<flag>[-\w/ ,]+?): invalid choice: (?P<value>'[^']*'|\S+) "
                             r"\(choose from (?P<list>[^)]*)\)")


def supported_from_error(text: str, flag: str | None = None) -> list[str] | None:
    """The names argparse's `invalid choice` refusal lists (for `flag` when given), in its
    order, or None when the text holds no such refusal."""
    matches = [m for m in _INVALID_CHOICE.finditer(text)
               if flag is None or flag in [f.strip() for f in m["flag"].split("/")]]
    if not matches:
        return None
    names = [n.strip().strip("'\"") for n in matches[-1]["list"].split(",")]
    return list(dict.fromkeys(n for n in names if n and n != UNKNOWN_BACKEND))


def backend_flag(engine: str, version: str, layer: str) -> str | None:
    """The flag of `version` that chooses `layer`'s backend, None when it has none (SGLang
    releases without --fp4-gemm-backend)."""
    name = BACKEND_FLAGS.get(engine, {}).get(layer)
    if name is None:
        return None
    try:
        table = release(engine, version)
    except LookupError:
        return None
    return name if table_flag(table, name) is not None else None


def declared_choices(engine: str, version: str, layer: str) -> list[str]:
    """The choices the version's table records for `layer`'s flag (what argparse would
    list), without `auto`; empty when the version has no such flag."""
    name = backend_flag(engine, version, layer)
    if name is None:
        return []
    entry = table_flag(release(engine, version), name) or {}
    return [str(c) for c in entry.get("choices") or [] if c != "auto"]


def refusal_argv(argv: Sequence[str], flag: str) -> list[str]:
    """`argv` with `flag` set to a name no version has (any value it had replaced)."""
    out: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        if token == flag:
            skip = True
            continue
        if token.startswith(flag + "="):
            continue
        out.append(token)
    return [*out, flag, UNKNOWN_BACKEND]


def reads_env(engine: str, version: str, name: str) -> bool:
    """Whether the version reads the variable `name` (its table's registry or a direct read)."""
    try:
        env = release(engine, version).get("env") or {}
    except LookupError:
        return False
    return name in (env.get("registry") or ()) or name in (env.get("read_directly") or ())


def pinned_env(config: Mapping[str, Any]) -> dict[str, str]:
    """The customer's variables that would pin a backend in their picture of the engine and
    that the configuration's version does not read (none of the modelled versions reads
    any of them): they chose nothing, and vLLM warned about each."""
    env = config.get("env") or {}
    engine = str((config.get("engine") or {}).get("name") or "")
    version = str((config.get("engine") or {}).get("version") or "")
    return {k: str(v) for k, v in env.items()
            if k in PIN_ENV and not (engine and version and reads_env(engine, version, k))}


def unknown_env_warned(engine: str, lines: Iterable[str]) -> list[str]:
    """The variables the engine's log says it does not read (vLLM's `Unknown vLLM
    environment variable detected: NAME`)."""
    return list(dict.fromkeys(str(e["name"]) for e in parse_log(engine, lines)
                              if e.get("kind") == "unknown_env" and e.get("name")))


def preference_order(lines: Iterable[str]) -> list[str]:
    """The MoE backends the version's default rule considered on this device, first
    preferred first, as the engine's own MoE line lists them (vLLM); the last such line
    wins. Empty when no line lists them (SGLang on GB10; a run whose flag named one)."""
    order: list[str] = []
    for line in lines:
        if m := _POTENTIAL.search(line):
            order = [normalize_backend(n) for n in m["list"].split(",") if n.strip(" '\"")]
    return list(dict.fromkeys(order))


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


def expressible(engine: str, version: str, layer: str, backend: str) -> bool:
    """Whether the version's flag for `layer` takes `backend`."""
    return backend != "auto" and backend in declared_choices(engine, version, layer)


def backend_changes(config: Mapping[str, Any], backend: str, layers: Iterable[str]) -> list[dict[str, Any]]:
    """The (path, from, to) triples that make the engine use `backend` for `layers`: the
    engine's flag for each layer, and every variable the customer thought pinned a backend
    removed (no modelled version reads them)."""
    serving = config.get("serving") or {}
    env = config.get("env") or {}
    out = []
    for layer in layers:
        field = FIELD_OF_LAYER[layer]
        if serving.get(field) != backend:
            out.append({"path": f"serving.{field}", "from": serving.get(field), "to": backend})
    pinned = pinned_env(config)
    for name in PIN_ENV:
        if name in pinned:
            out.append({"path": f"env.{name}", "from": env[name], "to": None})
    return out


def flags_for(engine: str, config_changes: Iterable[Mapping[str, Any]]) -> list[str]:
    """The command-line flags the changes render as."""
    out: list[str] = []
    for c in config_changes:
        path = str(c["path"])
        if path in ("serving.moe_backend", "serving.linear_backend") and c.get("to") not in (None, "auto"):
            flag = field_flag(engine, path)
            if flag:
                out += [flag, str(c["to"])]
    return out
