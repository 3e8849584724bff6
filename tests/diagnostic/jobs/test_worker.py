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
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone

from diagnostic.bookings.models import ClusterConfiguration, Lab
from diagnostic.celery import app
from diagnostic.jobs.models import DiagnosticJob, StageRun
from diagnostic.jobs.orchestration import create_job
from diagnostic.jobs.tasks import enqueue_job, reap_expired_leases
from lab.inventory import load_inventory
from lab.sim.lab import SimLab
from tests.diagnostic.conftest import REFERENCE_CONFIG, REFERENCE_SCENARIO, REPO
from tests.diagnostic.doubles import fast_scenario

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
    with SimLab(REFERENCE_SCENARIO, tmp_path / "labsim") as sim:
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
    assert f":{second.process.pid}:" in reproduce.log.splitlines()[0]
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


def test_a_worker_retries_an_unreachable_node_with_backoff_then_reports_it(
    start_worker: Callable[[str], Worker], tmp_path: Path
) -> None:
    start_worker("retry")
    scenario = fast_scenario(tmp_path, REPO / "lab" / "scenarios" / "fault-node-down.yaml")
    with pytest.raises(CommandError, match="preflight: the lab cannot run this configuration"):
        call_command("diagnose", "--config", str(REFERENCE_CONFIG), "--lab", f"sim:{scenario}",
                     "--out", str(tmp_path / "out"), "--queue", stdout=io.StringIO())
    document = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert [f["code"] for f in document["findings"]] == ["lab.node_unreachable"]
    assert document["findings"][0]["evidence"]["node"] == "spark-05"
    preflight = document["job"]["stages"][0]
    assert (preflight["name"], preflight["attempts"]) == ("preflight", 3)
