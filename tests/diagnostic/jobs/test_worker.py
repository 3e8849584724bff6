"""Services tier: real Celery worker processes on Redis and PostgreSQL running jobs,
including a worker killed with SIGKILL in the middle of a stage."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from diagnostic.bookings.models import ClusterConfiguration, Lab
from diagnostic.celery import app
from diagnostic.jobs.models import DiagnosticJob, JobEvent, LabLease, StageRun
from diagnostic.jobs.orchestration import create_job
from diagnostic.jobs.tasks import enqueue_job, reap_expired_leases
from lab.inventory import load_inventory
from lab.sim.lab import SimLab
from tests.diagnostic.conftest import REFERENCE_CONFIG, REFERENCE_SCENARIO, REPO
from tests.diagnostic.doubles import fast_scenario

# Tests that act while a stage runs (kill its worker, cancel it) keep a slower lab clock
# than fast_scenario's: reproduce's cold start lasts about eight wall seconds, room for the
# action to land mid-stage, against about nineteen at the scenario file's own 30.
MID_STAGE_DILATION = 75.0

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]
STAGE_LEASE_S = 6


class Worker:
    """One `celery -A diagnostic worker` process, its output kept in a file."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"worker-{name}.log"
        queue = app.conf.task_default_queue
        with self.log.open("w") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "diagnostic", "worker", "--pool=solo",
                 "--concurrency=1", "--without-gossip", "--without-mingle", "--without-heartbeat",
                 "-n", f"{name}@%h", "-Q", queue, "--loglevel=INFO"],
                cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
            )

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill9()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def start_worker(
    postgres: None, redis_url: str, transactional_db: None, tmp_path: Path, sim_state_dir: Path
) -> Iterator[Callable[[str], Worker]]:
    db = connection.settings_dict
    password = f":{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else ""
    host = f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
    env = {
        **os.environ,
        # The worker must see this test's database, not the one DATABASE_URL names.
        "DATABASE_URL": f"postgres://{quote(db['USER'], safe='')}{password}@{host}/{db['NAME']}",
        "CELERY_BROKER_URL": redis_url,
        "DIAG_QUEUE": app.conf.task_default_queue,
        "DIAG_STAGE_LEASE_S": str(STAGE_LEASE_S),
        "DIAG_LAB_LEASE_S": "10",
        "DIAG_HEARTBEAT_S": "1",
        "DIAG_RETRY_BASE_S": "1",
        "DIAG_OUT_DIR": str(tmp_path / "out"),
        # Where `diagnose --lab sim:` in this process starts the lab the worker must reach.
        "DIAG_SIM_STATE_DIR": str(sim_state_dir),
        "LOG_LEVEL": "INFO",
    }
    workers: list[Worker] = []

    def start(name: str) -> Worker:
        worker = Worker(name, env, tmp_path)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


