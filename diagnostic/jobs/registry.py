"""The stages a diagnostic job runs, in the order declared here (STAGE_ORDER).

The core stages (preflight, reproduce, report) register below; each pipeline stage has an
adapter module in `diagnostic.jobs.stages` named after it, which registers with
`register_stage("fp4", run)`. The registry imports those adapters itself (load_adapters),
so which stages exist and in what order never depends on the order apps are imported.
A stage is a callable taking a StageContext and returning a JSON-serialisable result
dict; a result's `sections` mapping fills the findings.json sections of the same name
(`cold_start`, `fp4`, `speculative`, `gap`, `measurement`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from diagnostic.jobs import preflight, report_versions, reproduce
from diagnostic.jobs.stage_context import StageContext

StageFn = Callable[[StageContext], dict[str, Any]]

# Every stage a job can run, in the order it runs them. A stage whose adapter is not
# built yet is simply absent from a job's plan; a name outside this list cannot register.
STAGE_ORDER = ("preflight", "reproduce", "triage", "fp4", "specdec", "gap", "measure", "report")
ADAPTER_PACKAGE = "diagnostic.jobs.stages"


@dataclass(frozen=True)
class Stage:
    name: str
    run: StageFn
    # A required stage that fails ends the job: nothing after it can be trusted.
    required: bool
    # Runs even after a stage stopped the job (StopJob): the report still says what stopped
    # it, and whether the engagement is free.
    after_stop: bool = False


class UnknownStage(ValueError):
    """A stage selection naming a stage that does not exist; lists the accepted ones."""


class StageRegistry:
    """The stages registered under a declared order; lists them in that order."""

    def __init__(self, order: Iterable[str]) -> None:
        self.order = tuple(order)
        self._stages: dict[str, Stage] = {}

    def register(self, name: str, run: StageFn, *, required: bool = False,
                 after_stop: bool = False) -> StageFn:
        if name not in self.order:
            raise ValueError(
                f"stage {name!r} is not in the declared stage order; accepted: {', '.join(self.order)}"
            )
        existing = self._stages.get(name)
        if existing is not None and existing.run is not run:
            raise ValueError(f"stage {name!r} is already registered by {existing.run.__module__}")
        self._stages[name] = Stage(name, run, required=required, after_stop=after_stop)
        return run

    def stages(self) -> list[Stage]:
        return [self._stages[name] for name in self.order if name in self._stages]

    def lookup(self, name: str) -> Stage | None:
        return self._stages.get(name)

    def select(self, names: Iterable[str] | None) -> list[Stage]:
        """The stages to run, in the declared order; None means all of them. An unknown
        name is an error listing the accepted ones."""
        stages = self.stages()
        if names is None:
            return stages
        accepted = ", ".join(s.name for s in stages)
        wanted = [n.strip() for n in names if n.strip()]
        for name in wanted:
            if name in self._stages:
                continue
            if name in self.order:
                raise UnknownStage(f"stage {name!r} is not available in this build; accepted: {accepted}")
            raise UnknownStage(f"unknown stage {name!r}; accepted: {accepted}")
        if not wanted:
            raise UnknownStage(f"no stage selected; accepted: {accepted}")
        return [s for s in stages if s.name in wanted]


REGISTRY = StageRegistry(STAGE_ORDER)


def register_stage(name: str, run: StageFn, *, required: bool = False, after_stop: bool = False) -> StageFn:
    """Add a stage under its declared name. Pipeline stages are optional (a failure is
    recorded and the job goes on); only core stages are required."""
    return REGISTRY.register(name, run, required=required, after_stop=after_stop)


def load_adapters() -> None:
    """Import the stage adapter package, which imports the adapter of every declared
    stage that exists; importing it again does nothing."""
    import_module(ADAPTER_PACKAGE)


def all_stages() -> list[Stage]:
    load_adapters()
    return REGISTRY.stages()


def lookup(name: str) -> Stage | None:
    load_adapters()
    return REGISTRY.lookup(name)


def select_stages(names: Iterable[str] | None) -> list[Stage]:
    load_adapters()
    return REGISTRY.select(names)


register_stage("preflight", preflight.run, required=True)
register_stage("reproduce", reproduce.run, required=True)
register_stage("report", report_versions.run, required=True, after_stop=True)
