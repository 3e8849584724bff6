"""Faults mid-day: which ones a stage retries and which fail it, progress writes that a
missing database cannot kill, bookkeeping written through an outage, the reaper finding
jobs whose message was lost, the synchronous run's time limit, and files written whole.

The stages are the orchestration tests' probes (a temporary registry); the database
faults are raised where the ORM would raise them, so these run on SQLite and PostgreSQL
alike. The services tier (test_chaos.py) restarts real servers.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import kombu.exceptions
import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, OperationalError, transaction
from django.utils import timezone

from diagnostic.jobs import faults, leases, tasks
from diagnostic.jobs.faults import classify, through_outage
from diagnostic.jobs.models import DiagnosticJob, Finding, StageRun
from diagnostic.jobs.orchestration import Next, orchestrate, run_until_done
from diagnostic.jobs.stage_context import StageContext
from diagnostic.pipelines.client import EndpointError
from lab.config import ConfigError
from lab.session import LaunchFailed, NodeUnreachable
from reports.render import write_atomically
from tests.diagnostic.conftest import REFERENCE_CONFIG
from tests.diagnostic.doubles import no_lab
from tests.diagnostic.jobs.test_orchestration import Probe, add_test_stage

MakeJob = Callable[..., DiagnosticJob]


def _caused(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


def _endpoint_reset() -> EndpointError:
    return _caused(EndpointError("streaming from http://head:8000 failed: RemoteProtocolError"),
                   httpx.RemoteProtocolError("peer closed connection"))  # type: ignore[return-value]


def _disk_full() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", "/srv/out/jobs/x/report.pdf")


FAULTS: list[tuple[str, Callable[[], BaseException], bool, str]] = [
    ("refused configuration", lambda: ConfigError("extra_args", "--trust-remote-code is refused"),
     False, "config"),
    ("engine error", lambda: LaunchFailed("spark-01", 1, "", "ValueError: not enough KV cache"),
     False, "engine"),
    ("node unreachable", lambda: NodeUnreachable({"spark-05": OSError("refused")}), True, "lab"),
    ("database connection", lambda: OperationalError("server closed the connection unexpectedly"),
     True, "database"),
    ("integrity error", lambda: IntegrityError("duplicate key"), False, "error"),
    ("broker connection", lambda: kombu.exceptions.OperationalError("Error 111 connecting to redis"),
     True, "broker"),
    ("endpoint reset", _endpoint_reset, True, "endpoint"),
    ("endpoint 503", lambda: EndpointError("answered HTTP 503", status=503), True, "endpoint"),
    ("endpoint 400", lambda: EndpointError("answered HTTP 400", status=400), False, "endpoint"),
    ("endpoint without logprobs", lambda: EndpointError("the answer carries no token_logprobs"),
     False, "endpoint"),
    ("disk full", _disk_full, True, "disk"),
    ("permission denied", lambda: PermissionError(errno.EACCES, "Permission denied"), False, "error"),
    ("wrapped database drop",
     lambda: _caused(RuntimeError("fp4 sweep aborted"), OperationalError("terminating connection")),
     True, "database"),
    ("a bug", lambda: KeyError("sections"), False, "error"),
]


@pytest.mark.parametrize(("fault", "transient", "kind"), [(f, t, k) for _, f, t, k in FAULTS],
                         ids=[name for name, *_ in FAULTS])
def test_faults_are_classed_transient_or_permanent(
    fault: Callable[[], BaseException], transient: bool, kind: str
) -> None:
    found = classify(fault())
    assert (found.transient, found.kind) == (transient, kind), found


# ----------------------------------------------------------------------- the orchestrator


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Probe]:
    def register(*outcomes: Any, name: str = "probe") -> Probe:
        stage = Probe(*outcomes)
        add_test_stage(monkeypatch, name, stage)
        return stage

    return register


def stage(job: DiagnosticJob, name: str) -> StageRun:
    return StageRun.objects.get(job=job, name=name)


@pytest.mark.django_db
@pytest.mark.parametrize(("fault", "kind"), [(f, k) for _, f, t, k in FAULTS if t],
                         ids=[name for name, _, t, _ in FAULTS if t])
def test_a_transient_fault_releases_the_stage_for_a_retry_and_says_what_it_was(
    make_job: MakeJob, probe: Callable[..., Probe], fault: Callable[[], BaseException], kind: str
) -> None:
    probe(fault())
    job = make_job(["probe", "report"])
    outcome = orchestrate(str(job.pk), no_lab)
    assert outcome.next is Next.RETRY
    run = stage(job, "probe")
    assert (run.status, run.attempts) == ("pending", 1)
    assert run.last_error.startswith(f"attempt 1: {kind}: ")


@pytest.mark.django_db
@pytest.mark.parametrize(("fault", "kind"), [(f, k) for _, f, t, k in FAULTS if not t],
                         ids=[name for name, _, t, _ in FAULTS if not t])
def test_a_permanent_fault_fails_the_stage_at_its_first_attempt(
    make_job: MakeJob, probe: Callable[..., Probe], fault: Callable[[], BaseException], kind: str
) -> None:
    probe(fault())
    job = make_job(["probe", "report"])
    done = run_until_done(str(job.pk), no_lab, sleep=lambda s: None)
    run = stage(job, "probe")
    assert (run.status, run.attempts) == ("failed", 1)
    assert str(fault()).split(":")[0] in run.status_message
    assert done.status == "partial"


@pytest.mark.django_db
def test_a_disk_that_stays_full_quarantines_the_stage_saying_so(
    make_job: MakeJob, probe: Callable[..., Probe], fast_retries: Any
) -> None:
    probe(_disk_full(), _disk_full(), _disk_full())
    job = make_job(["probe", "report"])
    done = run_until_done(str(job.pk), no_lab, sleep=lambda s: None)
    run = stage(job, "probe")
    assert (run.status, run.attempts) == ("quarantined", 3)
    assert "disk full writing /srv/out/jobs/x/report.pdf" in run.status_message
    assert done.status == "partial"


@pytest.mark.django_db
def test_a_database_blip_in_a_stage_is_retried_and_the_job_succeeds(
    make_job: MakeJob, probe: Callable[..., Probe], fast_retries: Any
) -> None:
    flaky = probe(OperationalError("the database system is shutting down"), "ok")
    job = make_job(["probe", "report"])
    done = run_until_done(str(job.pk), no_lab, sleep=lambda s: None)
    assert done.status == "succeeded", done.status_message
    assert flaky.calls == 2
    assert stage(job, "probe").attempts == 2
    # Only the successful attempt's finding is kept.
    titles = Finding.objects.filter(job=job, code="probe.seen").values_list("title", flat=True)
    assert list(titles) == ["call 2"]


# -------------------------------------------------------------- progress through an outage


class FlakyProgress:
    """Makes StageContext's progress write fail with a lost connection `failures` times."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        original = StageContext._save_progress

        def save(ctx: StageContext) -> None:
            self.calls += 1
            if self.failures > 0:
                self.failures -= 1
                raise OperationalError("could not connect to server: Connection refused")
            original(ctx)

        monkeypatch.setattr(StageContext, "_save_progress", save)
        monkeypatch.setattr("diagnostic.jobs.stage_context.PROGRESS_RETRY_PAUSES_S", (0.0,))


