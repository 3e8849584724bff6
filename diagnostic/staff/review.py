"""Reviewing a job's report: editing a finding's words (each edit kept with who, when and
what changed), the diff between two kept versions, whether the report is late, the
money-back decision as it would be decided now, and approving a version, which releases
it to the portal and emails it to the booking's contacts once per version.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from diagnostic.jobs.models import DiagnosticJob, Finding, FindingEdit, ReportVersion
from diagnostic.jobs.report import current_edits, lab_day, recipients, version_document, version_message
from reports.email import send_report_email
from reports.models import first_sent_at, overrides_for
from reports.moneyback import MoneyBackDecision, assess, report_deadline

TITLE_MAX = 300
TEXT_MAX = 4000


def finding_text(finding: Finding, edits: dict[str, str]) -> dict[str, str]:
    """A finding's editable words as they stand: the latest edit, else the pipeline's."""
    evidence = finding.evidence if isinstance(finding.evidence, dict) else {}
    return {
        "title": edits.get(FindingEdit.Field.TITLE) or finding.title,
        "narrative": edits[FindingEdit.Field.NARRATIVE]
        if FindingEdit.Field.NARRATIVE in edits
        else str(evidence.get("summary") or ""),
        "note": edits.get(FindingEdit.Field.NOTE, ""),
    }


def edit_finding(*, finding: Finding, by: User, title: str, narrative: str, note: str) -> list[FindingEdit]:
    """Record the fields that changed (one row each); an unchanged field records nothing."""
    title, narrative, note = title.strip(), narrative.strip(), note.strip()
    if not title:
        raise ValidationError({"title": "a finding needs a title"})
    if len(title) > TITLE_MAX:
        raise ValidationError({"title": f"at most {TITLE_MAX} characters (got {len(title)})"})
    for name, text in (("narrative", narrative), ("note", note)):
        if len(text) > TEXT_MAX:
            raise ValidationError({name: f"at most {TEXT_MAX} characters (got {len(text)})"})
    with transaction.atomic():
        # Two consultants saving at once: the second sees the first's text as "before".
        Finding.objects.select_for_update().filter(pk=finding.pk).first()
        now_text = finding_text(finding, current_edits(finding.job).get(finding.pk, {}))
        made = []
        for field, text in (("title", title), ("narrative", narrative), ("note", note)):
            if now_text[field] != text:
                made.append(FindingEdit.objects.create(
                    finding=finding, field=field, before=now_text[field], after=text, edited_by=by,
                ))
    return made


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "add", "del", "hunk", "same"
    text: str


def version_diff(older: ReportVersion, newer: ReportVersion) -> list[DiffLine]:
    """The findings documents of two versions, line by line (unified, 2 lines of context)."""
    def lines(version: ReportVersion) -> list[str]:
        document = version_document(version)
        if document is None:
            return [f"(version {version.version} kept no findings document)"]
        return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False).splitlines()

    out: list[DiffLine] = []
    for line in difflib.unified_diff(lines(older), lines(newer), older.version, newer.version,
                                     n=2, lineterm=""):
        if line.startswith(("---", "+++")):
            continue
        kind = "hunk" if line.startswith("@@") else "add" if line.startswith("+") else \
            "del" if line.startswith("-") else "same"
        out.append(DiffLine(kind, line))
    return out


def deadline_of(job: DiagnosticJob) -> dt.datetime | None:
    day = lab_day(job)
    return report_deadline(day, tz=timezone.get_default_timezone()) if day else None


def first_approved_at(job: DiagnosticJob) -> dt.datetime | None:
    return (job.report_versions.filter(approved_at__isnull=False).order_by("approved_at")
            .values_list("approved_at", flat=True).first())


def is_late(job: DiagnosticJob, now: dt.datetime | None = None) -> bool:
    """Not approved within one business day of the lab day (approved late, or still not)."""
    deadline = deadline_of(job)
    if deadline is None:
        return False
    approved = first_approved_at(job)
    return (approved or now or timezone.now()) >= deadline


def decision_now(job: DiagnosticJob) -> MoneyBackDecision:
    """The money-back rule on the job's current findings (with edits), as if sent now when
    nothing was sent yet, with the staff decisions in force."""
    from diagnostic.jobs.findings import build_findings
    from diagnostic.jobs.report import apply_finding_edits

    document = apply_finding_edits(build_findings(job), job)
    return assess(document, lab_day=lab_day(job), sent_at=first_sent_at(str(job.pk)),
                  overrides=overrides_for(str(job.pk)), tz=timezone.get_default_timezone())


class ApprovalRefused(ValueError):
    """The version cannot be approved as it is; the message says what to do."""


@dataclass(frozen=True)
class Approval:
    version: ReportVersion
    sent: bool
    recipients: list[str]


def approve_and_send(version: ReportVersion, *, by: User) -> Approval:
    """Release `version` to the portal (first approver recorded) and email it to the
    booking's contacts; a version already sent is not sent again (ReportEmail's claim).

    Refused when the money-back verdict the version prints is no longer the rule's verdict
    (the report became late since, or a staff decision changed): the customer must not
    receive a report that contradicts itself; render a new version first."""
    job = version.job
    document = version_document(version)
    if document is None:
        raise ApprovalRefused(f"version {version.version} kept no findings document; render a new version")
    printed = document.get("money_back") or {}
    now = decision_now(job).as_findings()
    if printed.get("eligible") != now["eligible"] or printed.get("conditions") != now["conditions"]:
        raise ApprovalRefused(
            f"version {version.version} says the money-back guarantee "
            f"{'applies' if printed.get('eligible') else 'does not apply'}, but the rule now says it "
            f"{'applies' if now['eligible'] else 'does not apply'} ({now['reason']}); render a new version "
            "and approve that one"
        )
    version.approve(by=by)
    to = recipients(job)
    message = version_message(version, to)
    sent = send_report_email(message, job_id=str(job.pk), report_digest=version.digest)
    return Approval(version, sent, to)


def sent_versions(job: DiagnosticJob) -> dict[str, Any]:
    """Report digest -> its ReportEmail row, for the versions list."""
    from reports.models import ReportEmail

    return {row.report_digest: row for row in ReportEmail.objects.filter(job_id=str(job.pk))}
