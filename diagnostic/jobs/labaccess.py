"""Reaching a job's lab: the default way to open a lab session for a Lab row, the lazy
holder that opens it only when a stage first needs it, and the lab's catalog (the models
it holds, lab.catalog), by which the job's configurations are admitted and rendered."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager

from diagnostic.bookings.configs import lab_catalog
from diagnostic.bookings.models import Lab
from lab.catalog import Catalog, CatalogError
from lab.session import LabError, LabSession

# How the orchestrator reaches a lab: given the Lab row, a context manager yielding an
# open session. The diagnose command and tests pass their own.
SessionFactory = Callable[[Lab], AbstractContextManager[LabSession]]


class LabNotServing(LabError):
    """A simulated lab the job needs is not running."""


class LabCatalogUnknown(LabError):
    """The lab's catalog cannot be read: the lab's fault, never the customer's."""


def job_lab_catalog(lab: Lab) -> Catalog:
    """The catalog of a job's lab (bookings.configs.lab_catalog); LabCatalogUnknown when it
    cannot be known, which holds the day as any other lab fault."""
    try:
        return lab_catalog(lab)
    except CatalogError as exc:
        raise LabCatalogUnknown(str(exc)) from exc


@contextmanager
def open_lab_session(lab: Lab) -> Iterator[LabSession]:
    """A session on `lab`'s inventory; for `sim:` labs, the inventory a running
    `python -m lab sim serve` wrote under DIAG_SIM_STATE_DIR."""
    path = lab.inventory_path()
    if lab.is_simulated and not path.exists():
        scenario = lab.inventory.removeprefix("sim:")
        raise LabNotServing(
            f"simulated lab {lab.name!r} is not serving: no inventory at {path}; start it with "
            f"`python -m lab sim serve --scenario {scenario} --state-dir {path.parent}`"
        )
    session = LabSession.open(path)
    try:
        yield session
    finally:
        session.close()


class LabAccess:
    """Opens the lab session the first time a stage asks for it, and closes it after."""

    def __init__(self, factory: SessionFactory, lab: Lab, owner: dict[str, str] | None = None,
                 on_open: Callable[[LabSession], None] | None = None) -> None:
        self._factory = factory
        self._lab = lab
        self._owner = owner
        # Called once with the session when it opens (the job's sweep of the lab).
        self._on_open = on_open
        self._checked = False
        self._stack = ExitStack()
        self._session: LabSession | None = None
        self._catalog: Catalog | None = None

    @property
    def catalog(self) -> Catalog:
        """The lab's catalog (read once per job attempt): what the lab holds, by which the
        job admits and renders its configurations and finds its model's profile."""
        if self._catalog is None:
            self._catalog = job_lab_catalog(self._lab)
        return self._catalog

    @property
    def opened(self) -> bool:
        return self._session is not None

    def session(self, *, check: bool = True) -> LabSession:
        """The open session; the first call with `check` runs `on_open` on it (a failure
        there is raised, and asked again at the next call)."""
        if self._session is None:
            self._session = self._stack.enter_context(self._factory(self._lab))
            if self._owner is not None:
                self._session.owner = dict(self._owner)
        if check and not self._checked and self._on_open is not None:
            self._on_open(self._session)
            self._checked = True
        return self._session

    def lab_seconds_since(self, wall_start: float) -> float:
        """Lab seconds elapsed since the monotonic `wall_start`; a stage that never
        touched the lab counts wall time, which is lab time on every real lab."""
        wall = time.monotonic() - wall_start
        if self._session is None:
            return wall
        return self._session.clock.lab_seconds(wall)

    def close(self) -> None:
        self._session = None
        self._stack.close()
