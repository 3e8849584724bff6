"""What vLLM and SGLang have in common: flag tables, launch specs, and the launch record.

Each engine module declares its flags as a table of `Flag`s; `FlagTable.parse` reads an
argv the way the engine's argparse would (long and short names, `--flag=value`, value
types, choices, `--no-` negations) and fails with argparse's own wording, so the
simulated engine can reject a bad launch exactly as the real one does. Flags the
diagnostic does not model but knows to be harmless are `passthrough`: they travel in
`extra_args` verbatim. A pass-through flag whose value makes the engine load something
(code, a tokenizer, a template, weights) says what in `loads`, and lab.engines.admission
holds its value to the lab's catalog.

A command line cannot carry every field of a configuration; `UNCARRIED` lists the ones
it cannot, and `launch_view` drops them, so that "the same configuration" can be
compared between a structured config and a command.
"""

from __future__ import annotations

import copy
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lab.config import JIT_CACHE_ENV, ConfigError, shown
from lab.engines.logs import Matcher
from lab.inventory import Node

# Fields a launch command (argv + env) cannot express. parse_command/parse_launch fill
# them with defaults: engine.version from lab.config.DEFAULT_ENGINE_VERSIONS,
# model.quantization nvfp4, cluster from tp × pp, workloads both, reported absent.
UNCARRIED = ("engine.version", "model.quantization", "cluster", "workloads", "reported")

LAUNCH_SCHEMA = "lab.launch/1"
MASTER_PORT = 29500  # torch.distributed rendezvous on the head's data address (vLLM)
SGLANG_DIST_PORT = 5000  # SGLang's --dist-init-addr port

# What a pass-through flag's value makes an engine load (Flag.loads).
LOADS = ("remote_code", "tokenizer", "chat_template", "generation_config", "download_dir",
         "compilation_config")

_NEGATIVE_NUMBER = re.compile(r"^-\d+(\.\d*)?([eE][-+]?\d+)?$")


class EngineArgError(ValueError):
    """A launch the engine would refuse. `message` is argparse's wording without the prog
    prefix ("unrecognized arguments: --foo"); str(error) is the whole line the engine
    prints before exiting 2 ("vllm serve: error: unrecognized arguments: --foo")."""

    def __init__(self, flag: str, message: str, prog: str = "vllm serve") -> None:
        super().__init__(f"{prog}: error: {message}")
        self.flag = flag
        self.message = message
        self.prog = prog


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

    `config` is the normalized configuration (fields in UNCARRIED hold defaults);
    `headless` is true for a node that serves no HTTP API (vLLM --headless, SGLang
    node_rank > 0); `master_addr`/`master_port` are the rendezvous address (vLLM
    --master-addr/--master-port, SGLang --dist-init-addr), None when not given.
    """

    config: dict[str, Any]
    engine: str


@dataclass(frozen=True)
class Flag:
    """One command-line option. `names[0]` is the canonical spelling used in messages.

    kind: "str", "int", "float" take a value; "bool" is store_true; "optbool" also
    accepts `--no-<name>`. `convert` replaces the kind's converter (it raises ValueError
    on a bad value, reported as "invalid <type_name> value").
    """

    names: tuple[str, ...]
    dest: str
    kind: str = "str"
    choices: tuple[str, ...] = ()
    convert: Callable[[str], Any] | None = None
    type_name: str = ""
    passthrough: bool = False
    # What the engine loads because of this flag (LOADS), for pass-through flags only.
    loads: str = ""

    @property
    def canonical(self) -> str:
        return self.names[0]

    @property
    def takes_value(self) -> bool:
        return self.kind not in ("bool", "optbool")


@dataclass
class ParsedArgs:
    values: dict[str, Any] = field(default_factory=dict)
    given: dict[str, str] = field(default_factory=dict)  # dest -> flag as the user wrote it
    positionals: list[str] = field(default_factory=list)
    passthrough: list[str] = field(default_factory=list)  # verbatim tokens, in order
    # The pass-through flags with their converted values, in order (for admission).
    passthrough_flags: list[tuple[Flag, Any]] = field(default_factory=list)


def is_flag(word: str) -> bool:
    return word.startswith("-") and word != "-" and not _NEGATIVE_NUMBER.match(word)


_CONVERTERS: dict[str, tuple[Callable[[str], Any], str]] = {
    "str": (str, "str"),
    "int": (int, "int"),
    "float": (float, "float"),
}


class FlagTable:
    """An engine's options; `parse` reads argv tokens like argparse (no abbreviations)."""

    def __init__(self, prog: str, flags: Sequence[Flag], *, underscores: bool = False) -> None:
        self.prog = prog
        self.flags = tuple(flags)
        # vLLM's FlexibleArgumentParser accepts --tensor_parallel_size for --tensor-parallel-size.
        self.underscores = underscores
        self._index: dict[str, tuple[Flag, bool]] = {}
        for flag in self.flags:
            for name in flag.names:
                self._index[name] = (flag, False)
            if flag.kind == "optbool":
                self._index["--no-" + flag.canonical[2:]] = (flag, True)

    def _key(self, name: str) -> str:
        if self.underscores and name.startswith("--"):
            return "--" + name[2:].replace("_", "-")
        return name

    def lookup(self, name: str) -> Flag | None:
        entry = self._index.get(self._key(name.partition("=")[0]))
        return entry[0] if entry else None

    def error(self, flag: str, message: str) -> EngineArgError:
        return EngineArgError(flag, message, self.prog)

    def _convert(self, flag: Flag, raw: str) -> Any:
        convert, type_name = flag.convert, flag.type_name
        if convert is None:
            convert, type_name = _CONVERTERS[flag.kind]
        try:
            value = convert(raw)
        except ValueError:
            raise self.error(flag.canonical, f"argument {flag.canonical}: invalid {type_name} "
                                             f"value: {raw!r}") from None
        if flag.choices and value not in flag.choices:
            listed = ", ".join(repr(c) for c in flag.choices)
            raise self.error(flag.canonical, f"argument {flag.canonical}: invalid choice: "
                                             f"{raw!r} (choose from {listed})")
        return value

    def parse(self, tokens: Sequence[str], *, max_positionals: int = 0) -> ParsedArgs:
        out = ParsedArgs()
        unknown: list[str] = []
        after_unknown = False  # argparse reports the values of an unknown flag with it
        only_positional = False
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            i += 1
            if only_positional or not is_flag(tok):
                if after_unknown or len(out.positionals) >= max_positionals:
                    unknown.append(tok)
                else:
                    out.positionals.append(tok)
                continue
            if tok == "--":
                only_positional = True
                continue
            name, eq, inline = tok.partition("=")
            entry = self._index.get(self._key(name))
            if entry is None:
                unknown.append(tok)
                after_unknown = True
                continue
            after_unknown = False
            flag, negated = entry
            if not flag.takes_value:
                if eq:
                    raise self.error(flag.canonical, f"argument {flag.canonical}: ignored "
                                                     f"explicit argument {inline!r}")
                value: Any = not negated
                used = [tok]
            else:
                if eq:
                    raw, used = inline, [tok]
                elif i < len(tokens) and not is_flag(tokens[i]):
                    raw, used = tokens[i], [tok, tokens[i]]
                    i += 1
                else:
                    raise self.error(flag.canonical,
                                     f"argument {flag.canonical}: expected one argument")
                value = self._convert(flag, raw)
            if flag.passthrough:
                out.passthrough.extend(used)
                out.passthrough_flags.append((flag, value))
            else:
                out.values[flag.dest] = value
                out.given[flag.dest] = name
        if unknown:
            raise self.error(unknown[0], "unrecognized arguments: " + " ".join(unknown))
        return out



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
                env: dict[str, str]) -> dict[str, Any]:
    return {
        "schema": LAUNCH_SCHEMA,
        "engine": engine,
        "node": node.name,
        "role": "head" if rank == 0 else "worker",
        "rank": rank,
        "argv": argv,
        "env": env,
        "log_file": f"{node.work_dir}/logs/engine.log",
        "cwd": node.work_dir,
    }