def wait_for(condition: Callable[[], Any], timeout: float, what: str, workers: list[Worker]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    logs = "\n".join(f"--- {w.name} ---\n{w.output()[-3000:]}" for w in workers)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{logs}")


def stage(job: DiagnosticJob, name: str) -> StageRun:
    return StageRun.objects.get(job=job, name=name)


def test_a_worker_runs_a_queued_job_to_the_end(
    start_worker: Callable[[str], Worker], make_job: Callable[..., DiagnosticJob]
) -> None:
    worker = start_worker("solo")
    with transaction.atomic():
        job = make_job(["report"])
        enqueue_job(job)
    done = wait_for(lambda: DiagnosticJob.objects.filter(pk=job.pk, status="succeeded").exists(),
                    60, "the job to succeed", [worker])
    assert done
    job.refresh_from_db()
    assert job.findings["job"]["status"] == "succeeded"
    assert "solo@" in worker.output()


def test_a_job_survives_its_worker_being_killed_mid_stage(
    start_worker: Callable[[str], Worker], reference_config: ClusterConfiguration, tmp_path: Path
) -> None:
    with SimLab(fast_scenario(tmp_path, REFERENCE_SCENARIO, MID_STAGE_DILATION), tmp_path / "labsim") as sim:
        lab = Lab.objects.create(name="worker-test-lab", inventory=str(sim.inventory_path))
        first = start_worker("first")
        with transaction.atomic():
            job = create_job(config=reference_config, lab=lab, stages=["preflight", "reproduce", "report"])
            enqueue_job(job)

        # Kill the worker while reproduce is launching the engine (a cold start of
        # several lab minutes, seconds on the wall at the scenario's dilation).
        wait_for(lambda: stage(job, "reproduce").progress_percent >= 10, 90,
                 "reproduce to start launching", [first])
        time.sleep(1.0)
        first.kill9()
        killed = stage(job, "reproduce")
        assert (killed.status, killed.attempts) == ("running", 1)
        assert f":{first.process.pid}:" in killed.lease_owner
        assert stage(job, "preflight").status == "succeeded"

        second = start_worker("second")
        # The killed delivery stays unacknowledged until the broker's visibility timeout
        # (hours); the reaper re-queues the stage once its lease has lapsed.
        wait_for(lambda: stage(job, "reproduce").lease_expires_at < timezone.now(),
                 STAGE_LEASE_S + 5, "the dead worker's lease to lapse", [first, second])
        assert reap_expired_leases() == [str(job.pk)]
        wait_for(lambda: DiagnosticJob.objects.get(pk=job.pk).is_terminal, 120,
                 "the second worker to finish the job", [first, second])
        calls = [json.loads(line) for line in sim.calls_log_path.read_text().splitlines()]

    job.refresh_from_db()
    assert job.status == "succeeded", job.status_message
    # What the nodes saw: preflight asked each node for its facts once, not again after
    # the new worker took over.
    facts = sorted(c["node"] for c in calls if c["verb"] == "facts")
    assert facts == sorted(n.name for n in load_inventory(sim.inventory_path).nodes), facts
    preflight, reproduce = stage(job, "preflight"), stage(job, "reproduce")
    assert preflight.attempts == 1, "preflight succeeded before the kill and must not run again"
    assert reproduce.attempts == 2
    # The log keeps both attempts: the killed worker's, then the second's.
    attempts = [line for line in reproduce.log.splitlines() if " attempt " in line]
    assert f":{first.process.pid}" in attempts[0] and f":{second.process.pid}:" in attempts[-1]
    assert reproduce.result["cold_start_s"] >= 450
    assert job.findings["cold_start"]["before_s"] == reproduce.result["cold_start_s"]
    assert stage(job, "report").status == "succeeded"


def test_diagnose_queue_hands_the_job_to_a_worker_and_waits_for_it(
    start_worker: Callable[[str], Worker], tmp_path: Path
) -> None:
    worker = start_worker("queue")
    scenario = fast_scenario(tmp_path, REFERENCE_SCENARIO)
    printed = io.StringIO()
    call_command("diagnose", "--config", str(REFERENCE_CONFIG), "--lab", f"sim:{scenario}",
                 "--out", str(tmp_path / "out"), "--stages", "preflight,reproduce,report", "--queue",
                 stdout=printed)
    document = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert document["job"]["status"] == "succeeded"
    assert document["cold_start"]["before_s"] >= 450
    assert f"job {document['job']['id']} queued" in printed.getvalue()
    reproduce = StageRun.objects.get(job_id=document["job"]["id"], name="reproduce")
    assert f":{worker.process.pid}:" in reproduce.log.splitlines()[0]


def test_a_worker_retries_an_unreachable_node_with_backoff_then_holds_the_day(
    start_worker: Callable[[str], Worker], tmp_path: Path
) -> None:
    start_worker("retry")
    scenario = fast_scenario(tmp_path, REPO / "lab" / "scenarios" / "fault-node-down.yaml")
    printed = io.StringIO()
    call_command("diagnose", "--config", str(REFERENCE_CONFIG), "--lab", f"sim:{scenario}",
                 "--out", str(tmp_path / "out"), "--queue", stdout=printed)
    document = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert document["job"]["status"] == "held"
    assert document["findings"] == [], "the lab's fault is not the customer's finding"
    assert document["lab_fault"]["nodes"] == ["spark-05"]
    preflight = document["job"]["stages"][0]
    assert (preflight["name"], preflight["attempts"], preflight["status"]) == ("preflight", 3, "pending")
    assert (tmp_path / "out" / "incident.md").is_file()


def running_engines(sim: SimLab) -> dict[str, Any]:
    from lab.session import LabSession

    with LabSession.open(sim.inventory_path) as session:
        return {n: st for n, st in session.status().items() if isinstance(st, dict) and st["running"]}


def lab_traces(job: DiagnosticJob) -> list[str]:
    """What of the lab's state reached the customer's findings (nothing should)."""
    job.refresh_from_db()
    return [f["title"] for f in (job.findings or {}).get("findings", []) if f["code"].startswith("lab.")]


def test_after_a_staff_cancel_the_next_customer_finds_the_lab_clean(
    start_worker: Callable[[str], Worker], reference_config: ClusterConfiguration, tmp_path: Path
) -> None:
    with SimLab(fast_scenario(tmp_path, REFERENCE_SCENARIO, MID_STAGE_DILATION), tmp_path / "labsim") as sim:
        lab = Lab.objects.create(name="cancel-lab", inventory=str(sim.inventory_path))
        worker = start_worker("cancel")
        with transaction.atomic():
            first = create_job(config=reference_config, lab=lab, stages=["preflight", "reproduce", "report"])
            enqueue_job(first)
        # Cancelled once its engine serves (reproduce goes on to measure the customer there).
        wait_for(lambda: len(running_engines(sim)) == 8, 120, "the first job's engines to run", [worker])
        first.request_cancel()
        wait_for(lambda: DiagnosticJob.objects.get(pk=first.pk).is_terminal, 120,
                 "the cancel to end the job", [worker])
        first.refresh_from_db()
        assert first.status == "cancelled"
        assert running_engines(sim) == {}, "a cancelled job leaves nothing running"
        stopped = JobEvent.objects.get(job=first, kind=JobEvent.Kind.ENGINES_STOPPED)
        assert sum(1 for pids in stopped.data["stopped"].values() if pids) == 8

        with transaction.atomic():
            second = create_job(config=reference_config, lab=lab, stages=["preflight", "reproduce", "report"])
            enqueue_job(second)
        wait_for(lambda: DiagnosticJob.objects.get(pk=second.pk).is_terminal, 180,
                 "the second job to end", [worker])
        second.refresh_from_db()
        assert second.status == "succeeded", second.status_message
        assert lab_traces(second) == []
        assert not JobEvent.objects.filter(job=second, kind=JobEvent.Kind.LAB_CLEANED).exists()
        assert running_engines(sim) == {}


def test_after_a_worker_killed_mid_stage_the_next_job_stops_what_it_left(
    start_worker: Callable[[str], Worker], reference_config: ClusterConfiguration, tmp_path: Path
) -> None:
    with SimLab(fast_scenario(tmp_path, REFERENCE_SCENARIO, MID_STAGE_DILATION), tmp_path / "labsim") as sim:
        lab = Lab.objects.create(name="killed-lab", inventory=str(sim.inventory_path))
        first_worker = start_worker("doomed")
        with transaction.atomic():
            first = create_job(config=reference_config, lab=lab, stages=["preflight", "reproduce", "report"])
            enqueue_job(first)
        wait_for(lambda: len(running_engines(sim)) == 8, 120, "the first job's engines to run",
                 [first_worker])
        first_worker.kill9()
        # Nobody resumes the first job (no reaper here): its leases lapse with its engines
        # still serving, as after a crash that nobody noticed.
        wait_for(lambda: not LabLease.objects.filter(lab=lab, expires_at__gt=timezone.now()).exists(), 30,
                 "the dead worker's lab lease to lapse", [first_worker])
        assert len(running_engines(sim)) == 8

        worker = start_worker("next")
        with transaction.atomic():
            second = create_job(config=reference_config, lab=lab, stages=["preflight", "reproduce", "report"])
            enqueue_job(second)
        wait_for(lambda: DiagnosticJob.objects.get(pk=second.pk).is_terminal, 180,
                 "the second job to end", [first_worker, worker])
        second.refresh_from_db()
        assert second.status == "succeeded", second.status_message
        assert lab_traces(second) == [], "the first job's engines are no finding of the second customer"
        cleaned = JobEvent.objects.get(job=second, kind=JobEvent.Kind.LAB_CLEANED)
        assert set(cleaned.data["stopped"].values()) == {str(first.pk)}
        preflight = StageRun.objects.get(job=second, name="preflight").result
        assert not [c for c in preflight["lab_conditions"] if c["code"] == "lab.memory_unavailable"]
        assert running_engines(sim) == {}
