"""Reading an engine's argv as the released version's argparse does, from its table.

`release_parser(engine, version)` builds, from lab/engines/releases/<engine>-<version>.json
(lab.engines.tables), a parser that reads tokens the way that version's serve command
does: its option strings (BooleanOptionalAction's `--no-X`, vLLM's `--disable-X`
spellings and short names such as `-tp`, `-sc`), prefix abbreviations when the table says
`allow_abbrev` (with argparse's `ambiguous option` refusal), `--flag=value`, nargs (`?`,
`+`, `*`), switches, the value converters the table names (int, float, json.loads,
vLLM's optional_type / human_readable_int[_or_auto] / the backend-name lambda, ...; a name
both engines use is the engine's own function: SGLang's human_readable_int is not vLLM's),
choices checked after the conversion, and required options. A refusal is an
EngineArgError whose str() is what argparse prints before it exits 2: the version's
usage line, then `<prog>: error: <message>`, in Python 3.12's wording (choices listed
`choose from a, b, c`). Two kinds of it are not argparse's: EngineException, what the
release refuses with an exception of its own code (its traceback's last line), and
NotReproduced, what the release accepts but the lab does not reproduce (the lab's words).

For vLLM the tokens are first rewritten as its FlexibleArgumentParser rewrites argv before
argparse sees it (vllm_flexible_args: underscores in option names, -O3 as
--optimization-level 3, `--speculative-config.method eagle3` merged into one JSON
argument, the --config file's checks); Given.tokens hold the tokens as argparse received
them.

The algorithm is argparse's own (classify each token as an option or an argument, let
each option take the arguments its nargs matches, positionals in between, leftovers
`unrecognized arguments`); only what the tables do not hold is approximated: the order
options were registered in (the tables are sorted by option name), which argparse uses
when it lists ambiguous matches and in a generated usage line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Context, Decimal
from functools import cache
from typing import Any

from lab.engines import tables

# argparse prints usage wrapped to the terminal's width less 2; an engine writing to a log
# file has no terminal, so Python's fallback of 80 columns applies.
USAGE_WIDTH = 78
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


class EngineArgError(ValueError):
    """A launch the engine refuses at argument parsing (argparse exits 2).

    `message` is argparse's wording without the prog prefix ("unrecognized arguments:
    --foo"); `flag` the option (or token) at fault; str(error) is the whole of what the
    engine prints: "usage: <usage>" and "<prog>: error: <message>" on the next line.
    """

    def __init__(self, flag: str, message: str, prog: str = "vllm serve",
                 usage: str | None = None) -> None:
        text = f"{prog}: error: {message}"
        super().__init__(f"usage: {usage}\n{text}" if usage else text)
        self.flag = flag
        self.message = message
        self.prog = prog
        self.usage = usage

    @property
    def error_line(self) -> str:
        """The last line argparse prints: "<prog>: error: <message>"."""
        return f"{self.prog}: error: {self.message}"


class EngineException(EngineArgError):
    """A launch the release refuses with an exception of its own code rather than argparse's
    exit 2: vLLM's FlexibleArgumentParser before argparse runs (a --config that is not a YAML
    file, a dotted argument without its value), or one of its configuration classes when it
    builds its configuration (pydantic's ValidationError for a key SpeculativeConfig does not
    have). `exception` is the exception's type as Python's traceback names it ("ValueError",
    "pydantic_core._pydantic_core.ValidationError"), `message` its text; str() and
    `error_line` are the traceback's last line(s): "<exception>: <message>"."""

    def __init__(self, flag: str, exception: str, message: str, prog: str = "vllm serve") -> None:
        super().__init__(flag, message, prog)
        self.exception = exception
        self.args = (f"{exception}: {message}",)

    @property
    def error_line(self) -> str:
        return f"{self.exception}: {self.message}"


class NotReproduced(EngineArgError):
    """Something the release accepts that the lab does not reproduce, refused in the
    platform's own words (str() and `error_line` are `message`), never as if the engine
    refused it."""

    def __init__(self, flag: str, message: str, prog: str = "vllm serve") -> None:
        super().__init__(flag, message, prog)
        self.args = (message,)

    @property
    def error_line(self) -> str:
        return self.message


