"""A lab day watched from the staff dashboard in a real browser, end to end on the real
services: a customer books today in the portal, submits a launch command and confirms;
the job goes to Redis and a real Celery worker process runs it on the simulated lab
(served by `python -m lab sim serve`, as any lab is reached). Meanwhile a consultant has
the jobs list, the job's page and the running stage's log open: each changes without a
reload (the row appears, the stage states move, the log grows). When the report is
written, the job page shows the telemetry and cold-start plots from that very run; the
consultant edits a finding's narrative, renders a new version (the worker writes it while
the review page follows), reads the diff, approves it (one email on a real SMTP receiver,
none on a second approval) and the customer's browser downloads that version. Screenshots
of each page land in out/screenshots/."""

from __future__ import annotations

import io
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.utils import timezone
from pypdf import PdfReader

from diagnostic.bookings.models import SIM_PREFIX, Booking, Lab, LabDay
from diagnostic.jobs.models import DiagnosticJob, ReportVersion, StageRun
from diagnostic.jobs.report_versions import recipients
from diagnostic.staff.demo import SCENARIO, serving_sim_lab
from tests.browser import test_customer_path as walk
from tests.browser.test_staff_review import browser_as

# The cast and the staff fixtures, used here as in tests/diagnostic; the worker as the
# services tier starts it.
from tests.diagnostic.conftest import (  # noqa: F401
    Cast,
    cast,
    customer,
    organisation,
    other_customer,
    postgres,
    redis_url,
    sim_state_dir,
)
from tests.diagnostic.jobs.test_worker import Worker, start_worker  # noqa: F401
from tests.diagnostic.staff.conftest import Mailbox, approver, smtp  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.services, pytest.mark.django_db(transaction=True)]

NARRATIVE = "Watched live: the engine answered /health only after the whole cold start."
# Lab seconds per wall second: reproduce and triage (~2,900 lab s) take about half a minute,
# the triage alone long enough for its log page to be seen growing.
DILATION = 100
LOG_STAGE = "triage"
FINISHED = ("succeeded", "partial", "failed", "cancelled")


