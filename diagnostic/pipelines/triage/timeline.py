"""A cold start's timeline per node, read from its engine log: the phases the log marks
(process start, weights, distributed init, kernel JIT, KV cache, graph capture, API ready)
and the stalls (METHODOLOGY.md: 60 s or more without a new log line, or shard-progress
lines more than 30 s apart).

Engine logs stamp lines with month, day and time only (and real nodes may print local
time), so stamps are placed on the node's own clock near a known instant of the launch;
the telemetry sampler runs on that same clock, which is what lets a stall's window be cut
from the node's telemetry exactly.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from lab.engines import parse_log
from lab.engines.logs import read_line

SILENCE_S = 60.0
SHARD_GAP_S = 30.0
# Time zones are whole quarter hours: a stamp this far from the node's clock is local time.
ZONE_STEP_S = 900.0
PHASES = ("process_start", "weights_load", "distributed_init", "kernel_jit", "kv_cache", "graph_capture",
          "api_ready")

# The line that ends each phase, in both engines' words (lab/engines has the formats).
_PHASE_ENDS: dict[str, re.Pattern[str]] = {
    "process_start": re.compile(r"Starting to load model|Load weight begin|Loading \S+ checkpoint shards"),
    "weights_load": re.compile(r"Loading weights took|Model loading took|Load weight end"),
    "distributed_init": re.compile(r"rank \d+ in world size|vLLM is using nccl|Init torch distributed ends"),
    "kernel_jit": re.compile(r"torch\.compile takes|JIT kernels ready|Directly load the compiled graph"),
    "kv_cache": re.compile(r"GPU KV cache size|Maximum concurrency for|KV Cache is allocated"),
    "graph_capture": re.compile(r"Graph capturing finished|Capture cuda graph end"),
    "api_ready": re.compile(r"Starting vLLM API server|The server is fired up|Uvicorn running on"),
}
# NCCL's and torch's words for a bootstrap that keeps failing to connect.
_BOOTSTRAP_RETRY = re.compile(r"\bretrying, attempt \d+")


def _is_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def stamp_epoch(seconds_of_year: float, near: float) -> float:
    """A log stamp (seconds since 1 January on a leap-year calendar, no year) as the epoch
    closest to `near`: the year is taken from `near`, or the one before or after it."""
    year = datetime.fromtimestamp(near, UTC).year
    best: float | None = None
    for y in (year - 1, year, year + 1):
        base = datetime(y, 1, 1, tzinfo=UTC).timestamp()
        value = base + seconds_of_year
        if not _is_leap(y) and seconds_of_year >= 60 * 86400:
            value -= 86400  # the leap-year calendar counted a 29 February this year lacks
        if best is None or abs(value - near) < abs(best - near):
            best = value
    assert best is not None
    return best


@dataclass(frozen=True)
class Line:
    epoch: float | None  # node clock; None for lines without a stamp (NCCL's own)
    message: str


@dataclass
class Stall:
    start: float  # node-clock epoch of the last line before the silence
    end: float  # of the first line after it
    kinds: list[str]  # "silence" (>= 60 s without a line), "shards" (progress lines > 30 s apart)
    longest_gap_s: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class NodeTimeline:
    node: str
    t0: float  # node-clock epoch of this launch's first line
    lines: list[Line]
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)
    zone_offset_s: float = 0.0
    lab_offset_s: float = 0.0  # lab time = node clock + this (the session's start correction)

    def phase_end(self, name: str) -> float | None:
        return next((end for n, _, end in self.phases if n == name), None)

    def bootstrap_retries(self, start: float, end: float) -> int:
        """Bootstrap retry attempts logged in [start, end] (untimed NCCL lines count where
        the stamped lines around them fall in the window)."""
        count, last = 0, None
        for line in self.lines:
            if line.epoch is not None:
                last = line.epoch
            if last is not None and start - 1 <= last <= end + 1 and _BOOTSTRAP_RETRY.search(line.message):
                count += 1
        return count


def read_segment(node: str, engine: str, text: str, *, launched_near: float,
                 until: float | None = None) -> NodeTimeline | None:
    """The timeline of the launch made at `launched_near` (node clock, no later than the
    engine's first line), from a node's engine log (`text` may hold earlier launches and
    later serving lines: only lines stamped from then on, and up to `until` when given, are
    this start's)."""
    raw = text.splitlines()
    stamps: list[float | None] = []
    for number, physical in enumerate(raw, 1):
        line = read_line(number, physical.split("\r")[-1])
        stamps.append(None if line.ts is None else float(line.ts))
    known = [s for s in stamps if s is not None]
    if not known:
        return None
    # Place the stamps on the node's clock; a quarter-hour-whole offset is its time zone.
    placed_first = [stamp_epoch(s, launched_near) for s in known]
    nearest = min(placed_first, key=lambda e: abs(e - launched_near))
    zone = round((nearest - launched_near) / ZONE_STEP_S) * ZONE_STEP_S
    lines: list[Line] = []
    started = False
    for physical, ts in zip(raw, stamps, strict=True):
        epoch = None if ts is None else stamp_epoch(ts, launched_near + zone) - zone
        if not started:
            if epoch is None or epoch < launched_near - 2.0:
                continue
            started = True
        if until is not None and epoch is not None and epoch > until + 2.0:
            break
        lines.append(Line(epoch, physical))
    if not lines or lines[0].epoch is None:
        return None
    timeline = NodeTimeline(node, float(lines[0].epoch), lines, zone_offset_s=zone)
    timeline.phases = _phases(timeline)
    timeline.stalls = _stalls(timeline, engine)
    return timeline


def _phases(timeline: NodeTimeline) -> list[tuple[str, float, float]]:
    """Each phase from the end of the one before to the first line that ends it."""
    out: list[tuple[str, float, float]] = []
    start = timeline.t0
    cursor = 0
    stamped = [(i, ln) for i, ln in enumerate(timeline.lines) if ln.epoch is not None]
    for name in PHASES:
        pattern = _PHASE_ENDS[name]
        hit = next(((i, ln) for i, ln in stamped if i >= cursor and pattern.search(ln.message)), None)
        if hit is None:
            continue
        i, ln = hit
        assert ln.epoch is not None
        out.append((name, start, ln.epoch))
        start, cursor = ln.epoch, i
    return out


def _stalls(timeline: NodeTimeline, engine: str) -> list[Stall]:
    epochs = [ln.epoch for ln in timeline.lines if ln.epoch is not None]
    found: list[Stall] = []
    for a, b in itertools.pairwise(epochs):
        if b - a >= SILENCE_S:
            found.append(Stall(a, b, ["silence"], b - a))
    shard_times = _shard_times(timeline, engine)
    for a, b in itertools.pairwise(shard_times):
        if b - a > SHARD_GAP_S:
            found.append(Stall(a, b, ["shards"], b - a))
    return merge(found)


def _shard_times(timeline: NodeTimeline, engine: str) -> list[float]:
    """When each shard-progress line was written (its line's stamp)."""
    numbered = {i + 1: ln.epoch for i, ln in enumerate(timeline.lines)}
    times = []
    for event in parse_log(engine, (ln.message for ln in timeline.lines)):
        if event["kind"] == "shard_progress":
            epoch = numbered.get(int(event["line"]))
            if epoch is not None:
                times.append(epoch)
    return times


def merge(stalls: Iterable[Stall]) -> list[Stall]:
    """A loader's storms of progress lines make a chain of touching shard gaps: that chain
    is one stall. Silences that merely touch stay apart (the weights end where the
    rendezvous starts); windows that overlap are one."""
    out: list[Stall] = []
    for stall in sorted(stalls, key=lambda s: (s.start, s.end)):
        last = out[-1] if out else None
        chained = last is not None and "shards" in last.kinds and "shards" in stall.kinds \
            and stall.start <= last.end + 1.0
        if last is not None and (chained or stall.start < last.end - 1.0):
            last.end = max(last.end, stall.end)
            last.kinds = sorted(set(last.kinds) | set(stall.kinds))
            last.longest_gap_s = max(last.longest_gap_s, stall.longest_gap_s)
        else:
            out.append(Stall(stall.start, stall.end, list(stall.kinds), stall.longest_gap_s))
    return out


def relative_phases(timeline: NodeTimeline, run: str, origin: float) -> list[dict[str, object]]:
    """The phases as the report draws them: seconds since `origin` (lab time, the launch)."""
    shift = timeline.lab_offset_s - origin
    return [{"run": run, "node": timeline.node, "phase": name, "start_s": round(a + shift, 1),
             "end_s": round(b + shift, 1)} for name, a, b in timeline.phases]

