"""Lab health: one poll asks every node's agent for its facts, its engine status (with the
engine's owner: the platform and job its launch spec names) and its newest telemetry
sample, through the same lab session the jobs use, and keeps the answers as LabHealth and
NodeHealth rows for the lab page.

Whose failure a failed answer is decides what is stored:

- a node that itself does not answer while the poll runs properly (SSH refused or
  unreachable, a host key that does not match, its agent failing) is marked unreachable
  with its error; so is every node of a simulated lab that is not serving;
- a failure on the platform's side is not the nodes': a node that times out while a job
  holds the lab (its nodes are busy with that job), a database or broker error, the
  inventory not readable, the poll itself failing. The poll is then recorded on LabHealth
  as "poll did not complete: <reason>" and the nodes it did not reach keep their last
  known state and its time (NodeHealth.checked_at), which the page shows as its age.

GPU temperature is not among the agent's facts, so it stays null ("not reported") unless
an agent reports one.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from diagnostic.bookings.models import Lab, LabNode
from diagnostic.jobs.labaccess import LabNotServing, open_lab_session
from diagnostic.jobs.models import DiagnosticJob, LabHealth, LabLease, NodeHealth
from lab.session import LabError, LabSession, NodeUnreachable
from lab.ssh import CommandTimeout

log = logging.getLogger(__name__)

SessionFactory = Callable[[Lab], AbstractContextManager[LabSession]]
# How far back (lab seconds) the first poll of a node looks for telemetry; later polls ask
# only for samples newer than the last one seen.
TELEMETRY_LOOKBACK_LAB_S = 3600.0
# LabHealth.error starts so when the failure was the platform's, not the lab's.
INCOMPLETE = "poll did not complete: "
def is_incomplete(error: str) -> bool:
    """The stored poll error was the platform's: the nodes' states were not (all) refreshed."""
    return error.startswith(INCOMPLETE)


def _first_gpu(facts: dict[str, Any]) -> dict[str, Any]:
    gpus = facts.get("gpus") or []
    return gpus[0] if gpus and isinstance(gpus[0], dict) else {}


def _temperature(gpu: dict[str, Any]) -> float | None:
    for key in ("temperature_c", "temperature"):
        value = gpu.get(key)
        if isinstance(value, int | float):
            return float(value)
    return None


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def _timed_out(exc: BaseException) -> bool:
    """The node was reached but did not answer in time (its command, or the connection,
    timed out), as opposed to refusing, being unreachable or offering the wrong host key."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, CommandTimeout | TimeoutError):
            return True
        if isinstance(current, NodeUnreachable):
            todo.extend(current.nodes.values())
        todo.extend((current.__cause__, current.__context__))
    return False


def lab_holder(lab: Lab, now: dt.datetime | None = None) -> DiagnosticJob | None:
    """The job holding the lab's lease now, if any."""
    lease = (LabLease.objects.filter(lab=lab, job__isnull=False, expires_at__gte=now or timezone.now())
             .select_related("job__organisation").first())
    return lease.job if lease is not None else None


def _mark_unreachable(lab: Lab, names: list[str], error: str, now: dt.datetime) -> None:
    for name in names:
        NodeHealth.objects.update_or_create(
            lab=lab, node=name,
            defaults={"reachable": False, "error": error, "checked_at": now, "engine_running": None},
        )


def poll_lab(lab: Lab, factory: SessionFactory = open_lab_session) -> LabHealth:
    """Poll one lab now and store what every node said, and whether the poll completed.
    Never raises for a failed poll: the failure is what LabHealth records."""
    started = time.monotonic()
    now = timezone.now()
    try:
        error = _poll(lab, factory, now)
    except Exception as exc:  # the platform's side: database, broker, a bug in the poll
        error = INCOMPLETE + _error_text(exc)
        log.exception("lab health: the poll did not complete", extra={"lab": lab.name})
    values = {"checked_at": now, "error": error, "poll_seconds": time.monotonic() - started}
    try:
        health, _ = LabHealth.objects.update_or_create(lab=lab, defaults=values)
    except DatabaseError as exc:
        # Not even the outcome could be stored; the page will find the last poll too old.
        log.error("lab health: the poll's outcome could not be stored: %s", exc, extra={"lab": lab.name})
        health = LabHealth(lab=lab, **values)
        health.error = health.error or INCOMPLETE + _error_text(exc)
    return health


