"""One true cold start, observed: the launch's figures, every node's log timeline and 1 Hz
telemetry frame, and its stalls attributed by signature.

`observe` runs one (engine stopped everywhere and page cache dropped by the session, the
sampler on before the launch); `from_reproduce` rebuilds the same from the cold start the
reproduce stage already ran, so the customer's start is not paid for twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from diagnostic.pipelines.triage import frames as fr
from diagnostic.pipelines.triage.fixes import nic_roles
from diagnostic.pipelines.triage.signatures import (
    FAULTS,
    GPU_WORK,
    INCOMPLETE,
    RENDEZVOUS,
    UNEXPLAINED,
    Verdict,
    classify,
)
from diagnostic.pipelines.triage.timeline import NodeTimeline, read_segment
from lab.session import LabError, LabSession, LaunchResult

LAUNCH_TIMEOUT_LAB_S = 3600.0
# The variable and level that make NCCL write its INFO lines (observation starts only).
NCCL_DEBUG = "NCCL_DEBUG"
NCCL_DEBUG_LEVEL = "INFO"
# Reproduce keeps only the last rank's start; the first started at most this long before
# (the launch calls go out in parallel; a fast simulated lab stretches their seconds).
REPRODUCE_START_SPREAD_S = 60.0
# What is left of a stall once the part before the last rank started is cut off must
# still be a stall's worth (the shard-gap rule's 30 s).
MIN_CLIPPED_STALL_S = 30.0


@dataclass
class StallGroup:
    """One stall as the nodes saw it together (the same silence on several nodes)."""

    start_s: float  # seconds since the launch (ColdStart.origin)
    end_s: float
    members: dict[str, tuple[float, float]]  # node -> its own window (node clock)
    verdict: Verdict
    representative: str
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)  # every node's window
    bootstrap_retries: int = 0

    @property
    def cause(self) -> str:
        return self.verdict.cause

    @property
    def silent_s(self) -> float:
        return max(b - a for a, b in self.members.values())


@dataclass
class ColdStart:
    """A true cold start and what its evidence says."""

    run: str
    config: dict[str, Any]
    cold_start_s: float
    started_at: float
    lab_s: float  # lab seconds this observation cost (0 when it was reproduce's)
    nodes: list[str]
    timelines: dict[str, NodeTimeline]
    frames: dict[str, pd.DataFrame]
    stalls: list[StallGroup] = field(default_factory=list)
    missing_logs: list[str] = field(default_factory=list)
    # Every true cold start of this configuration measured (this one first); with more
    # than one, `cold_start_s` is their mean. The stalls and timelines here are this first
    # start's; each other start keeps its own in `repeats`.
    samples_s: list[float] = field(default_factory=list)
    # The other true cold starts whose seconds are in `samples_s`, each with its own
    # evidence: each is a start of its own for the proof on the phases.
    repeats: list[ColdStart] = field(default_factory=list)
    # This start's own seconds (`cold_start_s` becomes the mean once samples are added).
    own_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.samples_s:
            self.samples_s = [self.cold_start_s]
        if not self.own_s:
            self.own_s = self.cold_start_s

    def add_start(self, other: ColdStart, *, first: bool = False) -> None:
        """Another true cold start of the same configuration: its seconds join the samples
        (as the first when `first`: it was taken earlier) and its evidence the phases'."""
        if first:
            self.samples_s.insert(0, other.own_s)
            self.repeats.insert(0, other)
        else:
            self.samples_s.append(other.own_s)
            self.repeats.append(other)
        self.cold_start_s = sum(self.samples_s) / len(self.samples_s)

    def physical(self) -> list[ColdStart]:
        """Each true cold start behind this one's samples that kept its evidence, this one
        first."""
        return [self, *self.repeats]

    @property
    def causes(self) -> list[str]:
        """The fault signatures this start shows, in the order of the faults' list."""
        seen = {g.cause for g in self.stalls}
        return [c for c in FAULTS if c in seen]

    @property
    def origin(self) -> float:
        """Lab time of the first rank's first log line: where the timeline's seconds count from."""
        if not self.timelines:
            return self.started_at
        return min(tl.t0 + tl.lab_offset_s for tl in self.timelines.values())

    def groups(self, cause: str) -> list[StallGroup]:
        return [g for g in self.stalls if g.cause == cause]


def _roles(facts: Mapping[str, Any], node: str) -> fr.NicRoles:
    data = facts.get(node)
    return nic_roles(data) if isinstance(data, Mapping) else fr.NicRoles((), ())


