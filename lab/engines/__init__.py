"""vLLM and SGLang: configuration <-> launch commands, and engine log parsing.

Every interface here is the released engines', read from their tables
(lab/engines/releases/<engine>-<version>.json, extracted from the packages by
enginetables.extract): which versions exist (`modelled_versions`), which flags each has
and how its argparse reads them (lab.engines.argv), its FP4 backend choices
(`backend_choices`) and its log lines. A configuration names one of those versions
(`engine.version`; lab.config.DEFAULT_ENGINE_VERSIONS when it does not).

`normalize_config` is the whole normalization of a customer configuration: lab.config's
field checks plus what needs the version's flags (a `launch_command` read into fields,
the backends and the flags in `extra_args` checked) and the lab's admission against its
catalog; `load_config_text` does it for a YAML file. `render` turns a normalized
configuration, as the lab launches it (`as_launched`), into one `lab.launch/1` spec per
node; `parse_launch` reads such an argv back with a version's parser (the simulated
engine uses it to learn what it was started with, and fails like the real engine on a
bad flag); `parse_command` reads a command a customer pasted; `parse_log` turns engine
log lines into events and `failure_message` picks from them the engine's own words for
why it stopped. Fields a command line cannot carry are listed in `UNCARRIED`;
`launch_view` drops them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from lab.catalog import Catalog, load_catalog
from lab.config import (
    DEFAULT_ENGINE_VERSIONS,
    ConfigError,
    check_document,
    launch_command_text,
    normalize_fields,
    read_config_text,
    shown,
    with_command_fields,
)
from lab.engines import tables
from lab.engines.admission import admit, served_model
from lab.engines.argv import refused_choice, release_parser
from lab.engines.base import (
    UNCARRIED,
    Engine,
    EngineArgError,
    LaunchInfo,
    ParsedLaunch,
    host_ip_env,
    jit_cache_env,
    launch_spec,
    launch_view,
    nodes_used,
    split_launch_env,
)
from lab.engines.command import split_command
from lab.engines.logs import Event, failure_event, parse_lines
from lab.engines.sglang import METRICS_FLAG, Sglang
from lab.engines.startup import check_startup
from lab.engines.vllm import Vllm
from lab.flag_policy import launch_argv_problem
from lab.inventory import Node

__all__ = [
    "UNCARRIED",
    "EngineArgError",
    "ParsedLaunch",
    "as_launched",
    "backend_choices",
    "check_extra_args",
    "failure_message",
    "launch_view",
    "load_config_text",
    "modelled_versions",
    "normalize_config",
    "parse_command",
    "parse_launch",
    "parse_log",
    "parse_log_file",
    "refused_choice",
    "render",
    "renormalize",
]

ENGINES: dict[str, Engine] = {"vllm": Vllm(), "sglang": Sglang()}
# The flag that picks each FP4 layer's backend, per engine (LAB_MODEL.md section 6): the
# engine's own field -> flag table, read for the two backend fields.
BACKEND_FLAGS = {name: {layer: engine.field_flags[f"serving.{layer}_backend"] for layer in ("moe", "linear")}
                 for name, engine in ENGINES.items()}


def field_flag(engine: str, field: str) -> str | None:
    """The flag that carries configuration `field` ("serving.moe_backend") on `engine`'s
    command line, as its module's FIELD_FLAGS says; None for a field without one."""
    return _engine(engine).field_flags.get(field)


def _engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"engine {name!r} is not known; use one of {', '.join(ENGINES)}") from None


def modelled_versions(engine: str) -> tuple[str, ...]:
    """The releases of `engine` the platform models (those with a table), oldest first."""
    return tables.modelled_versions(engine)


def _version(engine: Engine, version: str | None) -> str:
    chosen = version or DEFAULT_ENGINE_VERSIONS[engine.name]
    known = modelled_versions(engine.name)
    if chosen not in known:
        raise ConfigError("engine.version", f"{shown(chosen)} is not a {engine.name} version the "
                                            f"platform models; use one of {', '.join(known)}")
    return chosen


def backend_choices(engine: str, version: str | None, layer: str) -> tuple[str, ...]:
    """The names `engine` `version` accepts for its FP4 `layer` ("moe" or "linear") backend
    flag, in the table's order ("auto" included where the version has it); () when the
    version has no such flag."""
    known = _engine(engine)
    option = release_parser(engine, _version(known, version)).option(BACKEND_FLAGS[engine][layer])
    if option is None or option.choices is None:
        return ()
    return tuple(str(c) for c in option.choices if c is not None)


