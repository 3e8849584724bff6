"""The stages a diagnostic job runs, in order: preflight, reproduce, the pipeline stages
registered here, then report.

A pipeline adds itself with `register_pipeline_stage("fp4", run_fp4)` from a module
that is imported at start-up: an installed app's `stages.py` is (see JobsConfig.ready).
A stage is a callable taking a StageContext and returning a JSON-serialisable result
dict; a result's `sections` mapping fills the findings.json sections of the same name
(`cold_start`, `fp4`, `speculative`, `measurement`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from diagnostic.jobs import preflight, report, reproduce
from diagnostic.jobs.context import StageContext

StageFn = Callable[[StageContext], dict[str, Any]]


@dataclass(frozen=True)
class Stage:
    name: str
    run: StageFn
    # A required stage that fails ends the job: nothing after it can be trusted.
    required: bool
    # Runs even after a stage stopped the job (StopJob): the report still says what stopped
    # it, and whether the engagement is free.
    after_stop: bool = False


CORE_BEFORE = (
    Stage("preflight", preflight.run, required=True),
    Stage("reproduce", reproduce.run, required=True),
)
CORE_AFTER = (Stage("report", report.run, required=True, after_stop=True),)

PIPELINE_STAGES: dict[str, StageFn] = {}


class UnknownStage(ValueError):
    """A stage selection naming a stage that does not exist; lists the accepted ones."""


def register_pipeline_stage(name: str, fn: StageFn) -> StageFn:
    """Add a pipeline stage; it runs after reproduce, in registration order."""
    core = {s.name for s in (*CORE_BEFORE, *CORE_AFTER)}
    if name in core:
        raise ValueError(f"stage name {name!r} is taken by a core stage; choose another")
    existing = PIPELINE_STAGES.get(name)
    if existing is not None and existing is not fn:
        raise ValueError(f"stage {name!r} is already registered by {existing.__module__}")
    PIPELINE_STAGES[name] = fn
    return fn


def all_stages() -> list[Stage]:
    pipeline = [Stage(name, fn, required=False) for name, fn in PIPELINE_STAGES.items()]
    return [*CORE_BEFORE, *pipeline, *CORE_AFTER]


def lookup(name: str) -> Stage | None:
    return next((s for s in all_stages() if s.name == name), None)


def select_stages(names: Iterable[str] | None) -> list[Stage]:
    """The stages to run, in their fixed order; None means all of them. An unknown name
    is an error listing the accepted ones."""
    stages = all_stages()
    if names is None:
        return stages
    wanted = [n.strip() for n in names if n.strip()]
    known = {s.name for s in stages}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise UnknownStage(
            f"unknown stage {unknown[0]!r}; accepted: {', '.join(s.name for s in stages)}"
        )
    if not wanted:
        raise UnknownStage(f"no stage selected; accepted: {', '.join(s.name for s in stages)}")
    return [s for s in stages if s.name in wanted]
