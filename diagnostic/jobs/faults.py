"""Which failures of a stage pass and which are its answer, and how the orchestrator's own
bookkeeping rides out a database that is briefly away.

A lab day meets faults that pass: the database restarts, the broker drops its connections,
an endpoint resets a stream, an SSH connection drops, the disk fills until a cleanup frees
it. Those are transient: the stage is retried with backoff within its attempts. Others are
the stage's answer and would come out the same again (a configuration the lab refuses, an
engine that exits with its own error); the stage fails at once, saying why. `classify` tells
them apart and names the kind, so that a quarantine message says "database" or "disk full"
rather than a bare exception name.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from diagnostic.pipelines.client import EndpointError
from lab.config import ConfigError
from lab.session import LabError, LaunchFailed
from lab.ssh import SSHError

log = logging.getLogger(__name__)

T = TypeVar("T")

# A lost or refused database connection; IntegrityError and DataError are not among them:
# they are the query's own fault and come out the same on every try.
DATABASE_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError)
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


@dataclass(frozen=True)
class Fault:
    transient: bool
    kind: str  # lab, ssh, engine, config, database, broker, endpoint, disk, error
    reason: str

    @property
    def side(self) -> str:
        """Whose fault it is (METHODOLOGY.md "Money back"): `customer` (their configuration:
        refused, or the engine's own answer to it), `lab` (a node, its agent, SSH, the lab's
        network: the day is held and re-run at no cost) or `platform` (our database, broker,
        disk or code)."""
        if self.kind == "endpoint":
            # An endpoint that reset or was away: the lab's; one that answered and refused
            # (HTTP 400, no logprobs) is the engine's answer to the configuration.
            return "lab" if self.transient else "customer"
        return FAULT_SIDES.get(self.kind, "platform")

    @property
    def holds_the_day(self) -> bool:
        """A lab fault: the day stops, held for a re-run, instead of failing the customer."""
        return self.side == "lab"


# Kinds by whose they are; anything not named is the platform's.
FAULT_SIDES = {"config": "customer", "engine": "customer", "lab": "lab", "ssh": "lab"}


class LabFault(Exception):
    """A condition of the lab, found by the platform, that stops the day for staff: a node
    with no GPU or no model directory, an engine nobody here started, memory something else
    holds. `what` is a short code, `nodes` the nodes it concerns, `evidence` the facts."""

    def __init__(self, what: str, message: str, *, nodes: list[str] | None = None,
                 evidence: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.what = what
        self.message = message
        self.nodes = sorted(nodes or [])
        self.evidence = evidence or {}


def _broker_errors() -> tuple[type[BaseException], ...]:
    """The broker client's connection errors (kombu wraps redis-py's, which may escape it)."""
    found: list[type[BaseException]] = []
    try:
        from kombu.exceptions import OperationalError as KombuOperationalError

        found.append(KombuOperationalError)
    except ImportError:  # pragma: no cover - celery brings kombu
        pass
    try:
        import redis

        found += [redis.ConnectionError, redis.TimeoutError]
    except ImportError:  # pragma: no cover - the broker client is pinned
        pass
    return tuple(found)


BROKER_ERRORS = _broker_errors()


def _psycopg_errors() -> tuple[type[BaseException], ...]:
    try:
        import psycopg

        return (psycopg.OperationalError, psycopg.InterfaceError)
    except ImportError:  # pragma: no cover - SQLite-only installs
        return ()


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _one(exc: BaseException) -> Fault | None:
    """The fault `exc` itself is, when it is one this module knows."""
    described = _describe(exc)
    if isinstance(exc, LabFault):
        return Fault(False, "lab", described)
    if isinstance(exc, ConfigError):
        return Fault(False, "config", described)
    if isinstance(exc, LaunchFailed):
        return Fault(False, "engine", described)
    if isinstance(exc, LabError):
        return Fault(bool(getattr(exc, "transient", False)), "lab", described)
    if isinstance(exc, SSHError):
        return Fault(bool(exc.transient), "ssh", described)
    if isinstance(exc, DATABASE_CONNECTION_ERRORS + _psycopg_errors()):
        return Fault(True, "database", f"the database was unreachable ({described})")
    if isinstance(exc, BROKER_ERRORS):
        return Fault(True, "broker", f"the broker was unreachable ({described})")
    if isinstance(exc, EndpointError):
        return Fault(exc.transient, "endpoint", described)
    if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
        where = f" writing {exc.filename}" if exc.filename else ""
        return Fault(True, "disk", f"disk full{where} ({described})")
    return None


def classify(exc: BaseException) -> Fault:
    """What kind of fault `exc` is and whether another try may go otherwise.

    An exception raised `from` another takes the first known fault along its chain of
    explicit causes (a pipeline's own error wrapping a dropped connection is as transient
    as the drop)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        fault = _one(current)
        if fault is not None:
            if current is not exc:
                fault = Fault(fault.transient, fault.kind, f"{_describe(exc)} (caused by {fault.reason})")
            return fault
        current = current.__cause__
    return Fault(False, "error", _describe(exc))


def reset_connection() -> None:
    """Drop this thread's database connection so that the next query opens a fresh one; a
    connection inside a transaction is left to the transaction's owner."""
    if connection.in_atomic_block:
        return
    try:
        connection.close()
    except DATABASE_CONNECTION_ERRORS:
        pass  # it was already gone


def through_outage(
    action: Callable[[], T],
    what: str,
    *,
    budget_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run a bookkeeping write, retrying it while the database is away for up to `budget_s`
    seconds (DIAG_DB_OUTAGE_S): a restart takes seconds, and a stage that did its work must
    not lose it to one. Anything else, or an outage longer than that, is raised."""
    budget = float(settings.DIAG_DB_OUTAGE_S if budget_s is None else budget_s)
    deadline = time.monotonic() + budget
    pause = 0.25
    while True:
        try:
            return action()
        except DATABASE_CONNECTION_ERRORS as exc:
            if connection.in_atomic_block or time.monotonic() + pause > deadline:
                raise
            log.warning("database unreachable; retrying", extra={"what": what, "error": _describe(exc),
                                                                  "pause_s": pause})
            reset_connection()
            sleep(pause)
            pause = min(pause * 2, 5.0)
