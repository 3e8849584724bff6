"""What the reports app keeps in the database: staff money-back decisions (the audit
trail a report prints) and the record that makes each report version's email go out once.

Both are keyed by the job's id as findings.json names it (`job_id`, as the report and its
email quote it) and, when the platform has that job, linked to its row (`job_record`, a
foreign key to settings.REPORTS_JOB_MODEL, the way auth names AUTH_USER_MODEL): through it
a row has its job's organisation. The app imports nothing of the platform; save() fills the
link from `job_id`, and a row whose job the platform does not hold (a findings file
rendered on its own) keeps only the id.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from reports.moneyback import OverrideEntry

if TYPE_CHECKING:
    from django.contrib.auth.models import User

MIN_REASON_CHARS = 20

JOB_MODEL: str = getattr(settings, "REPORTS_JOB_MODEL", "")
if not JOB_MODEL:
    raise ImproperlyConfigured(
        "REPORTS_JOB_MODEL is not set: name the model whose primary key findings.json's job.id "
        "is, as app_label.ModelName (the platform's is jobs.DiagnosticJob)"
    )


def job_row_id(job_id: str) -> Any:
    """The primary key of the platform's job named `job_id`, or None when it holds none."""
    model = apps.get_model(JOB_MODEL)
    try:
        return model._default_manager.filter(pk=job_id).values_list("pk", flat=True).first()
    except (ValidationError, ValueError, TypeError):
        return None  # not a key of that model at all (a standalone findings file's id)


class JobLinked(models.Model):
    """A row about one job: `job_id` as the findings name it, `job_record` the platform's
    row of that job when there is one (filled on save; never pointing at another job)."""

    job_id = models.CharField(max_length=64, db_index=True)
    job_record = models.ForeignKey(
        JOB_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        help_text="the platform's job this row is about (its organisation owns the row)",
    )

    class Meta:
        abstract = True

    def save(self, *args: object, **kwargs: object) -> None:
        if self.job_record_id is None and self.job_id:
            self.job_record_id = job_row_id(self.job_id)
        self.clean()
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    def clean(self) -> None:
        if self.job_record_id is not None and str(self.job_record_id) != str(self.job_id):
            raise ValidationError({"job_record": f"must be the job {self.job_id} this row is about"})


class MoneyBackOverride(JobLinked):
    """One staff decision on a job's money-back flag. Rows are only ever added."""

    eligible = models.BooleanField(help_text="True: the engagement is free of charge.")
    reason = models.TextField()
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    decided_at = models.DateTimeField(default=timezone.now)
    # A row that takes back an earlier decision (with its own reason): both then leave the
    # decision in force, and the computed rule speaks again.
    reverts = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="reverted_by"
    )

    class Meta:
        ordering = ("decided_at", "id")

    def __str__(self) -> str:
        verdict = "free" if self.eligible else "charged"
        return f"{self.job_id}: {verdict} by {self.decided_by} at {self.decided_at:%Y-%m-%d %H:%M}"

    def as_entry(self) -> OverrideEntry:
        """The decision as the report's audit trail prints it."""
        user = self.decided_by
        name = user.get_full_name() or user.get_username()
        return OverrideEntry(eligible=self.eligible, reason=self.reason, by=name, at=self.decided_at)


def override_money_back(*, job_id: str, eligible: bool, reason: str, by: User) -> MoneyBackOverride:
    """Record a staff decision on the money-back flag; the reason must be written out."""
    text = " ".join(reason.split())
    if len(text) < MIN_REASON_CHARS:
        raise ValidationError(
            f"reason: write at least {MIN_REASON_CHARS} characters saying why the flag is overridden "
            f"(got {len(text)}); it is printed in the customer's report"
        )
    if not job_id:
        raise ValidationError("job_id: the findings' job.id of the report being overridden is required")
    return MoneyBackOverride.objects.create(job_id=job_id, eligible=eligible, reason=text, decided_by=by)


