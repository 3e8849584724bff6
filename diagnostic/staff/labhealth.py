"""Lab health: one poll asks every node's agent for its facts, its engine status and its
newest telemetry sample, through the same lab session the jobs use, and keeps the answers
as LabHealth and NodeHealth rows for the lab page. A node that does not answer is marked
unreachable with the error it gave; a lab that cannot be opened at all marks every known
node so. GPU temperature is not among the agent's facts, so it stays null ("not
reported") unless an agent reports one.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from django.utils import timezone

from diagnostic.bookings.models import Lab, LabNode
from diagnostic.jobs.labaccess import open_lab_session
from diagnostic.jobs.models import LabHealth, NodeHealth
from lab.session import LabError, LabSession

log = logging.getLogger(__name__)

SessionFactory = Callable[[Lab], AbstractContextManager[LabSession]]
# How far back (lab seconds) the first poll of a node looks for telemetry; later polls ask
# only for samples newer than the last one seen.
TELEMETRY_LOOKBACK_LAB_S = 3600.0


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


def _mark_unreachable(lab: Lab, names: list[str], error: str, now: dt.datetime) -> None:
    for name in names:
        NodeHealth.objects.update_or_create(
            lab=lab, node=name,
            defaults={"reachable": False, "error": error, "checked_at": now, "engine_running": None},
        )


def poll_lab(lab: Lab, factory: SessionFactory = open_lab_session) -> LabHealth:
    """Poll one lab now and store what every node said."""
    started = time.monotonic()
    now = timezone.now()
    try:
        with factory(lab) as session:
            lab.sync_nodes(session.inventory)
            _poll_nodes(lab, session, now)
    except (LabError, OSError, ValueError) as exc:
        # No session at all: the inventory is missing or unreadable, the simulated lab is
        # not serving. Every node we know of is unreachable for that reason.
        error = _error_text(exc)
        known = set(LabNode.objects.filter(lab=lab).values_list("name", flat=True))
        known |= set(NodeHealth.objects.filter(lab=lab).values_list("node", flat=True))
        _mark_unreachable(lab, sorted(known), error, now)
        health, _ = LabHealth.objects.update_or_create(
            lab=lab, defaults={"checked_at": now, "error": error, "poll_seconds": time.monotonic() - started}
        )
        log.warning("lab health: lab unreachable", extra={"lab": lab.name, "error": error})
        return health
    health, _ = LabHealth.objects.update_or_create(
        lab=lab, defaults={"checked_at": now, "error": "", "poll_seconds": time.monotonic() - started}
    )
    return health


def _poll_nodes(lab: Lab, session: LabSession, now: dt.datetime) -> None:
    roles = {n.name: n.role for n in session.nodes}
    facts = session.facts(tolerate=True)
    up = [name for name, value in facts.items() if not isinstance(value, Exception)]
    status = session.status(nodes=up) if up else {}
    previous = {h.node: h for h in NodeHealth.objects.filter(lab=lab)}
    lab_now = session.clock.now()
    for name, role in roles.items():
        answer = facts.get(name)
        if isinstance(answer, Exception) or answer is None:
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


def poll_all_labs(factory: SessionFactory = open_lab_session) -> list[LabHealth]:
    return [poll_lab(lab, factory) for lab in Lab.objects.order_by("name")]
