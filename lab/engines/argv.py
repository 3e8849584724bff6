"""Reading an engine's argv as the released version's argparse does, from its table.

`release_parser(engine, version)` builds, from lab/engines/releases/<engine>-<version>.json
(lab.engines.tables), a parser that reads tokens the way that version's serve command
does: its option strings (BooleanOptionalAction's `--no-X`, vLLM's `--disable-X`
spellings and short names such as `-tp`, `-sc`), prefix abbreviations when the table says
`allow_abbrev` (with argparse's `ambiguous option` refusal), `--flag=value`, nargs (`?`,
`+`, `*`), switches, the value converters the table names (int, float, json.loads,
vLLM's optional_type / human_readable_int[_or_auto] / the backend-name lambda, ...),
choices checked after the conversion, and required options. A refusal is an
EngineArgError whose str() is what argparse prints before it exits 2: the version's
usage line, then `<prog>: error: <message>`, in Python 3.12's wording (choices listed
`choose from a, b, c`).

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


class ArgumentTypeError(ValueError):
    """A converter's refusal in its own words (argparse.ArgumentTypeError)."""


# -- value converters, by the name the table gives them --------------------------------------
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(value: str) -> int:
    """262144, 256K (x1024) or 262.144k (x1000); a decimal with a binary suffix is refused."""
    value = value.strip()
    m = _HUMAN.fullmatch(value)
    if m:
        number, suffix = m.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        try:
            return int(number) * _BINARY[suffix]
        except ValueError:
            raise ArgumentTypeError(f"Decimals are not allowed with binary suffixes like "
                                    f"{suffix}. Did you mean to use {number}{suffix.lower()} "
                                    "instead?") from None
    return int(value)


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


@cache
def converter(type_name: str | None) -> Callable[[str], Any]:
    """The converter a table's `type` names (a string for None: argparse's default)."""
    if type_name is None:
        return _identity("str")
    if type_name in _SIMPLE:
        return _SIMPLE[type_name]
    if m := re.fullmatch(r"optional_type\((.*)\)", type_name):
        return _optional(converter(m[1]))
    if m := re.fullmatch(r"parse_type\((.*)\)", type_name):
        inner = converter(m[1])
        return _parse_type(inner, f"<function {getattr(inner, '__name__', m[1])}>")
    if m := re.fullmatch(r"parse_dataclass\((\w+)\)", type_name):
        return _json_object(m[1])
    # A converter the platform does not know (parse_reasoning_parser, SGLang's cuda-graph
    # parsers): the value is kept as written, and the engine judges it after parsing.
    return _identity(type_name.split("(")[0])


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

    @property
    def name(self) -> str:
        """How argparse names it in a message: the option strings joined by '/'."""
        return "/".join(self.option_strings)

    @property
    def effective_nargs(self) -> str | int | None:
        return self.nargs if self.takes_value else 0

    def convert(self, raw: str) -> Any:
        return converter(self.type_name)(raw)

    def value_of(self, written: str) -> bool:
        """A switch's value when given as `written` (BooleanOptionalAction: --no-X false;
        vLLM's EnableDisableAction also --disable-X false)."""
        if self.action == "store_false":
            return False
        if self.action == "boolean":
            return not written.startswith(("--no-", "--disable-"))
        return True


def _option(key: str, entry: Mapping[str, Any]) -> Option:
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
                  metavar=metavar if isinstance(metavar, str) else None)


_HELP = Option(key="--help", option_strings=("-h", "--help"), dest="help", action="help",
               takes_value=False, nargs=0, choices=None, type_name=None, required=False,
               const=None, metavar=None)


@dataclass(frozen=True)
class Given:
    """One option as a command gave it: the option, how it was written, the tokens it
    took (verbatim, the option's own first) and its converted value."""

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
        self.options: tuple[Option, ...] = tuple(_option(k, e) for k, e in table["flags"].items())
        self.positionals: tuple[dict[str, Any], ...] = tuple(table.get("positionals") or ())
        self._by_string: dict[str, Option] = {}
        for option in (_HELP, *self.options):
            for s in option.option_strings:
                self._by_string.setdefault(s, option)
        self._by_dest: dict[str, Option] = {}
        for option in self.options:
            self._by_dest.setdefault(option.dest, option)
        self._generated: str | None = None
        self._negative_like = any(_NEGATIVE_NUMBER.match(s) for s in self._by_string)

    # -- lookups ------------------------------------------------------------------------------
    def option(self, name: str) -> Option | None:
        """The option `name` (an exact option string) names, or None."""
        return self._by_string.get(name)

    def by_dest(self, dest: str) -> Option | None:
        return self._by_dest.get(dest)

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
    def _normalized(self, token: str) -> str:
        """vLLM's FlexibleArgumentParser reads --tensor_parallel_size as
        --tensor-parallel-size before argparse sees it."""
        if self.engine == "vllm" and token.startswith("--"):
            key, eq, value = token.partition("=")
            return "--" + key[2:].replace("_", "-") + eq + value
        return token

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
            name = getattr(converter(option.type_name), "__name__", "str")
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

    def parse(self, tokens: Sequence[str], *, partial: bool = False) -> Parsed:
        """`tokens` (the arguments after the program) as the release reads them; an
        EngineArgError for anything it refuses. `partial`: the tail of a command (its extra
        arguments), read as argparse reads them there: the positionals were taken before
        it, and options the whole command requires may be missing."""
        args = [self._normalized(t) for t in tokens]
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
        text = "".join(pattern)
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
