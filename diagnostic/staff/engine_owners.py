"""Which job a node's engine belongs to, from what the jobs recorded: a node reports the
sha256 of the launch spec its engine was started from; the lab's recent jobs are matched
against it without asking the lab anything.

Two sources, both existing records: each stage works on the customer's configuration with
the proved changes of the stages before it applied (as the stage context does), and that
configuration renders to one spec per node through the lab's inventory, so its hashes are
recomputed here; stages that launch settings of their own (the speculative-decoding
search) keep the hashes they verified under `spec_sha256` in their result. A hash that
matches neither is an engine no recent job started (by hand, or an older job)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from diagnostic.bookings.models import Lab
from diagnostic.jobs.models import DiagnosticJob, StageRun
from diagnostic.pipelines.changes import apply_changes
from lab.inventory import Inventory, load_inventory
from lab.session import LabError, LabSession, spec_sha256

# How many of the lab's newest jobs are looked through.
RECENT_JOBS = 20


@dataclass(frozen=True)
class Served:
    job: DiagnosticJob
    stage: str  # the stage that recorded the hash; "" when it is the job's configuration
    what: str  # "the customer's configuration", "... with the changes triage proved", ...


def _hashes_in(value: Any) -> Iterator[str]:
    """Every spec hash a stage result holds under a `spec_sha256` key (node -> hash, or one)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key == "spec_sha256":
                if isinstance(item, str):
                    yield item
                elif isinstance(item, Mapping):
                    yield from (h for h in item.values() if isinstance(h, str))
            else:
                yield from _hashes_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from _hashes_in(item)


def _rendered(inventory: Inventory, config: Mapping[str, Any]) -> set[str]:
    session = LabSession(inventory)  # renders only: no node is contacted
    try:
        return {spec_sha256(spec) for spec in session.specs_for(config)}
    except (LabError, ValueError, KeyError, TypeError):
        return set()  # a configuration this lab cannot run served nothing here
    finally:
        session.close()


def _job_hashes(job: DiagnosticJob, stages: Iterable[StageRun],
                inventory: Inventory | None) -> Iterator[tuple[str, Served]]:
    customer = job.config.normalized
    changes: list[dict[str, Any]] = []
    provers: list[str] = []
    rendered_with = -1  # how many changes the last rendered configuration held
    for stage in stages:
        if stage.status == StageRun.Status.PENDING:
            continue
        if inventory is not None and isinstance(customer, Mapping) and rendered_with != len(changes):
            rendered_with = len(changes)
            try:
                config = apply_changes(customer, changes) if changes else customer
            except ValueError:
                config = {}  # a recorded change that no longer applies: nothing to render
            what = ("the customer's configuration" if not changes else
                    f"the customer's configuration with the changes {', '.join(provers)} proved")
            for digest in _rendered(inventory, config):
                yield digest, Served(job, "", what)
        for digest in _hashes_in(stage.result):
            yield digest, Served(job, stage.name, "a setting it tried")
        if stage.status in StageRun.WITH_RESULT and isinstance(stage.result, Mapping):
            mine = [c for c in stage.result.get("config_changes") or [] if isinstance(c, dict)]
            if mine:
                changes.extend(mine)
                provers.append(stage.name)


def jobs_serving(lab: Lab, hashes: Iterable[str]) -> dict[str, Served]:
    """For each of `hashes` a node reported, the newest job (and its stage) that launched it."""
    wanted = {h for h in hashes if h}
    if not wanted:
        return {}
    try:
        inventory: Inventory | None = load_inventory(lab.inventory_path())
    except (OSError, ValueError):
        inventory = None  # a simulated lab not serving has no inventory file: results only
    found: dict[str, Served] = {}
    jobs = list(DiagnosticJob.objects.filter(lab=lab).select_related("config", "organisation")
                .order_by("-created_at")[:RECENT_JOBS])
    runs: dict[Any, list[StageRun]] = {}
    for run in StageRun.objects.filter(job__in=jobs).order_by("job", "order"):
        runs.setdefault(run.job_id, []).append(run)
    for job in jobs:
        for digest, served in _job_hashes(job, runs.get(job.pk, []), inventory):
            if digest in wanted and digest not in found:
                found[digest] = served
        if wanted <= set(found):
            break
    return found
