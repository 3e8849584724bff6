"""The staff dashboard in a real browser: the jobs list, a job's timeline and log, the
review page where a consultant edits a finding's narrative, renders a new version (in the
background: the page shows it waiting, then being written, then the new version, without
a reload), reads the diff and approves it (one email on a real SMTP receiver, none on a
second approval), then the customer's browser downloads that very version; a render that
fails says so in place; screenshots of each page.

On a finished job made in the database, so it runs without a broker: the render handed to
the workers is run by a thread of this process standing in for one. The same path from a
job queued in the portal, watched live while a real worker runs it, is test_staff_live.py."""

from __future__ import annotations

import io
import shutil
import threading
import time
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from pypdf import PdfReader

from diagnostic.jobs import report_versions as report
from diagnostic.jobs.models import ReportVersion
from diagnostic.jobs.report_versions import render_version
from diagnostic.staff import tasks

# The shared cast and the staff fixtures, used here as in tests/diagnostic.
from tests.diagnostic.conftest import Cast, cast, customer, lab, organisation, other_customer  # noqa: F401
from tests.diagnostic.staff.conftest import Mailbox, approver, make_finished_job, smtp  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NARRATIVE = "Weights arrived at 180 MB/s from the network share; a local NVMe copy fixes it."


def a_worker_thread(monkeypatch: pytest.MonkeyPatch, *, writing_s: float) -> None:
    """The render handed to the workers is taken by a thread of this process half a second
    later, as a worker would take it, and written at least `writing_s` long (so that the
    page is seen following it)."""
    real = report.render_version

    def slow(job: Any, **options: Any) -> Any:
        time.sleep(writing_s)
        return real(job, **options)

    def later(*args: Any) -> None:
        def work() -> None:
            try:
                time.sleep(0.5)
                tasks.render_report_version(*args)
            finally:
                connection.close()
        threading.Thread(target=work, daemon=True).start()

    monkeypatch.setattr(report, "render_version", slow)
    monkeypatch.setattr(tasks.render_report_version, "delay", later)


def browser_as(browser: Any, live_server: Any, user: Any) -> Any:
    client = Client()
    client.force_login(user)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    host = live_server.url.split("//", 1)[1].split(":")[0]
    context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value,
                          "domain": host, "path": "/"}])
    return context


