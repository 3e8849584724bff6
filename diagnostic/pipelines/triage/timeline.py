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
from functools import cache

from lab.engines import parse_log
from lab.engines.lines import line_pattern
from lab.engines.logs import read_line

SILENCE_S = 60.0
SHARD_GAP_S = 30.0
# Time zones are whole quarter hours: a stamp this far from the node's clock is local time.
ZONE_STEP_S = 900.0
# Both engines' real order (LAB_MODEL.md section 5): the ranks meet (distributed init)
# right after the process has started, before any weight is read; then model init (the
# kernel backends are chosen and logged), the weights, compile/JIT, KV cache, graphs, API.
PHASES = ("process_start", "distributed_init", "model_init", "weights_load", "kernel_jit", "kv_cache",
          "graph_capture", "api_ready")

# The lines that end each phase, by their keys in the release tables
# (lab/engines/releases/<engine>-<version>.json `lines`, the format strings the packages
# write them with): patterns are built from the version's own strings, so a line one
# release writes and another does not (SGLang 0.5.12's "Init torch distributed begin.",
# 0.5.23's "Init parallel begin.") ends a phase only where it is written. A phase whose
# line a version does not write (SGLang logs no compile line) is left out of the timeline.
PHASE_END_LINES: dict[str, tuple[str, ...]] = {
    # The rendezvous begins, where a line says so (SGLang). vLLM at INFO writes no stamped
    # line of its own from its start to model init: the timeline begins at the launch
    # (read_segment's `started`) and distributed_init spans the process start as well.
    "process_start": ("dist_init_begin",),
    # The ranks have met: SGLang says so; vLLM's next lines are model init's (the kernels
    # chosen) or the weights'. SGLang 0.5.23's MoE runner line is not among them: it is
    # written while the arguments are read, before any rank meets another.
    "distributed_init": ("dist_init_end", "moe_backend", "nvfp4_linear_kernel", "marlin_fp4",
                         "load_model_begin", "load_weight_begin", "shard_progress"),
    # Model init ends where the weights start to be read.
    "model_init": ("load_model_begin", "load_weight_begin", "shard_progress"),
    "weights_load": ("weights_loaded", "model_loading", "load_weight_end"),
    "kernel_jit": ("torch_compile", "compile_cache_hit"),
    "kv_cache": ("kv_cache_size", "kv_cache_allocated", "memory_pool_end"),
    "graph_capture": ("graph_capture", "cuda_graph_capture_end"),
    "api_ready": ("api_server_start", "server_ready"),
}
# Where a node writes none of a phase's ending lines, the line that ends it there: vLLM's
# cache size in tokens comes from the head's engine core only (the tables' `writers`), and
# a --headless worker ends its KV phase with its own "Available KV cache memory" line.
PHASE_FALLBACK_LINES: dict[str, tuple[str, ...]] = {"kv_cache": ("available_kv_memory",)}
# The first lines after the rendezvous that only model init or the weights write.
MODEL_OR_WEIGHTS_LINES = ("moe_backend", "nvfp4_linear_kernel", "marlin_fp4", "load_model_begin",
                          "load_weight_begin", "shard_progress", "weights_loaded", "load_weight_end")
# NCCL's words (with NCCL_DEBUG=INFO only; NCCL is not the engine, and its lines are in no
# release table) for a bootstrap connect that keeps failing: "... retrying (n/m) ..." in
# current releases, "Call to connect returned ..., retrying" in older ones.
_BOOTSTRAP_RETRY = re.compile(r"\bretrying \(\d+/\d+\)|Call to connect returned .*, retrying")
# A line NCCL writes only when NCCL_DEBUG=INFO is set.
_NCCL_INFO = re.compile(r"\bNCCL INFO\b")


@cache
def phase_ends(engine: str, version: str | None) -> dict[str, re.Pattern[str]]:
    """Each phase's ending lines as `engine` `version` writes them (every modelled version's
    when None)."""
    return {phase: line_pattern(engine, keys, version) for phase, keys in PHASE_END_LINES.items()}


@cache
def phase_fallbacks(engine: str, version: str | None) -> dict[str, re.Pattern[str]]:
    """PHASE_FALLBACK_LINES as `engine` `version` writes them."""
    return {phase: line_pattern(engine, keys, version) for phase, keys in PHASE_FALLBACK_LINES.items()}


@cache
def model_or_weights(engine: str, version: str | None) -> re.Pattern[str]:
    return line_pattern(engine, MODEL_OR_WEIGHTS_LINES, version)


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
    engine: str = "vllm"
    version: str | None = None  # the release that wrote the log (None: any modelled one)

    def phase_end(self, name: str) -> float | None:
        return next((end for n, _, end in self.phases if n == name), None)

    def nccl_lines(self) -> int:
        """How many NCCL INFO lines the start wrote (none without NCCL_DEBUG=INFO)."""
        return sum(1 for line in self.lines if _NCCL_INFO.search(line.message))

    def first_weights_line(self) -> float | None:
        """When the node wrote its first model-init or weights line (node clock): a
        rendezvous, which comes before both, has ended by then. None when it wrote none."""
        pattern = model_or_weights(self.engine, self.version)
        for line in self.lines:
            if line.epoch is not None and pattern.search(line.message):
                return line.epoch
        return None

    def bootstrap_retries(self, start: float, end: float) -> int:
        """Bootstrap retry attempts logged in [start, end] (untimed NCCL lines count where
        the stamped line before them falls in the window; before the first, the process
        start)."""
        count, last = 0, self.t0
        for line in self.lines:
            if line.epoch is not None:
                last = line.epoch
            if start - 1 <= last <= end + 1 and _BOOTSTRAP_RETRY.search(line.message):
                count += 1
        return count