@pytest.mark.django_db
def test_progress_writes_the_database_misses_never_kill_the_stage(
    make_job: MakeJob, probe: Callable[..., Probe], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []

    def many_updates(ctx: StageContext) -> None:
        for step in range(5):
            ctx.progress(60 + step, f"step {step}")
        seen.append(ctx.deferred_writes)

    probe(many_updates)
    job = make_job(["probe"])
    # The attempt's first log line and the probe's first progress (two tries each) fail,
    # with the first try of the next: the stage goes on and a later write carries them.
    FlakyProgress(monkeypatch, failures=5)
    done = run_until_done(str(job.pk), no_lab, sleep=lambda s: None)
    assert done.status == "succeeded", done.status_message
    assert seen == [2]
    run = stage(job, "probe")
    assert run.attempts == 1
    for line in ("attempt 1 of", "probe call 1", "step 0", "step 4"):
        assert line in run.log


@pytest.mark.django_db
def test_a_deferred_progress_write_goes_out_with_the_next_log_line(
    make_job: MakeJob, probe: Callable[..., Probe], monkeypatch: pytest.MonkeyPatch
) -> None:
    def progress_then_log(ctx: StageContext) -> None:
        flaky = FlakyProgress(monkeypatch, failures=2)
        ctx.progress(70, "during the outage")
        assert StageRun.objects.get(pk=ctx.stage.pk).progress_percent != 70
        ctx.log("the database is back")  # within the throttle interval, but a write is owed
        assert flaky.failures == 0
        row = StageRun.objects.get(pk=ctx.stage.pk)
        assert (row.progress_percent, row.progress_message) == (70, "during the outage")
        assert "the database is back" in row.log

    probe(progress_then_log)
    job = make_job(["probe"])
    assert run_until_done(str(job.pk), no_lab, sleep=lambda s: None).status == "succeeded"


# ------------------------------------------------------------------ bookkeeping in outage


def test_bookkeeping_is_retried_through_an_outage_then_gives_up(settings: Any) -> None:
    settings.DIAG_DB_OUTAGE_S = 10
    failures = [OperationalError("connection refused")] * 3
    waits: list[float] = []

    def write() -> str:
        if failures:
            raise failures.pop()
        return "written"

    assert through_outage(write, "test write", sleep=waits.append) == "written"
    assert waits == [0.25, 0.5, 1.0]

    def never() -> None:
        raise OperationalError("connection refused")

    started = time.monotonic()
    with pytest.raises(OperationalError):
        through_outage(never, "test write", budget_s=0.6)
    assert time.monotonic() - started < 3


def test_bookkeeping_does_not_retry_errors_that_are_not_an_outage() -> None:
    calls = []

    def write() -> None:
        calls.append(1)
        raise IntegrityError("duplicate key")

    with pytest.raises(IntegrityError):
        through_outage(write, "test write", sleep=lambda s: None)
    assert calls == [1]


@pytest.mark.django_db(transaction=True)  # the retry happens outside any transaction
def test_a_stage_completion_the_database_lost_at_commit_is_kept_when_retried(
    make_job: MakeJob, probe: Callable[..., Probe], monkeypatch: pytest.MonkeyPatch
) -> None:
    from diagnostic.jobs import orchestration

    original = orchestration._complete
    tries: list[bool] = []

    def landed_then_lost(*args: Any) -> bool:
        # The first try commits, then the connection drops before the answer arrives.
        result = original(*args)
        tries.append(result)
        if len(tries) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return result

    monkeypatch.setattr(orchestration, "_complete", landed_then_lost)
    monkeypatch.setattr(faults.time, "sleep", lambda s: None)
    counting = probe()
    job = make_job(["probe"])
    done = run_until_done(str(job.pk), no_lab, sleep=lambda s: None)
    assert done.status == "succeeded"
    assert tries == [True, True]
    assert counting.calls == 1
    assert Finding.objects.filter(job=job, code="probe.seen").count() == 1


# ------------------------------------------------------------------------ the reaper


def _age(job: DiagnosticJob, seconds: float) -> None:
    DiagnosticJob.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(seconds=seconds))