def watch(page: Any, errors: list[str]) -> Any:
    page.on("pageerror", lambda exc: errors.append(f"{page.url}: {exc}"))
    page.on("console", lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" else None)
    return page


@pytest.fixture
def worker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the worker process inherits besides the services tier's settings: reports wait
    for a consultant's approval, as in production."""
    monkeypatch.setenv("PORTAL_AUTO_APPROVE", "0")


@pytest.fixture
def live_settings(worker_env: None, portal_settings: Any, start_worker: Callable[[str], Worker],  # noqa: F811
                  smtp: Mailbox) -> Iterator[tuple[Any, Worker]]:  # noqa: F811
    """The live server with a broker: a confirmed job goes to Redis, the worker runs it."""
    portal_settings.CELERY_TASK_ALWAYS_EAGER = False
    portal_settings.PORTAL_AUTO_APPROVE = False
    worker = start_worker("staff-live")
    yield portal_settings, worker
    worker.stop()


def test_a_consultant_watches_a_portal_job_live_then_reviews_and_approves(
    browser: Any, live_server: Any, live_settings: tuple[Any, Worker], screenshot: Any, cast: Cast,  # noqa: F811
    approver: User, smtp: Mailbox, tmp_path: Path,  # noqa: F811
) -> None:
    settings, worker = live_settings
    # The loading triage runs too: it records the cold start's phases the job page plots.
    settings.PORTAL_JOB_STAGES = ["preflight", "reproduce", "triage", "report"]
    scenario = yaml.safe_load(SCENARIO.read_text())
    scenario["dilation"] = DILATION
    fast = tmp_path / SCENARIO.name
    fast.write_text(yaml.safe_dump(scenario))
    lab = Lab.objects.create(name="sim:staff-live-lab", inventory=f"{SIM_PREFIX}{fast}")
    today = timezone.localdate()
    LabDay.objects.create(lab=lab, date=today)
    errors: list[str] = []

    staff = browser_as(browser, live_server, approver)
    jobs = watch(staff.new_page(), errors)
    jobs.goto(f"{live_server.url}/staff/")
    jobs.evaluate("window.__same = true")

    alice = browser_as(browser, live_server, cast.alice)
    portal = watch(alice.new_page(), errors)
    portal.goto(f"{live_server.url}/portal/book/")
    portal.click(f"table.calendar button[data-date='{today.isoformat()}']")
    portal.click("#confirm-booking")
    portal.wait_for_url(re.compile(r"/portal/bookings/[0-9a-f-]+/$"))
    booking = Booking.objects.get(customer=cast.alice)
    assert booking.lab_day.date == today
    portal.click("a.button:has-text('Submit your configuration')")
    portal.fill("#command", walk.COMMAND)
    portal.click("#by-command button[value=preview]")
    assert "--tensor-parallel-size 8" in portal.inner_text("#launch-command")

    with serving_sim_lab(lab):
        portal.click("button[value=confirm]")
        portal.wait_for_url(re.compile(r"/portal/jobs/[0-9a-f-]+/$"))
        job = DiagnosticJob.objects.get(booking=booking)
        row = f"tr[data-job='{job.pk}']"
        # The new job appears in the list the consultant already had open.
        jobs.wait_for_selector(row, timeout=15_000)

        detail = watch(staff.new_page(), errors)
        detail.goto(f"{live_server.url}/staff/jobs/{job.pk}/")
        detail.evaluate("window.__same = true")

        list_states: list[str] = []
        stage_states: list[str] = []
        log_lengths: list[tuple[str, int]] = []
        holders: set[str] = set()
        log: Any = None
        log_stage = ""
        shots: set[str] = set()
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            badge = jobs.inner_text(f"{row} .badge")
            if not list_states or list_states[-1] != badge:
                list_states.append(badge)
            states = detail.eval_on_selector_all(
                "tr.stage", "rows => rows.map(r => r.dataset.stage + ':' + r.classList[1]).join(' ')")
            if not stage_states or stage_states[-1] != states:
                stage_states.append(states)
                holders.update(detail.eval_on_selector_all("table.timeline code",
                                                           "cs => cs.map(c => c.textContent)"))
            running = re.findall(r"(\w+):running", states)
            # Follow the log of the day's longest stage while it runs.
            if log is None and LOG_STAGE in running:
                log_stage = LOG_STAGE
                log = watch(staff.new_page(), errors)
                log.goto(f"{live_server.url}/staff/jobs/{job.pk}/log/{log_stage}/")
                log.evaluate("window.__same = true")
            if log is not None:
                entry = (log.inner_text("#log-state"), len(log.inner_text("#stage-log")))
                if not log_lengths or log_lengths[-1] != entry:
                    log_lengths.append(entry)
                if entry[0] == "running" and entry[1] > 0 and "log" not in shots:
                    running_log = [n for s, n in log_lengths if s == "running"]
                    if len(running_log) >= 2:
                        shots.add("log")
                        screenshot(log, "staff-live-03-log-running")
            if running and "running" not in shots:
                shots.add("running")
                screenshot(jobs, "staff-live-01-jobs-running")
                screenshot(detail, "staff-live-02-job-running")
            if detail.inner_text("#job-status") in FINISHED and badge in FINISHED:
                break
            detail.wait_for_timeout(500)
        else:
            raise AssertionError(f"the job did not end: {stage_states[-1:]}\n{worker.output()[-3000:]}")

        # The job page's actions followed the end without a reload: cancel gone, the
        # report's rewrite offered.
        detail.wait_for_selector("#rerun-report", state="visible", timeout=10_000)
        assert detail.locator("#cancel-job").is_hidden()
        # The list tells the state: how the day ended and where its report stands.
        ended = jobs.inner_text(row)
        assert "all 4 stages done" in ended and ("awaiting approval" in ended or "none yet" in ended), ended
        # Every page changed in place: the same documents throughout.
        for page in (jobs, detail, log):
            assert page is not None and page.evaluate("window.__same") is True
        job.refresh_from_db()
        assert job.status == DiagnosticJob.Status.SUCCEEDED, (job.status_message, worker.output()[-3000:])
        assert list_states[-1] == "succeeded" and "running" in list_states, list_states
        assert any(":running" in s for s in stage_states) and len(stage_states) >= 3, stage_states
        assert stage_states[-1].count(":succeeded") == 4, stage_states
        # The log of a running stage grew on the open page, then its state turned.
        growing = [n for state, n in log_lengths if state == "running"]
        assert len(set(growing)) >= 2 and growing == sorted(growing), log_lengths
        assert log_lengths[-1][0] == "done", log_lengths
        assert log is not None
        # The lab page, polled now: the day stopped its engines when it ended (the lab is
        # left as found), and the last one the head ran was this job's.
        lab_page = watch(staff.new_page(), errors)
        lab_page.goto(f"{live_server.url}/staff/lab/")
        lab_page.click("#refresh-lab")
        head = lab_page.locator("tr.node[data-node='spark-01']")
        assert "exited" in head.inner_text() and "running" not in head.inner_text(), head.inner_text()
        assert head.locator(f"a[href='/staff/jobs/{job.pk}/']").count() == 1, head.inner_text()
        screenshot(lab_page, "staff-live-07-lab")
        saved = StageRun.objects.get(job=job, name=log_stage).log
        assert log.inner_text("#stage-log").strip() == saved.strip()
        # The worker process ran it, not this one: the lease holder the timeline showed.
        assert any(f":{worker.process.pid}" in holder for holder in holders), holders

    # A reload now shows the finished job with its plots, drawn from this run's artifacts.
    detail.reload()
    plots = detail.inner_text("section.plots")
    assert "the customer's configuration: 5" in plots and "with the proved changes: 1" in plots, plots
    assert "No telemetry recorded yet" not in plots and "No cold-start phases" not in plots, plots
    assert detail.locator("section.plots svg.plot").count() >= 2
    screenshot(detail, "staff-live-04-job-finished")
    assert "{&quot;" not in detail.content() and '{"' not in detail.inner_text("main")

    # Review: edit a finding's narrative, render a new version, read the diff, approve.
    review = watch(staff.new_page(), errors)
    review.goto(f"{live_server.url}/staff/reports/{job.pk}/")
    first = ReportVersion.objects.get(job=job)
    assert not first.is_approved
    # The first finding in the report's order, as the page lists them.
    first_article = review.get_attribute("#findings article.finding", "id")
    assert first_article, "the day recorded no findings"
    finding = job.finding_set.get(pk=int(first_article.removeprefix("finding-")))
    review.fill(f"#narrative-{finding.pk}", NARRATIVE)
    review.click(f"#finding-{finding.pk} button[type=submit]")
    assert "Saved narrative" in review.inner_text("main")
    review.click("#render-version")
    # The render goes to the worker and the request answers at once; the page follows it
    # in place until the new version is on top, with its diff.
    review.wait_for_selector("#render-progress", timeout=10_000)
    assert "in the background" in review.inner_text("main")
    review.evaluate("window.__same = true")
    review.wait_for_selector("#render-done", timeout=120_000)
    assert review.evaluate("window.__same") is True
    newest = ReportVersion.objects.filter(job=job).exclude(pk=first.pk).get()
    assert f"Last render: version {newest.version}" in review.inner_text("#render-done")
    assert NARRATIVE in review.inner_text("#version-diff")
    screenshot(review, "staff-live-05-review-diff")
    # Approving goes through the confirmation of what goes to whom.
    review.click(f"tr[data-version='{newest.version}'] a.approve")
    assert review.inner_text("#recipients") == ", ".join(recipients(job))
    review.click("#confirm-send")
    assert "approved and emailed" in review.inner_text("main")
    review.click(f"tr[data-version='{newest.version}'] a.approve")
    review.click("#confirm-send")
    assert "none was sent again" in review.inner_text("main")
    assert len(smtp.messages) == 1
    assert newest.version in smtp.messages[0].get_body(preferencelist=("plain",)).get_content() or \
        newest.version in str(smtp.messages[0])
    screenshot(review, "staff-live-06-approved")
    staff.close()

    # The customer's open job page now offers the approved version; the download is it.
    portal.goto(f"{live_server.url}/portal/jobs/{job.pk}/")
    with portal.expect_download() as download_info:
        portal.click("#download-report")
    got = open(download_info.value.path(), "rb").read()
    assert got == open(newest.pdf_path, "rb").read()
    text = "\n".join(p.extract_text() or "" for p in PdfReader(io.BytesIO(got)).pages)
    assert "answered /health only after" in text.replace("\n", " ")
    alice.close()
    assert errors == [], errors
