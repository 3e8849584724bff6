"""vLLM and SGLang: configuration <-> launch commands, and engine log parsing.

`normalize_config` is the whole normalization of a customer configuration: lab.config's
field checks plus what needs the engines' flags (a `launch_command` read into fields,
the flags in `extra_args` checked); `load_config_text` does it for a YAML file.
`render` turns a normalized configuration into one `lab.launch/1` spec per node;
`parse_launch` reads such an argv back (the simulated engine uses it to learn what it
was started with, and fails like the real engine on a bad flag); `parse_command` reads
a command a customer pasted; `parse_log` turns engine log lines into events and
`failure_message` picks from them the engine's own words for why it stopped. Fields a
command line cannot carry are listed in `UNCARRIED`; `launch_view` drops them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from lab.catalog import load_catalog
from lab.config import (
    ConfigError,
    check_document,
    launch_command_text,
    normalize_fields,
    read_config_text,
    shown,
    with_command_fields,
)
from lab.engines.admission import admit
from lab.engines.base import (
    UNCARRIED,
    Engine,
    EngineArgError,
    LaunchInfo,
    ParsedLaunch,
    jit_cache_env,
    launch_spec,
    launch_view,
    nodes_used,
    split_launch_env,
)
from lab.engines.command import split_command
from lab.engines.logs import Event, failure_event, parse_lines
from lab.engines.sglang import Sglang
from lab.engines.vllm import Vllm
from lab.inventory import Node

__all__ = [
    "UNCARRIED",
    "EngineArgError",
    "ParsedLaunch",
    "check_extra_args",
    "failure_message",
    "launch_view",
    "load_config_text",
    "normalize_config",
    "parse_command",
    "parse_launch",
    "parse_log",
    "parse_log_file",
    "render",
]

ENGINES: dict[str, Engine] = {"vllm": Vllm(), "sglang": Sglang()}


def _engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"engine {name!r} is not known; use one of {', '.join(ENGINES)}") from None


def _detect(tokens: Sequence[str]) -> tuple[Engine, list[str]] | None:
    for engine in ENGINES.values():
        args = engine.invocation(tokens)
        if args is not None:
            return engine, args
    return None


def normalize_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """Validate `data` and return a new dict with every field of `diagnostic.config/1`.

    `launch_command` may stand for the model/parallel/serving/speculative/env/extra_args
    fields; it is parsed by the engine it starts, and `engine.version`, `cluster`,
    `workloads` and `reported` may sit beside it. `extra_args` may hold only the engine's
    known pass-through flags. Then the lab's admission (lab.engines.admission): the model,
    its draft and whatever a pass-through flag loads must be in the lab's catalog.
    Normalizing a normalized config returns it unchanged. Raises ConfigError naming the
    field.
    """
    return _normalize(data, admitting=True)


def _normalize(data: Mapping[str, Any], *, admitting: bool) -> dict[str, Any]:
    check_document(data)
    if "launch_command" in data:
        parsed = parse_command(launch_command_text(data))
        return _normalize(with_command_fields(data, parsed), admitting=admitting)
    config = normalize_fields(data)
    engine = _engine(config["engine"]["name"])
    engine.check_extra_args(config["extra_args"])
    if admitting:
        admit(config, engine, load_catalog())
    return config


def load_config_text(text: str, *, max_bytes: int = 65536) -> dict[str, Any]:
    """Parse a YAML configuration (at most `max_bytes` of UTF-8) and normalize it."""
    return normalize_config(read_config_text(text, max_bytes=max_bytes))


def render(config: Mapping[str, Any], nodes: Sequence[Node], *,
           model_dir: str | None = None) -> list[dict[str, Any]]:
    """One `lab.launch/1` spec per node used: the first tp × pp nodes, head first (rank 0).

    `config` is normalized and admitted first, so nothing the lab's catalog does not hold
    reaches a node. `model_dir`, when given, is where this lab keeps the admitted model's
    weights (the inventory's model_dir): the argv names it instead of model.path.
    """
    config = normalize_config(config)
    if model_dir is not None:
        config = {**config, "model": {**config["model"], "path": model_dir}}
    engine = _engine(config["engine"]["name"])
    used = nodes_used(config, nodes)
    head = used[0]
    specs = []
    for rank, node in enumerate(used):
        argv = engine.argv(config, rank=rank, nnodes=len(used), head=head, node=node)
        env = {**config["env"], **jit_cache_env(config["serving"]["jit_cache"], node)}
        specs.append(launch_spec(engine.name, node, rank, argv, env))
    return specs


def parse_launch(argv: Sequence[str], env: Mapping[str, str]) -> ParsedLaunch:
    """What an engine was launched with. `env` is the launch spec's env (not the whole
    process environment: every variable in it lands in config.env). Raises EngineArgError
    with the engine's own wording for anything the engine would refuse."""
    found = _detect(argv)
    if found is None:
        program = argv[0] if argv else ""
        raise EngineArgError(program, f"{program!r} does not launch vllm or sglang", program)
    engine, args = found
    raw, info = engine.read_args(args)
    raw["env"], raw["serving"]["jit_cache"] = split_launch_env(env)
    try:
        # An engine knows nothing of the lab's catalog: what it was started with is read
        # as the engine reads it, without the lab's admission.
        config = _normalize(raw, admitting=False)
    except ConfigError as exc:
        flag, problem = engine.value_problem(exc)
        raise engine.table.error(flag, f"argument {flag}: {problem}") from None
    where = {f.name: getattr(info, f.name) for f in fields(LaunchInfo)}
    return ParsedLaunch(config=config, engine=engine.name, **where)