def build(run: str, config: dict[str, Any], engine: str, *, cold_start_s: float, launched_from: float,
          started_at: float, ready_at: float, corrections: Mapping[str, float], logs: Mapping[str, str],
          samples: Mapping[str, Sequence[Mapping[str, Any]]], facts: Mapping[str, Any],
          nodes: Sequence[str], lab_s: float) -> ColdStart:
    """A ColdStart from its raw evidence. Lab times: `launched_from` no later than the first
    rank's start, `started_at` the last rank's, `ready_at` the API's first answer; each
    node's clock is the lab's minus the correction the session applied to its start."""
    timelines: dict[str, NodeTimeline] = {}
    missing: list[str] = []
    for node in nodes:
        offset = float(corrections.get(node, 0.0))
        near = launched_from - offset
        # The process started by `started_at` at the latest (the last rank's start): the
        # timeline begins there, for the engines log nothing until the ranks have met.
        timeline = read_segment(node, engine, logs.get(node, ""), launched_near=near,
                                until=ready_at - offset + 1.0, started=started_at - offset,
                                version=(config.get("engine") or {}).get("version"))
        if timeline is None:
            missing.append(node)
        else:
            timeline.lab_offset_s = offset
            timelines[node] = timeline
    frames = {node: fr.node_frame(samples.get(node) or [], _roles(facts, node)) for node in nodes}
    start = ColdStart(run, config, cold_start_s, started_at, lab_s, list(nodes), timelines, frames,
                      missing_logs=missing)
    start.stalls = attribute(start)
    return start


def attribute(start: ColdStart) -> list[StallGroup]:
    """Group each node's stalls with the same silence on the other nodes (on the lab's
    clock: ranks start seconds apart and wait for each other), then read every node's
    telemetry over that window against the signatures."""
    origin = start.origin
    spans = []
    # When the last rank finished loading its weights (lab clock): a rank that reaches
    # the rendezvous earlier waits for it, and that wait belongs to whatever held the
    # other rank up (its loader, or its starting later), not to the rendezvous.
    loaded = [end + tl.lab_offset_s for tl in start.timelines.values()
              if (end := tl.phase_end("weights_load")) is not None]
    last_loaded = max(loaded) if len(loaded) == len(start.timelines) else None
    for node, tl in start.timelines.items():
        own_loaded = tl.phase_end("weights_load")
        for s in tl.stalls:
            # The cold start counts from the last rank's start: a rank started earlier
            # waits for the others, and that wait is the launcher's, not the engine's.
            lab_a = max(s.start + tl.lab_offset_s, start.started_at)
            if last_loaded is not None and own_loaded is not None and s.start >= own_loaded - 1.0:
                lab_a = max(lab_a, last_loaded)
            lab_b = s.end + tl.lab_offset_s
            if lab_b - lab_a >= MIN_CLIPPED_STALL_S:
                spans.append((lab_a, lab_b, node, lab_a - tl.lab_offset_s, s.end))
    spans.sort(key=lambda x: x[0])
    raw_groups: list[list[tuple[float, float, str, float, float]]] = []
    for span in spans:
        if raw_groups and span[0] < max(s[1] for s in raw_groups[-1]) - 1.0 \
                and span[2] not in {s[2] for s in raw_groups[-1]}:
            raw_groups[-1].append(span)
        else:
            raw_groups.append([span])
    out = []
    for members in raw_groups:
        lab_start = min(s[0] for s in members)
        lab_end = max(s[1] for s in members)
        own = {s[2]: (s[3], s[4]) for s in members}
        windows: dict[str, tuple[float, float]] = {}
        for node in start.nodes:
            if node in own:
                windows[node] = own[node]
            elif node in start.timelines:
                shift = start.timelines[node].lab_offset_s
                windows[node] = (lab_start - shift, lab_end - shift)
        summaries = {node: fr.summarize(fr.window(start.frames[node], a, b))
                     for node, (a, b) in windows.items()}
        after_weights = all(
            (end := start.timelines[node].phase_end("weights_load")) is not None and a >= end - 1.0
            for node, (a, _) in own.items())
        # The rendezvous comes right after process start: its silence ends no later than
        # the node's first model-init or weights line.
        before_weights = all(
            (first := start.timelines[node].first_weights_line()) is None or b <= first + 1.0
            for node, (_, b) in own.items())
        verdict = classify(summaries, sorted(own), after_weights=after_weights,
                           before_weights=before_weights)
        head = start.nodes[0]
        representative = head if head in own else sorted(own)[0]
        group = StallGroup(round(lab_start - origin, 1), round(lab_end - origin, 1), own, verdict,
                           representative, windows)
        if verdict.cause == RENDEZVOUS and verdict.late_node in start.timelines:
            a, b = windows[verdict.late_node]
            late_timeline = start.timelines[verdict.late_node]
            group.bootstrap_retries = late_timeline.bootstrap_retries(a, b)
            # NCCL's retry lines are evidence only where the start asked NCCL for them.
            verdict.decided_by["nccl_debug_lines"] = late_timeline.nccl_lines()
            verdict.decided_by["bootstrap_retries_logged"] = group.bootstrap_retries
        out.append(group)
    return out


def _each(nodes: Sequence[str], fn: Callable[[str], Any]) -> dict[str, Any]:
    """fn for every node at once: each node is its own SSH connection, and one after the
    other would spend lab time on round trips alone."""
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        return dict(zip(nodes, pool.map(fn, nodes), strict=True))


