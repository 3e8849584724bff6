"""`manage.py diagnose`: one diagnostic end to end, from a configuration file to
DIR/findings.json.

    python manage.py diagnose --config FILE --lab sim:SCENARIO.yaml --out DIR
        [--stages a,b] [--seed N] [--queue] [--time-limit-s S] [--budget-lab-s S]

`--lab sim:FILE` starts the simulated lab for the run and stops it afterwards;
`--lab inventory:FILE` uses a real (or separately served) lab. Without `--queue` the
job runs in this process; with it, Celery workers run it and this command waits.
`--time-limit-s` (default DIAG_DIAGNOSE_TIME_LIMIT_S) bounds the whole run: a stage still
running then is stopped and the job fails saying the limit was reached.
Log records go to DIR/diagnose.log (and to stderr with -v 2), so that a failure ends
with one clear line on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from diagnostic.bookings.configs import submit_configuration
from diagnostic.bookings.models import SIM_PREFIX, ClusterConfiguration, Lab
from diagnostic.jobs.findings_document import build_findings, validate_findings
from diagnostic.jobs.labaccess import open_lab_session
from diagnostic.jobs.leases import lab_holder
from diagnostic.jobs.models import DiagnosticJob, StageRun
from diagnostic.jobs.orchestration import Next, Outcome, create_job, run_until_done
from diagnostic.jobs.registry import UnknownStage
from diagnostic.jobs.tasks import enqueue_job
from diagnostic.jobs.tuning import write_tuned_files
from diagnostic.logfmt import KeyValueFormatter
from lab.config import ConfigError
from lab.inventory import InventoryError, load_inventory
from lab.session import LabError
from lab.sim.lab import SimLab
from lab.sim.scenario import ScenarioError, load_scenario
from reports.render import write_atomically

CONFIG_MAX_BYTES = 1024 * 1024
# A YAML configuration starts with `key:`; anything else is taken as a launch command.
_YAML_KEY = re.compile(r"^[A-Za-z_][\w.-]*\s*:(\s|$)")
QUEUE_POLL_S = 1.0


def looks_like_yaml(text: str) -> bool:
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped == "---":
            continue
        return bool(_YAML_KEY.match(stripped))
    return True


class Command(BaseCommand):
    help = "Run one diagnostic end to end and write DIR/findings.json."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--config", required=True, type=Path,
                            help="customer configuration: diagnostic.config/1 YAML or a launch command")
        parser.add_argument("--lab", required=True,
                            help="sim:SCENARIO.yaml (simulated lab, started for this run) or inventory:FILE")
        parser.add_argument("--out", required=True, type=Path, help="directory for findings.json")
        parser.add_argument("--stages", help="comma-separated stages to run (default: all)")
        parser.add_argument("--seed", type=int, default=0, help="seed for the pipelines' sampling")
        parser.add_argument("--dilation", type=float, default=None,
                            help="with --lab sim:, lab seconds per wall second instead of the scenario's")
        parser.add_argument("--budget-lab-s", type=float, default=None,
                            help="lab seconds the whole day may spend (default DIAG_DAY_BUDGET_LAB_S); "
                                 "stages stop early and say what they did not try")
        parser.add_argument("--queue", action="store_true",
                            help="hand the job to Celery workers (needs CELERY_BROKER_URL) and wait")
        parser.add_argument("--time-limit-s", type=float, default=None,
                            help="give up after this many wall seconds (default: DIAG_DIAGNOSE_TIME_LIMIT_S, "
                                 f"{settings.DIAG_DIAGNOSE_TIME_LIMIT_S} s)")

    def handle(self, *args: Any, **options: Any) -> None:
        out: Path = options["out"]
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CommandError(f"--out {out}: cannot create the directory ({exc.strerror})") from exc
        if options["seed"] < 0:
            raise CommandError(f"--seed must be 0 or more, got {options['seed']}")
        self._dilation = options["dilation"]
        if self._dilation is not None and not (0 < self._dilation <= 1000):
            raise CommandError(f"--dilation must be a number of lab seconds per wall second in (0, 1000], "
                               f"got {self._dilation}")
        budget = options["budget_lab_s"]
        if budget is not None and not (budget > 0 and budget < float("inf")):
            raise CommandError(f"--budget-lab-s must be a positive number of lab seconds, got {budget}")
        limit = options["time_limit_s"]
        limit = float(settings.DIAG_DIAGNOSE_TIME_LIMIT_S if limit is None else limit)
        if not limit > 0 or limit == float("inf"):
            raise CommandError(f"--time-limit-s must be a positive number of seconds, got {limit:g}")
        if options["queue"] and settings.CELERY_TASK_ALWAYS_EAGER:
            raise CommandError(
                "--queue needs CELERY_BROKER_URL (e.g. redis://127.0.0.1:6379/0) and a running "
                "worker (celery -A diagnostic worker); without --queue the job runs here"
            )
        stages = options["stages"].split(",") if options["stages"] else None
        with self._log_to(out / "diagnose.log", verbose=options["verbosity"] >= 2), ExitStack() as stack:
            try:
                # The file is read first (a path that cannot be read is told before any lab
                # starts); it is admitted by the catalog of the lab, so the lab comes next.
                text = self._read_configuration(options["config"])
                lab = self._lab(options["lab"], stack)
                config = self._configuration(options["config"], text, lab)
                job = self._run(config, lab, stages, options["seed"], queue=options["queue"],
                                time_limit_s=limit, budget=budget)
            except (ConfigError, InventoryError, ScenarioError, UnknownStage, LabError) as exc:
                raise CommandError(str(exc)) from exc
            except KeyboardInterrupt:
                raise CommandError("interrupted; the job was asked to cancel") from None
        path = self._write(job, out)
        if job.is_held:
            # The command did its job: the lab's fault is told apart from the customer's
            # configuration, written down for staff, and the day awaits its re-run.
            self.stdout.write(f"job {job.pk} held for a lab fault; a re-run is due at no cost "
                              f"(see {out / INCIDENT_NOTE})")
            return
        if job.status != DiagnosticJob.Status.SUCCEEDED:
            raise CommandError(
                f"job {job.pk} {job.status}: {job.status_message or 'see the stage table'}; "
                f"findings so far in {path}"
            )

    # -- inputs --------------------------------------------------------------------------
    def _read_configuration(self, path: Path) -> str:
        try:
            size = path.stat().st_size
            if size > CONFIG_MAX_BYTES:
                raise CommandError(f"--config {path}: {size} bytes is far too large for a configuration")
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"--config {path}: cannot read ({exc.strerror})") from exc
        except UnicodeDecodeError:
            raise CommandError(f"--config {path}: not UTF-8 text") from None

    def _configuration(self, path: Path, text: str, lab: Lab) -> ClusterConfiguration:
        """The configuration read from `path`, admitted by `lab`'s catalog and stored."""
        kinds = ClusterConfiguration.Source
        source = kinds.YAML if looks_like_yaml(text) else kinds.COMMAND
        try:
            return submit_configuration(raw_text=text, source=source, label=path.name, lab=lab)
        except ValidationError as exc:
            raise CommandError(f"--config {path}: {'; '.join(exc.messages)}") from exc

    def _lab(self, spec: str, stack: ExitStack) -> Lab:
        kind, _, target = spec.partition(":")
        if kind == "sim" and target:
            scenario = load_scenario(target)
            if self._dilation is not None:
                # Lab-time figures stay what they are; only the wall clock runs faster.
                scenario = dataclasses.replace(scenario, dilation=self._dilation)
            lab = _upsert_lab(f"{SIM_PREFIX}{scenario.name}", f"{SIM_PREFIX}{Path(target).resolve()}")
            holder = lab_holder(lab)
            if holder is not None:
                raise CommandError(f"lab {lab.name} is in use by job {holder}; wait for it or cancel it")
            self.stdout.write(f"starting simulated lab {scenario.name} (dilation {scenario.dilation:g})")
            sim = SimLab(scenario, lab.sim_state_dir)
            stack.enter_context(sim)
            lab.sync_nodes(load_inventory(sim.inventory_path))
            return lab
        if kind == "inventory" and target:
            inventory = load_inventory(target)
            lab = _upsert_lab(inventory.name, str(Path(target).resolve()))
            lab.sync_nodes(inventory)
            return lab
        raise CommandError(f"--lab must be sim:SCENARIO.yaml or inventory:FILE, got {spec!r}")

    # -- running -------------------------------------------------------------------------
    def _run(
        self, config: ClusterConfiguration, lab: Lab, stages: list[str] | None, seed: int, *, queue: bool,
        time_limit_s: float, budget: float | None = None,
    ) -> DiagnosticJob:
        printed: dict[str, str] = {}
        if queue:
            with transaction.atomic():
                job = create_job(config=config, lab=lab, stages=stages, seed=seed, budget_lab_s=budget)
                enqueue_job(job)
            self.stdout.write(f"job {job.pk} queued on {lab.name}")
            deadline = time.monotonic() + time_limit_s
            try:
                while not (job.is_terminal or job.is_held):
                    time.sleep(QUEUE_POLL_S)
                    job.refresh_from_db()
                    self._report_stages(job, printed)
                    if time.monotonic() > deadline:
                        # The workers stop the stage at their next heartbeat; the job is
                        # theirs to end, so this command stops waiting and says so.
                        job.request_cancel()
                        raise CommandError(
                            f"job {job.pk}: the time limit of {time_limit_s:g} s was reached; "
                            "the job was asked to cancel"
                        )
            except KeyboardInterrupt:
                job.request_cancel()
                raise
            self._report_stages(job, printed)
            return job

        job = create_job(config=config, lab=lab, stages=stages, seed=seed, budget_lab_s=budget)
        self.stdout.write(f"job {job.pk} on {lab.name}: {', '.join(_stage_names(job))}")

        def on_step(outcome: Outcome) -> None:
            self._report_stages(job, printed)
            if outcome.next in (Next.RETRY, Next.LAB_BUSY, Next.ELSEWHERE):
                wait = f" (next try in {outcome.countdown:g} s)" if outcome.countdown else ""
                self.stdout.write(f"  waiting: {outcome.message}{wait}")

        try:
            return run_until_done(str(job.pk), open_lab_session, max_stages=1, on_step=on_step,
                                  time_limit_s=time_limit_s)
        except KeyboardInterrupt:
            job.request_cancel()
            raise

    def _report_stages(self, job: DiagnosticJob, printed: dict[str, str]) -> None:
        """One line per stage each time its status changes."""
        for stage in StageRun.objects.filter(job=job).order_by("order"):
            if printed.get(stage.name) == stage.status or stage.status == StageRun.Status.PENDING:
                continue
            printed[stage.name] = stage.status
            seconds = f"{stage.lab_seconds:9.1f} lab s" if stage.lab_seconds is not None else " " * 15
            detail = stage.status_message or stage.progress_message
            self.stdout.write(f"  {stage.name:<12} {stage.status:<12}{seconds}  {detail}".rstrip())

    # -- output --------------------------------------------------------------------------
    def _write(self, job: DiagnosticJob, out: Path) -> Path:
        job.refresh_from_db()
        document = job.findings or build_findings(job)
        validate_findings(document)
        # Written whole or not at all (a full disk leaves the previous file, not half of one).
        path = write_atomically(out / "findings.json", (json.dumps(document, indent=2) + "\n").encode())
        succeeded = job.stage_runs.filter(name="report", status=StageRun.Status.SUCCEEDED)
        report = succeeded.values_list("result", flat=True).first()
        if isinstance(report, dict):
            for key, name in (("report_pdf", "report.pdf"), ("email_eml", "email.eml")):
                if report.get(key) and Path(report[key]).is_file():
                    write_atomically(out / name, Path(report[key]).read_bytes())
                    self.stdout.write(f"wrote {out / name}")
        for stage in job.stage_runs.filter(status__in=StageRun.WITH_RESULT).order_by("order"):
            result = stage.result if isinstance(stage.result, dict) else {}
            for name, text in (result.get("artifacts") or {}).items():
                # Files a stage made for the customer's own analysis (the cold-start telemetry).
                if isinstance(text, str) and Path(name).name == name and not name.startswith("."):
                    (out / name).write_text(text)
                    self.stdout.write(f"wrote {out / name}")
        if job.is_held:
            note = write_atomically(out / INCIDENT_NOTE, incident_note(job, document).encode())
            self.stdout.write(f"wrote {note}")
        if document.get("tuned"):
            for written in write_tuned_files(document["tuned"], out):
                self.stdout.write(f"wrote {written}")
        logs = out / "logs"
        logs.mkdir(exist_ok=True)
        for stage in job.stage_runs.order_by("order"):
            if stage.log:
                (logs / f"{stage.order:02d}-{stage.name}.log").write_text(stage.log)
        self.stdout.write(f"job {job.pk} {job.status}; lab time {document['job']['lab_time_s']:.0f} s")
        for line in headline_table(document):
            self.stdout.write(line)
        for finding in document["findings"]:
            self.stdout.write(f"  {finding['code']:<24} {finding['title']}")
        self.stdout.write(f"wrote {path}")
        return path

    @contextmanager
    def _log_to(self, path: Path, *, verbose: bool) -> Iterator[None]:
        """Send the platform's log records to `path` (and stderr only when verbose)."""
        handler = logging.FileHandler(path)
        handler.setFormatter(KeyValueFormatter())
        saved: list[tuple[logging.Logger, list[logging.Handler], int]] = []
        # The root logger too: libraries such as paramiko log there.
        for name in ("diagnostic", "lab", "celery", None):
            logger = logging.getLogger(name)
            saved.append((logger, list(logger.handlers), logger.level))
            logger.handlers = [*logger.handlers, handler] if verbose else [handler]
            logger.setLevel(logging.DEBUG if verbose else logging.INFO)
        try:
            yield
        finally:
            for logger, handlers, level in saved:
                logger.handlers = handlers
                logger.setLevel(level)
            handler.close()


