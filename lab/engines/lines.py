"""Log lines as a release writes them, from the format strings its table quotes.

A table's `lines[<key>]["found"]` holds the format strings in the package that write a
line the platform reads: printf style for the logging calls (`"Loading weights took %.2f
seconds"`) and f-string style for the rest (`"Load weight end. elapsed={elapsed:.2f} s,
..."`, whose fields are Python expressions). `fill(text, args, fields)` writes one line:
the printf placeholders take `args` in order, each `{expression[:spec]}` takes
`fields[expression]` (formatted with its spec). `formats(engine, version, key)` lists a
release's format strings for a key. The simulated engine and the tests build their lines
with these, so the lines are the release's, with only the values the lab's own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lab.engines import tables

_PRINTF = re.compile(r"%(?P<spec>[-+ #0]*\d*(?:\.\d+)?[sdfirx%])")


def formats(engine: str, version: str, key: str) -> tuple[str, ...]:
    """The format strings `engine` `version` writes its `key` line with (() when none)."""
    entry = tables.release(engine, version)["lines"].get(key) or {}
    return tuple(found["text"] for found in entry.get("found") or ())


def _brace_fields(text: str) -> Iterable[tuple[int, int, str, str, str]]:
    """(start, end, expression, conversion, spec) of each `{...}` field of an f-string's
    text; `{{` and `}}` are literal braces."""
    i = 0
    while i < len(text):
        c = text[i]
        if c == "{" and text.startswith("{{", i):
            i += 2
            continue
        if c != "{":
            i += 1
            continue
        depth, j, quote = 0, i, ""
        while j < len(text):
            ch = text[j]
            if quote:
                if ch == quote:
                    quote = ""
            elif ch in "'\"":
                quote = ch
            elif ch in "{[(":
                depth += 1
            elif ch in "}])":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        body = text[i + 1:j]
        if body.startswith("%"):
            i += 1  # a printf string's literal brace ("cuda_graph={%s}")
            continue
        expr, conversion, spec = _split_spec(body)
        yield i, j + 1, expr, conversion, spec
        i = j + 1


def _split_spec(body: str) -> tuple[str, str, str]:
    """`expr!conversion:spec` -> (expr, conversion, spec), a colon inside brackets,
    parentheses or quotes not counting (nor the `:=` of an assignment expression)."""
    depth, quote = 0, ""
    for k, ch in enumerate(body):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == ":" and depth == 0 and not body[k:].startswith(":="):
            return body[:k].strip(), "", body[k + 1:]
        elif ch == "!" and depth == 0 and body[k + 1:k + 2] in ("r", "s", "a"):
            return body[:k].strip(), body[k + 1], body[k + 3:]
    return body.strip(), "", ""


def _formatted(value: Any, conversion: str, spec: str) -> str:
    if conversion == "r":
        value = repr(value)
    elif conversion == "a":
        value = ascii(value)
    elif conversion == "s":
        value = str(value)
    return format(value, spec)


def _field_value(fields: Mapping[str, Any], expr: str, text: str) -> Any:
    if expr not in fields:
        raise KeyError(f"no value for {{{expr}}} in {text!r}")
    return fields[expr]


def fill_fields(text: str, fields: Mapping[str, Any]) -> str:
    """An f-string's or str.format's `text` with each `{expression!conversion:spec}` field
    replaced by `fields[expression]` (`""` for a bare `{}`), formatted as Python would; `{{`
    and `}}` are literal braces and `%` stays as it is. KeyError naming the expression when
    a value is missing, so a format string that changes between versions is caught."""
    pieces: list[str] = []
    last = 0
    for start, end, expr, conversion, spec in _brace_fields(text):
        pieces.append(text[last:start].replace("{{", "{").replace("}}", "}"))
        pieces.append(_formatted(_field_value(fields, expr, text), conversion, spec))
        last = end
    pieces.append(text[last:].replace("{{", "{").replace("}}", "}"))
    return "".join(pieces)


def placeholders(text: str) -> tuple[list[str], list[str]]:
    """(the printf conversions in order, the f-string expressions in order) of `text`."""
    printf = [m["spec"] for m in _PRINTF.finditer(text) if m["spec"] != "%"]
    braces = [expr for _, _, expr, _, _ in _brace_fields(text)]
    return printf, braces


def fill(text: str, args: Sequence[Any] = (), fields: Mapping[str, Any] | None = None) -> str:
    """`text` with its printf placeholders filled from `args` (in order) and its `{expr}`
    fields from `fields` (by the expression's text; an empty expression takes the next of
    `args`). KeyError or IndexError when a value is missing."""
    fields = fields or {}
    queue = list(args)

    def printf(m: re.Match[str]) -> str:
        if m["spec"] == "%":
            return "%"
        return ("%" + m["spec"]) % queue.pop(0)

    def literal(part: str) -> str:
        out = _PRINTF.sub(printf, part)
        return out if braced_printf else out.replace("{{", "{").replace("}}", "}")

    braced_printf = any(m["spec"] != "%" for m in _PRINTF.finditer(text)) and \
        not any(True for _ in _brace_fields(text))

    pieces: list[str] = []
    last = 0
    for start, end, expr, conversion, spec in _brace_fields(text):
        pieces.append(literal(text[last:start]))
        value = queue.pop(0) if expr == "" else _field_value(fields, expr, text)
        pieces.append(_formatted(value, conversion, spec))
        last = end
    pieces.append(literal(text[last:]))
    return "".join(pieces)


def pattern_text(text: str) -> str:
    """A format string as a regular expression (unanchored): its literal text escaped, each
    printf placeholder and `{expression[:spec]}` field matching any text."""
    out: list[str] = []
    last = 0
    for start, end, _, _, _ in _brace_fields(text):
        out.append(_printf_pattern(text[last:start]))
        out.append(".*?")
        last = end
    out.append(_printf_pattern(text[last:]))
    return "".join(out)


def _printf_pattern(part: str) -> str:
    pieces: list[str] = []
    last = 0
    for m in _PRINTF.finditer(part):
        pieces.append(re.escape(part[last:m.start()].replace("{{", "{").replace("}}", "}")))
        pieces.append("%" if m["spec"] == "%" else ".*?")
        last = m.end()
    pieces.append(re.escape(part[last:].replace("{{", "{").replace("}}", "}")))
    return "".join(pieces)


def line_pattern(engine: str, keys: Iterable[str], version: str | None = None) -> re.Pattern[str]:
    """One expression matching (by search) any line a release writes for any of `keys`
    (the format strings its table quotes): the given `version`'s, or every modelled
    version's when None. Never matches when no release writes such a line."""
    versions = [version] if version is not None else list(tables.modelled_versions(engine))
    texts = sorted({text for v in versions for key in keys for text in formats(engine, v, key)})
    if not texts:
        return re.compile(r"(?!)")
    return re.compile("|".join(f"(?:{pattern_text(t)})" for t in texts))