def launch_offsets(nodes: Sequence[str]) -> dict[str, int]:
    """Where a launch's lines begin in each node's engine log: at 0, since every launch
    writes a log of its own (the node agent moves the previous one aside)."""
    return {node: 0 for node in nodes}


def _logs_since(session: LabSession, offsets: Mapping[str, int]) -> dict[str, str]:
    def text(node: str) -> str:
        try:
            return session.logs(node, since=offsets.get(node, 0)).text
        except LabError:
            return ""
    return _each(list(offsets), text)


def observed(config: Mapping[str, Any]) -> dict[str, Any]:
    """What an observation start launches: `config` with NCCL asked for its INFO lines
    (the bootstrap interface it chose, its connect retries), which it writes only with
    NCCL_DEBUG=INFO. Only the diagnostic's own starts carry it: the configuration the
    triage proves and hands on is `config` itself. A customer's own NCCL_DEBUG is kept."""
    env = dict(config.get("env") or {})
    if "NCCL_DEBUG" in env:
        return dict(config)
    env[NCCL_DEBUG] = NCCL_DEBUG_LEVEL
    return {**config, "env": env}


def observe(session: LabSession, config: dict[str, Any], run: str, *, facts: Mapping[str, Any],
            check_cancelled: Callable[[], None], cold: bool = True, nccl_debug: bool = True) -> ColdStart:
    """Launch `config` from cold (every engine stopped, page cache dropped) with the sampler
    running and, with `nccl_debug`, NCCL_DEBUG=INFO (`observed`), and read its evidence.
    The ColdStart carries `config`, never the observation's variable."""
    began = session.clock.now()
    launching = observed(config) if nccl_debug else dict(config)
    nodes = [spec["node"] for spec in session.specs_for(launching)]
    offsets = launch_offsets(nodes)
    session.start_sampler(nodes)
    since = session.clock.now() - 2.0
    launched: LaunchResult = session.launch(launching, cold=cold, timeout_s=LAUNCH_TIMEOUT_LAB_S)
    check_cancelled()
    samples = session.telemetry(since=since, nodes=nodes)
    logs = _logs_since(session, offsets)
    return build(run, config, str(config["engine"]["name"]), cold_start_s=launched.cold_start_s,
                 launched_from=since, started_at=launched.started_at, ready_at=launched.ready_at,
                 corrections=launched.start_corrections_s, logs=logs, samples=samples, facts=facts,
                 nodes=nodes, lab_s=session.clock.now() - began)


def from_reproduce(session: LabSession, config: dict[str, Any], result: Mapping[str, Any], *,
                   facts: Mapping[str, Any]) -> tuple[ColdStart | None, str]:
    """The reproduce stage's cold start as a ColdStart, or None and why it cannot serve:
    it must be a true cold start of this very configuration with 1 Hz telemetry."""
    if not result.get("launched") or result.get("warm"):
        return None, "reproduce did not record a true cold start"
    telemetry = result.get("telemetry")
    if not isinstance(telemetry, Mapping) or not telemetry:
        return None, "reproduce kept no telemetry"
    strides = result.get("telemetry_stride") or {}
    if any(int(v) > 1 for v in strides.values()):
        return None, "reproduce kept its telemetry thinned, not at 1 Hz"
    specs = session.specs_for(config)
    launched = {str(s.get("node")): (s.get("argv"), s.get("env")) for s in result.get("launch") or []}
    if any(launched.get(s["node"]) != (s["argv"], s["env"]) for s in specs):
        return None, "reproduce launched a different configuration"
    nodes = [s["node"] for s in specs]
    # A result that recorded where each log ended and when the launch went out is read
    # exactly as `observe` reads its own start; an older one from the log's beginning, with
    # the segment found near its last rank's start.
    recorded = result.get("log_offsets") or {}
    offsets = {node: int(recorded.get(node, 0)) for node in nodes}
    launched_from = result.get("launched_from")
    if launched_from is None:
        launched_from = float(result["started_at"]) - REPRODUCE_START_SPREAD_S
    logs = _logs_since(session, offsets)
    start = build("before", config, str(config["engine"]["name"]),
                  cold_start_s=float(result["cold_start_s"]),
                  launched_from=float(launched_from),
                  started_at=float(result["started_at"]),
                  ready_at=float(result["ready_at"]), corrections=result.get("start_corrections_s") or {},
                  logs=logs, samples=telemetry, facts=facts, nodes=nodes, lab_s=0.0)
    if len(start.missing_logs) == len(nodes):
        return None, "the engine logs hold no lines of reproduce's start"
    return start, ""


def describe(group: StallGroup) -> str:
    """A stall in a few words, for the stage log."""
    nodes = ", ".join(sorted(group.members))
    what = {UNEXPLAINED: "matches no signature", INCOMPLETE: "evidence incomplete",
            GPU_WORK: "GPU busy (engine work)"}.get(group.cause, group.cause)
    return f"{group.silent_s:.0f} s stall at {group.start_s:.0f}-{group.end_s:.0f} s on {nodes}: {what}"