def _poll(lab: Lab, factory: SessionFactory, now: dt.datetime) -> str:
    """Poll `lab`; returns LabHealth.error: empty, the lab's own failure, or INCOMPLETE..."""
    holder = lab_holder(lab, now)
    with ExitStack() as stack:
        try:
            session = stack.enter_context(factory(lab))
        except LabNotServing as exc:
            # A simulated lab that is not running: its nodes are off, each of them down.
            error = _error_text(exc)
            known = set(LabNode.objects.filter(lab=lab).values_list("name", flat=True))
            known |= set(NodeHealth.objects.filter(lab=lab).values_list("node", flat=True))
            _mark_unreachable(lab, sorted(known), error, now)
            log.warning("lab health: lab unreachable", extra={"lab": lab.name, "error": error})
            return error
        except (OSError, ValueError) as exc:
            # The inventory is missing or unreadable: no node was asked anything.
            return f"{INCOMPLETE}the lab's inventory could not be read ({_error_text(exc)})"
        lab.sync_nodes(session.inventory)
        skipped = _poll_nodes(lab, session, now, holder)
    if not skipped:
        return ""
    names = ", ".join(sorted(skipped))
    first = next(iter(skipped.values()))
    who = f"job {holder.pk}" if holder is not None else "a job"
    return (f"{INCOMPLETE}{names} did not answer in time while {who} holds the lab and its nodes "
            f"are busy; their last known state is kept ({first})")


def _poll_nodes(lab: Lab, session: LabSession, now: dt.datetime,
                holder: DiagnosticJob | None) -> dict[str, str]:
    """Store what every node said; returns the nodes left as they were (name -> why)."""
    roles = {n.name: n.role for n in session.nodes}
    facts = session.facts(tolerate=True)
    up = [name for name, value in facts.items() if not isinstance(value, Exception)]
    status = session.status(nodes=up) if up else {}
    previous = {h.node: h for h in NodeHealth.objects.filter(lab=lab)}
    lab_now = session.clock.now()
    skipped: dict[str, str] = {}
    for name, role in roles.items():
        answer = facts.get(name)
        if isinstance(answer, Exception) or answer is None:
            if holder is not None and answer is not None and _timed_out(answer):
                inner = answer.nodes.get(name, answer) if isinstance(answer, NodeUnreachable) else answer
                skipped[name] = str(inner)
                continue
            error = _error_text(answer) if answer is not None else "no answer"
            NodeHealth.objects.update_or_create(
                lab=lab, node=name,
                defaults={"role": role, "reachable": False, "error": error, "checked_at": now,
                          "engine_running": None},
            )
            continue
        values: dict[str, Any] = {"role": role, "reachable": True, "error": "", "checked_at": now,
                                  "last_seen_at": now}
        gpu = _first_gpu(answer)
        values.update(
            gpu_name=str(gpu.get("name") or ""),
            gpu_temperature_c=_temperature(gpu),
            gpu_memory_total_mib=gpu.get("memory_total_mib"),
            mem_total_kib=answer.get("mem_total_kib"),
            mem_available_kib=answer.get("mem_available_kib"),
            disk_free_bytes=(answer.get("model_dir") or {}).get("free_bytes"),
        )
        state = status.get(name)
        if isinstance(state, dict):
            values.update(engine_running=bool(state.get("running")), engine_exit_code=state.get("exit_code"),
                          spec_sha256=str(state.get("spec_sha256") or ""))
            # An older agent reports no owner; an engine started by hand names none.
            owner = state.get("owner")
            values["engine_owner"] = owner if isinstance(owner, dict) and owner else None
        elif state is not None:
            values["error"] = f"status: {_error_text(state)}"
        before = previous.get(name)
        since = before.last_telemetry_lab_t if before and before.last_telemetry_lab_t else None
        since = since if since is not None else lab_now - TELEMETRY_LOOKBACK_LAB_S
        try:
            samples = session.telemetry(since=since, nodes=[name]).get(name) or []
        except LabError as exc:
            samples = []
            values["error"] = f"telemetry: {_error_text(exc)}"
        if samples:
            newest = max(samples, key=lambda s: float(s.get("t") or 0.0))
            t = float(newest.get("t") or 0.0)
            age_wall = session.clock.wall_seconds(max(0.0, lab_now - t))
            values.update(
                last_telemetry_lab_t=t,
                last_telemetry_at=now - dt.timedelta(seconds=age_wall),
                page_cache_kib=(newest.get("mem") or {}).get("cached_kib"),
            )
        NodeHealth.objects.update_or_create(lab=lab, node=name, defaults=values)
    # Nodes no longer in the inventory are no longer the lab's.
    NodeHealth.objects.filter(lab=lab).exclude(node__in=list(roles)).delete()
    return skipped


def poll_all_labs(factory: SessionFactory = open_lab_session) -> list[LabHealth]:
    return [poll_lab(lab, factory) for lab in Lab.objects.order_by("name")]