def parse_command(text: str) -> dict[str, Any]:
    """A pasted `vllm serve ...` / `python3 -m sglang.launch_server ...` command (with
    NAME=value prefixes, continuations, quoting) -> a normalized configuration. Per-node
    flags (--nnodes, --node-rank, --master-addr, --headless, --host, --port) are read and
    ignored; the fields in UNCARRIED take their defaults. Raises ConfigError naming the
    token at fault."""
    env, tokens = split_command(text)
    found = _detect(tokens)
    if found is None:
        culprit = " ".join(tokens[:2]) if tokens[0] == "vllm" else tokens[0]
        raise ConfigError("launch_command", f"{shown(culprit)} does not start vllm or sglang; paste "
                                            "'vllm serve MODEL ...' or 'python3 -m "
                                            "sglang.launch_server ...'")
    engine, args = found
    try:
        raw, _ = engine.read_args(args)
    except EngineArgError as exc:
        raise ConfigError("launch_command", engine.describe(exc)) from None
    raw["env"], raw["serving"]["jit_cache"] = split_launch_env(env)
    try:
        return normalize_config(raw)
    except ConfigError as exc:
        if exc.field.startswith("env."):
            raise ConfigError("launch_command", f"{exc.field[4:]}: {exc.problem}") from None
        flag, problem = engine.value_problem(exc)
        raise ConfigError("launch_command", f"{flag}: {problem}") from None


def check_extra_args(engine: str, args: Sequence[str]) -> None:
    """ConfigError unless `args` are known pass-through flags of `engine` (normalize_config)."""
    _engine(engine).check_extra_args(args)


def parse_log(engine: str, lines: Iterable[str]) -> Iterator[Event]:
    """DESIGN.md's parse-log events from an engine log, one line at a time."""
    known = _engine(engine)
    return parse_lines(lines, known.log_matchers, known.error_matchers)


def parse_log_file(engine: str, path: str | Path) -> Iterator[Event]:
    """parse_log over a file (undecodable bytes replaced, not fatal)."""
    known = _engine(engine)
    with open(path, encoding="utf-8", errors="replace", newline="\n") as handle:
        yield from parse_lines(handle, known.log_matchers, known.error_matchers)


# A reason longer than this is cut: it travels in one-line messages and finding titles.
FAILURE_MESSAGE_CHARS = 600


def failure_message(engine: str, log_text: str) -> str | None:
    """The engine's own words for why it stopped, from (the tail of) its log: the final
    exception line of its traceback, or its last error line (logs.failure_event says
    which), on one line; None when the log holds no error."""
    event = failure_event(parse_log(engine, log_text.splitlines()))
    if event is None:
        return None
    message = " ".join(str(event["message"]).split())
    if len(message) > FAILURE_MESSAGE_CHARS:
        message = message[:FAILURE_MESSAGE_CHARS - 1].rstrip() + "…"
    return message