@pytest.mark.django_db
def test_the_reaper_enqueues_again_a_job_whose_message_was_lost(
    make_job: MakeJob, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DIAG_QUEUED_REQUEUE_S = 300
    lost = make_job(["report"])
    fresh = make_job(["report"])
    cancelled = make_job(["report"])
    for job in (lost, cancelled):
        _age(job, 301)
    cancelled.request_cancel()
    sent: list[str] = []
    monkeypatch.setattr(tasks.run_diagnostic, "delay", lambda job_id: sent.append(job_id))
    assert tasks.reap_expired_leases() == [str(lost.pk)]
    assert sent == [str(lost.pk)]
    assert fresh.status == "queued"


@pytest.mark.django_db
def test_a_queued_job_waiting_for_a_busy_lab_is_left_to_its_own_retry(make_job: MakeJob) -> None:
    holder = make_job(["report"])
    waiting = make_job(["report"])
    _age(waiting, 10_000)
    assert leases.acquire_lab(holder, owner="w1", lease_s=60)
    assert leases.lost_queued_jobs(older_than_s=300) == []
    leases.release_lab(holder)
    assert leases.lost_queued_jobs(older_than_s=300) == [str(waiting.pk)]


@pytest.mark.django_db(transaction=True)  # the publish waits for the commit
def test_a_submission_with_the_broker_down_is_kept_queued_for_the_reaper(
    make_job: MakeJob, settings: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = False

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise kombu.exceptions.OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(tasks.run_diagnostic, "apply_async", broker_down)
    logging.getLogger("diagnostic.jobs.tasks").addHandler(caplog.handler)
    try:
        with transaction.atomic():
            job = make_job(["report"])
            tasks.enqueue_job(job)
    finally:
        logging.getLogger("diagnostic.jobs.tasks").removeHandler(caplog.handler)
    job.refresh_from_db()
    assert job.status == "queued"
    assert "could not enqueue the new job; the reaper will" in caplog.text


# -------------------------------------------------------------------- the time limit


@pytest.mark.django_db
def test_the_time_limit_stops_a_running_stage_and_fails_the_job_saying_so(
    make_job: MakeJob, probe: Callable[..., Probe]
) -> None:
    def forever(ctx: StageContext) -> None:
        while True:
            ctx.check_cancelled()
            time.sleep(0.02)

    probe(forever)
    job = make_job(["probe", "report"])
    started = time.monotonic()
    done = run_until_done(str(job.pk), no_lab, sleep=lambda s: None, time_limit_s=0.5)
    assert time.monotonic() - started < 5
    assert done.status == "failed"
    assert done.status_message == (
        "the run's time limit of 0.5 s was reached during probe; the stage was stopped"
    )
    assert (stage(job, "probe").status, stage(job, "report").status) == ("failed", "cancelled")
    assert stage(job, "report").status_message.startswith("not run: the run's time limit")


@pytest.mark.django_db
def test_the_time_limit_ends_the_wait_for_a_retry(
    make_job: MakeJob, probe: Callable[..., Probe], settings: Any
) -> None:
    settings.DIAG_RETRY_BASE_S = 600
    probe(NodeUnreachable({"spark-05": OSError("refused")}))
    job = make_job(["probe", "report"])
    waits: list[float] = []
    done = run_until_done(str(job.pk), no_lab, sleep=lambda s: (waits.append(s), time.sleep(s)),
                          time_limit_s=0.3)
    assert waits and max(waits) <= 0.3
    assert done.status == "failed"
    assert "time limit of 0.3 s was reached before" in done.status_message


@pytest.mark.django_db
def test_diagnose_refuses_a_time_limit_that_is_not_a_positive_number(tmp_path: Path) -> None:
    for value in ("0", "-5", "inf", "nan"):
        with pytest.raises(CommandError, match="--time-limit-s must be a positive number"):
            call_command("diagnose", "--config", str(REFERENCE_CONFIG), "--lab", "sim:none.yaml",
                         "--out", str(tmp_path), "--time-limit-s", value, stdout=io.StringIO())


# ----------------------------------------------------------------- whole files or none


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, the disk a report fills; where mounting is not permitted the test
    runs the write in a child under a file-size limit instead (see `write_on_full_disk`)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        yield tmp_path / "rlimit"
        return
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def write_on_full_disk(directory: Path, name: str, size: int) -> str:
    """Write `size` bytes atomically to directory/name in a child; returns its error text."""
    limit = "" if directory.name == "small" else (
        "import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (32768, 32768)); "
    )
    directory.mkdir(exist_ok=True)
    code = (
        f"{limit}from pathlib import Path; from reports.render import write_atomically\n"
        f"try:\n    write_atomically(Path({str(directory)!r}) / {name!r}, b'%PDF-' + b'x' * {size})\n"
        "except OSError as exc:\n    print(exc.errno, exc)\nelse:\n    print('written')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[3])
    return out.stdout.strip()


def test_a_write_that_fills_the_disk_leaves_no_truncated_file_and_keeps_the_old_one(full_disk: Path) -> None:
    assert write_on_full_disk(full_disk, "report.pdf", 1000) == "written"
    before = (full_disk / "report.pdf").read_bytes()
    error = write_on_full_disk(full_disk, "report.pdf", 200_000)
    assert error.split()[0] in (str(errno.ENOSPC), str(errno.EFBIG)), error
    assert (full_disk / "report.pdf").read_bytes() == before
    # The partial temporary file is gone, so the space is free for the retry.
    assert sorted(p.name for p in full_disk.iterdir()) == ["report.pdf"]
    error = write_on_full_disk(full_disk, "email.eml", 200_000)
    assert not (full_disk / "email.eml").exists()
    assert sorted(p.name for p in full_disk.iterdir()) == ["report.pdf"]


def test_an_atomic_write_replaces_the_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "report.pdf"
    write_atomically(target, b"first")
    write_atomically(target, b"second version")
    assert target.read_bytes() == b"second version"
    assert os.listdir(target.parent) == ["report.pdf"]
