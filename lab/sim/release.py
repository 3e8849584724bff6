"""What the simulated engine reads from its release's table (lab/engines/releases/*.json).

The simulated engine writes every engine log line from the format string its version's
package holds (`release(engine, version)["lines"][key]["found"][i]["text"]`), filled
here; nothing in the simulator spells an engine line of its own. `Release(engine,
version)` picks a format string (by the file it comes from, or by a piece of its text)
and fills it: `%`-style strings with Python's `%` operator (what the engine's logger
does), f-strings and `str.format` strings by naming each `{expression}` of the string
with its value, so a format string that changes between versions is caught here (a
missing expression raises KeyError) instead of drifting silently.

Also here: the `VLLM_*` names the version reads (its `envs.py` registry), its metric
names, and the flags of an argv as the version reads them (the argv was accepted by
lab.engines.parse_launch first).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from lab.engines.lines import fill_fields
from lab.engines.tables import flag as table_flag
from lab.engines.tables import release as table_release


@dataclass(frozen=True)
class Line:
    """One format string of the release: its text and where the package writes it."""

    text: str
    file: str
    line: int
    # The logger call's level and, for vLLM's *_once calls, its scope ("local": each
    # node's first rank, "global": rank 0 only, "process": every process); None where
    # the table has none (a literal that is not a logger call's message).
    level: str | None = None
    once: str | None = None
    # The table's writers of its key: "rank 0" where only the head writes the line in a
    # multi-node launch, "every rank", or None where the key's lines have mixed writers.
    writers: str | None = None

    @property
    def source(self) -> str:
        """`file.py:N`, as vLLM's log prefix names the line's origin."""
        return f"{PurePosixPath(self.file).name}:{self.line}"

    def pct(self, *args: Any) -> str:
        """A `%`-style format string filled as logging does (`msg % args`)."""
        return self.text % args if args else self.text

    def fmt(self, values: Mapping[str, Any] | None = None, /, **named: Any) -> str:
        """An f-string / str.format string filled: each `{expression[:spec]}` takes the
        value given for that expression's text (`""` for a bare `{}` or `{:03d}`)."""
        return fill_fields(self.text, {**(values or {}), **named})


class Release:
    """One modelled engine release, as the simulated engine reads its table."""

    def __init__(self, engine: str, version: str) -> None:
        self.engine = engine
        self.version = version
        self.table = table_release(engine, version)

    def line(self, key: str, *, file: str | None = None, contains: str | None = None,
             startswith: str | None = None) -> Line:
        """The format string `key` of this release; with several, the first from a file
        ending in `file` and/or whose text contains `contains` / starts with `startswith`.
        LookupError when the release has no such line (a version without it)."""
        found = self.lines(key)
        for entry in found:
            if file is not None and not entry.file.endswith(file):
                continue
            if contains is not None and contains not in entry.text:
                continue
            if startswith is not None and not entry.text.startswith(startswith):
                continue
            return entry
        raise LookupError(f"{self.engine} {self.version} has no {key!r} line"
                          + (f" from {file}" if file else "")
                          + (f" containing {contains!r}" if contains else "")
                          + (f" starting {startswith!r}" if startswith else ""))

    def lines(self, key: str) -> list[Line]:
        entry = self.table["lines"].get(key) or {}
        return [Line(str(f["text"]), str(f["file"]), int(f["line"]), f.get("level"), f.get("once"),
                     entry.get("writers"))
                for f in entry.get("found") or []]

    def has_line(self, key: str, **which: str) -> bool:
        try:
            self.line(key, **which)
        except LookupError:
            return False
        return True

    # -- environment and metrics -------------------------------------------------------

    def reads_env(self, name: str) -> bool:
        """Whether the release's environment registry (vLLM's envs.py) knows `name`."""
        env = self.table.get("env") or {}
        return name in set(env.get("registry") or ()) or name in (env.get("read_directly") or {})

    def unknown_vllm_env(self, env: Mapping[str, str]) -> list[str]:
        """The VLLM_* names of `env` vLLM's registry does not list: vLLM warns about each
        and otherwise ignores it."""
        if self.engine != "vllm":
            return []
        registry = set((self.table.get("env") or {}).get("registry") or ())
        return sorted(n for n in env if n.startswith("VLLM_") and n not in registry)

    def metric(self, name: str) -> str | None:
        """The name `name` is exposed under (`<name>_total` for a counter registered
        without the suffix), or None when the release has no such metric."""
        entry = (self.table.get("metrics") or {}).get(name)
        if entry is None:
            return None
        return str(entry.get("exposed_as") or name)

    # -- flags ---------------------------------------------------------------------------

    def option(self, argv: Sequence[str], option: str) -> tuple[bool, str | None]:
        """(given, value) of `option` in an argv this release accepted: the last
        occurrence wins, as argparse's store does; a flag without a value gives None."""
        entry = table_flag(self.table, option)
        if entry is None:
            return False, None
        names = list(entry["option_strings"])
        takes_value = bool(entry.get("takes_value"))
        given, value = False, None
        i = 0
        while i < len(argv):
            token = argv[i]
            name, eq, inline = token.partition("=")
            canonical = name.replace("_", "-") if self.engine == "vllm" and name.startswith("--") else name
            if canonical in names:
                given = True
                if takes_value:
                    if eq:
                        value = inline
                    elif i + 1 < len(argv):
                        value = argv[i + 1]
                        i += 1
                else:
                    value = None if not canonical.startswith("--no-") else "no"
            i += 1
        return given, value

    def flag_on(self, argv: Sequence[str], option: str) -> bool:
        """Whether a store_true / boolean flag is set (its --no- form unsets it)."""
        given, value = self.option(argv, option)
        return given and value != "no"
