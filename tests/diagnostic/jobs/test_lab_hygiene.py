"""Every job leaves the lab as it found it, on the simulated lab over real SSH.

A job stops its engines on every node when it ends (however it ends), each launch writes
a log of its own, and a job's first act on the lab stops what an earlier job of this
platform left running (a worker killed mid-stage, a node that was away at the end):
written in the staff's log, never a finding of the next customer. An engine nobody here
started holds the day as a lab fault. The services tier (test_lab_hygiene_worker.py) does
the same with real Celery workers, a staff cancel and a worker killed mid-stage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diagnostic.bookings.models import ClusterConfiguration, Lab
from diagnostic.jobs.hygiene import PLATFORM, job_owner
from diagnostic.jobs.labaccess import open_lab_session
from diagnostic.jobs.models import DiagnosticJob, Finding, JobEvent, StageRun
from diagnostic.jobs.orchestration import create_job, run_until_done
from diagnostic.jobs.stage_context import StageContext
from lab.session import LabSession
from lab.sim.lab import SimLab
from tests.diagnostic.conftest import REFERENCE_SCENARIO
from tests.diagnostic.doubles import fast_scenario
from tests.diagnostic.jobs.test_orchestration import add_test_stage

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimLab]:
    from lab.sim.scenario import load_scenario

    with SimLab(load_scenario(fast_scenario(tmp_path, REFERENCE_SCENARIO)), tmp_path / "labsim") as lab:
        yield lab


@pytest.fixture
def sim_lab(sim: SimLab, db: None) -> Lab:
    return Lab.objects.create(name="hygiene-lab", inventory=str(sim.inventory_path))


def running(sim: SimLab) -> dict[str, dict[str, Any]]:
    """What each node's agent says it runs, over SSH as the platform asks."""
    with LabSession.open(sim.inventory_path) as session:
        return {node: st for node, st in session.status().items() if isinstance(st, dict) and st["running"]}


def launch_as(sim: SimLab, config: ClusterConfiguration, owner: dict[str, str] | None) -> None:
    """Start the configuration on the lab as `owner` would have (None: by hand, no owner)."""
    with LabSession.open(sim.inventory_path) as session:
        session.owner = owner
        session.launch(config.normalized, cold=False)


def run(job: DiagnosticJob) -> DiagnosticJob:
    run_until_done(str(job.pk), open_lab_session, sleep=lambda s: None)
    job.refresh_from_db()
    return job


def lab_findings(job: DiagnosticJob) -> list[str]:
    return list(Finding.objects.filter(job=job, code__startswith="lab.").values_list("title", flat=True))


