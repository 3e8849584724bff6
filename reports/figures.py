"""How the report prints each kind of figure: one function per kind, used by the report
and by the tests that read the PDF back, so both agree on every digit.

Rates are printed to 0.1 tok/s (the run-to-run spread is about 3 %, so a second decimal
would be noise), cold starts to the second and to 0.1 minute, fractions as percentages.
Negative numbers use a true minus sign and intervals an en dash, as in print.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

MINUS = "\u2212"
DASH = "\u2013"
ARROW = "\u2192"

Formatter = Callable[[float], str]


def _signless(text: str) -> str:
    return text.replace("-", MINUS)


def tps(value: float) -> str:
    """A decode rate in tokens per second: `26.0`."""
    return _signless(f"{value:.1f}")


def seconds_bare(value: float) -> str:
    """A duration in seconds without its unit: whole seconds from 10 s up, else two digits
    (`563`, `4.2`, `0.35`), so that short durations keep their meaning."""
    size = abs(value)
    if size >= 10 or size == 0:
        return _signless(f"{value:.0f}")
    if size >= 1:
        return _signless(f"{value:.1f}")
    return _signless(f"{value:.2f}")


def seconds(value: float) -> str:
    """A lab-time duration: `563 s`, `4.2 s`, `0.35 s`."""
    return seconds_bare(value) + " s"


def minutes(value_s: float) -> str:
    """A duration given in seconds, printed in minutes: `9.4 min`."""
    return _signless(f"{value_s / 60:.1f} min")


def hours(value_s: float) -> str:
    """A long duration given in seconds: in minutes up to two hours, else in hours (`9.4 h`)."""
    if abs(value_s) < 7200:
        return minutes(value_s)
    return _signless(f"{value_s / 3600:.1f} h")


def milliseconds(value_s: float) -> str:
    """A short duration given in seconds, printed in milliseconds: `392 ms`."""
    return _signless(f"{value_s * 1000:.0f} ms")


def percent(fraction: float) -> str:
    """A fraction as a percentage: whole numbers without decimals, others to 0.1 %."""
    pct = fraction * 100
    if math.isclose(pct, round(pct), abs_tol=1e-9):
        return _signless(f"{round(pct)} %")
    return _signless(f"{pct:.1f} %")


def ratio(value: float) -> str:
    """How many times one figure is another: `1.59×`."""
    return _signless(f"{value:.2f}\u00d7")


def number(value: float | int) -> str:
    """A figure with no known unit: integers grouped, others to four significant digits."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) >= 1):
        return _signless(f"{int(value):,}")
    if abs(value) >= 1000:
        return _signless(f"{value:,.0f}")
    return _signless(f"{value:.4g}")


def signed(value: float, fmt: Formatter) -> str:
    """A change with its sign always shown: `+1.9`, `−216 s`."""
    text = fmt(abs(value))
    if value > 0:
        return "+" + text
    if value < 0:
        return MINUS + text
    return text


def interval(ci: Sequence[float], fmt: Formatter) -> str:
    """A 95 % interval: `25.7–26.4`; a signed interval keeps both signs: `−216–−203 s`."""
    lo, hi = ci[0], ci[1]
    return f"{fmt(lo)}{DASH}{fmt(hi)}"


def signed_interval(ci: Sequence[float], fmt: Formatter) -> str:
    """An interval of a change, each bound with its sign: `[+1.4, +2.4]` (kept on one line)."""
    return f"[{signed(ci[0], fmt)},\u00a0{signed(ci[1], fmt)}]"


# Units a metric or evidence key may carry, and how each prints.
UNIT_FORMATS: dict[str, Formatter] = {
    "tok/s": lambda v: f"{tps(v)} tok/s",
    "s": seconds,
    "ms": lambda v: _signless(f"{v:.0f} ms"),
    "fraction": percent,
    "%": lambda v: _signless(f"{v:.1f} %"),
    "MB/s": lambda v: _signless(f"{v:,.1f} MB/s"),
    "Mbit/s": lambda v: _signless(f"{v:,.1f} Mbit/s"),
    "GB": lambda v: _signless(f"{v:,.1f} GB"),
    "GiB": lambda v: _signless(f"{v:,.1f} GiB"),
    "GiB/min": lambda v: _signless(f"{v:,.1f} GiB/min"),
    "GB/s": lambda v: _signless(f"{v:,.2f} GB/s"),
    "×": ratio,
    "": number,
}


def unit_for_key(key: str) -> str:
    """The unit a findings key names by one of its words (`cold_start_s` is seconds,
    `disk_read_mbps_mean` megabytes per second).

    Telemetry spells both disk and network rates `mbps`; the agent's contract makes the
    disk one megabytes and the NIC one megabits per second, so the key's other words decide.
    """
    words = key.lower().replace(".", "_").split("_")
    if "mbps" in words:
        return "Mbit/s" if ("nic" in words or "net" in words) else "MB/s"
    per_minute = words[-2:] == ["per", "min"]
    if per_minute:
        # `page_cache_gib_per_min`: a rate of growth, not a duration in minutes.
        words = words[:-2]
    for word, unit in _UNIT_WORDS:
        if word in words:
            return unit + "/min" if per_minute else unit
    return ""


_UNIT_WORDS = (
    ("tps", "tok/s"),
    ("ms", "ms"),
    ("s", "s"),
    ("pct", "%"),
    ("rate", "fraction"),
    ("gib", "GiB"),
    ("gbs", "GB/s"),
    ("gb", "GB"),
)


def formatter_for(unit: str) -> Formatter:
    """The printer for a unit; an unknown unit prints the bare number followed by it."""
    if unit in UNIT_FORMATS:
        return UNIT_FORMATS[unit]
    return lambda v: f"{number(v)} {unit}"
