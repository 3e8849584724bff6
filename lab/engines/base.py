"""What vLLM and SGLang have in common: the release parsers, launch specs, and the launch record.

Which flags an engine version has, and how its argparse reads them, comes from that
version's table (lab.engines.argv over lab/engines/releases/*.json); which of them a
launch may carry, who sets each and what its value must be, from that version's reviewed
list beside it (lab.flag_policy over lab/engines/releases/*.flags.yaml). Each engine
module holds only semantics: which flag carries which configuration field
(`field_flags`) and which flags the lab sets per node (`launch_flags`); the lists must
agree with them (a test keeps them so). A flag a configuration passes in `extra_args` must
be on the version's list without `set_by`, its value meeting its rule; it is stored under
the listed spelling (an abbreviation expanded by the version's own parser) and its value
as the parser read it, so that what is stored, masked, rendered and launched is the flag
the engine will see.

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

from lab import env_policy, flag_policy
from lab.config import (
    DEFAULT_ENGINE_VERSIONS,
    HOST_IP_ENV,
    JIT_CACHE_ENV,
    PER_LAUNCH_CACHE,
    ConfigError,
    shown,
)
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


# Where each engine's compiled kernels land, by the variable that moves them (folder under
# the cache root the lab gives). Without them every cache is under the engine user's home
# and survives restarts on bare metal. vLLM: VLLM_CACHE_ROOT (envs.py, ~/.cache/vllm: the
# torch.compile cache, with Inductor's and Triton's for the compiled graph under it).
# SGLang: SGLANG_CACHE_DIR (srt/environ.py, ~/.cache/sglang: its compile cache, and from
# 0.5.23 DeepGEMM's) and 0.5.23's SGLANG_JIT_CACHE_DIR (kernels/jit/utils/compile/cache.py,
# ~/.cache/sglang/jit whatever SGLANG_CACHE_DIR says). Both: FlashInfer's JIT under
# FLASHINFER_WORKSPACE_BASE/.cache/flashinfer (flashinfer/jit/env.py, base the home) and
# Triton's kernels under TRITON_CACHE_DIR (~/.triton/cache). An engine's own variable is
# set only for a version whose release reads it (lab.env_policy.version_reads).
JIT_CACHE_DIRS: Mapping[str, Mapping[str, str]] = {
    "vllm": {"VLLM_CACHE_ROOT": "vllm", "FLASHINFER_WORKSPACE_BASE": "flashinfer",
             "TRITON_CACHE_DIR": "triton"},
    "sglang": {"SGLANG_CACHE_DIR": "sglang", "SGLANG_JIT_CACHE_DIR": "sglang-jit",
               "FLASHINFER_WORKSPACE_BASE": "flashinfer", "TRITON_CACHE_DIR": "triton"},
}
# Read by the libraries under every engine, not by the engines' own lists.
_LIBRARY_CACHE_ENV = frozenset({"FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR"})


def cache_env(engine: str, version: str | None, root: str) -> dict[str, str]:
    """The variables that put `engine` `version`'s JIT caches under `root`."""
    reads = env_policy.version_reads(engine, version or DEFAULT_ENGINE_VERSIONS[engine])
    return {name: f"{root}/{folder}" for name, folder in JIT_CACHE_DIRS[engine].items()
            if name in _LIBRARY_CACHE_ENV or name in reads}


def jit_cache_env(engine: str, version: str | None, jit_cache: str, node: Node, *,
                  per_launch: bool = False) -> dict[str, str]:
    """The launch env that places the JIT caches: persisted, in the node's cache volume
    (kept across restarts); ephemeral, when `per_launch` (the lab's own launches), in the
    volume's per-launch folder, which the node agent empties before each launch, so every
    start compiles as a container without a kept volume does. An ephemeral cache outside
    the lab sets nothing: the caches are wherever the customer's engines keep them."""
    if jit_cache == "persisted":
        return cache_env(engine, version, node.cache_dir)
    if per_launch:
        return cache_env(engine, version, f"{node.cache_dir}/{PER_LAUNCH_CACHE}")
    return {}


def host_ip_env(engine: str, nnodes: int, node: Node) -> dict[str, str]:
    """What the lab sets for a rank's own address: vLLM's multi-node head binds its
    broadcast queue to VLLM_HOST_IP, else to the default-route interface (the management
    NIC) or 0.0.0.0 (vllm/utils/network_utils.py get_ip), so each vLLM rank of a multi-node
    launch is given its data-network address. SGLang meets at --dist-init-addr."""
    if engine != "vllm" or nnodes <= 1:
        return {}
    return {HOST_IP_ENV: node.data_addr}


