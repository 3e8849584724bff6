"""Leaving the lab as it was found.

Every engine the platform starts carries its owner in the launch spec (`owner`: the
platform and the job), and each node's agent reports it back in `status`. So a job can
tell, from the nodes' own word, which engines are its own, which an earlier job of this
platform left behind (stopped, and written in the staff's log: never a finding of this
customer's), and which nobody here started (a lab-side condition for staff: the day is
held as a lab fault rather than measured on a node someone else is using).

A job stops its engines on every node when it ends however it ends, and when it is held;
the next job's first act (`sweep`) catches what a job that could not (a worker killed
mid-stage, a node that was down at the time) left running.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lab.session import LabSession

log = logging.getLogger(__name__)

PLATFORM = "gb10-diag"


def nodes_words(nodes: Iterable[str]) -> str:
    """Nodes as a sentence names them: "spark-05", or "3 nodes (spark-01, spark-02, spark-03)"."""
    names = sorted(nodes)
    return names[0] if len(names) == 1 else f"{len(names)} nodes ({', '.join(names)})"


def job_owner(job_id: str) -> dict[str, str]:
    """The `owner` a job's launch specs carry."""
    return {"platform": PLATFORM, "job": str(job_id)}


@dataclass
class Sweep:
    """What the nodes ran when a job looked, and what it did about it."""

    # node -> the earlier job whose engine was stopped there
    stopped: dict[str, str] = field(default_factory=dict)
    # node -> why an earlier job's engine could not be stopped
    stop_failed: dict[str, str] = field(default_factory=dict)
    # node -> the status of an engine this platform did not start
    foreign: dict[str, dict[str, Any]] = field(default_factory=dict)
    # node -> why its agent did not answer
    unreachable: dict[str, str] = field(default_factory=dict)
    # nodes running this job's own engine (left alone: a later stage may use it)
    own: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.stopped or self.stop_failed or self.foreign)

    def as_dict(self) -> dict[str, Any]:
        return {"stopped": self.stopped, "stop_failed": self.stop_failed, "foreign": self.foreign,
                "unreachable": self.unreachable, "own": self.own}


def owner_of(status: Mapping[str, Any]) -> dict[str, Any] | None:
    owner = status.get("owner")
    return owner if isinstance(owner, dict) else None


def sweep(session: LabSession, job_id: str) -> Sweep:
    """Ask every node what it runs; stop the engines an earlier job of this platform left;
    report the rest. Unreachable nodes are reported, not raised (the stages decide whether
    the configuration needs them)."""
    found = Sweep()
    statuses = session.status()
    leftovers: dict[str, str] = {}
    for node, status in sorted(statuses.items()):
        if not isinstance(status, dict):
            found.unreachable[node] = str(status)
            continue
        if not status.get("running"):
            continue
        owner = owner_of(status)
        if owner is not None and owner.get("platform") == PLATFORM:
            if owner.get("job") == str(job_id):
                found.own.append(node)
            else:
                leftovers[node] = str(owner.get("job") or "unknown")
        else:
            found.foreign[node] = {k: status.get(k) for k in ("pid", "spec_sha256", "owner")}
    if leftovers:
        results = session.stop(list(leftovers))
        for node, earlier in leftovers.items():
            result = results.get(node)
            if isinstance(result, dict):
                found.stopped[node] = earlier
            else:
                found.stop_failed[node] = str(result)
    return found


@dataclass
class Shutdown:
    """The engines a job stopped at its end."""

    stopped: dict[str, list[int]] = field(default_factory=dict)  # node -> pids stopped
    unreachable: dict[str, str] = field(default_factory=dict)  # node -> why it could not be asked

    def as_dict(self) -> dict[str, Any]:
        return {"stopped": self.stopped, "unreachable": self.unreachable}

    def sentence(self) -> str:
        parts = []
        running = {n: p for n, p in self.stopped.items() if p}
        if running:
            parts.append(f"stopped the engine on {nodes_words(running)}")
        else:
            parts.append("no engine was running")
        if self.unreachable:
            parts.append("could not reach " + ", ".join(
                f"{n} ({why})" for n, why in sorted(self.unreachable.items()))
                + ": stop its engine by hand or let the next job's sweep do it")
        return "; ".join(parts)


def shut_down(session: LabSession, job_id: str) -> Shutdown:
    """Stop the engines this job started, on every node of the lab: a job ends leaving
    nothing of its own running (and touches nothing it did not start)."""
    done = Shutdown()
    mine: list[str] = []
    for node, status in sorted(session.status().items()):
        if not isinstance(status, dict):
            done.unreachable[node] = str(status)
            continue
        owner = owner_of(status) or {}
        if status.get("running") and owner.get("platform") == PLATFORM and owner.get("job") == str(job_id):
            mine.append(node)
        else:
            done.stopped[node] = []
    if mine:
        for node, result in sorted(session.stop(mine).items()):
            if isinstance(result, dict):
                done.stopped[node] = [int(p) for p in result.get("stopped") or []]
            else:
                done.unreachable[node] = str(result)
    return done
