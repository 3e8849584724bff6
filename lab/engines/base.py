"""What vLLM and SGLang have in common: the release parsers, launch specs, and the launch record.

Which flags an engine version has, and how its argparse reads them, comes from that
version's table (lab.engines.argv over lab/engines/releases/*.json): nothing here lists
flags. Each engine module holds only semantics: which flag carries which configuration
field (`field_flags`), which flags the lab sets per node (`launch_flags`), and what a
flag's value makes the engine load (`loads`, by the flag's dest), so that
lab.engines.admission can hold it to the lab's catalog. Every other flag the version has
is a pass-through: it travels in `extra_args` verbatim, unless `pass_problem` refuses it
(a flag that points the engine at code, files or the network is set by the lab, never by
a configuration).

A command line cannot carry every field of a configuration; `UNCARRIED` lists the ones
it cannot, and `launch_view` drops them, so that "the same configuration" can be
compared between a structured config and a command.
"""

from __future__ import annotations

import copy
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from lab.config import DEFAULT_ENGINE_VERSIONS, JIT_CACHE_ENV, ConfigError, shown
from lab.engines.argv import EngineArgError, Given, Option, Parsed, ReleaseParser, release_parser
from lab.engines.logs import Matcher
from lab.inventory import Node

# Fields a launch command (argv + env) cannot express. parse_command/parse_launch fill
# them: engine.version with the version given beside the command (else
# lab.config.DEFAULT_ENGINE_VERSIONS), model.quantization nvfp4, cluster from tp × pp,
# workloads both, reported absent.
UNCARRIED = ("engine.version", "model.quantization", "cluster", "workloads", "reported", "requirements")

LAUNCH_SCHEMA = "lab.launch/1"
MASTER_PORT = 29500  # torch.distributed rendezvous on the head's data address (vLLM)
SGLANG_DIST_PORT = 5000  # SGLang's --dist-init-addr port

# What a pass-through flag's value makes an engine load (Engine.loads).
LOADS = ("remote_code", "tokenizer", "chat_template", "generation_config", "download_dir",
         "compilation_config")

# A pass-through flag whose dest has one of these words points the engine at code (plugins,
# modules, classes, processors, middleware), at files, directories or the network, at the
# hub, or at a JSON configuration that can name any of those: the lab sets such things
# itself, so a configuration may not (the same rule as lab.config's for variables).
REFUSED_DEST_WORDS = frozenset({
    "plugin", "plugins", "module", "modules", "middleware", "cls", "class", "processor",
    "processors", "path", "paths", "file", "files", "dir", "dirs", "directory", "root",
    "url", "uri", "host", "addr", "address", "port", "endpoint", "endpoints", "ssl",
    "otlp", "download", "revision", "token", "hf", "overrides", "lora", "transfer",
    "events", "config", "corpus", "storage", "remote", "backend_path",
})

# ... and these dests, whose names do not say it: a tool server's address, a Unix socket's
# path, and an executor backend that may name a class to import.
REFUSED_DESTS = frozenset({"tool_server", "uds", "distributed_executor_backend"})

_NEGATIVE_NUMBER = re.compile(r"^-\d+(\.\d*)?([eE][-+]?\d+)?$")

__all__ = ["EngineArgError", "Given", "Option", "Parsed", "ReleaseParser"]


# The line argparse prints before it exits 2: "<prog>: error: <message>".
_ARGPARSE_ERROR = re.compile(r"^(?:[\w./-]+ )*[\w./-]+: error: (?P<message>.+)$")


def argument_refusal(engine_error: str | None, exit_code: int | None) -> str | None:
    """argparse's words when an engine exited refusing its arguments (exit status 2 and its
    "prog: error: ..." line), else None: that is the configuration's, not a crash."""
    if exit_code != 2 or not engine_error:
        return None
    match = _ARGPARSE_ERROR.match(engine_error.strip().splitlines()[-1])
    return match.group("message") if match else None


@dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in a multi-node launch: its rank, whether it serves the
    HTTP API, and the rendezvous address."""

    node_rank: int
    nnodes: int
    headless: bool
    host: str
    port: int
    master_addr: str | None
    master_port: int | None


@dataclass(frozen=True)
class ParsedLaunch(LaunchInfo):
    """What an engine process was launched with, as the simulated engine reads it.

    `config` is the normalized configuration (engine.version the version it was parsed
    with; the other fields in UNCARRIED hold defaults); `headless` is true for a node that
    serves no HTTP API (vLLM --headless, SGLang node_rank > 0); `master_addr`/`master_port`
    are the rendezvous address (vLLM --master-addr/--master-port, SGLang
    --dist-init-addr), None when not given.
    """

    config: dict[str, Any]
    engine: str


def is_flag(word: str) -> bool:
    return word.startswith("-") and word != "-" and not _NEGATIVE_NUMBER.match(word)


def launch_view(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` without the fields a launch command cannot carry (UNCARRIED)."""
    view = copy.deepcopy(dict(config))
    for path in UNCARRIED:
        head, _, leaf = path.partition(".")
        if leaf:
            view.get(head, {}).pop(leaf, None)
        else:
            view.pop(head, None)
    return view


def jit_cache_env(jit_cache: str, node: Node) -> dict[str, str]:
    """The launch env that keeps (persisted) or drops (ephemeral) the JIT caches."""
    if jit_cache != "persisted":
        return {}
    return {"VLLM_CACHE_ROOT": f"{node.cache_dir}/vllm",
            "FLASHINFER_WORKSPACE_BASE": f"{node.cache_dir}/flashinfer"}


