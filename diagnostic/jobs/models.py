"""Diagnostic jobs and what they produce.

A DiagnosticJob runs one configuration on one lab as an ordered list of StageRuns.
Each StageRun is claimed under a lease (owner + expiry) so that exactly one worker runs
it at a time and a dead worker's stage can be taken over; a stage that succeeded is
never run again. Findings and Measurements are written when their stage succeeds.
LabLease makes one job at a time the holder of a lab. ReportVersion records each report
a job produced and whether staff approved it for the customer.

A job belongs to the organisation of its configuration, and its booking is the
configuration's booking: save() derives both and refuses a job whose links disagree.

A job for a booking waits, queued, until its lab day begins (midnight of the day in
settings.TIME_ZONE, the lab's time); `released_at` records when it was handed to the
workers. A job without a booking (`diagnose`, a consultant's run) is due at once.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from diagnostic import lifecycle
from diagnostic.bookings.models import Booking, ClusterConfiguration, Lab, Organisation, OrganisationScoped
from diagnostic.lifecycle import JOB_ENDED, STAGE_ENDED, STAGE_WITH_RESULT, JobState, StageState


class JobQuerySet(OrganisationScoped):
    """Jobs, with the filters the lab-day start and the reaper share."""

    def due(self, now: dt.datetime | None = None) -> JobQuerySet:
        """Jobs that may run now: no booking, or a booking whose lab day has begun and was
        not closed (maintenance) before the job started."""
        today = timezone.localdate(now or timezone.now())
        open_day = Q(booking__lab_day__closed=False) | Q(started_at__isnull=False)
        return self.filter(Q(booking__isnull=True) | (Q(booking__lab_day__date__lte=today) & open_day))

    def held_by_closed_day(self) -> JobQuerySet:
        """Queued, never-started jobs whose booked lab day was closed after they were
        confirmed: they wait until the booking moves to an open day."""
        return self.filter(status=DiagnosticJob.Status.QUEUED, started_at__isnull=True,
                           booking__lab_day__closed=True)

    def waiting_for_lab_day(self, now: dt.datetime | None = None) -> JobQuerySet:
        """Queued jobs whose booking's lab day is still ahead."""
        today = timezone.localdate(now or timezone.now())
        return self.filter(status=DiagnosticJob.Status.QUEUED, booking__lab_day__date__gt=today)

    def queued_since(self, moment: dt.datetime) -> JobQuerySet:
        """Queued jobs handed to the workers (or, never handed, created) before `moment`."""
        return self.alias(since=Coalesce("released_at", "created_at")).filter(
            status=DiagnosticJob.Status.QUEUED, since__lt=moment
        )


