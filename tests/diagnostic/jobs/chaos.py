"""Fault injection for the services tier and benchmarks/bench_chaos.py: a private PostgreSQL
and a private Redis that may be restarted at will, Celery workers on them, and small stages
that leave traces the checks read back.

Nothing shared is touched: the PostgreSQL cluster is initialised from the machine's own
binaries in a temporary directory on a free port, Redis likewise, so restarting them breaks
no other test. The platform runs in child processes pointed at them (`python -m
tests.diagnostic.jobs.chaos worker|submit|inspect|reap`), each with the chaos stages
registered, so the test process itself never holds a connection to the private servers
except for its own read-only polling.

The chaos stages, in job order:
- `chaos_first`: a quick stage with a finding (what was written before a fault must stay).
- `chaos_slow`: writes progress every 0.1 s for CHAOS_SLOW_S seconds (the window a fault
  lands in) and records a finding; a database restart must not kill it.
- `report` (the real one, when selected): renders the PDF into DIAG_OUT_DIR.
- `chaos_deliver`: sends one message per report version through the sent-once claim, to a
  directory (one file per message sent).
Every stage call is appended to CHAOS_CALLS as "stage attempt pid", so a check can tell
a stage that ran twice from one that was retried.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
# The children are development processes (as under pytest, tests/environment.py): the
# settings then need no SECRET_KEY.
DEVELOPMENT = {"DEBUG": os.environ.get("DEBUG", "1")}
CHAOS_STAGES = ("chaos_first", "chaos_slow")
AFTER_REPORT = ("chaos_deliver",)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _postgres_bin() -> Path:
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name)
    )
    if not versions:
        raise FileNotFoundError("no PostgreSQL binaries under /usr/lib/postgresql/*/bin")
    return versions[-1].parent


class PrivatePostgres:
    """A PostgreSQL cluster of our own: trust authentication, loopback, a free port."""

    def __init__(self) -> None:
        self.bin = _postgres_bin()
        self.root = Path(tempfile.mkdtemp(prefix="chaos-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.log = self.root / "server.log"
        # initdb and the server refuse to run as root; the packaged cluster's user runs them.
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.root, "postgres")

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self._as, *argv], capture_output=True, text=True, check=check)

    def start(self) -> PrivatePostgres:
        if not self.data.exists():
            self._run(
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
            )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            "30",
            "-o",
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the server (its clients' connections are cut), wait, start it again."""
        self.stop("fast")
        time.sleep(down_s)
        self.start()

    def url(self, name: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        done = subprocess.run(
            [
                str(self.bin / "psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                database,
                "-v",
                "ON_ERROR_STOP=1",
                "-Atqc",
                sql,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip()

    def close(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis:
    """A Redis of our own, without persistence: a restart comes back empty, as a broker
    that lost its queue does."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="chaos-redis-"))
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> PrivateRedis:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.root),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2),
            ):
                return self
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start listening within 10 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class Services:
    """The private servers and a migrated template database new scenarios copy."""

    postgres: PrivatePostgres
    redis: PrivateRedis
    template: str = "chaos_template"
    _count: int = 0

    @classmethod
    @contextlib.contextmanager
    def running(cls) -> Iterator[Services]:
        postgres, redis = PrivatePostgres(), PrivateRedis()
        try:
            postgres.start()
            redis.start()
            services = cls(postgres, redis)
            postgres.psql(f"CREATE DATABASE {services.template}")
            env = {
                **os.environ,
                "DATABASE_URL": postgres.url(services.template),
                "CELERY_BROKER_URL": redis.url,
                **DEVELOPMENT,
            }
            subprocess.run(
                [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
                cwd=REPO,
                env=env,
                check=True,
                capture_output=True,
            )
            yield services
        finally:
            redis.close()
            postgres.close()

    def new_database(self) -> str:
        self._count += 1
        name = f"chaos_{os.getpid()}_{self._count}"
        self.postgres.psql(f"CREATE DATABASE {name} TEMPLATE {self.template}")
        return name


@dataclass
class Scenario:
    """One job's world: its database, its directories, its workers, and how to read it."""

    services: Services
    root: Path
    slow_s: float = 4.0
    database: str = ""
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # Settings of this scenario's children over the defaults below.
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.database = self.database or self.services.new_database()
        for name in ("out", "mail"):
            (self.root / name).mkdir(parents=True, exist_ok=True)

    @property
    def calls_path(self) -> Path:
        return self.root / "calls.log"

    @property
    def mail_dir(self) -> Path:
        return self.root / "mail"

    @property
    def out_dir(self) -> Path:
        return self.root / "out"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": self.services.postgres.url(self.database),
            "CELERY_BROKER_URL": self.services.redis.url,
            "DIAG_QUEUE": "chaos",
            "DIAG_STAGE_LEASE_S": "6",
            "DIAG_LAB_LEASE_S": "8",
            "DIAG_HEARTBEAT_S": "1",
            "DIAG_RETRY_BASE_S": "1",
            "DIAG_RETRY_MAX_S": "4",
            "DIAG_REAPER_INTERVAL_S": "2",
            "DIAG_QUEUED_REQUEUE_S": "3",
            "DIAG_DB_OUTAGE_S": "30",
            "DIAG_OUT_DIR": str(self.out_dir),
            "CHAOS_CALLS": str(self.calls_path),
            "CHAOS_MAIL_DIR": str(self.mail_dir),
            "CHAOS_SLOW_S": str(self.slow_s),
            "LOG_LEVEL": "INFO",
            **DEVELOPMENT,
            **self.extra_env,
        }

    def command(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "tests.diagnostic.jobs.chaos", *argv],
            cwd=REPO,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"chaos {argv[0]} exited with {done.returncode}: {done.stderr[-1500:]}")
        return done

    def start_worker(self, name: str = "w") -> subprocess.Popen[bytes]:
        log = (self.root / f"worker-{name}-{len(self.workers)}.log").open("w")
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.diagnostic.jobs.chaos",
                "worker",
                name,
                str(self.root / f"beat-{name}"),
            ],
            cwd=REPO,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.workers.append(worker)
        return worker

    def worker_log_text(self) -> str:
        """Everything the workers wrote."""
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.root.glob("worker-*.log")))

    def worker_logs(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.root.glob("worker-*.log"))
        )

    def stop_workers(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                worker.terminate()
        for worker in self.workers:
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        self.workers.clear()

    def submit(self, stages: list[str], inventory: Path | None = None) -> str:
        """Create and enqueue a job (on the lab of `inventory`, if given); its id even when
        the enqueue failed (printed first)."""
        done = self.command("submit", ",".join(stages), *([str(inventory)] if inventory else []), check=False)
        lines = done.stdout.split()
        if not lines:
            raise RuntimeError(f"submit printed no job id: {done.stderr[-2000:]}")
        return lines[0]

    def inspect(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.command("inspect", job_id).stdout)
        return result

    def stage_row(self, job_id: str, name: str) -> tuple[str, int, int]:
        """(status, attempts, progress) of a stage, read straight from the database; raises
        while the database is down."""
        row = self.services.postgres.psql(
            f"SELECT status, attempts, progress_percent FROM jobs_stagerun WHERE job_id = '{job_id}' "
            f"AND name = '{name}'",
            database=self.database,
        )
        status, attempts, progress = row.split("|")
        return status, int(attempts), int(progress)

    def job_status(self, job_id: str) -> str:
        return self.services.postgres.psql(
            f"SELECT status FROM jobs_diagnosticjob WHERE id = '{job_id}'", database=self.database
        )

    def wait_for(self, condition: Any, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = condition()
            except subprocess.CalledProcessError:
                value = None  # the database is away for the moment
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{self.worker_logs()}")

    def wait_until_running(self, job_id: str, name: str, timeout: float = 60) -> None:
        self.wait_for(
            lambda: self.stage_row(job_id, name)[0] == "running" and self.stage_row(job_id, name)[2] >= 10,
            timeout,
            f"{name} to be running",
        )

    def wait_until_ended(self, job_id: str, timeout: float = 90) -> str:
        # Held for a lab fault is where a day stops that a lab fault outlasted: it waits for staff.
        terminal = {"succeeded", "partial", "failed", "cancelled", "held"}
        status: str = self.wait_for(
            lambda: (s := self.job_status(job_id)) in terminal and s, timeout, f"job {job_id} to end"
        )
        return status

    def calls(self) -> list[tuple[str, int]]:
        if not self.calls_path.exists():
            return []
        return [(line.split()[0], int(line.split()[1])) for line in self.calls_path.read_text().splitlines()]

    def emails_sent(self) -> int:
        return len(list(self.mail_dir.iterdir()))


def check_outcome(scenario: Scenario, job_id: str, *, expect_stages: list[str]) -> dict[str, Any]:
    """The properties every fault must leave standing; returns the job as inspected.

    The job ended with one clear reason (or none, succeeded), or is held for a lab fault with
    one; no stage that succeeded ran again; at most one email per report version; findings
    of succeeded stages are there once each."""
    job = scenario.inspect(job_id)
    assert job["status"] in ("succeeded", "partial", "failed", "held"), job
    if job["status"] != "succeeded":
        assert job["status_message"].strip(), job
    stages = {s["name"]: s for s in job["stages"]}
    assert sorted(stages) == sorted(expect_stages), stages
    calls = scenario.calls()
    for name, stage in stages.items():
        if stage["status"] == "succeeded" and name in (*CHAOS_STAGES, *AFTER_REPORT):
            runs = [attempt for stage_name, attempt in calls if stage_name == name]
            # A stage runs once per attempt at most, and none after the attempt that succeeded.
            assert runs == sorted(set(runs)) and runs[-1] == stage["attempts"], (name, runs, stage)
    for code in ("chaos.first", "chaos.slow"):
        stage_name = code.replace(".", "_")
        if stages.get(stage_name, {}).get("status") == "succeeded":
            assert [f["code"] for f in job["findings"]].count(code) == 1, job["findings"]
    assert scenario.emails_sent() <= max(1, len(job["emails"])), job["emails"]
    assert all(e["state"] == "sent" for e in job["emails"]) or job["status"] != "succeeded", job["emails"]
    return job


# ----------------------------------------------------------------- the child processes


def _record_call(stage: str, attempt: int) -> None:
    with open(os.environ["CHAOS_CALLS"], "a") as sink:
        sink.write(f"{stage} {attempt} {os.getpid()}\n")


def _install_stages() -> None:
    """Register the chaos stages in a registry whose order extends the real one."""
    from diagnostic.jobs import registry
    from diagnostic.jobs.stage_context import StageContext

    def first(ctx: StageContext) -> dict[str, Any]:
        _record_call("chaos_first", ctx.attempt)
        ctx.progress(50, "first stage working")
        ctx.add_finding("chaos.first", "written before the fault", evidence={"attempt": ctx.attempt})
        return {"stage": "first"}

    def slow(ctx: StageContext) -> dict[str, Any]:
        _record_call("chaos_slow", ctx.attempt)
        seconds = float(os.environ.get("CHAOS_SLOW_S", "4"))
        steps = max(1, int(seconds / 0.1))
        for step in range(steps):
            ctx.check_cancelled()
            ctx.progress(10 + 80 * step / steps, f"slow step {step + 1}/{steps}")
            time.sleep(0.1)
        ctx.add_finding("chaos.slow", "survived the fault", evidence={"steps": steps})
        return {"steps": steps, "deferred_writes": ctx.deferred_writes}

    def deliver(ctx: StageContext) -> dict[str, Any]:
        from django.core.mail import EmailMultiAlternatives, get_connection

        from reports.email import send_report_email

        _record_call("chaos_deliver", ctx.attempt)
        ctx.progress(20, "sending the report email")
        message = EmailMultiAlternatives(
            subject=f"job {ctx.job.pk}",
            body="report ready",
            to=["ops@example.org"],
            headers={"Message-ID": f"<{ctx.job.pk}@chaos>"},
        )
        connection = get_connection(
            "django.core.mail.backends.filebased.EmailBackend", file_path=os.environ["CHAOS_MAIL_DIR"]
        )
        sent = send_report_email(
            message, job_id=str(ctx.job.pk), report_digest="chaos-v1", connection=connection
        )
        return {"sent_now": sent}

    registry.load_adapters()
    current = registry.REGISTRY
    order = [n for n in current.order if n != "report"]
    scratch = registry.StageRegistry([*order, *CHAOS_STAGES, "report", *AFTER_REPORT])
    for stage in current.stages():
        scratch.register(stage.name, stage.run, required=stage.required, after_stop=stage.after_stop)
    scratch.register("chaos_first", first)
    scratch.register("chaos_slow", slow)
    scratch.register("chaos_deliver", deliver)
    registry.REGISTRY = scratch


def _submit(stages: str, inventory: str | None = None) -> None:
    from diagnostic.bookings.configs import submit_configuration
    from diagnostic.bookings.models import Lab
    from diagnostic.jobs.orchestration import create_job
    from diagnostic.jobs.tasks import enqueue_job

    config = submit_configuration(
        raw_text=(REPO / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml").read_text(),
        source="yaml",
        label="chaos",
    )
    if inventory is not None:
        from lab.inventory import load_inventory

        lab, _ = Lab.objects.update_or_create(name="chaos-sim-lab", defaults={"inventory": inventory})
        lab.sync_nodes(load_inventory(inventory))
    else:
        # Stages that never open the lab: the row only has to exist.
        lab, _ = Lab.objects.get_or_create(
            name="chaos-lab",
            defaults={"inventory": f"sim:{REPO / 'lab/scenarios/reference-kimi-k2-8spark.yaml'}"},
        )
    job = create_job(config=config, lab=lab, stages=stages.split(","))
    print(job.pk, flush=True)
    enqueue_job(job)  # outside a transaction: publishes now (a broker that is down is logged)


def _inspect(job_id: str) -> None:
    from diagnostic.jobs.models import DiagnosticJob
    from reports.models import ReportEmail

    job = DiagnosticJob.objects.get(pk=job_id)
    print(
        json.dumps(
            {
                "status": job.status,
                "status_message": job.status_message,
                "stages": [
                    {
                        "name": s.name,
                        "status": s.status,
                        "attempts": s.attempts,
                        "message": s.status_message,
                        "last_error": s.last_error,
                        "result": s.result,
                        "log": s.log,
                    }
                    for s in job.stage_runs.order_by("order")
                ],
                "findings": [
                    {"code": f.code, "stage": f.stage.name if f.stage else None, "evidence": f.evidence}
                    for f in job.finding_set.select_related("stage")
                ],
                "emails": [
                    {"digest": e.report_digest, "state": e.state, "attempts": e.attempts}
                    for e in ReportEmail.objects.filter(job_id=job_id)
                ],
            },
            default=str,
        )
    )


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "diagnostic.settings")
    import django

    django.setup()
    _install_stages()
    verb, *rest = argv
    if verb == "worker":
        from diagnostic.celery import app

        name, schedule = rest
        app.worker_main(
            [
                "worker",
                "--pool=solo",
                "--concurrency=1",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-n",
                f"{name}@%h",
                "-Q",
                os.environ["DIAG_QUEUE"],
                "--loglevel=INFO",
                "-B",
                "-s",
                schedule,
            ]
        )
    elif verb == "submit":
        _submit(*rest)
    elif verb == "inspect":
        _inspect(rest[0])
    else:
        raise SystemExit(f"unknown verb {verb!r}: worker, submit or inspect")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
