"""Review and approval end to end below the browser: edits kept with who/when/what, a new
version rendered from them (the PDF says the new title), the diff between versions, the
approval that emails the version once on a real SMTP server, lateness and money back."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.utils import timezone
from pypdf import PdfReader

from diagnostic.jobs.models import DiagnosticJob, FindingEdit, ReportVersion
from diagnostic.jobs.report_versions import NOTE_KEY, render_version, version_document
from diagnostic.staff import review
from reports.models import ReportEmail, override_money_back, overrides_for, revert_override
from tests.diagnostic.conftest import Cast
from tests.diagnostic.staff.conftest import Mailbox, make_finished_job

pytestmark = pytest.mark.django_db


def pdf_text(path: str) -> str:
    return "\n".join(page.extract_text() or "" for page in PdfReader(path).pages)


def test_edits_are_kept_and_a_new_version_carries_them(finished: DiagnosticJob, approver: User) -> None:
    first = render_version(finished).row
    finding = finished.finding_set.get(code="load.weights_io")
    made = review.edit_finding(finding=finding, by=approver, title="Weights stream from a slow network disk",
                               narrative="We watched the weights arrive at 180 MB/s from NFS.",
                               note="Measured twice; the second run agreed within 2 %.")
    assert [(e.field, e.before) for e in made] == [
        ("title", "Weights load from a slow disk"),
        ("narrative", "The weights were read at 180 MB/s."),
        ("note", ""),
    ]
    assert all(e.edited_by == approver and e.edited_at is not None for e in made)
    # Saving the same words again records nothing.
    assert review.edit_finding(finding=finding, by=approver, title="Weights stream from a slow network disk",
                               narrative="We watched the weights arrive at 180 MB/s from NFS.",
                               note="Measured twice; the second run agreed within 2 %.") == []

    second = render_version(finished).row
    assert second.digest != first.digest
    assert Path(first.pdf_path).is_file() and Path(second.pdf_path).is_file()
    assert Path(first.pdf_path) != Path(second.pdf_path)
    text = pdf_text(second.pdf_path)
    assert "Weights stream from a slow network disk" in text
    assert "Weights stream" not in pdf_text(first.pdf_path)
    document = version_document(second)
    assert document is not None
    entry = next(f for f in document["findings"] if f["code"] == "load.weights_io")
    # Words changed; the measured values did not.
    assert entry["evidence"]["disk_read_mbps"] == 180.0
    assert entry["evidence"][NOTE_KEY].startswith("Measured twice")
    assert entry["impact"]["ci95"] == [-200.0, -160.0]

    diff = review.version_diff(first, second)
    added = [d.text for d in diff if d.kind == "add"]
    removed = [d.text for d in diff if d.kind == "del"]
    assert any("Weights stream from a slow network disk" in t for t in added)
    assert any("Weights load from a slow disk" in t for t in removed)
    assert not any("disk_read_mbps" in t for t in added + removed)
    # In words, by finding, the words first; no JSON.
    labels = [d.text for d in diff if d.kind == "hunk"]
    assert set(labels[:3]) == {f"Finding load.weights_io: {field}"
                               for field in ("title", "narrative", "consultant's note")}, labels
    assert not any(t.lstrip().startswith(("{", '"')) for t in added + removed + labels)


def test_a_title_cannot_be_emptied(finished: DiagnosticJob, approver: User) -> None:
    finding = finished.finding_set.first()
    assert finding is not None
    with pytest.raises(ValidationError):
        review.edit_finding(finding=finding, by=approver, title="  ", narrative="", note="")
    assert not FindingEdit.objects.exists()


def test_approval_emails_each_version_once_on_a_real_smtp_server(
    finished: DiagnosticJob, approver: User, smtp: Mailbox
) -> None:
    version = render_version(finished).row
    assert not version.is_approved
    done = review.approve_and_send(version, by=approver)
    assert done.sent and done.recipients == ["alice@acme.example"]
    again = review.approve_and_send(ReportVersion.objects.get(pk=version.pk), by=approver)
    assert not again.sent
    assert len(smtp.messages) == 1
    message = smtp.messages[0]
    assert message["To"] == "alice@acme.example"
    assert str(message["X-Report-Version"]).strip() == version.digest
    attachments = [p for p in message.walk() if p.get_content_type() == "application/pdf"]
    assert len(attachments) == 1
    assert attachments[0].get_payload(decode=True) == Path(version.pdf_path).read_bytes()
    version.refresh_from_db()
    assert version.approved_by == approver and version.approved_at is not None
    assert ReportEmail.objects.get(report_digest=version.digest).state == ReportEmail.State.SENT


def test_a_late_report_shows_late_and_the_rule_sees_it(cast: Cast, lab: Any, out_dir: Path,
                                                       approver: User, smtp: Mailbox) -> None:
    job = make_finished_job(cast, lab, lab_day=timezone.localdate() - dt.timedelta(days=10))
    assert review.is_late(job)
    decision = review.decision_now(job)
    late = next(c for c in decision.conditions if c.key == "late_report")
    assert late.holds is True and decision.eligible
    version = render_version(job).row
    assert version_document(version)["money_back"]["conditions"]["late_report"] is True  # type: ignore[index]
    review.approve_and_send(version, by=approver)
    assert review.is_late(job)


def test_a_version_whose_verdict_is_stale_is_not_sent(finished: DiagnosticJob, approver: User,
                                                      smtp: Mailbox) -> None:
    version = render_version(finished).row
    computed = review.decision_now(finished).computed_eligible
    override_money_back(job_id=str(finished.pk), eligible=not computed,
                        reason="The customer's network was down for half the day.", by=approver)
    with pytest.raises(review.ApprovalRefused, match="render a new version"):
        review.approve_and_send(version, by=approver)
    assert smtp.messages == []
    fresh = render_version(finished).row
    assert review.approve_and_send(fresh, by=approver).sent


def test_an_override_is_reverted_with_a_reason(finished: DiagnosticJob, approver: User) -> None:
    row = override_money_back(job_id=str(finished.pk), eligible=True,
                              reason="Lab cooling failed for two hours mid-day.", by=approver)
    assert [e.reason for e in overrides_for(str(finished.pk))] == [row.reason]
    assert review.decision_now(finished).eligible
    with pytest.raises(ValidationError):
        revert_override(override=row, reason="oops", by=approver)
    revert_override(override=row, reason="Cooling logs show it was within limits.", by=approver)
    assert overrides_for(str(finished.pk)) == []
    assert review.decision_now(finished).override is None
    with pytest.raises(ValidationError, match="already reverted"):
        revert_override(override=row, reason="Cooling logs show it was within limits.", by=approver)


def test_the_review_page_says_the_impact_in_the_reports_words(cast: Cast, finished: DiagnosticJob) -> None:
    page = cast.client("staff").get(f"/staff/reports/{finished.pk}/").content.decode()
    box = page.split('id="finding-', 1)[1].split("</article>", 1)[0]
    assert "load.weights_io" in box  # the largest measured impact comes first
    impact = box.split("Impact and interval", 1)[1]
    assert "95 % interval of the change" in impact and "Improvement" in impact
    assert "480" in impact and "300" in impact and "→" in impact
    assert "cold_start_s" not in impact and "Ci95" not in impact