def split_launch_env(env: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """A launch's env back into config.env and serving.jit_cache."""
    kept = {k: v for k, v in env.items() if k not in JIT_CACHE_ENV}
    jit = "persisted" if any(k in env for k in JIT_CACHE_ENV) else "ephemeral"
    return kept, jit


def nodes_used(config: Mapping[str, Any], nodes: Sequence[Node]) -> list[Node]:
    """The first tp × pp nodes, the head (rank 0) first, the rest in the given order."""
    needed = config["parallel"]["tp"] * config["parallel"]["pp"]
    head = next((i for i, n in enumerate(nodes) if n.is_head), 0)
    ordered = [nodes[head], *(n for i, n in enumerate(nodes) if i != head)]
    if len(ordered) < needed:
        raise ConfigError("parallel", f"tp × pp = {needed} nodes are needed, but only "
                                      f"{len(ordered)} were given")
    return ordered[:needed]


def launch_spec(engine: str, node: Node, rank: int, argv: list[str],
                env: dict[str, str], version: str | None = None) -> dict[str, Any]:
    """One node's `lab.launch/1` spec. `version` is the engine release the argv is written
    for: the node agent holds `env` to the lab's environment policy for that version."""
    return {
        "schema": LAUNCH_SCHEMA,
        "engine": engine,
        **({"version": version} if version is not None else {}),
        "node": node.name,
        "role": "head" if rank == 0 else "worker",
        "rank": rank,
        "argv": argv,
        "env": env,
        "log_file": f"{node.work_dir}/logs/engine.log",
        "cwd": node.work_dir,
    }


class Engine(ABC):
    """One inference engine: the semantics of its flags, how it is launched, how its log
    reads. Which flags exist, and how they are read, is each version's table."""

    name: ClassVar[str]
    # Configuration field -> the flag (an option string every modelled version has) that
    # carries it.
    field_flags: ClassVar[Mapping[str, str]]
    # Flags the lab sets per node (rank, rendezvous, HTTP address): never in a config.
    launch_flags: ClassVar[tuple[str, ...]]
    # What a pass-through flag makes the engine load, by the option string (LOADS).
    loads_flags: ClassVar[Mapping[str, str]]
    log_matchers: ClassVar[Sequence[Matcher]]
    # Matchers that also read the message of every error line and traceback (logs.parse_lines).
    error_matchers: ClassVar[Sequence[Matcher]] = ()

    @property
    def default_version(self) -> str:
        return DEFAULT_ENGINE_VERSIONS[self.name]

    def parser(self, version: str | None = None) -> ReleaseParser:
        """The serve command's parser of `version` (the default version when None)."""
        return release_parser(self.name, version or self.default_version)

    def prog(self, version: str | None = None) -> str:
        return self.parser(version).prog

    def _dests(self, parser: ReleaseParser, flags: Sequence[str]) -> set[str]:
        found = (parser.option(f) for f in flags)
        return {o.dest for o in found if o is not None}

    def modelled_dests(self, parser: ReleaseParser) -> dict[str, str]:
        """dest -> configuration field, for this version's options that carry a field."""
        out: dict[str, str] = {}
        for config_field, flag in self.field_flags.items():
            option = parser.option(flag)
            if option is not None:
                out.setdefault(option.dest, config_field)
        return out

    def launch_dests(self, parser: ReleaseParser) -> set[str]:
        return self._dests(parser, self.launch_flags)

    def loads(self, parser: ReleaseParser, option: Option) -> str:
        """What `option`'s value makes the engine load ("" for nothing)."""
        for flag, kind in self.loads_flags.items():
            known = parser.option(flag)
            if known is not None and known.dest == option.dest:
                return kind
        return ""

    @abstractmethod
    def invocation(self, tokens: Sequence[str]) -> list[str] | None:
        """The arguments after the program (`vllm serve`, `python3 -m sglang.launch_server`),
        or None when `tokens` do not launch this engine."""

    @abstractmethod
    def argv(self, config: Mapping[str, Any], *, rank: int, nnodes: int, head: Node,
             node: Node) -> list[str]:
        """The full argv that starts rank `rank` of `config` (as the lab launches it) on
        `node`, in the flags of config.engine.version."""

    @abstractmethod
    def read_args(self, args: Sequence[str], version: str) -> tuple[dict[str, Any], LaunchInfo]:
        """Arguments -> an un-normalized partial config (no env) and the per-node facts.
        Raises EngineArgError as the engine `version` would."""

    @abstractmethod
    def check_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """A config normalized by lab.config, checked against its version's flags (backend
        names, loaders, ...): the values as the version reads them. ConfigError naming the
        field otherwise."""

    def flag_for(self, config_field: str) -> tuple[str, str]:
        """(the flag that carries `config_field`, the part of the field below that flag's
        own field), for messages about a bad value: ("--speculative-config", "draft_model")."""
        best = ""
        for target in self.field_flags:
            if (config_field == target or config_field.startswith(target + ".")) and \
                    len(target) > len(best):
                best = target
        if not best:
            return config_field, ""
        return self.field_flags[best], config_field[len(best):].lstrip(".")

    def value_problem(self, exc: ConfigError) -> tuple[str, str]:
        """A configuration error restated against the flag that set the value."""
        flag, below = self.flag_for(exc.field)
        return flag, f"{below} {exc.problem}" if below else exc.problem

    def describe(self, exc: EngineArgError, version: str | None = None) -> str:
        """An argument error in words for a customer (parse_command, extra_args): the
        version's own refusal, with what the lab makes of it."""
        where = f"{self.name} {version or self.default_version}"
        if exc.message.startswith("unrecognized arguments"):
            if not is_flag(exc.flag):
                return (f"{shown(exc.flag)} is an extra argument {where} does not take "
                        f"({exc.error_line}); remove it")
            return f"{shown(exc.flag)} is not a flag of {where} ({exc.error_line}); remove it"
        return exc.error_line

    def pass_problem(self, parser: ReleaseParser, given: Given) -> str | None:
        """Why `given` may not travel in extra_args (None when it may)."""
        option = given.option
        if option.dest in self.launch_dests(parser):
            return f"{given.written!r} is set by the lab for each node; remove it"
        modelled = self.modelled_dests(parser)
        if option.dest in modelled:
            return f"{given.written!r} is set by {modelled[option.dest]}; set it there instead"
        if self.loads(parser, option):
            return None
        words = set(option.dest.lower().split("_"))
        refused = sorted(words & REFUSED_DEST_WORDS) or \
            (["server, socket or class"] if option.dest in REFUSED_DESTS else [])
        if refused:
            return (f"{given.written!r} names a {refused[0]}: flags that point an engine at code, "
                    "files, directories, the hub or the network are set by the lab, not by a "
                    "configuration; remove it")
        return None

    def check_extra_args(self, args: Sequence[str], version: str | None = None) -> Parsed:
        """extra_args may hold pass-through flags of the version only (ConfigError
        otherwise); returns them parsed."""
        parser = self.parser(version)
        try:
            parsed = parser.parse(args, partial=True)
        except EngineArgError as exc:
            raise ConfigError("extra_args", self.describe(exc, parser.version)) from None
        if parsed.positionals and any(v is not None for v in parsed.positionals.values()):
            stray = next(str(v) for v in parsed.positionals.values() if v is not None)
            raise ConfigError("extra_args", f"{shown(stray)} is an extra argument "
                                            f"{parser.prog} does not take; remove it")
        for given in parsed.given:
            problem = self.extra_problem(parser, given)
            if problem is not None:
                raise ConfigError("extra_args", problem)
        return parsed

    def extra_problem(self, parser: ReleaseParser, given: Given) -> str | None:
        return self.pass_problem(parser, given)
