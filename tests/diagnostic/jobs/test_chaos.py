"""Services tier: faults in the middle of a job, on servers of its own (chaos.py): PostgreSQL
restarted mid-stage, Redis restarted mid-job and down at submit, the disk filled during the
report, a node powered off mid-measure.

In each the job ends succeeded or failed with one clear reason, no stage that completed
is redone, no email goes out twice, and what was written before the fault is intact
(`check_outcome`). Real Celery workers (with beat running the reaper) do the work.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import service_missing
from tests.diagnostic.jobs.chaos import Scenario, Services, check_outcome

pytestmark = pytest.mark.services
QUICK = ["chaos_first", "chaos_slow", "chaos_deliver"]


@pytest.fixture(scope="module")
def services() -> Iterator[Services]:
    if not list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")):
        service_missing("PostgreSQL's binaries (/usr/lib/postgresql/*/bin) are not installed")
    if shutil.which("redis-server") is None:
        service_missing("redis-server is not installed")
    with Services.running() as running:
        yield running


@pytest.fixture
def scenario(services: Services, tmp_path: Path) -> Iterator[Scenario]:
    world = Scenario(services, tmp_path / "chaos")
    try:
        yield world
    finally:
        world.stop_workers()
        if services.redis.process is None:
            services.redis.start()


def test_a_postgresql_restart_mid_stage_does_not_fail_the_stage(
    scenario: Scenario, services: Services
) -> None:
    scenario.start_worker()
    job_id = scenario.submit(QUICK)
    scenario.wait_until_running(job_id, "chaos_slow")
    services.postgres.restart(down_s=1.0)
    assert scenario.wait_until_ended(job_id) == "succeeded", scenario.worker_logs()
    job = check_outcome(scenario, job_id, expect_stages=QUICK)
    slow = next(s for s in job["stages"] if s["name"] == "chaos_slow")
    # The same attempt carried on through the restart; the writes it missed were deferred.
    assert slow["attempts"] == 1
    assert slow["result"]["deferred_writes"] >= 1
    assert f"slow step {slow['result']['steps']}/" in slow["log"]
    assert scenario.emails_sent() == 1


def test_a_redis_restart_mid_job_loses_no_stage_and_sends_one_email(
    scenario: Scenario, services: Services
) -> None:
    scenario.start_worker()
    job_id = scenario.submit(QUICK)
    scenario.wait_until_running(job_id, "chaos_slow")
    # Redis comes back empty: the message in flight is gone; the worker reconnects and the
    # next step is published once the broker answers (or the reaper finds the job).
    services.redis.restart(down_s=2.0)
    assert scenario.wait_until_ended(job_id, timeout=120) == "succeeded", scenario.worker_logs()
    check_outcome(scenario, job_id, expect_stages=QUICK)
    assert scenario.calls().count(("chaos_first", 1)) == 1
    assert scenario.emails_sent() == 1


def test_a_job_whose_enqueue_failed_is_enqueued_again_by_the_reaper(
    scenario: Scenario, services: Services
) -> None:
    services.redis.stop()
    scenario.start_worker()  # it keeps trying to reach the broker meanwhile
    job_id = scenario.submit(["chaos_first"])
    assert scenario.job_status(job_id) == "queued"
    services.redis.start()
    # DIAG_QUEUED_REQUEUE_S is 3 s here and beat runs the reaper every 2 s.
    assert scenario.wait_until_ended(job_id, timeout=60) == "succeeded", scenario.worker_logs()
    check_outcome(scenario, job_id, expect_stages=["chaos_first"])
    assert "message was lost while queued" in scenario.worker_log_text()


@pytest.fixture
def small_disk(scenario: Scenario) -> Iterator[Path]:
    """The scenario's output directory on a 2 MiB tmpfs (the workers write reports there)."""
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(scenario.out_dir)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        service_missing(
            f"mounting a small tmpfs is not permitted here ({done.stderr.strip()}); "
            "test_faults.py covers full disks under a file-size limit"
        )
    try:
        yield scenario.out_dir
    finally:
        scenario.stop_workers()
        subprocess.run(["umount", "-l", str(scenario.out_dir)], check=False)


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as sink:
        while True:
            sink.write(b"\0" * 65536)
            sink.flush()
    return filler


