"""Approve and send, unmistakably: approving goes through a confirmation that shows what
goes to whom; an older version is sent only by saying so; a decision recorded after the
customer was told otherwise is flagged on the review page until a new version goes out."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from diagnostic.jobs.models import DiagnosticJob, ReportVersion
from diagnostic.jobs.report_versions import render_version
from diagnostic.staff import review
from tests.conftest import service_missing
from tests.diagnostic.staff.conftest import Mailbox

pytestmark = pytest.mark.django_db


def test_approving_needs_the_confirmation_and_an_older_version_needs_saying_so(
        finished: DiagnosticJob, approver_client: Client, smtp: Mailbox) -> None:
    old = render_version(finished).row
    edited = finished.finding_set.get(code="load.weights_io")
    edited.title = "Weights read from a network share"
    edited.save(update_fields=["title"])
    new = render_version(finished).row
    assert new.digest != old.digest
    url = f"/staff/reports/{finished.pk}/approve/"

    page = approver_client.get(f"/staff/reports/{finished.pk}/").content.decode()
    assert page.index(f'data-version="{new.version}"') < page.index(f'data-version="{old.version}"')
    assert page.count("data-latest") == 1

    # A bare POST (no confirmation) sends nothing and goes to the confirmation page.
    answer = approver_client.post(url, {"version": new.version})
    assert answer.status_code == 302 and answer["Location"] == f"{url}{new.version}/"
    assert smtp.messages == [] and not ReportVersion.objects.get(pk=new.pk).is_approved

    confirm = approver_client.get(f"{url}{old.version}/").content.decode()
    assert "not the latest version" in confirm and 'name="older"' in confirm
    assert "alice@acme.example" in confirm and "Money-back guarantee" in confirm
    refused = approver_client.post(url, {"version": old.version, "confirmed": "yes"}, follow=True)
    assert "is not the latest" in refused.content.decode()
    assert smtp.messages == [] and not ReportVersion.objects.get(pk=old.pk).is_approved

    approver_client.post(url, {"version": old.version, "confirmed": "yes", "older": "yes"})
    assert len(smtp.messages) == 1 and ReportVersion.objects.get(pk=old.pk).is_approved


def test_a_decision_after_sending_is_flagged_until_a_new_version_tells_the_customer(
        finished: DiagnosticJob, approver: User, approver_client: Client, smtp: Mailbox) -> None:
    sent = render_version(finished).row
    review.approve_and_send(sent, by=approver)
    told_free = review.decision_now(finished).eligible
    answer = approver_client.post(f"/staff/reports/{finished.pk}/money-back/", {
        "eligible": "no" if told_free else "yes", "reason": "Decided with the customer's account manager."},
        follow=True)
    page = answer.content.decode()
    assert "already sent version" in page and "render a new version" in page
    assert 'id="told-otherwise"' in page
    fresh = render_version(finished).row
    review.approve_and_send(fresh, by=approver)
    page = approver_client.get(f"/staff/reports/{finished.pk}/").content.decode()
    assert 'id="told-otherwise"' not in page
    assert len(smtp.messages) == 2


def test_the_confirmation_shows_the_first_page_and_links_the_pdf(
        finished: DiagnosticJob, approver_client: Client) -> None:
    if shutil.which("pdftoppm") is None:
        service_missing("pdftoppm (Debian's poppler-utils) is not installed")
    version = render_version(finished).row
    page = approver_client.get(f"/staff/reports/{finished.pk}/approve/{version.version}/").content.decode()
    base = f"/staff/reports/{finished.pk}/versions/{version.version}"
    assert f'src="{base}/page-1.png"' in page and f'href="{base}/report.pdf"' in page
    image = approver_client.get(f"{base}/page-1.png")
    assert image["Content-Type"] == "image/png"
    assert b"".join(image.streaming_content)[:8] == b"\x89PNG\r\n\x1a\n"  # type: ignore[attr-defined]
    pdf = approver_client.get(f"{base}/report.pdf")
    assert pdf["Content-Type"] == "application/pdf"
    assert b"".join(pdf.streaming_content)[:5] == b"%PDF-"  # type: ignore[attr-defined]


def test_without_pdftoppm_the_confirmation_says_so_and_links_the_pdf(
        finished: DiagnosticJob, approver_client: Client, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    version = render_version(finished).row
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without poppler-utils: no pdftoppm
    assert shutil.which("pdftoppm") is None
    page = approver_client.get(f"/staff/reports/{finished.pk}/approve/{version.version}/").content.decode()
    base = f"/staff/reports/{finished.pk}/versions/{version.version}"
    assert "page-1.png" not in page  # no broken image
    assert "Preview unavailable" in page and f'href="{base}/report.pdf"' in page
    assert approver_client.get(f"{base}/report.pdf").status_code == 200