INCIDENT_NOTE = "incident.md"


def incident_note(job: DiagnosticJob, document: dict[str, Any]) -> str:
    """The staff's short note on a day a lab fault stopped: what, where, the evidence, what
    was done to the lab, and what to do next. Not a customer report: none is written."""
    fault = document.get("lab_fault") or {}
    money = document.get("money_back") or {}
    lines = [
        f"# Lab fault: diagnostic {job.pk} held",
        "",
        f"- Lab: {job.lab.name}",
        f"- Stopped during: {fault.get('stage', '?')} ({fault.get('at', '?')})",
        f"- What: {fault.get('summary') or job.status_message}",
        f"- Nodes: {', '.join(fault.get('nodes') or []) or 'the lab as a whole'}",
        f"- Error: {fault.get('message', '')}",
        f"- Money back: {money.get('reason', 'not decided')}",
        "",
        "## Evidence",
        "",
        "```json",
        json.dumps(fault.get("evidence") or {}, indent=2, sort_keys=True),
        "```",
        "",
        "## The staff's log",
        "",
    ]
    lines += [f"- {timezone.localtime(e.at):%Y-%m-%d %H:%M:%S} {e.get_kind_display()}: {e.message}"
              for e in job.events.order_by("at", "id")]
    lines += [
        "",
        "## Next",
        "",
        "No customer report was written. Once the lab is healthy, re-run the day from the staff job "
        "page (from the stage that stopped, on the same day, or moved to another free lab day); the "
        "stages that completed are kept.",
        "",
    ]
    return "\n".join(lines)