def _detect(tokens: Sequence[str]) -> tuple[Engine, list[str]] | None:
    for engine in ENGINES.values():
        args = engine.invocation(tokens)
        if args is not None:
            return engine, args
    return None


def normalize_config(data: Mapping[str, Any], *, catalog: Catalog | None = None) -> dict[str, Any]:
    """Validate `data` and return a new dict with every field of `diagnostic.config/1`.

    `launch_command` may stand for the model/parallel/serving/speculative/env/extra_args
    fields; it is parsed by the engine it starts, in the version given beside it
    (`engine.version`, else the engine's default), and `cluster`, `workloads` and
    `reported` may sit beside it. `engine.version` must be a modelled release; the FP4
    backends and loaders are checked against that release's flags, and `extra_args` holds
    only what the release's reviewed list lets a configuration pass (lab.flag_policy),
    stored as the list spells it, with the combinations the release refuses at start
    refused (lab.engines.startup). Then the lab's admission (lab.engines.admission)
    against `catalog` (None: lab.catalog.load_catalog()): the model, its draft and
    whatever a listed flag loads must be in the lab's catalog, judged on the command as
    the lab launches it. Normalizing a normalized config returns it unchanged. Raises
    ConfigError naming the field.
    """
    return _normalize(data, catalog=catalog, admitting=True)


def renormalize(data: Mapping[str, Any]) -> dict[str, Any]:
    """normalize_config without the lab's admission, for a configuration that was admitted
    at intake and then changed by the platform's own fixes (diagnostic.pipelines.changes):
    the fields and the release's flags are checked again; the catalog is not, because
    `render` admits every configuration against the lab's catalog before any node sees it."""
    return _normalize(data, catalog=None, admitting=False)


def _normalize(data: Mapping[str, Any], *, catalog: Catalog | None,
               admitting: bool) -> dict[str, Any]:
    check_document(data)
    if "launch_command" in data:
        beside = data.get("engine")
        version = beside.get("version") if isinstance(beside, Mapping) else None
        parsed = _parse_command(launch_command_text(data),
                                version=version if isinstance(version, str) else None)
        try:
            return _normalize_fields(with_command_fields(data, parsed), catalog=catalog,
                                     admitting=admitting)
        except ConfigError as exc:
            raise _command_error(_engine(parsed["engine"]["name"]), exc) from None
    return _normalize_fields(data, catalog=catalog, admitting=admitting)


# Fields that may sit beside a launch command: their errors stay theirs.
_BESIDE_COMMAND = ("engine", "cluster", "workloads", "reported", "schema", "requirements")


def _command_error(engine: Engine, exc: ConfigError) -> ConfigError:
    """A configuration error of a pasted command, restated as the command's: a customer
    who pasted a command wrote flags and variables, not fields."""
    if exc.field == "launch_command" or exc.field.split(".")[0] in _BESIDE_COMMAND:
        return exc
    if exc.field.startswith("env."):
        return ConfigError("launch_command", f"{exc.field[4:]}: {exc.problem}")
    if exc.field.startswith("extra_args"):
        return ConfigError("launch_command", exc.problem)
    flag, problem = engine.value_problem(exc)
    return ConfigError("launch_command", f"{flag}: {problem}")


def _normalize_fields(data: Mapping[str, Any], *, catalog: Catalog | None,
                      admitting: bool) -> dict[str, Any]:
    config = normalize_fields(data)
    engine = _engine(config["engine"]["name"])
    _version(engine, config["engine"]["version"])
    config = engine.check_config(config)
    # Stored as the version's list spells them: abbreviations expanded, values as read.
    config["extra_args"] = engine.check_extra_args(config["extra_args"], config["engine"]["version"])
    check_startup(config, engine)
    if admitting:
        admit(config, engine, catalog if catalog is not None else load_catalog())
    return config


def load_config_text(text: str, *, max_bytes: int = 65536,
                     catalog: Catalog | None = None) -> dict[str, Any]:
    """Parse a YAML configuration (at most `max_bytes` of UTF-8) and normalize it."""
    return normalize_config(read_config_text(text, max_bytes=max_bytes), catalog=catalog)