class ArgumentTypeError(ValueError):
    """A converter's refusal in its own words (argparse.ArgumentTypeError)."""


# -- value converters, by the name the table gives them --------------------------------------
# vLLM's human_readable_int (vllm/utils/argparse_utils.py: 0.29.0 lines 29-72, 0.34.0 lines
# 30-74, the same in both): k/m/g/t decimal (x1000..., a decimal number allowed, computed in
# floating point), K/M/G/T binary (x1024..., an integer only), anything else read by int().
_VLLM_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_VLLM_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_VLLM_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(value: str) -> int:
    """vLLM's: 262144, 256K (x1024) or 262.144k (x1000); a decimal with a binary suffix is
    refused in vLLM's words, anything else unreadable is int()'s ValueError (argparse then
    says `invalid human_readable_int value`)."""
    value = value.strip()
    m = _VLLM_HUMAN.fullmatch(value)
    if m:
        number, suffix = m.groups()
        if suffix in _VLLM_DECIMAL:
            return int(float(number) * _VLLM_DECIMAL[suffix])
        try:
            return int(number) * _VLLM_BINARY[suffix]
        except ValueError:
            raise ArgumentTypeError(f"Decimals are not allowed with binary suffixes like "
                                    f"{suffix}. Did you mean to use {number}{suffix.lower()} "
                                    "instead?") from None
    return int(value)


# SGLang's human_readable_int (sglang/srt/utils/common.py: 0.5.12 lines 2383-2418, 0.5.23
# lines 3394-3429, the same in both; --context-length, --max-total-tokens,
# --max-prefill-tokens and 0.5.23's --cuda-graph-prefill-max-context use it): suffixes are
# case-sensitive, SI k/M/G/T decimal (x1000..., a decimal number allowed, computed exactly
# with Decimal), IEC Ki/Mi/Gi/Ti binary (x1024..., an integer only); `256K` or `1m` is not a
# suffix at all, and anything int() cannot read is refused in its words.
_SGLANG_HUMAN = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")
_SGLANG_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SGLANG_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def sglang_human_readable_int(value: str) -> int:
    """SGLang's: 262144, 256Ki (x1024), 262.144k (x1000), 1M (x1,000,000)."""
    value = value.strip()
    m = _SGLANG_HUMAN.fullmatch(value)
    if m:
        number, suffix = m.groups()
        if suffix in _SGLANG_IEC:
            if "." in number:
                raise ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. Use an integer "
                    f"IEC value such as '{int(Decimal(number))}{suffix}', or an SI value such as "
                    f"'{number}{suffix[0]}'.")
            return int(number) * _SGLANG_IEC[suffix]
        # Decimal arithmetic in the default context (28 digits), as the release's is.
        return int(Context().multiply(Decimal(number), _SGLANG_SI[suffix]))
    try:
        return int(value)
    except ValueError:
        raise ArgumentTypeError(
            f"Invalid integer value: '{value}'. Use a plain integer, SI suffixes (1k, 1M), or "
            "IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive.") from None


sglang_human_readable_int.__name__ = "human_readable_int"


def human_readable_int_or_auto(value: str) -> int:
    """`auto` (or -1): the engine fits the length to memory, read as -1."""
    if value.strip().lower() in ("auto", "-1"):
        return -1
    return human_readable_int(value)


def _optional(inner: Callable[[str], Any]) -> Callable[[str], Any]:
    def _optional_type(val: str) -> Any:
        if val in ("", "None"):
            return None
        return inner(val)
    return _optional_type


def _parse_type(inner: Callable[[str], Any], shown: str) -> Callable[[str], Any]:
    def _parse_type(val: str) -> Any:
        try:
            return inner(val)
        except ValueError:
            raise ArgumentTypeError(f"Value {val} cannot be converted to {shown}.") from None
    return _parse_type


def _json(val: str) -> Any:
    try:
        return json.loads(val)
    except RecursionError:
        raise ValueError(val[:60]) from None


_json.__name__ = "loads"


