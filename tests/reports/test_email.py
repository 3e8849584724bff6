"""The report-ready email: its record of staff overrides, the sent-once claim, the .eml
file the demo writes, and (services tier) delivery to a real SMTP server on loopback."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import io
import os
import socket
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.utils import timezone
from pypdf import PdfReader

from reports import figures as fig
from reports.email import (
    ReportEmailError,
    attachment_name,
    build_report_email,
    deliver_report,
    send_report_email,
    write_eml,
)
from reports.models import ReportEmail, first_sent_at, override_money_back, overrides_for
from tests.reports.conftest import CUSTOMER, ReferenceReport, minimal_findings, squash

RECIPIENT = "ops@northwind.example"


def _parse(raw: bytes) -> EmailMessage:
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    return message


def _attached_pdf(message: EmailMessage) -> tuple[str, bytes]:
    (part,) = [p for p in message.iter_attachments() if p.get_content_type() == "application/pdf"]
    payload = part.get_content()
    assert isinstance(payload, bytes)
    return str(part.get_filename()), payload


@pytest.fixture
def staff() -> User:
    return User.objects.create_user("dana", first_name="Dana", last_name="Reyes", is_staff=True)


@pytest.mark.django_db
def test_an_override_without_a_written_reason_is_refused(staff: User) -> None:
    with pytest.raises(ValidationError, match="write at least 20 characters"):
        override_money_back(job_id="job-1", eligible=True, reason="  because ", by=staff)
    assert overrides_for("job-1") == []


@pytest.mark.django_db
def test_overrides_are_kept_oldest_first_with_who_and_when(staff: User) -> None:
    override_money_back(job_id="job-1", eligible=True, reason="Our lab lost power for two hours.", by=staff)
    later = override_money_back(
        job_id="job-1", eligible=False, reason="Power loss was after the last run.", by=staff
    )
    override_money_back(
        job_id="job-2", eligible=True, reason="Unrelated job, kept apart from job-1.", by=staff
    )
    entries = overrides_for("job-1")
    assert [e.eligible for e in entries] == [True, False]
    assert entries[-1].by == "Dana Reyes"
    assert entries[-1].at == later.decided_at


@pytest.mark.django_db
def test_a_report_version_is_claimed_once() -> None:
    first = ReportEmail.claim(job_id="job-1", report_digest="d" * 64, recipients=[RECIPIENT])
    assert first is not None
    assert ReportEmail.claim(job_id="job-1", report_digest="d" * 64, recipients=[RECIPIENT]) is None
    first.mark_sent("<m@x>")
    assert ReportEmail.claim(job_id="job-1", report_digest="d" * 64, recipients=[RECIPIENT]) is None
    assert ReportEmail.claim(job_id="job-1", report_digest="e" * 64, recipients=[RECIPIENT]) is not None
    assert first_sent_at("job-1") is not None


@pytest.mark.django_db
def test_a_failed_send_is_claimed_again_and_a_stale_claim_is_taken_over() -> None:
    failed = ReportEmail.claim(job_id="job-1", report_digest="f" * 64, recipients=[RECIPIENT])
    assert failed is not None
    failed.mark_failed("SMTPServerDisconnected: gone")
    again = ReportEmail.claim(job_id="job-1", report_digest="f" * 64, recipients=[RECIPIENT])
    assert again is not None
    assert again.attempts == 2
    stale = timezone.now() - ReportEmail.CLAIM_LEASE - dt.timedelta(seconds=1)
    ReportEmail.objects.filter(pk=again.pk).update(claimed_at=stale)
    taken_over = ReportEmail.claim(job_id="job-1", report_digest="f" * 64, recipients=[RECIPIENT])
    assert taken_over is not None
    assert taken_over.attempts == 3


def test_the_eml_file_carries_both_bodies_and_the_pdf(
    reference_report: ReferenceReport, tmp_path: Path
) -> None:
    f, report = reference_report.findings, reference_report.report
    message = build_report_email(f, report, customer=CUSTOMER, to=[RECIPIENT])
    path = write_eml(message, tmp_path / "out" / "email.eml")
    parsed = _parse(path.read_bytes())
    assert parsed["To"] == RECIPIENT
    assert str(parsed["X-Report-Version"]).strip() == report.digest
    text = parsed.get_body(("plain",))
    html = parsed.get_body(("html",))
    assert text is not None and html is not None
    body = squash(text.get_content())
    assert f"Dear {CUSTOMER}," in body
    code = f["measurement"]["code"]["mean_tps"], f["measurement"]["tuned"]["code"]["mean_tps"]
    assert f"Decode rate, code (tok/s): {fig.tps(code[0])}" in body
    assert f"-> {fig.tps(code[1])}" in body
    assert "Money-back guarantee: does not apply." in body
    assert "<strong>" + fig.tps(code[1]) + "</strong>" in html.get_content()
    name, pdf_bytes = _attached_pdf(parsed)
    assert name == attachment_name(f) == f"diagnostic-findings-{f['job']['id']}.pdf"
    assert pdf_bytes == report.pdf_path.read_bytes()


def test_a_message_needs_a_recipient(reference_report: ReferenceReport) -> None:
    with pytest.raises(ValueError, match="at least one recipient"):
        build_report_email(reference_report.findings, reference_report.report, customer=CUSTOMER, to=[])


# --------------------------------------------------------------------------- services tier


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[bytes] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(bytes(envelope.content))
        return "250 Message accepted"


@pytest.fixture
def smtp_server(settings: Any) -> Iterator[_Inbox]:
    """A real SMTP server (aiosmtpd) on a free loopback port, and Django pointed at it."""
    try:
        from aiosmtpd.controller import Controller
    except ImportError:
        if os.environ.get("REQUIRE_SERVICES") == "1":
            pytest.fail("aiosmtpd is required for the SMTP tests (pip install aiosmtpd)")
        pytest.skip("aiosmtpd not installed")
    inbox = _Inbox()
    port = _free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = port
    settings.EMAIL_HOST_USER = ""
    settings.EMAIL_HOST_PASSWORD = ""
    settings.EMAIL_USE_TLS = False
    settings.EMAIL_USE_SSL = False
    settings.EMAIL_TIMEOUT = 10
    try:
        yield inbox
    finally:
        controller.stop()


@pytest.mark.services
@pytest.mark.django_db
def test_the_report_email_reaches_an_smtp_server_once_with_the_right_pdf(
    reference_report: ReferenceReport, smtp_server: _Inbox
) -> None:
    f, report = reference_report.findings, reference_report.report
    for _ in range(2):
        message = build_report_email(f, report, customer=CUSTOMER, to=[RECIPIENT])
        send_report_email(message, job_id=f["job"]["id"], report_digest=report.digest)
    assert len(smtp_server.messages) == 1
    received = _parse(smtp_server.messages[0])
    assert received["Subject"] == f"Your serving diagnostic findings (job {f['job']['id']})"
    _, pdf_bytes = _attached_pdf(received)
    reader = PdfReader(io.BytesIO(pdf_bytes))
    assert len(reader.pages) == report.pages
    text = squash(" ".join(page.extract_text() for page in reader.pages))
    for workload in ("code", "prose"):
        for block in (f["measurement"][workload], f["speculative"]["best"][workload]):
            assert fig.tps(block["mean_tps"]) in text
            assert fig.interval(block["ci95"], fig.tps) in text
    assert fig.minutes(f["cold_start"]["before_s"]) in text
    row = ReportEmail.objects.get(job_id=f["job"]["id"])
    assert row.state == ReportEmail.State.SENT
    assert row.message_id == received["Message-ID"]


@pytest.mark.services
@pytest.mark.django_db
def test_delivering_twice_renders_the_same_version_and_sends_once(
    smtp_server: _Inbox, tmp_path: Path
) -> None:
    # The lab day is today, so the first send is on time and the second run sees it sent on time.
    document = minimal_findings()
    document["job"]["lab_day"] = timezone.now().date().isoformat()
    first = deliver_report(document, tmp_path / "1", customer=CUSTOMER, to=[RECIPIENT])
    second = deliver_report(document, tmp_path / "2", customer=CUSTOMER, to=[RECIPIENT])
    assert (first.sent, second.sent) == (True, False)
    assert first.report.digest == second.report.digest
    assert len(smtp_server.messages) == 1


@pytest.mark.services
@pytest.mark.django_db
def test_an_unreachable_mail_server_fails_loudly_and_leaves_the_version_to_retry(
    reference_report: ReferenceReport, settings: Any
) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = _free_port()  # nothing listens here
    settings.EMAIL_TIMEOUT = 5
    f, report = reference_report.findings, reference_report.report
    message = build_report_email(f, report, customer=CUSTOMER, to=[RECIPIENT])
    with pytest.raises(ReportEmailError, match=r"could not be sent via 127\.0\.0\.1"):
        send_report_email(message, job_id=f["job"]["id"], report_digest=report.digest)
    row = ReportEmail.objects.get(job_id=f["job"]["id"])
    assert row.state == ReportEmail.State.FAILED
    assert "ConnectionRefusedError" in row.last_error


def test_the_email_lists_the_findings_in_the_reports_order(reference_report: Any) -> None:
    from reports.sections.findings import by_impact

    f, report = reference_report.findings, reference_report.report
    ordered = [str(x.get("title") or x.get("code")) for x in by_impact(f["findings"])]
    assert ordered != [str(x.get("title")) for x in f["findings"]], "the reference findings need reordering"
    body = build_report_email(f, report, customer=CUSTOMER, to=[RECIPIENT]).body
    listed = [line.strip()[2:] for line in body.split("What we found:")[1].splitlines()
              if line.strip().startswith("- ")]
    assert listed == ordered