def as_launched(config: Mapping[str, Any], *, catalog: Catalog | None = None) -> dict[str, Any]:
    """A normalized, admitted configuration as the lab launches it: the model and its EAGLE-3
    draft named by their paths in the lab's catalog (nodes run offline: a hub id would not load),
    `--trust-remote-code` added when the catalog says the model needs its own code and it
    was reviewed, and (SGLang) `--enable-metrics`, without which it serves no /metrics."""
    catalog = catalog if catalog is not None else load_catalog()
    out = copy.deepcopy(dict(config))
    engine = _engine(out["engine"]["name"])
    model = served_model(out, catalog)
    out["model"] = {**out["model"], "path": model.path}
    spec = out["speculative"]
    if spec is not None and spec.get("draft_model") is not None:
        draft = model.draft(spec["draft_model"], spec["method"])
        if draft is not None:
            out["speculative"] = {**spec, "draft_model": draft.path}
    parser = engine.parser(out["engine"]["version"])
    given = parser.parse(out["extra_args"], partial=True).values()
    extra = list(out["extra_args"])
    remote = parser.option("--trust-remote-code")
    if model.remote_code and remote is not None and remote.dest not in given:
        extra.append("--trust-remote-code")
    metrics = parser.option(METRICS_FLAG) if engine.name == "sglang" else None
    if metrics is not None and metrics.dest not in given:
        extra.append(METRICS_FLAG)
    out["extra_args"] = extra
    return out


def render(config: Mapping[str, Any], nodes: Sequence[Node], *,
           model_dir: str | None = None, catalog: Catalog | None = None,
           per_launch_cache: bool = False) -> list[dict[str, Any]]:
    """One `lab.launch/1` spec per node used: the first tp × pp nodes, head first (rank 0).

    `config` is normalized and admitted first against `catalog` (None: the default lab
    catalog), so nothing the lab's catalog does not hold reaches a node, then taken as the
    lab launches it (as_launched: the draft by its path, --trust-remote-code where the
    catalog says, SGLang's --enable-metrics). Every argv is in the flags of
    config.engine.version and is read back by that version's parser before it is handed
    out. `model_dir`, when given, is where this lab keeps the admitted model's weights (the
    inventory's model_dir): the argv names it instead of model.path. `per_launch_cache`:
    the lab's own launches, which give an ephemeral JIT cache a folder emptied before each
    launch (jit_cache_env); without it an ephemeral cache sets nothing.
    """
    catalog = catalog if catalog is not None else load_catalog()
    config = as_launched(normalize_config(config, catalog=catalog), catalog=catalog)
    # Admitted again as launched: the lab's own flags (--trust-remote-code) included.
    admit(config, _engine(config["engine"]["name"]), catalog)
    if model_dir is not None:
        config = {**config, "model": {**config["model"], "path": model_dir}}
    engine = _engine(config["engine"]["name"])
    version = config["engine"]["version"]
    used = nodes_used(config, nodes)
    head = used[0]
    specs = []
    for rank, node in enumerate(used):
        argv = engine.argv(config, rank=rank, nnodes=len(used), head=head, node=node)
        args = engine.invocation(argv)
        try:
            engine.parser(version).parse(args or [])
        except EngineArgError as exc:
            raise ConfigError("engine.version", f"{engine.name} {version} does not accept the "
                                                f"launch: {exc.error_line}") from None
        # The node agent's own check, on the same list: nothing it would refuse is handed out.
        refused = launch_argv_problem(argv, engine.name, version, None)
        if refused is not None:
            raise ConfigError("engine.version", f"the lab's flag list for {engine.name} {version} "
                                                f"refuses the launch: {refused[0]}: {refused[1]}")
        env = {**config["env"],
               **jit_cache_env(engine.name, version, config["serving"]["jit_cache"], node,
                               per_launch=per_launch_cache),
               **host_ip_env(engine.name, len(used), node)}
        specs.append(launch_spec(engine.name, node, rank, argv, env, version))
    return specs