def test_staff_review_approve_and_the_customer_downloads(
    browser: Any, live_server: Any, portal_settings: Any, screenshot: Any, cast: Cast, lab: Any,  # noqa: F811
    approver: Any, smtp: Mailbox, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    portal_settings.PORTAL_AUTO_APPROVE = False
    job = make_finished_job(cast, lab, lab_day=timezone.localdate())
    first = render_version(job).row
    a_worker_thread(monkeypatch, writing_s=3.0)

    staff = browser_as(browser, live_server, approver)
    page = staff.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

    page.goto(f"{live_server.url}/staff/")
    assert page.inner_text(f"tr[data-job='{job.pk}'] .badge") == "succeeded"
    screenshot(page, "staff-01-jobs")
    page.click(f"tr[data-job='{job.pk}'] a >> nth=0")
    assert "reproduce" in page.inner_text("table.timeline")
    screenshot(page, "staff-02-job")
    page.click("tr[data-stage='reproduce'] a:has-text('log')")
    assert "started" in page.inner_text("#stage-log")
    screenshot(page, "staff-03-log")

    page.goto(f"{live_server.url}/staff/reports/{job.pk}/")
    finding = job.finding_set.get(code="load.weights_io")
    page.fill(f"#narrative-{finding.pk}", NARRATIVE)
    page.click(f"#finding-{finding.pk} button[type=submit]")
    assert "Saved narrative" in page.inner_text("main")
    page.click("#render-version")
    # The request answered at once: the render waits for a worker, then is written, and the
    # page follows it in place (the same document throughout), the button gone meanwhile.
    progress = page.wait_for_selector("#render-progress", timeout=10_000)
    assert progress is not None and ("waiting for a worker" in progress.inner_text()
                                     or "being written" in progress.inner_text())
    assert "in the background" in page.inner_text("main")
    assert page.locator("#render-version").count() == 0
    page.evaluate("window.__same = true")
    page.wait_for_selector("#render-progress[data-state='running']", timeout=15_000)
    said = page.inner_text("#render-progress")
    assert "being written" in said and "so far" in said, said
    assert page.locator("#render-progress progress").get_attribute("value") not in (None, "0")
    screenshot(page, "staff-04a-review-rendering")
    page.wait_for_selector("#render-done", timeout=60_000)
    assert page.evaluate("window.__same") is True
    assert page.locator(".flash.gone-when-ended").is_hidden()  # "rendering…" said no more
    newest = ReportVersion.objects.filter(job=job).exclude(pk=first.pk).get()
    assert f"Last render: version {newest.version}" in page.inner_text("#render-done")
    assert page.locator("#render-version").is_visible()
    assert NARRATIVE in page.inner_text("#version-diff .add >> nth=0") or NARRATIVE in page.inner_text(
        "#version-diff")
    screenshot(page, "staff-04-review-diff")
    # Newest first, the latest marked; the older one is offered only as "older".
    assert page.locator("table.versions tbody tr").first.get_attribute("data-version") == newest.version
    assert page.locator(f"tr[data-version='{newest.version}'] [data-latest]").is_visible()
    assert "draft" in page.inner_text(f"tr[data-version='{first.version}'] .state")

    # The old, unedited version: its confirmation says so and will not send without saying so.
    page.click(f"tr[data-version='{first.version}'] a.approve")
    assert "not the latest version" in page.inner_text("#not-latest")
    screenshot(page, "staff-05-confirm-older")
    page.evaluate("document.querySelector('#send-older').removeAttribute('required')")
    page.click("#confirm-send")
    assert "is not the latest" in page.inner_text("main")
    assert len(smtp.messages) == 0 and not ReportVersion.objects.get(pk=first.pk).is_approved

    # The latest: what goes to whom, the money-back statement, the first page; then send.
    page.goto(f"{live_server.url}/staff/reports/{job.pk}/")
    page.click(f"tr[data-version='{newest.version}'] a.approve")
    assert page.inner_text("#recipients") == "alice@acme.example"
    statement = page.inner_text("#money-back-statement")
    assert statement.startswith(("free of charge", "charged"))
    assert NARRATIVE not in statement and "job" in page.inner_text("#subject")
    if shutil.which("pdftoppm") is None:  # a machine without poppler: no broken image, the PDF's link
        assert "Preview unavailable" in page.inner_text("#no-preview")
    else:
        image = page.locator("figure.page-one img")
        for _ in range(100):  # the page image is drawn on first request (pdftoppm)
            if image.evaluate("img => img.complete && img.naturalWidth") > 100:
                break
            page.wait_for_timeout(100)
        assert image.evaluate("img => img.naturalWidth") > 100
    screenshot(page, "staff-06-confirm-latest")
    page.click("#confirm-send")
    assert "approved and emailed" in page.inner_text("main")
    assert len(smtp.messages) == 1
    sent_body = next(part.get_payload(decode=True).decode() for part in smtp.messages[0].walk()
                     if part.get_content_type() == "text/plain")
    said = ("applies. This engagement is free of charge" if statement.startswith("free")
            else "Money-back guarantee: does not apply.")
    assert said in " ".join(sent_body.split())
    assert "sent" in page.inner_text(f"tr[data-version='{newest.version}'] .state")
    page.click(f"tr[data-version='{newest.version}'] a.approve")
    page.click("#confirm-send")
    assert "none was sent again" in page.inner_text("main")
    assert len(smtp.messages) == 1
    screenshot(page, "staff-07-approved")
    page.goto(f"{live_server.url}/staff/lab/")
    screenshot(page, "staff-08-lab")
    assert errors == [], errors
    staff.close()

    alice = browser_as(browser, live_server, cast.alice)
    mine = alice.new_page()
    mine.goto(f"{live_server.url}/portal/jobs/{job.pk}/")
    with mine.expect_download() as download_info:
        mine.click("#download-report")
    got = open(download_info.value.path(), "rb").read()
    assert got == open(newest.pdf_path, "rb").read()
    text = "\n".join(p.extract_text() or "" for p in PdfReader(io.BytesIO(got)).pages)
    assert "network share" in text
    alice.close()


def test_a_render_that_fails_says_why_in_place(
    browser: Any, live_server: Any, portal_settings: Any, screenshot: Any, cast: Cast, lab: Any,  # noqa: F811
    approver: Any, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    portal_settings.PORTAL_AUTO_APPROVE = False
    job = make_finished_job(cast, lab, lab_day=timezone.localdate())
    first = render_version(job).row
    a_worker_thread(monkeypatch, writing_s=2.0)

    def broken(job: Any, **options: Any) -> Any:
        time.sleep(2.0)
        raise RuntimeError("the renderer's child was stopped at its memory limit (3072 MB)")

    monkeypatch.setattr(report, "render_version", broken)
    page = browser_as(browser, live_server, approver).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{live_server.url}/staff/reports/{job.pk}/")
    page.click("#render-version")
    page.wait_for_selector("#render-progress", timeout=10_000)
    page.evaluate("window.__same = true")
    error = page.wait_for_selector("#render-error", timeout=30_000)
    assert error is not None
    said = error.inner_text()
    assert "failed: RuntimeError: the renderer's child was stopped at its memory limit (3072 MB)" in said
    assert "No version was kept" in said
    assert page.evaluate("window.__same") is True
    assert page.locator(".flash.gone-when-ended").is_hidden()
    # In place: in the Versions section, just above the button that tries again.
    assert page.locator("#versions #render-box #render-error").count() == 1
    assert page.inner_text("#render-version") == "Render again"
    assert list(ReportVersion.objects.filter(job=job)) == [first]
    page.locator("#versions").scroll_into_view_if_needed()
    screenshot(page, "staff-04b-review-render-failed")
    assert errors == [], errors
