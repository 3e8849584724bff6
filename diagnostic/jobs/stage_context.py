"""What a stage gets to work with: the job's configuration, the lab session, and ways to
report progress, write its log and record findings and measurements.

Findings and measurements are held here and saved only when the stage succeeds, in the
same transaction that marks it succeeded: a stage that dies half-way leaves nothing
behind, and its retry starts from its own beginning. Progress and the log are written
as the stage goes so that people watching the job see it move; a write the database
misses (a restart) is carried by the next one and never stops the stage.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from diagnostic.jobs.budget import stage_budget_lab_s
from diagnostic.jobs.faults import DATABASE_CONNECTION_ERRORS, reset_connection
from diagnostic.jobs.labaccess import LabAccess
from diagnostic.jobs.models import DiagnosticJob, StageRun
from diagnostic.pipelines.changes import apply_changes
from lab.catalog import Catalog
from lab.session import LabSession

# The stage log keeps its beginning and its end when it grows beyond this; the middle of
# a long engine log is the least useful part and the database row must stay small.
LOG_LIMIT_CHARS = 256 * 1024
PROGRESS_WRITE_INTERVAL_S = 1.0
# A progress write the database refuses is tried again after these pauses, then deferred.
PROGRESS_RETRY_PAUSES_S = (0.2,)

log = logging.getLogger(__name__)


class StopJob(Exception):
    """Raised by a stage that concluded the job cannot go on (e.g. preflight found the lab
    cannot run the configuration). The stage still succeeds: its findings are the result."""

    def __init__(self, reason: str, result: dict[str, Any] | None = None, *,
                 side: str = "customer") -> None:
        super().__init__(reason)
        self.reason = reason
        self.result = result or {}
        # Whose the stop is: "customer" (their configuration) or "lab" (ours).
        self.side = side


class StageCancelled(Exception):
    """The job was cancelled while this stage ran."""


def truncate_middle(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters, keeping its head and tail."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - 100) // 2
    dropped = len(text) - 2 * keep
    return f"{text[:keep]}\n[... {dropped} characters left out ...]\n{text[-keep:]}"


@dataclass
class FindingDraft:
    code: str
    title: str
    evidence: dict[str, Any]
    change: dict[str, Any]
    impact: dict[str, Any] | None
    blocking: bool


@dataclass
class MeasurementDraft:
    workload: str
    configuration: str
    n: int
    mean_tps: float
    ci95: tuple[float, float]
    ttft_s: float | None
    samples: list[Any]


@dataclass
class StageContext:
    job: DiagnosticJob
    stage: StageRun
    owner: str
    max_attempts: int
    access: LabAccess
    cancel_event: threading.Event = field(default_factory=threading.Event)
    findings: list[FindingDraft] = field(default_factory=list)
    measurements: list[MeasurementDraft] = field(default_factory=list)
    _log_parts: list[str] = field(default_factory=list)
    _last_write: float = 0.0
    _write_deferred: bool = False
    # Progress writes the database missed (each was carried by a later one).
    deferred_writes: int = 0

    @property
    def customer_config(self) -> dict[str, Any]:
        """The normalized customer configuration (diagnostic.config/1), as submitted."""
        normalized: dict[str, Any] = self.job.config.normalized
        return normalized

    @cached_property
    def config(self) -> dict[str, Any]:
        """The configuration this stage works on: the customer's, with every change the earlier
        stages of this job proved (their results' `config_changes`) applied in stage order, so
        that a later pipeline starts from what the earlier ones fixed and restarts are cheap."""
        changes = self.earlier_changes()
        if not changes:
            return self.customer_config
        return apply_changes(self.customer_config, changes, catalog=self.catalog)

    def earlier_changes(self) -> list[dict[str, Any]]:
        """The proved configuration changes of the stages before this one that did their work."""
        rows = StageRun.objects.filter(
            job=self.job, order__lt=self.stage.order, status__in=StageRun.WITH_RESULT
        ).order_by("order").values_list("result", flat=True)
        changes: list[dict[str, Any]] = []
        for result in rows:
            if isinstance(result, dict):
                changes.extend(c for c in result.get("config_changes") or [] if isinstance(c, dict))
        return changes

    @property
    def catalog(self) -> Catalog:
        """The catalog of the job's lab (the models it holds, with their profiles): what the
        job's configurations are admitted and rendered by, and where the model's sizes come
        from (the roofline, the memory checks)."""
        return self.access.catalog

    @property
    def budget_lab_s(self) -> float:
        """Lab seconds this stage may spend (the day's budget, shared: jobs/budget.py)."""
        return stage_budget_lab_s(self.job, self.stage)

    @property
    def seed(self) -> int:
        return self.job.seed

    @property
    def attempt(self) -> int:
        """1 on the first try of this stage, 2 on its first retry, ..."""
        return self.stage.attempts

    @property
    def session(self) -> LabSession:
        """The lab session, opened on first use (stages that never touch the lab never connect)."""
        return self.access.session()

    def earlier_result(self, stage_name: str) -> dict[str, Any] | None:
        """The result of an earlier stage of this job that did its work (succeeded, or stopped
        the job saying why), if any."""
        row = (
            StageRun.objects.filter(job=self.job, name=stage_name, status__in=StageRun.WITH_RESULT)
            .values_list("result", flat=True)
            .first()
        )
        return row if isinstance(row, dict) else None

    def check_cancelled(self) -> None:
        """Stop here if the job was cancelled; call between long steps."""
        if self.cancel_event.is_set():
            raise StageCancelled(f"job {self.job.pk} was cancelled during {self.stage.name}")

    def carry_log(self, earlier: str) -> None:
        """Start from what the stage's earlier attempts wrote: its log keeps every attempt."""
        if earlier.strip():
            self._log_parts.insert(0, earlier if earlier.endswith("\n") else earlier + "\n")

    def log(self, line: str) -> None:
        """Append a line to the stage's log (saved with the next progress write)."""
        stamp = time.strftime("%H:%M:%S", time.gmtime())
        self._log_parts.append(f"{stamp} {line.rstrip()}\n")
        self._write(force=False)

    def attach(self, title: str, text: str, *, limit: int = 64 * 1024) -> None:
        """Add a block of outside text (an engine log tail, say) to the stage's log."""
        self._log_parts.append(f"----- {title} -----\n{truncate_middle(text, limit).rstrip()}\n")
        self._write(force=False)

    @property
    def log_text(self) -> str:
        return truncate_middle("".join(self._log_parts), LOG_LIMIT_CHARS)

    def progress(self, percent: float, message: str) -> None:
        """Record how far the stage has got; written at once so the dashboard follows it."""
        self.stage.progress_percent = max(0, min(100, round(percent)))
        self.stage.progress_message = message[:300]
        stamp = time.strftime("%H:%M:%S", time.gmtime())
        self._log_parts.append(f"{stamp} [{self.stage.progress_percent}%] {message}\n")
        self._write(force=True)

    def _write(self, *, force: bool) -> None:
        """Save progress and the log. A database that is away (restarting, say) never
        stops the stage: the write is tried once more after a short pause, then left for
        the next one, which carries everything since (the log is written whole)."""
        now = time.monotonic()
        if not force and not self._write_deferred and now - self._last_write < PROGRESS_WRITE_INTERVAL_S:
            return
        self._last_write = now
        for pause in (*PROGRESS_RETRY_PAUSES_S, None):
            try:
                self._save_progress()
            except DATABASE_CONNECTION_ERRORS as exc:
                reset_connection()
                if pause is None:
                    self._write_deferred = True
                    self.deferred_writes += 1
                    log.warning("progress not saved: the database is unreachable; kept for the next write",
                                extra={"stage": self.stage.name, "error": f"{type(exc).__name__}: {exc}"})
                    return
                time.sleep(pause)
            else:
                self._write_deferred = False
                return

    def _save_progress(self) -> None:
        # Only the lease holder writes: a stage taken over by another worker keeps theirs.
        StageRun.objects.filter(
            pk=self.stage.pk, status=StageRun.Status.RUNNING, lease_owner=self.owner
        ).update(
            progress_percent=self.stage.progress_percent,
            progress_message=self.stage.progress_message,
            log=self.log_text,
        )

    def add_finding(
        self,
        code: str,
        title: str,
        *,
        evidence: dict[str, Any],
        change: dict[str, Any] | None = None,
        impact: dict[str, Any] | None = None,
        blocking: bool = False,
    ) -> None:
        self.findings.append(FindingDraft(code, title, evidence, change or {}, impact, blocking))
        self.log(f"finding {code}: {title}")

    def add_findings(self, findings: list[dict[str, Any]]) -> None:
        """Record the findings a pipeline returned, in its shape ({code, title, evidence,
        change, impact, blocking})."""
        for finding in findings:
            self.add_finding(
                finding["code"],
                finding["title"],
                evidence=finding.get("evidence", {}),
                change=finding.get("change"),
                impact=finding.get("impact"),
                blocking=bool(finding.get("blocking", False)),
            )

    def add_measurement(
        self,
        *,
        workload: str,
        configuration: str,
        n: int,
        mean_tps: float,
        ci95: tuple[float, float],
        ttft_s: float | None,
        samples: list[Any],
    ) -> None:
        self.measurements.append(
            MeasurementDraft(workload, configuration, n, mean_tps, ci95, ttft_s, samples)
        )