def parse_launch(argv: Sequence[str], env: Mapping[str, str], *,
                 version: str | None = None) -> ParsedLaunch:
    """What an engine was launched with, read by `version`'s parser (None: the engine's
    default version). `env` is the launch spec's env (not the whole process environment:
    every variable in it lands in config.env). Raises EngineArgError with the version's
    own wording (str(): usage line and error line) for anything it would refuse."""
    found = _detect(argv)
    if found is None:
        program = argv[0] if argv else ""
        raise EngineArgError(program, f"{program!r} does not launch vllm or sglang", program)
    engine, args = found
    try:
        chosen = _version(engine, version)
    except ConfigError as exc:
        raise LookupError(exc.problem) from None
    raw, info = engine.read_args(args, chosen)
    raw["env"], raw["serving"]["jit_cache"] = split_launch_env(env)
    parser = engine.parser(chosen)
    try:
        # An engine knows nothing of the lab's catalog: what it was started with is read
        # as the engine reads it, without the lab's admission.
        # The lab's environment policy is not the engine's: it reads any variable.
        config = normalize_fields(raw, env_policy=False)
        config = engine.check_config(config)
    except ConfigError as exc:
        flag, problem = engine.value_problem(exc)
        raise parser.error(flag, f"argument {flag}: {problem}") from None
    where = {f.name: getattr(info, f.name) for f in fields(LaunchInfo)}
    return ParsedLaunch(config=config, engine=engine.name, **where)


def parse_command(text: str, *, version: str | None = None,
                  catalog: Catalog | None = None) -> dict[str, Any]:
    """A pasted `vllm serve ...` / `python3 -m sglang.launch_server ...` command (with
    NAME=value prefixes, continuations, quoting) -> a normalized, admitted configuration,
    read as engine `version` reads it (None: the engine's default version). Per-node flags
    (--nnodes, --node-rank, --master-addr, --headless, --host, --port) are read and
    ignored; the fields in UNCARRIED take their defaults. Raises ConfigError naming the
    token at fault (in the version's own words where the version refuses it)."""
    raw = _parse_command(text, version=version)
    try:
        return normalize_config(raw, catalog=catalog)
    except ConfigError as exc:
        raise _command_error(_engine(raw["engine"]["name"]), exc) from None


def _parse_command(text: str, *, version: str | None) -> dict[str, Any]:
    """parse_command without normalizing: the raw configuration the command stands for."""
    env, tokens = split_command(text)
    found = _detect(tokens)
    if found is None:
        culprit = " ".join(tokens[:2]) if tokens[0] == "vllm" else tokens[0]
        raise ConfigError("launch_command", f"{shown(culprit)} does not start vllm or sglang; paste "
                                            "'vllm serve MODEL ...' or 'python3 -m "
                                            "sglang.launch_server ...'")
    engine, args = found
    chosen = _version(engine, version)
    try:
        raw, _ = engine.read_args(args, chosen)
    except EngineArgError as exc:
        raise ConfigError("launch_command", engine.describe(exc, chosen)) from None
    raw["env"], raw["serving"]["jit_cache"] = split_launch_env(env)
    try:
        config = normalize_fields(raw)
        return engine.check_config(config)
    except ConfigError as exc:
        raise _command_error(engine, exc) from None


def check_extra_args(engine: str, args: Sequence[str], version: str | None = None) -> list[str]:
    """`args` as the version's list spells them; ConfigError unless each is a flag of that
    list a configuration may pass, with a value its rule accepts (normalize_config)."""
    known = _engine(engine)
    return known.check_extra_args(args, _version(known, version))


def parse_log(engine: str, lines: Iterable[str], *, version: str | None = None) -> Iterator[Event]:
    """DESIGN.md's parse-log events from an engine log, one line at a time. `version` is
    the release that wrote it (None: lines of any modelled release are understood)."""
    known = _engine(engine)
    return parse_lines(lines, known.log_matchers, known.error_matchers, version=version)


def parse_log_file(engine: str, path: str | Path, *, version: str | None = None) -> Iterator[Event]:
    """parse_log over a file (undecodable bytes replaced, not fatal)."""
    known = _engine(engine)
    with open(path, encoding="utf-8", errors="replace", newline="\n") as handle:
        yield from parse_lines(handle, known.log_matchers, known.error_matchers, version=version)


# A reason longer than this is cut: it travels in one-line messages and finding titles.
FAILURE_MESSAGE_CHARS = 600


def failure_message(engine: str, log_text: str, *, version: str | None = None) -> str | None:
    """The engine's own words for why it stopped, from (the tail of) its log: the final
    exception line of its traceback, or its last error line (logs.failure_event says
    which), on one line; None when the log holds no error."""
    event = failure_event(parse_log(engine, log_text.splitlines(), version=version))
    if event is None:
        return None
    message = " ".join(str(event["message"]).split())
    if len(message) > FAILURE_MESSAGE_CHARS:
        message = message[:FAILURE_MESSAGE_CHARS - 1].rstrip() + "…"
    return message
