"""What the dashboard keeps of its own: each request to render a new report version, which
a Celery worker carries out (diagnostic.staff.tasks.render_report_version) while the review
page follows it: queued, being written, done (the version it made) or failed (why); and the
one-time links through which a staff account enrols its authenticator
(diagnostic.staff.enrolment)."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import models
from django.utils import timezone
from django_otp.plugins.otp_totp.models import TOTPDevice

from diagnostic.jobs.models import DiagnosticJob

# How long a render may be "being written" before the page stops waiting for it: the PDF's
# own limit twice (the renderer's child is killed at its limit), and a minute for the rest.
STALL_MARGIN_S = 60
# How long a render may wait for a worker before another may be asked for: the workers run
# the lab days' stages too, but ten minutes without one means its message was likely lost.
QUEUE_PATIENCE_S = 600


class ReportRender(models.Model):
    """One "render a new version" request of a job's report and how it went."""

    class State(models.TextChoices):
        QUEUED = "queued", "waiting for a worker"
        RUNNING = "running", "being written"
        DONE = "done", "done"
        FAILED = "failed", "failed"

    job = models.ForeignKey(DiagnosticJob, on_delete=models.CASCADE, related_name="report_renders")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    requested_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    # The version it made or found (its digest), whether that version is new, its pages.
    digest = models.CharField(max_length=64, blank=True)
    new_version = models.BooleanField(default=False)
    pages = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ("job", "requested_at", "id")

    def __str__(self) -> str:
        return f"render of job {self.job_id} requested {self.requested_at:%Y-%m-%d %H:%M:%S} ({self.state})"

    @property
    def version(self) -> str:
        return self.digest[:12]

    @property
    def is_active(self) -> bool:
        return self.state in (self.State.QUEUED, self.State.RUNNING)

    def stalled(self, now: dt.datetime | None = None) -> bool:
        """Being written for longer than a render can take (its worker stopped mid-way), or
        waiting for a worker for longer than QUEUE_PATIENCE_S (its message lost)."""
        now = now or timezone.now()
        if self.state == self.State.QUEUED:
            return (now - self.requested_at).total_seconds() > QUEUE_PATIENCE_S
        if self.state != self.State.RUNNING or self.started_at is None:
            return False
        limit = 2 * float(settings.REPORT_RENDER_TIMEOUT_S) + STALL_MARGIN_S
        return (now - self.started_at).total_seconds() > limit

    @property
    def seconds(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


class EnrolmentLink(models.Model):
    """A one-time link for `user` to enrol a TOTP authenticator: issued by another member of
    the staff group or by `manage.py otp_enrol_link` (issued_by empty), used once, before it
    expires, by that account signed in. Only the SHA-256 of its token is kept."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    token_hash = models.CharField(max_length=64, unique=True)
    issued_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                  on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    # The device the link's page offered (its secret shown to the account), confirmed by the
    # first right code, which uses the link.
    device = models.ForeignKey(TOTPDevice, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"enrolment link for user {self.user_id}, issued {self.created_at:%Y-%m-%d %H:%M}"

    @property
    def is_usable(self) -> bool:
        return self.used_at is None and timezone.now() < self.expires_at