def _upsert_lab(name: str, inventory: str) -> Lab:
    lab, _ = Lab.objects.update_or_create(name=name, defaults={"inventory": inventory})
    return lab


def _stage_names(job: DiagnosticJob) -> list[str]:
    return list(job.stage_runs.order_by("order").values_list("name", flat=True))


def headline_table(document: dict[str, Any]) -> list[str]:
    """The figures a consultant reads first, each straight from findings.json; a section
    that was not run shows as 'not run', never as a number."""
    rows: list[tuple[str, str, str]] = []
    cold = document.get("cold_start") or {}
    rows.append(("cold start, lab s", _fmt(cold.get("before_s"), 0), _fmt(cold.get("after_s"), 0)))
    measurement = document.get("measurement") or {}
    tuned = measurement.get("tuned") or {}
    for workload in ("code", "prose"):
        rows.append((f"{workload}: delivered tok/s (95 % CI)", _rate(measurement.get(workload)),
                     _rate(tuned.get(workload))))
    claimed = measurement.get("server_claimed_tps") or {}
    for workload in ("code", "prose"):
        claim = claimed.get(workload)
        shown = _fmt(claim, 1) if claim is not None or not measurement else "not reported"
        rows.append((f"{workload}: server-claimed tok/s", shown, ""))
    fp4 = document.get("fp4") or {}
    rows.append(("FP4 verdict", str(fp4.get("verdict", "not run")),
                 str(fp4.get("verdict_after") or ("" if not fp4 else fp4.get("verdict", "")))))
    money = document.get("money_back")
    rows.append(("money back", "not decided" if not money else
                 ("eligible" if money.get("eligible") else "not eligible"), ""))
    width = max(len(r[0]) for r in rows)
    lines = [f"  {'':<{width}}  {'customer config':<22}  tuned", f"  {'-' * (width + 32)}"]
    lines += [f"  {name:<{width}}  {before:<22}  {after}".rstrip() for name, before, after in rows]
    return lines


def _rate(section: Any) -> str:
    if not isinstance(section, dict):
        return "not run"
    value = _fmt(section.get("mean_tps"), 1)
    ci = section.get("ci95")
    if ci:
        value += f" [{ci[0]:.1f}, {ci[1]:.1f}]"
    return value


def _fmt(value: Any, digits: int) -> str:
    if value is None:
        return "not run"
    return f"{float(value):.{digits}f}"