class Engine(ABC):
    """One inference engine: its flags, how it is launched, how its log reads."""

    name: ClassVar[str]
    table: ClassVar[FlagTable]
    # Modelled flags (by dest) -> the configuration field each one sets.
    dest_fields: ClassVar[Mapping[str, str]]
    # Flags the lab sets per node (rank, rendezvous, HTTP address): never in a config.
    launch_dests: ClassVar[frozenset[str]]
    log_matchers: ClassVar[Sequence[Matcher]]
    # Matchers that also read the message of every error line and traceback (logs.parse_lines).
    error_matchers: ClassVar[Sequence[Matcher]] = ()

    @property
    def prog(self) -> str:
        return self.table.prog

    @abstractmethod
    def invocation(self, tokens: Sequence[str]) -> list[str] | None:
        """The arguments after the program (`vllm serve`, `python3 -m sglang.launch_server`),
        or None when `tokens` do not launch this engine."""

    @abstractmethod
    def argv(self, config: Mapping[str, Any], *, rank: int, nnodes: int, head: Node,
             node: Node) -> list[str]:
        """The full argv that starts rank `rank` of `config` on `node`."""

    @abstractmethod
    def read_args(self, args: Sequence[str]) -> tuple[dict[str, Any], LaunchInfo]:
        """Arguments -> an un-normalized partial config (no env) and the per-node facts.
        Raises EngineArgError as the engine would."""

    def flag_for(self, config_field: str) -> tuple[str, str]:
        """(the flag that carries `config_field`, the part of the field below that flag's
        own field), for messages about a bad value: ("--speculative-config", "draft_model")."""
        best, found = "", config_field
        for dest, target in self.dest_fields.items():
            if (config_field == target or config_field.startswith(target + ".")) and \
                    len(target) > len(best):
                flag = next(f for f in self.table.flags if f.dest == dest)
                best, found = target, flag.canonical
        return found, config_field[len(best):].lstrip(".") if best else ""

    def value_problem(self, exc: ConfigError) -> tuple[str, str]:
        """A configuration error restated against the flag that set the value."""
        flag, below = self.flag_for(exc.field)
        return flag, f"{below} {exc.problem}" if below else exc.problem

    def describe(self, exc: EngineArgError) -> str:
        """An argument error in words for a customer (parse_command, extra_args)."""
        if exc.message.startswith("unrecognized arguments"):
            if not is_flag(exc.flag):
                return f"{shown(exc.flag)} is an extra argument {self.prog} does not take; remove it"
            return (f"{shown(exc.flag)} is not a {self.name} flag the diagnostic knows; remove it, "
                    "or ask us to add it")
        return exc.message

    def check_extra_args(self, args: Sequence[str]) -> None:
        """extra_args may hold known pass-through flags only (ConfigError otherwise)."""
        try:
            parsed = self.table.parse(args)
        except EngineArgError as exc:
            raise ConfigError("extra_args", self.describe(exc)) from None
        for dest, written in parsed.given.items():
            if dest in self.launch_dests:
                raise ConfigError("extra_args", f"{written!r} is set by the lab for each node; "
                                                "remove it")
            raise ConfigError("extra_args", f"{written!r} is set by {self.dest_fields[dest]}; "
                                            "set it there instead")