class DiagnosticJob(models.Model):
    Status = JobState

    class Side(models.TextChoices):
        """Whose a stop is: the customer's configuration, or the firm's (the lab, the
        platform). METHODOLOGY.md "Money back"."""

        CUSTOMER = "customer", "the customer's configuration"
        LAB = "lab", "the lab"
        PLATFORM = "platform", "the platform"

    TERMINAL = JOB_ENDED

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organisation = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="jobs")
    booking = models.ForeignKey(
        Booking, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
    )
    config = models.ForeignKey(ClusterConfiguration, on_delete=models.PROTECT, related_name="jobs")
    lab = models.ForeignKey(Lab, on_delete=models.PROTECT, related_name="jobs")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="diagnostic_jobs",
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    status_message = models.TextField(blank=True)
    seed = models.PositiveIntegerField(default=0)
    # Lab seconds the whole day may spend (None: settings.DIAG_DAY_BUDGET_LAB_S); the
    # stages share what is left (diagnostic/jobs/budget.py) and say what they left untried.
    budget_lab_s = models.FloatField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    # When the job was handed to the workers: at creation for a job due at once, when its
    # lab day begins for a booking ahead (diagnostic.jobs.tasks.start_due_jobs).
    released_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The diagnostic.findings/1 document, rebuilt when the job ends.
    findings = models.JSONField(null=True, blank=True)
    # Whose the stop was (the job ended failed, or is held) and why: status_message.
    stop_side = models.CharField(max_length=10, choices=Side.choices, blank=True)
    # The lab fault the job is held for: what, where (stage, nodes), the evidence, when.
    # Kept after a re-run (the audit trail is the JobEvent rows); cleared fields are not.
    fault = models.JSONField(null=True, blank=True)
    # When a lab fault first held this diagnostic: the five business days of the money-back
    # rule run from here.
    first_fault_at = models.DateTimeField(null=True, blank=True)
    # Some stage opened a session on the lab: the job has engines to stop at its end.
    lab_used = models.BooleanField(default=False)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ("-created_at",)
        indexes = (models.Index(fields=["status"], name="job_status_idx"),)

    def __str__(self) -> str:
        return f"job {self.pk} on {self.lab_id} ({self.status})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # The configuration decides whose job this is; a job given no booking takes the
        # configuration's, so job.booking and job.config.booking cannot drift apart.
        if self._state.adding:
            if self.organisation_id is None:
                self.organisation_id = self.config.organisation_id
            if self.booking_id is None:
                self.booking_id = self.config.booking_id
        self.clean()
        super().save(*args, **kwargs)

    def clean(self) -> None:
        config = self.config
        if self.booking_id != config.booking_id:
            raise ValidationError({"booking": "must be the booking the configuration was submitted for"})
        if self.organisation_id != config.organisation_id:
            raise ValidationError({"organisation": "must be the organisation of the configuration"})

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    @property
    def is_held(self) -> bool:
        return self.status == self.Status.HELD

    @property
    def lab_day_starts_at(self) -> dt.datetime | None:
        """When the booked lab day begins (None: no booking, the job is due at once)."""
        booking = self.booking
        return booking.lab_day.starts_at if booking is not None else None

    def is_due(self, now: dt.datetime | None = None) -> bool:
        """True once the job may run: it has no booking, or its lab day has begun and was
        not closed before the job started."""
        if self.held_by_closed_day:
            return False
        starts = self.lab_day_starts_at
        return starts is None or (now or timezone.now()) >= starts

    @property
    def held_by_closed_day(self) -> bool:
        """The booked lab day was closed (maintenance) after confirmation and the job never
        started: it waits for the booking to move to an open day."""
        booking = self.booking
        return (booking is not None and booking.lab_day.closed and self.started_at is None
                and self.status == self.Status.QUEUED)

    def waits_for_lab_day(self, now: dt.datetime | None = None) -> bool:
        return self.status == self.Status.QUEUED and not self.is_due(now)

    @property
    def status_words(self) -> str:
        """The job's state in the words of the portal: a job confirmed ahead of its day
        says which day it waits for."""
        booking = self.booking
        if booking is not None and self.held_by_closed_day:
            day = booking.lab_day.date
            when = f"{day:%A} {day.day} {day:%B %Y}"
            return f"on hold: the lab closed on your lab day ({when}); move the booking"
        if booking is not None and self.waits_for_lab_day():
            day = booking.lab_day.date
            return f"waiting for your lab day ({day:%A} {day.day} {day:%B %Y})"
        return self.get_status_display()

    def request_cancel(self) -> bool:
        """Ask the job to stop; the orchestrator honours it between stages and through the
        stage heartbeat. Returns False when the job had already ended."""
        changed = (
            DiagnosticJob.objects.filter(pk=self.pk)
            .exclude(status__in=self.TERMINAL)
            .update(cancel_requested=True)
        )
        self.refresh_from_db(fields=["cancel_requested", "status"])
        return changed == 1


class StageRun(models.Model):
    Status = StageState

    DONE = STAGE_ENDED
    WITH_RESULT = STAGE_WITH_RESULT

    job = models.ForeignKey(DiagnosticJob, on_delete=models.CASCADE, related_name="stage_runs")
    name = models.CharField(max_length=40)
    order = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    status_message = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    progress_percent = models.PositiveSmallIntegerField(default=0)
    progress_message = models.CharField(max_length=300, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    lab_seconds = models.FloatField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    log = models.TextField(blank=True)

    class Meta:
        ordering = ("job", "order")
        constraints = (
            models.UniqueConstraint(fields=["job", "name"], name="stage_run_name_unique"),
            models.UniqueConstraint(fields=["job", "order"], name="stage_run_order_unique"),
            models.CheckConstraint(
                condition=Q(progress_percent__lte=100), name="stage_run_progress_at_most_100"
            ),
        )
        indexes = (
            models.Index(fields=["status", "lease_expires_at"], name="stage_run_lease_idx"),
        )

    def __str__(self) -> str:
        return f"{self.name} of job {self.job_id} ({self.status})"

    @property
    def is_done(self) -> bool:
        return self.status in self.DONE


class Finding(models.Model):
    """One thing that stood between the customer's configuration and good numbers, or a
    problem with the lab, with the evidence that decided it and the change that fixes it."""

    job = models.ForeignKey(DiagnosticJob, on_delete=models.CASCADE, related_name="finding_set")
    stage = models.ForeignKey(
        StageRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="findings"
    )
    code = models.CharField(max_length=60)
    title = models.CharField(max_length=300)
    # A blocking finding stopped the job: the lab could not run the configuration.
    blocking = models.BooleanField(default=False)
    evidence = models.JSONField(default=dict, blank=True)
    change = models.JSONField(default=dict, blank=True)
    impact = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("job", "id")
        indexes = (models.Index(fields=["code"], name="finding_code_idx"),)

    def __str__(self) -> str:
        return f"{self.code}: {self.title}"

    def as_document(self) -> dict[str, Any]:
        """This finding as an entry of findings.json's `findings` list."""
        return {
            "code": self.code,
            "title": self.title,
            "evidence": self.evidence,
            "change": self.change,
            "impact": self.impact,
            "blocking": self.blocking,
        }


class Measurement(models.Model):
    """Delivered throughput of one workload under one configuration, with its interval
    and the raw per-run samples it was computed from."""

    job = models.ForeignKey(DiagnosticJob, on_delete=models.CASCADE, related_name="measurements")
    stage = models.ForeignKey(
        StageRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="measurements"
    )
    workload = models.CharField(max_length=40)
    configuration = models.CharField(max_length=200, help_text="label, e.g. 'customer' or 'eagle3 k=3'")
    n = models.PositiveIntegerField()
    mean_tps = models.FloatField()
    ci95_low = models.FloatField()
    ci95_high = models.FloatField()
    ttft_s = models.FloatField(null=True, blank=True)
    samples = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("job", "id")
        constraints = (
            models.CheckConstraint(
                condition=Q(ci95_low__lte=models.F("ci95_high")), name="measurement_ci_ordered"
            ),
        )

    def __str__(self) -> str:
        return f"{self.workload} / {self.configuration}: {self.mean_tps:.1f} tok/s (n={self.n})"


class LabLease(models.Model):
    """Which job holds a lab, until when. Taken with a conditional UPDATE; a lease whose
    expiry passed (its worker died) is free for the next job."""

    lab = models.OneToOneField(Lab, on_delete=models.CASCADE, primary_key=True, related_name="lease")
    job = models.ForeignKey(
        DiagnosticJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="lab_leases"
    )
    owner = models.CharField(max_length=200, blank=True)
    acquired_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.lab_id}: {self.job_id or 'free'}"