def overrides_for(job_id: str) -> list[OverrideEntry]:
    """The staff decisions in force for a job (none reverted), oldest first, ready for
    `reports.render.render`."""
    rows = MoneyBackOverride.objects.filter(
        job_id=job_id, reverts__isnull=True, reverted_by__isnull=True
    ).select_related("decided_by")
    return [row.as_entry() for row in rows]


def revert_override(*, override: MoneyBackOverride, reason: str, by: User) -> MoneyBackOverride:
    """Take back a staff decision, saying why; the reverting row is kept beside it."""
    text = " ".join(reason.split())
    if len(text) < MIN_REASON_CHARS:
        raise ValidationError(
            f"reason: write at least {MIN_REASON_CHARS} characters saying why the override is reverted "
            f"(got {len(text)})"
        )
    if override.reverts_id is not None:
        raise ValidationError("a revert cannot itself be reverted; record a new decision instead")
    with transaction.atomic():
        locked = MoneyBackOverride.objects.select_for_update().get(pk=override.pk)
        if MoneyBackOverride.objects.filter(reverts=locked).exists():
            raise ValidationError("this decision was already reverted")
        return MoneyBackOverride.objects.create(
            job_id=locked.job_id, eligible=locked.eligible, reason=text, decided_by=by, reverts=locked
        )


class ReportEmail(JobLinked):
    """The report-ready email of one report version: claimed before sending, marked after.

    A row per (job, report digest) means a report version is mailed once however often
    the email task runs. A claim that is never marked sent (the worker died mid-send) can
    be taken over after CLAIM_LEASE; that is the one case where a customer could get the
    same report twice, which we prefer to never getting it.
    """

    CLAIM_LEASE = dt.timedelta(minutes=10)

    class State(models.TextChoices):
        PENDING = "pending"
        SENDING = "sending"
        SENT = "sent"
        FAILED = "failed"

    report_digest = models.CharField(max_length=64)
    recipients = models.TextField(help_text="Comma-separated addresses.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    claimed_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    message_id = models.CharField(max_length=255, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = (
            models.UniqueConstraint(fields=["job_id", "report_digest"], name="one_email_per_report_version"),
        )

    def __str__(self) -> str:
        return f"{self.job_id} report {self.report_digest[:12]}: {self.state}"

    @classmethod
    def claim(cls, *, job_id: str, report_digest: str, recipients: list[str]) -> ReportEmail | None:
        """Take the right to send this report version, or None if it is sent or being sent.

        The row is created once (the unique constraint settles a race to create it); the
        claim itself is a conditional UPDATE that must change exactly one row.
        """
        with transaction.atomic():
            row, _ = cls.objects.get_or_create(
                job_id=job_id, report_digest=report_digest, defaults={"recipients": ", ".join(recipients)}
            )
        now = timezone.now()
        claimable = Q(state__in=[cls.State.PENDING, cls.State.FAILED]) | Q(
            state=cls.State.SENDING, claimed_at__lt=now - cls.CLAIM_LEASE
        )
        won = cls.objects.filter(claimable, pk=row.pk).update(
            state=cls.State.SENDING, claimed_at=now, attempts=models.F("attempts") + 1
        )
        if won != 1:
            return None
        row.refresh_from_db()
        return row

    def mark_sent(self, message_id: str) -> None:
        type(self).objects.filter(pk=self.pk).update(
            state=self.State.SENT, sent_at=timezone.now(), message_id=message_id[:255], last_error=""
        )

    def mark_failed(self, error: str) -> None:
        type(self).objects.filter(pk=self.pk).update(state=self.State.FAILED, last_error=error[:2000])


def first_sent_at(job_id: str) -> dt.datetime | None:
    """When any version of the job's report was first emailed (the one-business-day rule)."""
    row = (
        ReportEmail.objects.filter(job_id=job_id, state=ReportEmail.State.SENT)
        .order_by("sent_at")
        .values_list("sent_at", flat=True)
        .first()
    )
    return row