def read_segment(node: str, engine: str, text: str, *, launched_near: float,
                 until: float | None = None, started: float | None = None,
                 version: str | None = None) -> NodeTimeline | None:
    """The timeline of the launch made at `launched_near` (node clock, no later than the
    engine's first line), from a node's engine log (`text` may hold earlier launches and
    later serving lines: only lines stamped from then on, and up to `until` when given, are
    this start's). `version`: the release that wrote it, whose lines end its phases.

    `started`: when the process was started (node clock), as the launch itself reported
    it. The timeline begins there when the log's first stamped line comes later: the
    released engines write no stamped line of their own between the process start and the
    end of the rendezvous (vLLM's first is model init's backend choice, SGLang's the
    weights' "Load weight begin"; NCCL's lines carry no stamp), so a rendezvous stall is a
    silence that begins at the launch. NCCL's unstamped lines written before the first
    stamped one belong to the start too."""
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
    # Unstamped lines (NCCL's) since the last stamped line of an earlier launch: this
    # launch's when its first stamped line follows them.
    pending: list[Line] = []
    inside = False
    for physical, ts in zip(raw, stamps, strict=True):
        epoch = None if ts is None else stamp_epoch(ts, launched_near + zone) - zone
        if not inside:
            if epoch is None:
                pending.append(Line(None, physical))
                continue
            if epoch < launched_near - 2.0:
                pending = []
                continue
            inside = True
            lines += pending
        if until is not None and epoch is not None and epoch > until + 2.0:
            break
        lines.append(Line(epoch, physical))
    first = next((ln.epoch for ln in lines if ln.epoch is not None), None)
    if first is None:
        return None
    t0 = first if started is None else min(first, started)
    timeline = NodeTimeline(node, t0, lines, zone_offset_s=zone, engine=engine, version=version)
    timeline.phases = _phases(timeline)
    timeline.stalls = _stalls(timeline, engine)
    return timeline


def _phases(timeline: NodeTimeline) -> list[tuple[str, float, float]]:
    """Each phase from the end of the one before to the first line that ends it."""
    out: list[tuple[str, float, float]] = []
    start = timeline.t0
    cursor = 0
    stamped = [(i, ln) for i, ln in enumerate(timeline.lines) if ln.epoch is not None]
    ends = phase_ends(timeline.engine, timeline.version)
    fallbacks = phase_fallbacks(timeline.engine, timeline.version)
    for name in PHASES:
        pattern = ends[name]
        hit = next(((i, ln) for i, ln in stamped if i >= cursor and pattern.search(ln.message)), None)
        if hit is None and name in fallbacks:
            hit = next(((i, ln) for i, ln in stamped if i >= cursor and fallbacks[name].search(ln.message)),
                       None)
        if hit is None:
            continue
        i, ln = hit
        assert ln.epoch is not None
        out.append((name, start, ln.epoch))
        start, cursor = ln.epoch, i
    return out


def _stalls(timeline: NodeTimeline, engine: str) -> list[Stall]:
    # From the process start on (the timeline's t0, which may precede the first line); the
    # progress bar's updates are output too, though tqdm stamps none of them.
    shard_times = _shard_times(timeline, engine)
    epochs = sorted([timeline.t0, *(ln.epoch for ln in timeline.lines if ln.epoch is not None),
                     *shard_times])
    found: list[Stall] = []
    for a, b in itertools.pairwise(epochs):
        if b - a >= SILENCE_S:
            found.append(Stall(a, b, ["silence"], b - a))
    for a, b in itertools.pairwise(shard_times):
        if b - a > SHARD_GAP_S:
            found.append(Stall(a, b, ["shards"], b - a))
    return merge(found)


def _shard_times(timeline: NodeTimeline, engine: str) -> list[float]:
    """When each shard-progress update was written (node clock).

    The released engines draw the bar with tqdm, which writes to stderr with no logger
    prefix: its updates carry no stamp, only the bar's own elapsed time ("[01:12<...]"),
    each after a carriage return on one physical line. An update is placed at the bar's
    start plus its elapsed time; the bar starts (elapsed 00:00) no earlier than the last
    stamped line before it, which is where it is anchored (whole seconds: the shard-gap
    rule's 30 s is far coarser). A bar line that does carry a stamp is placed by it."""
    # The last stamp at or before each line (1-based, as parse_log numbers them).
    stamped_before = [timeline.t0]
    for ln in timeline.lines:
        stamped_before.append(stamped_before[-1] if ln.epoch is None else ln.epoch)
    times: list[float] = []
    anchor: float | None = None
    for event in parse_log(engine, (ln.message for ln in timeline.lines)):
        if event["kind"] != "shard_progress":
            continue
        number = int(event["line"])
        elapsed = event.get("elapsed_s")
        if timeline.lines[number - 1].epoch is not None:
            times.append(stamped_before[number])  # a bar line that carries a stamp
        elif elapsed is not None:
            if anchor is None or float(elapsed) == 0.0:
                anchor = stamped_before[number]
            times.append(anchor + float(elapsed))
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

