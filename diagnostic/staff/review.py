"""Reviewing a job's report: editing a finding's words (each edit kept with who, when and
what changed), the diff between two kept versions, whether the report is late, the
money-back decision as it would be decided now, and approving a version, which releases
it to the portal and emails it to the booking's contacts once per version.
"""

from __future__ import annotations

import copy
import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from diagnostic.jobs.models import DiagnosticJob, Finding, FindingEdit, ReportVersion
from diagnostic.jobs.report_versions import (
    NOTE_KEY,
    current_edits,
    lab_day,
    recipients,
    version_document,
    version_message,
)
from reports.email import send_report_email
from reports.models import first_sent_at, overrides_for
from reports.moneyback import MoneyBackDecision, assess, report_deadline
from reports.sections.findings import EVIDENCE_LABELS
from reports.structure import humanize, value_text

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
    kind: str  # "hunk" (what changed, in words), "del" (the older text), "add" (the newer)
    text: str


# A finding's words as staff edit them, by where they sit in the findings document.
WORD_FIELDS = {("title",): "title", ("evidence", "summary"): "narrative",
               ("evidence", NOTE_KEY): "consultant's note"}
ABSENT = "(not in this version)"


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], Any]:
    """Every scalar of a findings document by its path; a list of scalars is one value."""
    if isinstance(value, dict):
        out: dict[tuple[Any, ...], Any] = {}
        for key, item in value.items():
            out.update(_leaves(item, (*path, key)))
        return out
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        out = {}
        for index, item in enumerate(value):
            out.update(_leaves(item, (*path, index)))
        return out
    return {path: value}


def _shown(value: Any, path: tuple[Any, ...] = ()) -> str:
    """A recorded value as the report prints one: a figure with the unit its key names
    (`lab_time_s` 2593.044 is 2593 s), text as written."""
    if value is ABSENT:
        return ABSENT
    if value is None:
        return "(none)"
    key = next((str(p) for p in reversed(path) if isinstance(p, str)), "")
    if key.endswith("_seconds"):  # a stage's `lab_seconds`: the report's seconds
        key = key.removesuffix("_seconds") + "_s"
    if isinstance(value, list):
        return ", ".join(_shown(v, path) for v in value) or "(none)"
    if isinstance(value, str):
        return value
    return value_text(key, value)


PLACE_WORDS = {"ci95": "95 % interval"}


def _part(part: Any) -> str:
    """One step of a value's place in the report's words (its evidence labels); a name the
    engine or the shell reads (an environment variable, a flag, a setting's path) stays
    exactly as written."""
    if isinstance(part, int):
        return f"#{part + 1}"
    text = str(part)
    if text in PLACE_WORDS or text in EVIDENCE_LABELS:
        return PLACE_WORDS.get(text) or EVIDENCE_LABELS[text]
    if "_" not in text or text.upper() == text or text.startswith("-") or "." in text:
        return text
    said = humanize(text)
    return said if "_" not in said else text.replace("_", " ")


def _label(path: tuple[Any, ...], codes: dict[int, str]) -> str:
    return " › ".join(
        (f"finding {codes.get(part, part)}" if i == 1 and path[0] == "findings" and isinstance(part, int)
         else _part(part))
        for i, part in enumerate(path) if not (i == 0 and part == "findings" and len(path) > 1)
    )


def version_diff(older: ReportVersion, newer: ReportVersion) -> list[DiffLine]:
    """What differs between two versions' findings documents, in words: the findings' titles,
    narratives and notes first (what staff edit), by finding; then any other recorded value
    that differs (a figure, a stage's record), each as its place, the older and the newer."""
    documents = [version_document(older), version_document(newer)]
    if documents[0] is None or documents[1] is None:
        missing = older if documents[0] is None else newer
        return [DiffLine("hunk", f"Version {missing.version} kept no findings document to compare.")]
    old, new = _leaves(documents[0]), _leaves(documents[1])
    codes = {i: str(f.get("code")) for i, f in enumerate((documents[1] or {}).get("findings") or [])
             if isinstance(f, dict)}
    words: list[DiffLine] = []
    others: list[DiffLine] = []
    for path in sorted(set(old) | set(new), key=lambda p: [str(x).zfill(6) for x in p]):
        before, after = old.get(path, ABSENT), new.get(path, ABSENT)
        if before == after:
            continue
        field = WORD_FIELDS.get(tuple(path[2:])) if len(path) > 2 and path[0] == "findings" else None
        if field is not None:
            lines = words
            label = f"Finding {codes.get(path[1], path[1])}: {field}"
        else:
            lines = others
            label = _label(path, codes)
        lines += [DiffLine("hunk", label), DiffLine("del", _shown(before, path)),
                  DiffLine("add", _shown(after, path))]
    if others:
        others.insert(0, DiffLine("hunk", "Other recorded values that differ (not staff edits):"))
    return words + others


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


def decision_now(job: DiagnosticJob, findings: dict[str, Any] | None = None) -> MoneyBackDecision:
    """The money-back rule on the job's current findings (with edits), as if sent now when
    nothing was sent yet, with the staff decisions in force. `findings` is the job's
    document as build_findings made it, when the caller has it already (left unchanged)."""
    from diagnostic.jobs.findings_document import build_findings
    from diagnostic.jobs.report_versions import apply_finding_edits

    made = copy.deepcopy(findings) if findings is not None else build_findings(job)
    document = apply_finding_edits(made, job)
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