def test_a_job_that_fails_stops_its_engines_and_the_next_starts_clean(
    sim: SimLab, sim_lab: Lab, reference_config: ClusterConfiguration, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def launch_then_break(ctx: StageContext) -> dict[str, Any]:
        ctx.session.launch(ctx.config, cold=False)
        raise KeyError("a bug after the launch")

    add_test_stage(monkeypatch, "probe", launch_then_break)
    first = run(create_job(config=reference_config, lab=sim_lab, stages=["preflight", "probe"]))
    assert first.status == "partial", "an optional stage failed: the job ended without it"
    assert running(sim) == {}, "a failed job leaves no engine running"
    [stopped] = JobEvent.objects.filter(job=first, kind=JobEvent.Kind.ENGINES_STOPPED)
    assert sorted(stopped.data["stopped"]) == sorted(sim.nodes)
    assert all(stopped.data["stopped"][node] for node in sim.nodes), "every node's engine was stopped"

    second = run(create_job(config=reference_config, lab=sim_lab, stages=["preflight", "reproduce"]))
    assert second.status == "succeeded", second.status_message
    assert lab_findings(second) == []
    preflight = StageRun.objects.get(job=second, name="preflight").result
    assert not [c for c in preflight["lab_conditions"] if c["code"] == "lab.memory_unavailable"]
    assert not JobEvent.objects.filter(job=second, kind=JobEvent.Kind.LAB_CLEANED).exists()
    assert running(sim) == {}


def test_engines_an_earlier_job_left_are_stopped_and_logged_for_staff_not_the_customer(
    sim: SimLab, sim_lab: Lab, reference_config: ClusterConfiguration,
) -> None:
    # What a worker killed mid-stage leaves: the earlier job's engine still serving.
    earlier = create_job(config=reference_config, lab=sim_lab, stages=["preflight"])
    launch_as(sim, reference_config, job_owner(str(earlier.pk)))
    assert sorted(running(sim)) == sorted(sim.nodes)

    job = run(create_job(config=reference_config, lab=sim_lab, stages=["preflight", "reproduce"]))
    assert job.status == "succeeded", job.status_message
    assert lab_findings(job) == [], "another job's engines are never this customer's finding"
    [cleaned] = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.LAB_CLEANED)
    assert set(cleaned.data["stopped"]) == set(sim.nodes)
    assert set(cleaned.data["stopped"].values()) == {str(earlier.pk)}
    assert str(earlier.pk) in cleaned.message
    # The customer's start is a cold start of its own, logged alone: the engine log the
    # reproduce stage kept holds one launch (the earlier one's log was moved aside).
    reproduce = StageRun.objects.get(job=job, name="reproduce")
    head = sim.nodes[sorted(sim.nodes)[0]]
    logs = head.host_path(f"{head.paths.work_dir}/logs")
    assert (logs / "engine.log.1").is_file(), "the earlier launch's log is kept beside it"
    # vLLM writes this once a launch, when the weights are in (the `weights_loaded` line of
    # its release table): one per launch a log holds.
    start = "Loading weights took"
    assert (logs / "engine.log.1").read_text().count(start) == 1
    assert reproduce.log.count(start) == 1, "the stage log holds this job's launch, not the earlier one's"
    assert running(sim) == {}, "and this job stopped its own at its end"


def test_an_engine_nobody_here_started_holds_the_day_as_a_lab_fault(
    sim: SimLab, sim_lab: Lab, reference_config: ClusterConfiguration,
) -> None:
    launch_as(sim, reference_config, owner=None)
    job = run(create_job(config=reference_config, lab=sim_lab, stages=["preflight", "reproduce", "report"]))
    assert job.status == "held"
    assert job.fault["what"] == "node_busy"
    assert job.fault["nodes"] == sorted(sim.nodes)
    assert Finding.objects.filter(job=job).count() == 0
    # Not ours to stop: it still runs, for staff to look at.
    assert sorted(running(sim)) == sorted(sim.nodes)
    assert not StageRun.objects.filter(job=job, name="report", status="succeeded").exists()


def test_the_owner_reaches_the_node_and_comes_back_in_status(
    sim: SimLab, reference_config: ClusterConfiguration,
) -> None:
    launch_as(sim, reference_config, {"platform": PLATFORM, "job": "job-42"})
    states = running(sim)
    assert {st["owner"]["job"] for st in states.values()} == {"job-42"}
    assert all(st["log_file"].endswith("/logs/engine.log") for st in states.values())


def test_a_stage_log_keeps_every_attempt(
    sim: SimLab, sim_lab: Lab, reference_config: ClusterConfiguration, monkeypatch: pytest.MonkeyPatch,
    fast_retries: Any,
) -> None:
    from lab.session import NodeUnreachable

    calls: list[int] = []

    def flaky(ctx: StageContext) -> dict[str, Any]:
        calls.append(ctx.attempt)
        ctx.log(f"attempt {ctx.attempt} says hello")
        if ctx.attempt == 1:
            raise NodeUnreachable({"spark-05": OSError("connection refused")})
        return {}

    add_test_stage(monkeypatch, "probe", flaky)
    job = run(create_job(config=reference_config, lab=sim_lab, stages=["probe"]))
    assert job.status == "succeeded"
    text = StageRun.objects.get(job=job, name="probe").log
    assert "attempt 1 says hello" in text and "attempt 2 says hello" in text
    assert text.index("attempt 1 says hello") < text.index("attempt 2 says hello")
    assert "connection refused" in text