class ReportVersion(models.Model):
    """One version of a job's written report (its digest names what it says), and whether
    staff approved it for the customer. The customer sees only approved versions."""

    job = models.ForeignKey(DiagnosticJob, on_delete=models.CASCADE, related_name="report_versions")
    digest = models.CharField(max_length=64)
    pdf_path = models.CharField(max_length=500)
    pages = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    approved_at = models.DateTimeField(null=True, blank=True)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        ordering = ("job", "created_at", "id")
        # Who may release a report and decide a refund: the "staff" group holds both
        # (diagnostic/staff/apps.py); being is_staff alone lets a consultant look, not act.
        permissions = (
            ("approve_report", "Can approve a report version and send it to the customer"),
            ("decide_refund", "Can override the money-back decision"),
        )
        constraints = (
            models.UniqueConstraint(fields=["job", "digest"], name="report_version_once_per_digest"),
            # An approval names who gave it, and only an approval does.
            models.CheckConstraint(
                condition=Q(approved_at__isnull=True, approved_by__isnull=True)
                | Q(approved_at__isnull=False),
                name="report_version_approver_only_when_approved",
            ),
        )

    def __str__(self) -> str:
        state = "approved" if self.approved_at else "awaiting approval"
        return f"report {self.version} of job {self.job_id} ({state})"

    @property
    def version(self) -> str:
        return self.digest[:12]

    @property
    def is_approved(self) -> bool:
        return self.approved_at is not None

    def approve(self, *, by: Any = None) -> None:
        """Release this version to the customer (staff dashboard; the demo's auto-approval)."""
        ReportVersion.objects.filter(pk=self.pk, approved_at__isnull=True).update(
            approved_at=timezone.now(), approved_by=by
        )
        self.refresh_from_db(fields=["approved_at", "approved_by"])


def record_report_version(*, job: DiagnosticJob, digest: str, pdf_path: str, pages: int) -> ReportVersion:
    """Note a rendered report version once (re-rendering the same report changes nothing);
    with PORTAL_AUTO_APPROVE on it is released to the customer at once."""
    row, _ = ReportVersion.objects.get_or_create(
        job=job, digest=digest, defaults={"pdf_path": pdf_path, "pages": pages}
    )
    if settings.PORTAL_AUTO_APPROVE and not row.is_approved:
        row.approve()
    return row


class FindingEdit(models.Model):
    """One staff edit of a finding's words: its title, its narrative (the paragraph the
    report opens the finding with) or the consultant's note. Rows are only ever added; a
    field's current text is its latest edit's `after`. Measured numbers, evidence and
    intervals are not editable, so they have no field here."""

    class Field(models.TextChoices):
        TITLE = "title", "title"
        NARRATIVE = "narrative", "narrative"
        NOTE = "note", "consultant's note"

    finding = models.ForeignKey(Finding, on_delete=models.CASCADE, related_name="edits")
    field = models.CharField(max_length=12, choices=Field.choices)
    before = models.TextField(blank=True)
    after = models.TextField(blank=True)
    edited_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    edited_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("finding", "edited_at", "id")
        indexes = (models.Index(fields=["finding", "field"], name="finding_edit_field_idx"),)

    def __str__(self) -> str:
        return f"{self.field} of finding {self.finding_id} by user {self.edited_by_id}"