def test_a_disk_filled_during_the_report_is_retried_once_freed_and_leaves_no_truncated_pdf(
    scenario: Scenario, small_disk: Path
) -> None:
    scenario.extra_env["DIAG_RETRY_BASE_S"] = "4"
    scenario.start_worker()
    stages = ["chaos_first", "report"]
    job_id = scenario.submit(stages)
    scenario.wait_for(lambda: scenario.stage_row(job_id, "report")[0] == "running", 60, "the report to start")
    filler = fill(small_disk)
    scenario.wait_for(
        lambda: scenario.stage_row(job_id, "report")[:2] == ("pending", 1),
        60,
        "the report to fail on the full disk",
    )
    reports = small_disk / "jobs" / job_id
    assert not (reports / "report.pdf").exists()
    assert not list(reports.glob(".*.part")), "the partial file must be cleaned up"
    filler.unlink()  # the cleanup: the retry finds room
    assert scenario.wait_until_ended(job_id) == "succeeded", scenario.worker_logs()
    job = check_outcome(scenario, job_id, expect_stages=stages)
    report = next(s for s in job["stages"] if s["name"] == "report")
    assert report["attempts"] == 2
    assert "disk: disk full" in report["last_error"]
    pdf = (reports / "report.pdf").read_bytes()
    assert pdf.startswith(b"%PDF-") and pdf.rstrip().endswith(b"%%EOF")
    assert [s for s, _ in scenario.calls()].count("chaos_first") == 1


def test_a_node_powered_off_mid_measure_ends_the_job_with_one_clear_reason(
    scenario: Scenario, tmp_path: Path
) -> None:
    from lab.sim.lab import SimLab
    from tests.diagnostic.conftest import REFERENCE_SCENARIO
    from tests.diagnostic.doubles import fast_scenario

    stages = ["preflight", "reproduce", "measure"]
    # At 60 lab seconds per wall second the measurement (about 600 lab s) lasts ten wall
    # seconds, so the node goes down while it runs even when a busy machine makes this
    # test's polling slow; at the usual 150 it could end first (one attempt, no fault).
    with SimLab(fast_scenario(tmp_path, REFERENCE_SCENARIO, 60), tmp_path / "labsim") as sim:
        scenario.start_worker()
        job_id = scenario.submit(stages, inventory=sim.inventory_path)
        scenario.wait_for(
            lambda: (
                scenario.stage_row(job_id, "measure")[0] == "running"
                and scenario.stage_row(job_id, "measure")[2] >= 5
            ),
            120,
            "measure to start measuring",
        )
        before = scenario.inspect(job_id)
        sim.set_node_down("spark-01")
        scenario.wait_for(
            lambda: scenario.stage_row(job_id, "measure")[0] != "running", 60, "the measure attempt to end"
        )
        sim.set_node_down("spark-01", down=False)
        status = scenario.wait_until_ended(job_id, timeout=120)
    job = check_outcome(scenario, job_id, expect_stages=stages)
    by_name = {s["name"]: s for s in job["stages"]}
    # The stages that completed before the fault were not run again, and what they wrote stands.
    assert [by_name[n]["attempts"] for n in ("preflight", "reproduce")] == [1, 1]
    earlier = {s["name"]: s["result"] for s in before["stages"] if s["status"] == "succeeded"}
    assert {n: by_name[n]["result"] for n in earlier} == earlier
    measure = by_name["measure"]
    assert measure["attempts"] >= 2
    assert measure["last_error"].startswith("attempt 1: "), measure["last_error"]
    if status == "succeeded":
        assert measure["status"] == "succeeded"
    else:
        assert (
            status == "partial" and job["status_message"] == f"finished without: measure {measure['status']}"
        )