def _json_object(name: str) -> Callable[[str], Any]:
    def parse_dataclass(val: str) -> Any:
        try:
            value = json.loads(val)
        except (ValueError, RecursionError):
            raise ArgumentTypeError(f"{name}: {val[:80]!r} is not valid JSON") from None
        if not isinstance(value, dict):
            raise ArgumentTypeError(f"{name}: {val[:80]!r} is not a JSON object")
        return value
    return parse_dataclass


def union_dict_and_str(val: str) -> Any:
    if not re.match(r"(?s)^\s*\{.*\}\s*$", val):
        return str(val)
    return _optional(_json)(val)


def json_list_type(val: str) -> Any:
    value = _json(val)
    if not isinstance(value, list):
        raise ArgumentTypeError(f"Expected a JSON list, got {val!r}")
    return value


def nullable_str(val: str) -> str | None:
    return None if val in ("", "None") else val


def _lower_dashes(s: str) -> str:
    return s.lower().replace("-", "_")


_lower_dashes.__name__ = "<lambda>"


def _device_ids(s: str) -> list[int | str]:
    return [int(d) if d.isdigit() else d for d in (p.strip() for p in s.split(","))]


_device_ids.__name__ = "<lambda>"


def _identity(name: str) -> Callable[[str], Any]:
    def convert(val: str) -> str:
        return val
    convert.__name__ = name
    return convert


_SIMPLE: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "json.loads": _json,
    "human_readable_int": human_readable_int,
    "human_readable_int_or_auto": human_readable_int_or_auto,
    "union_dict_and_str": union_dict_and_str,
    "json_list_type": json_list_type,
    "nullable_str": nullable_str,
    "lambda s: s.lower().replace('-', '_')": _lower_dashes,
    "lambda s: [int(device_id) if device_id.isdigit() else device_id for device_id in "
    "(part.strip() for part in s.split(','))]": _device_ids,
}


# The converters an engine names like another's but defines its own way: SGLang's tables say
# `human_readable_int` for its own function (sglang/srt/utils/common.py), not vLLM's.
_ENGINE_SIMPLE: dict[str, dict[str, Callable[[str], Any]]] = {
    "sglang": {"human_readable_int": sglang_human_readable_int},
}


@cache
def converter(type_name: str | None, engine: str = "vllm") -> Callable[[str], Any]:
    """The converter a table's `type` names in `engine`'s release (a string for None:
    argparse's default)."""
    if type_name is None:
        return _identity("str")
    own = _ENGINE_SIMPLE.get(engine, {})
    if type_name in own:
        return own[type_name]
    if type_name in _SIMPLE:
        return _SIMPLE[type_name]
    if m := re.fullmatch(r"optional_type\((.*)\)", type_name):
        return _optional(converter(m[1], engine))
    if m := re.fullmatch(r"parse_type\((.*)\)", type_name):
        inner = converter(m[1], engine)
        return _parse_type(inner, f"<function {getattr(inner, '__name__', m[1])}>")
    if m := re.fullmatch(r"parse_dataclass\((\w+)\)", type_name):
        return _json_object(m[1])
    # A converter the platform does not know (parse_reasoning_parser, SGLang's cuda-graph
    # parsers): the value is kept as written, and the engine judges it after parsing.
    return _identity(type_name.split("(")[0])


# -- vLLM's FlexibleArgumentParser: argv as argparse receives it --------------------------------
# vllm/utils/argparse_utils.py FlexibleArgumentParser.parse_args, the same code in both modelled
# releases (0.29.0 lines 259-448, 0.34.0 lines 313-502), rewrites the whole argv before
# argparse reads it; ReleaseParser.preprocess does the same for a vLLM release.
_OPTIMIZATION_LEVELS = ("0", "1", "2", "3")


