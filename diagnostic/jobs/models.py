"""Diagnostic jobs and what they produce.

A DiagnosticJob runs one configuration on one lab as an ordered list of StageRuns.
Each StageRun is claimed under a lease (owner + expiry) so that exactly one worker runs
it at a time and a dead worker's stage can be taken over; a stage that succeeded is
never run again. Findings and Measurements are written when their stage succeeds.
LabLease makes one job at a time the holder of a lab.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q

from diagnostic.bookings.models import Booking, ClusterConfiguration, Lab


class DiagnosticJob(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued", "queued"
        RUNNING = "running", "running"
        SUCCEEDED = "succeeded", "succeeded"
        # Finished, but a pipeline stage failed or was quarantined; its section is null.
        PARTIAL = "partial", "partial"
        FAILED = "failed", "failed"
        CANCELLED = "cancelled", "cancelled"

    TERMINAL = frozenset({Status.SUCCEEDED, Status.PARTIAL, Status.FAILED, Status.CANCELLED})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
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
    cancel_requested = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The diagnostic.findings/1 document, rebuilt when the job ends.
    findings = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)
        indexes = (models.Index(fields=["status"], name="job_status_idx"),)

    def __str__(self) -> str:
        return f"job {self.pk} on {self.lab_id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

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
    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        RUNNING = "running", "running"
        SUCCEEDED = "succeeded", "succeeded"
        FAILED = "failed", "failed"
        QUARANTINED = "quarantined", "quarantined"
        CANCELLED = "cancelled", "cancelled"

    DONE = frozenset({Status.SUCCEEDED, Status.FAILED, Status.QUARANTINED, Status.CANCELLED})

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