class LabHealth(models.Model):
    """The latest health poll of a lab as a whole: when it ran and, when the lab could not
    be reached at all (no inventory, a simulated lab not serving), why."""

    lab = models.OneToOneField(Lab, on_delete=models.CASCADE, primary_key=True, related_name="health")
    checked_at = models.DateTimeField(default=timezone.now)
    error = models.TextField(blank=True)
    poll_seconds = models.FloatField(default=0.0)

    def __str__(self) -> str:
        return f"{self.lab_id} checked {self.checked_at:%H:%M:%S}"


class NodeHealth(models.Model):
    """One node's state at the latest poll, as its agent reported it (facts, status,
    telemetry). Null means the node did not report it; the dashboard says so rather than
    showing a number nobody measured."""

    lab = models.ForeignKey(Lab, on_delete=models.CASCADE, related_name="node_health")
    node = models.CharField(max_length=100)
    role = models.CharField(max_length=10, blank=True)
    reachable = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    checked_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    engine_running = models.BooleanField(null=True)
    engine_exit_code = models.IntegerField(null=True, blank=True)
    spec_sha256 = models.CharField(max_length=64, blank=True)
    gpu_name = models.CharField(max_length=200, blank=True)
    gpu_temperature_c = models.FloatField(null=True, blank=True)
    gpu_memory_total_mib = models.PositiveIntegerField(null=True, blank=True)
    mem_total_kib = models.PositiveBigIntegerField(null=True, blank=True)
    mem_available_kib = models.PositiveBigIntegerField(null=True, blank=True)
    disk_free_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    page_cache_kib = models.PositiveBigIntegerField(null=True, blank=True)
    # The newest telemetry sample: its lab-clock stamp and the wall time it stands for.
    last_telemetry_lab_t = models.FloatField(null=True, blank=True)
    last_telemetry_at = models.DateTimeField(null=True, blank=True)
    # Who started the engine, as its launch spec says ({"platform": ..., "job": ...}); null
    # when the agent named nobody (an engine started by hand, or an older agent).
    engine_owner = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ("lab", "node")
        constraints = (
            models.UniqueConstraint(fields=["lab", "node"], name="node_health_once_per_node"),
        )

    def __str__(self) -> str:
        return f"{self.lab_id}/{self.node}: {'up' if self.reachable else 'unreachable'}"


class JobEvent(models.Model):
    """The staff's log of a job: what the platform did to the lab for it (engines of an
    earlier job stopped, its own stopped at its end), lab faults that held it, re-runs and
    moves. Staff only; the customer's report carries none of it except, for a re-run day,
    the fault in its audit trail."""

    class Kind(models.TextChoices):
        LAB_CLEANED = "lab_cleaned", "lab cleaned before the job"
        ENGINES_STOPPED = "engines_stopped", "engines stopped"
        LAB_FAULT = "lab_fault", "held for a lab fault"
        RETRIED = "retried", "re-run on the same day"
        MOVED = "moved", "moved to another lab day"

    job = models.ForeignKey(DiagnosticJob, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")

    class Meta:
        ordering = ("job", "at", "id")

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.kind}: {self.message}"


def cancel_waiting_jobs(booking: Booking, *, reason: str, now: dt.datetime | None = None,
                        only: Any = None) -> int:
    """Cancel the jobs (or the one job `only`) still waiting for the booking's lab day,
    with their stages, saying why; returns how many. A job that has started is left be."""
    moment = now or timezone.now()
    waiting = DiagnosticJob.objects.filter(booking=booking, status=DiagnosticJob.Status.QUEUED,
                                           started_at__isnull=True)
    if only is not None:
        waiting = waiting.filter(pk=only)
    ids = list(waiting.values_list("pk", flat=True))
    lifecycle.CANCEL.apply(StageRun.objects.filter(job_id__in=ids, status=StageRun.Status.PENDING),
                           status_message=f"not run: {reason}", finished_at=moment)
    return lifecycle.CANCEL_WAITING.apply(waiting.filter(pk__in=ids), status_message=reason,
                                          cancel_requested=True, finished_at=moment)


def booking_cancelling_receiver(sender: Any, *, booking: Booking, reason: str, now: dt.datetime,
                                 **kwargs: Any) -> None:
    """bookings.booking_cancelling: the booking's waiting diagnostics go with it."""
    cancel_waiting_jobs(booking, reason=reason, now=now)