def _vllm_dashes(key: str) -> str:
    """Underscores to dashes between the leading `--` and the first `.` (0.29.0 line 325,
    0.34.0 line 379: the pattern `(?<=--)[^.]*`, replaced once): `--max_model_len` ->
    `--max-model-len`, `--speculative_config.num_speculative_tokens` ->
    `--speculative-config.num_speculative_tokens`."""
    head, dot, rest = key[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest


def _vllm_config_file(args: Sequence[str], prog: str) -> None:
    """`--config FILE` (parse_args 0.29.0 lines 317-318, 0.34.0 lines 371-372; then
    _pull_args_from_config 0.29.0 lines 496-502, 0.34.0 lines 551-557, and load_config_file
    0.29.0 lines 571-575, 0.34.0 lines 633-637): the release's refusals that do not depend
    on the file, in its words. A YAML file itself is read on the node, which the platform
    cannot do: the tokens are left to argparse, which stores the path (the lab's lists do
    not hold --config, so intake refuses it in the platform's words)."""
    flag = "--config"
    if args.count(flag) > 1:
        raise EngineException(flag, "AssertionError", "More than one config file specified!", prog)
    index = list(args).index(flag)
    if index == len(args) - 1:
        raise EngineException(flag, "ValueError", "No config file specified! Please check your "
                                                  "command-line arguments.", prog)
    extension = args[index + 1].split(".")[-1]
    if extension not in ("yaml", "yml"):
        raise EngineException(flag, "ValueError", f"Config file must be of a yaml/yml type. "
                                                  f"{extension} supplied", prog)


def _vllm_dotted_value(value: str) -> Any:
    """A dotted argument's value (0.29.0 lines 423-431, 0.34.0 lines 477-485): JSON, else
    vLLM's human_readable_int (`80g`, `1k`), else the string as written. Only a JSON decoding
    error falls through; any other exception of json.loads ends the release."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        try:
            return human_readable_int(value)
        except ValueError:  # argparse.ArgumentTypeError is ours too
            return value


def _vllm_merge(original: dict[str, Any], update: Mapping[str, Any]) -> None:
    """recursive_dict_update (0.29.0 lines 367-385, 0.34.0 lines 421-439): dictionaries
    merge key by key, lists extend, anything else is replaced."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(original.get(key), dict):
            _vllm_merge(original[key], value)
        elif isinstance(value, list) and isinstance(original.get(key), list):
            original[key] += value
        else:
            original[key] = value


def vllm_flexible_args(tokens: Sequence[str], prog: str = "vllm serve") -> list[str]:
    """`tokens` as vLLM's FlexibleArgumentParser hands them to argparse:

    - `--config FILE` checked as the release checks it (_vllm_config_file);
    - `--help=WORD` read as `--help`; in every other token starting with `--`, underscores
      turned into dashes up to the first `.` (0.29.0 lines 325-340, 0.34.0 lines 379-394);
    - `-O3`, `-O=3`, `-Odecode` read as `--optimization-level 3` (`decode`): anything after
      `-O` is the level; `-O N` with N one of 0-3 as `--optimization-level N` (0.29.0 lines
      341-352, 0.34.0 lines 395-406). In both releases -O stands for --optimization-level,
      a string flag (VllmConfig.optimization_level, checked when the configuration is built);
    - every token starting with `-` and holding a `.` (`--speculative-config.method eagle3`,
      `-sc.num_speculative_tokens=3`, `--compilation-config.cudagraph_capture_sizes+ 1,2`)
      taken out with its value and merged by the part before the first `.` into one JSON
      object per argument, appended at the end as `--speculative-config '{"method": ...}'`
      (0.29.0 lines 356-446, 0.34.0 lines 410-500): `+` makes a list of the comma-separated
      values, and repeated keys merge (later values win).

    EngineException for what the release refuses with an exception (a dotted argument last
    with no value: IndexError; a value json.loads fails on other than by a decoding error).
    """
    args = list(tokens)
    if "--config" in args:
        _vllm_config_file(args, prog)
    processed: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--help="):
            processed.append("--help")
        elif arg.startswith("--"):
            key, eq, value = arg.partition("=")
            processed.append(_vllm_dashes(key) + eq + value)
        elif arg.startswith("-O") and arg != "-O":
            processed += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in _OPTIMIZATION_LEVELS:
            processed.append("--optimization-level")
        else:
            processed.append(arg)
    delete: set[int] = set()
    merged: dict[str, dict[str, Any]] = {}
    arg = ""
    try:
        for i, arg in enumerate(processed):
            if i in delete or (arg.startswith("--") and "." not in arg):
                continue
            if not (arg.startswith("-") and "." in arg):
                continue
            if "=" in arg:
                arg, value = arg.split("=", 1)
                if "." not in arg:
                    continue  # the `.` was in the value only
            elif i + 1 < len(processed):
                value = processed[i + 1]
                delete.add(i + 1)
            else:
                raise EngineException(arg, "IndexError", "list index out of range", prog)
            if arg.endswith("+"):
                arg = arg[:-1]
                value = json.dumps(value.split(","))
            key, *path = arg.split(".")
            nested: Any = _vllm_dotted_value(value)
            for part in reversed(path):
                nested = {part: nested}
            _vllm_merge(merged.setdefault(key, {}), nested)
            delete.add(i)
        out = [a for i, a in enumerate(processed) if i not in delete]
        for arg, merged_value in merged.items():
            out += [arg, json.dumps(merged_value)]
    except EngineArgError:
        raise
    except (ValueError, RecursionError) as exc:
        # json.loads beyond a decoding error (an integer of more than 4,300 digits, nesting
        # past the recursion limit) or json.dumps of what was merged: the release's
        # traceback ends with the exception.
        raise EngineException(arg, type(exc).__name__, str(exc), prog) from None
    return out


# -- the options of one release ----------------------------------------------------------------
_ACTIONS = {
    "store": "store", "append": "append", "store_true": "store_true",
    "store_false": "store_false", "store_const": "store_const",
    "BooleanOptionalAction": "boolean", "EnableDisableAction": "boolean",
    "LoRAParserAction": "store", "LoRAPathAction": "store",
    "DeprecatedLogConfigFileAction": "store", "DeprecatedStoreTrueAction": "store_true",
    "DeprecatedStoreConstAction": "store_const", "DeprecatedAction": "deprecated",
    "help": "help",
}


@dataclass(frozen=True)
class Option:
    """One option of a release, as its table describes it."""

    key: str
    option_strings: tuple[str, ...]
    dest: str
    action: str  # _ACTIONS' values
    takes_value: bool
    nargs: str | int | None
    choices: tuple[Any, ...] | None
    type_name: str | None
    required: bool
    const: Any
    metavar: str | None
    engine: str = "vllm"  # whose converters `type_name` names (lab.engines.argv.converter)

    @property
    def name(self) -> str:
        """How argparse names it in a message: the option strings joined by '/'."""
        return "/".join(self.option_strings)

    @property
    def effective_nargs(self) -> str | int | None:
        return self.nargs if self.takes_value else 0

    def convert(self, raw: str) -> Any:
        return converter(self.type_name, self.engine)(raw)

    def value_of(self, written: str) -> bool:
        """A switch's value when given as `written` (BooleanOptionalAction: --no-X false;
        vLLM's EnableDisableAction also --disable-X false)."""
        if self.action == "store_false":
            return False
        if self.action == "boolean":
            return not written.startswith(("--no-", "--disable-"))
        return True


def _option(key: str, entry: Mapping[str, Any], engine: str) -> Option:
    action = _ACTIONS.get(entry["action"]) or _ACTIONS.get(entry.get("action_base") or "", "store")
    choices = entry.get("choices")
    if action == "store_const" and entry.get("takes_value"):
        action = "store"  # SGLang's deprecated store-const alias still takes its value
    metavar = entry.get("metavar")
    return Option(key=key, option_strings=tuple(entry["option_strings"]), dest=entry["dest"],
                  action=action, takes_value=bool(entry.get("takes_value")),
                  nargs=entry.get("nargs"),
                  choices=tuple(choices) if choices is not None else None,
                  type_name=entry.get("type"), required=bool(entry.get("required")),
                  const=entry.get("const"),
                  metavar=metavar if isinstance(metavar, str) else None, engine=engine)


_HELP = Option(key="--help", option_strings=("-h", "--help"), dest="help", action="help",
               takes_value=False, nargs=0, choices=None, type_name=None, required=False,
               const=None, metavar=None)


@dataclass(frozen=True)
class Given:
    """One option as a command gave it: the option, how it was written, the tokens it
    took (the option's own first; as the release's argparse received them, so for vLLM after
    its FlexibleArgumentParser's rewriting: `-O3` took `--optimization-level 3`) and its
    converted value."""

    option: Option
    written: str
    tokens: tuple[str, ...]
    value: Any


@dataclass
class Parsed:
    given: list[Given] = field(default_factory=list)
    positionals: dict[str, Any] = field(default_factory=dict)

    def values(self) -> dict[str, Any]:
        """dest -> value, as argparse's namespace holds them (the last given wins;
        `append` options collect)."""
        out: dict[str, Any] = {}
        for g in self.given:
            if g.option.action == "append":
                out.setdefault(g.option.dest, []).append(g.value)
            else:
                out[g.option.dest] = g.value
        return out

    def last(self, dest: str) -> Given | None:
        found = [g for g in self.given if g.option.dest == dest]
        return found[-1] if found else None


def _metavar(option: Option) -> str:
    if option.metavar:
        return option.metavar
    if option.choices is not None:
        return "{" + ",".join(str(c) for c in option.choices) + "}"
    return option.dest.upper()


def _usage_part(option: Option) -> str:
    first = option.option_strings[0]
    if option.action == "boolean":
        return "[" + " | ".join(option.option_strings) + "]"
    if not option.takes_value:
        return f"[{first}]"
    mv = _metavar(option)
    body = {"?": f"[{mv}]", "*": f"[{mv} ...]", "+": f"{mv} [{mv} ...]"}.get(str(option.nargs), mv)
    return f"[{first} {body}]" if not option.required else f"{first} {body}"


class ReleaseParser:
    """The serve command's parser of one engine release (see the module docstring)."""

    def __init__(self, table: Mapping[str, Any]) -> None:
        self.engine: str = table["engine"]
        self.version: str = table["version"]
        self.prog: str = table["prog"]
        self.allow_abbrev: bool = bool(table.get("allow_abbrev", True))
        self._usage: str | None = table.get("usage")
        self.options: tuple[Option, ...] = tuple(_option(k, e, self.engine)
                                                 for k, e in table["flags"].items())
        self.positionals: tuple[dict[str, Any], ...] = tuple(table.get("positionals") or ())
        self._by_string: dict[str, Option] = {}
        for option in (_HELP, *self.options):
            for s in option.option_strings:
                self._by_string.setdefault(s, option)
        self._generated: str | None = None
        self._negative_like = any(_NEGATIVE_NUMBER.match(s) for s in self._by_string)

    # -- lookups ------------------------------------------------------------------------------
    def option(self, name: str) -> Option | None:
        """The option `name` (an exact option string) names, or None."""
        return self._by_string.get(name)

    def has(self, name: str) -> bool:
        return name in self._by_string

    @property
    def usage(self) -> str:
        """The usage line as argparse prints it after "usage: "."""
        if self._usage:
            return str(self._usage).replace("%(prog)s", self.prog)
        return self._generated_usage()

    def _generated_usage(self) -> str:
        if self._generated is not None:
            return self._generated
        self._generated = self._wrapped_usage()
        return self._generated

    def _wrapped_usage(self) -> str:
        parts = ["[-h]", *(_usage_part(o) for o in self.options)]
        parts += [p["name"] if p.get("nargs") is None else f"[{p['name']}]"
                  for p in self.positionals]
        text = " ".join([self.prog, *parts])
        if len("usage: ") + len(text) <= USAGE_WIDTH:
            return text
        indent = " " * (len("usage: ") + len(self.prog) + 1)
        lines: list[str] = []
        line = ""
        for part in parts:
            if line and len(indent) + len(line) + 1 + len(part) > USAGE_WIDTH:
                lines.append(line)
                line = part
            else:
                line = f"{line} {part}" if line else part
        lines.append(line)
        return self.prog + " " + ("\n" + indent).join(lines)

    def error(self, flag: str, message: str) -> EngineArgError:
        return EngineArgError(flag, message, self.prog, self.usage)

    def _arg_error(self, option: Option | None, message: str) -> EngineArgError:
        if option is None:
            return self.error("", message)
        return self.error(option.option_strings[0], f"argument {option.name}: {message}")

    # -- argparse's algorithm -------------------------------------------------------------
    def preprocess(self, tokens: Sequence[str]) -> list[str]:
        """`tokens` as the release's argparse receives them: vLLM's FlexibleArgumentParser
        rewrites them first (vllm_flexible_args); SGLang's plain ArgumentParser takes them as
        given."""
        if self.engine == "vllm":
            return vllm_flexible_args(tokens, self.prog)
        return list(tokens)

    def _option_tuples(self, arg: str) -> list[tuple[Option, str, str | None]]:
        found: list[tuple[Option, str, str | None]] = []
        if arg[1] == "-":
            if not self.allow_abbrev:
                return found
            prefix, eq, explicit = arg.partition("=")
            for s, option in self._by_string.items():
                if s.startswith(prefix):
                    found.append((option, s, explicit if eq else None))
        else:
            short, short_explicit = arg[:2], arg[2:]
            for s, option in self._by_string.items():
                if s == short:
                    found.append((option, s, short_explicit))
                elif s.startswith(arg):
                    found.append((option, s, None))
        return found

    def _classify(self, arg: str) -> tuple[Option | None, str, str | None] | None:
        """None for an argument; (option or None when unknown, option string, inline value)."""
        if not arg or arg[0] != "-":
            return None
        if arg in self._by_string:
            return self._by_string[arg], arg, None
        if len(arg) == 1:
            return None
        if "=" in arg:
            name, _, explicit = arg.partition("=")
            if name in self._by_string:
                return self._by_string[name], name, explicit
        matches = self._option_tuples(arg)
        if len(matches) > 1:
            listed = ", ".join(s for _, s, _ in matches)
            raise self.error(arg, f"ambiguous option: {arg} could match {listed}")
        if len(matches) == 1:
            return matches[0]
        if _NEGATIVE_NUMBER.match(arg) and not self._negative_like:
            return None
        if " " in arg:
            return None
        return None, arg, None

    @staticmethod
    def _count(option: Option, pattern: str) -> int | None:
        nargs = option.effective_nargs
        fixed = {None: "(A)", "?": "(A?)", "*": "(A*)", "+": "(AA*)", 0: "()"}
        regex = fixed[nargs] if nargs in fixed else "(" + "A" * int(nargs or 0) + ")"
        m = re.match(regex, pattern)
        return len(m[1]) if m else None

    def _convert(self, option: Option, raw: str) -> Any:
        try:
            value = option.convert(raw)
        except ArgumentTypeError as exc:
            raise self._arg_error(option, str(exc)) from None
        except (TypeError, ValueError):
            name = getattr(converter(option.type_name, option.engine), "__name__", "str")
            raise self._arg_error(option, f"invalid {name} value: {raw!r}") from None
        if option.choices is not None and value not in option.choices:
            listed = ", ".join(str(c) for c in option.choices)
            raise self._arg_error(option, f"invalid choice: {value!r} (choose from {listed})")
        return value

    def _values(self, option: Option, strings: list[str], written: str) -> Any:
        strings = [s for s in strings if s != "--"]
        if not option.takes_value:
            if option.action == "store_const":
                return option.const
            return option.value_of(written)
        if not strings and option.nargs == "?":
            const = option.const
            return self._convert(option, const) if isinstance(const, str) else const
        if len(strings) == 1 and option.nargs in (None, "?"):
            return self._convert(option, strings[0])
        return [self._convert(option, s) for s in strings]

    def _pattern(self, args: Sequence[str]) -> tuple[str, dict[int, tuple[Option | None, str, str | None]]]:
        """argparse's view of the arguments: one letter each (O an option, A an argument, - the
        `--` after which all are arguments), and the options found by position."""
        pattern: list[str] = []
        found: dict[int, tuple[Option | None, str, str | None]] = {}
        after_dashes = False
        for i, arg in enumerate(args):
            if after_dashes:
                pattern.append("A")
            elif arg == "--":
                pattern.append("-")
                after_dashes = True
            else:
                classified = self._classify(arg)
                if classified is None:
                    pattern.append("A")
                else:
                    found[i] = classified
                    pattern.append("O")
        return "".join(pattern), found

    def parse(self, tokens: Sequence[str], *, partial: bool = False) -> Parsed:
        """`tokens` (the arguments after the program) as the release reads them; an
        EngineArgError for anything it refuses. `partial`: the tail of a command (its extra
        arguments), read as argparse reads them there: the positionals were taken before
        it, and options the whole command requires may be missing."""
        # Given.tokens and the refusals hold the tokens as argparse received them.
        args = tokens = self.preprocess(tokens)
        text, found = self._pattern(args)
        out = Parsed()
        extras: list[str] = []
        positionals = [] if partial else list(self.positionals)

        def take(option: Option, strings: list[str], written: str, used: list[str]) -> None:
            if option.action == "help":
                raise self.error(written, f"{written} prints the help and exits; remove it")
            if option.action == "deprecated":
                raise self._arg_error(option, "is deprecated and refused by this release")
            value = self._values(option, strings, written)
            out.given.append(Given(option, written, tuple(used), value))

        def consume_optional(start: int) -> int:
            option, written, explicit = found[start]
            if option is None:
                extras.append(tokens[start])
                return start + 1
            if explicit is not None:
                count = self._count(option, "A")
                if count == 1:
                    take(option, [explicit], written, [tokens[start]])
                    return start + 1
                raise self._arg_error(option, f"ignored explicit argument {explicit!r}")
            count = self._count(option, text[start + 1:])
            if count is None:
                nargs = option.effective_nargs
                known: dict[str | int | None, str] = {
                    None: "expected one argument", "?": "expected at most one argument",
                    "+": "expected at least one argument"}
                message = known.get(nargs, f"expected {nargs} argument{'s' if nargs != 1 else ''}")
                raise self._arg_error(option, message)
            stop = start + 1 + count
            take(option, args[start + 1:stop], written, list(tokens[start:stop]))
            return stop

        def consume_positionals(start: int) -> int:
            while positionals:
                spec = positionals[0]
                regex = {None: "-*A-*", "?": "-*A?-*", "*": "-*[A-]*", "+": "-*A[A-]*"}.get(
                    spec.get("nargs"), "-*A-*")
                m = re.match(regex, text[start:])
                if not m:
                    break
                strings = [a for a in args[start:start + m.end()] if a != "--"]
                positionals.pop(0)
                if spec.get("nargs") in (None, "?") and len(strings) <= 1:
                    out.positionals[spec["name"]] = strings[0] if strings else None
                else:
                    out.positionals[spec["name"]] = strings
                start += m.end()
            return start

        indices = sorted(found)
        start = 0
        while indices and start <= indices[-1]:
            following = [i for i in indices if i >= start]
            next_option = following[0]
            if start != next_option:
                end = consume_positionals(start)
                if end > start:
                    start = end
                    continue
            if start not in found:
                extras.extend(tokens[start:next_option])
                start = next_option
            start = consume_optional(start)
        stop = consume_positionals(start)
        extras.extend(tokens[stop:])
        seen = {g.option.dest for g in out.given}
        required = [o.name for o in self.options if o.required and o.dest not in seen]
        required += [p["name"] for p in positionals if p.get("nargs") in (None, "+")]
        if required and not partial:
            raise self.error(required[0], "the following arguments are required: "
                                          + ", ".join(required))
        if extras:
            raise self.error(extras[0], "unrecognized arguments: " + " ".join(extras))
        return out


@cache
def release_parser(engine: str, version: str) -> ReleaseParser:
    """The parser of `engine` `version` (LookupError naming the modelled versions)."""
    return ReleaseParser(tables.release(engine, version))


_QUOTED_CHOICE = re.compile(r"invalid choice: (?P<value>'[^']*'|\"[^\"]*\") \(choose from (?P<choices>.*)\)$")


def refused_choice(message: str) -> tuple[str, list[str]] | None:
    """(the value, the accepted names) of an argparse `invalid choice` message, in Python
    3.12's unquoted form or the older quoted one; None for another message."""
    m = _QUOTED_CHOICE.search(message.strip())
    if not m:
        return None
    names = [c.strip().strip("'\"") for c in m["choices"].split(",")]
    return m["value"][1:-1], [n for n in names if n]