def split_launch_env(env: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """A launch's env back into config.env and serving.jit_cache (the lab's own per-rank
    address dropped): cache variables under a per-launch folder are an ephemeral cache."""
    kept = {k: v for k, v in env.items() if k not in JIT_CACHE_ENV and k != HOST_IP_ENV}
    caches = [v for k, v in env.items() if k in JIT_CACHE_ENV]
    per_launch = bool(caches) and all(PER_LAUNCH_CACHE in v.split("/") for v in caches)
    jit = "persisted" if caches and not per_launch else "ephemeral"
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
        """What `option`'s value makes the engine load ("" for nothing), by the version's
        list (`loads`)."""
        for spelling in option.option_strings:
            rule = flag_policy.rule_of(self.name, parser.version, spelling)
            if rule is not None and rule.get("loads"):
                return str(rule["loads"])
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

    def listed(self, parser: ReleaseParser, given: Given) -> tuple[str, dict[str, Any]] | None:
        """(the spelling the version's list holds for the option `given` names, its rule),
        None when the list does not hold it."""
        option = given.option
        negative = (not option.value_of(given.written)) if option.action == "boolean" else None
        spelling = flag_policy.listed_spelling(self.name, parser.version, option.option_strings,
                                               given.written, negative)
        if spelling is None:
            return None
        rule = flag_policy.rule_of(self.name, parser.version, spelling)
        return (spelling, rule) if rule is not None else None

    def _raw_values(self, given: Given) -> list[str]:
        """The values `given` took, as written (`--flag=value` or the tokens after it)."""
        head = given.tokens[0]
        if "=" in head and head.startswith("--") and given.option.takes_value:
            return [head.partition("=")[2]]
        return [t for t in given.tokens[1:] if t != "--"]

    def _canonical(self, given: Given, rule: Mapping[str, Any]) -> list[str]:
        """The values of `given` as the list's rule checks them and the engine reads them:
        a number as the version's converter read it (16k -> 16000), a word of the rule
        (auto) as written, anything else as written."""
        raw = self._raw_values(given)
        if rule.get("rule") != "number":
            return raw
        words = [str(w) for w in rule.get("words") or []]
        values = given.value if isinstance(given.value, list) else [given.value]
        out = []
        for written, value in zip(raw, values, strict=False):
            if written in words or isinstance(value, bool) or not isinstance(value, int | float):
                out.append(written)
            else:
                out.append(str(value) if isinstance(value, int) else repr(float(value)))
        return out

    def extra_problem(self, parser: ReleaseParser, given: Given) -> str | None:
        """Why `given` may not travel in extra_args (None when it may): a flag the version's
        list does not hold, one the lab or a field sets, or a value its rule refuses."""
        where = shown_label(self.name, parser.version)
        found = self.listed(parser, given)
        if found is None:
            return (f"{given.written!r} is not a flag the lab lets a configuration pass to {where} "
                    f"(the flags it does, each with the values it takes, are listed in "
                    f"{flag_policy.shown_path(self.name, parser.version)}); remove it")
        spelling, rule = found
        set_by = rule.get("set_by")
        values = self._canonical(given, rule)
        if set_by == "lab":
            return f"{spelling!r} is set by the lab for each node; remove it"
        if set_by is not None and not (values and all(v in (rule.get("passes") or ()) for v in values)):
            return f"{spelling!r} is set by {set_by}; set it there instead"
        for value in values:
            problem = flag_policy.flag_value_problem(value, rule)
            if problem is not None:
                shown_value = "the value" if rule.get("rule") == "secret" else shown(value)
                return f"{shown_value} is not accepted: {spelling} {problem} in {where}"
        return None

    def check_extra_args(self, args: Sequence[str], version: str | None = None) -> list[str]:
        """extra_args may hold flags of the version's list that a configuration may pass
        (ConfigError otherwise); returns them as the list spells them, each flag's values
        as the version's parser read them, abbreviations expanded."""
        parser = self.parser(version)
        try:
            parsed = parser.parse(args, partial=True)
        except EngineArgError as exc:
            raise ConfigError("extra_args", self.describe(exc, parser.version)) from None
        if parsed.positionals and any(v is not None for v in parsed.positionals.values()):
            stray = next(str(v) for v in parsed.positionals.values() if v is not None)
            raise ConfigError("extra_args", f"{shown(stray)} is an extra argument "
                                            f"{parser.prog} does not take; remove it")
        out: list[str] = []
        for given in parsed.given:
            problem = self.extra_problem(parser, given)
            if problem is not None:
                raise ConfigError("extra_args", problem)
            found = self.listed(parser, given)
            assert found is not None  # extra_problem refused it otherwise
            spelling, rule = found
            values = self._canonical(given, rule)
            if "=" in given.tokens[0] and given.option.takes_value:
                out.append(f"{spelling}={values[0]}")
            else:
                out += [spelling, *values]
        return out


def shown_label(engine: str, version: str) -> str:
    """"vLLM 0.34.0", as messages name a release."""
    return flag_policy.release_list(engine, version)["label"]
