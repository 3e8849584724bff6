"""The customer's three pages of issue 30, in a real browser: the configuration form (sent
empty, then with three mistakes at once, then a YAML file with three), the job page while
the day runs and once its report is approved (the page following the end without a reload),
and booking, cancelling and moving with their summaries and confirmations. Each state is
screenshotted under out/screenshots/ (customer-*.png)."""

from __future__ import annotations

import datetime as dt
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from diagnostic.bookings.configs import submit_configuration
from diagnostic.bookings.models import SIM_PREFIX, Booking, Customer, Lab, LabDay, Organisation, book_lab_day
from diagnostic.jobs.models import DiagnosticJob, ReportVersion
from diagnostic.jobs.orchestration import create_job
from diagnostic.staff.demo import SCENARIO
from tests.diagnostic.conftest import REFERENCE_CONFIG

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "customer pages 30"
REFERENCE_DAY = Path(__file__).resolve().parents[1] / "reports" / "reference_day.json"
THREE_MISTAKES_YAML = """schema: diagnostic.config/1
engine: {name: vllm, version: "0.34.0"}
model: {id: moonshotai/Kimi-K2-Instruct-0905, path: /models/kimi-k2}
parallel:
  tp: 0
serving:
  gpu_memory_utilization: 1.5
  kv_cache_dtype: fp9
"""


def customer_page(browser: Any, base: str, *, width: int = 1366) -> tuple[Any, User, Lab]:
    organisation = Organisation.objects.create(name="Acme Inference")
    user = User.objects.create_user("alice@acme.example", "alice@acme.example", PASSWORD,
                                    first_name="Alice")
    Customer.objects.create(user=user, organisation=organisation)
    lab = Lab.objects.create(name="sim:pages-lab", inventory=f"{SIM_PREFIX}{SCENARIO}")
    context = browser.new_context(viewport={"width": width, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", user.email)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/portal/")
    return page, user, lab


def days(lab: Lab, count: int = 30, start: int = 0) -> list[LabDay]:
    today = timezone.localdate()
    return [LabDay.objects.create(lab=lab, date=today + dt.timedelta(days=n)) for n in range(start, count)]


def test_the_configuration_form_lists_every_mistake_beside_its_field(
    browser: Any, live_server: Any, portal_settings: Any, screenshot: Any
) -> None:
    page, user, lab = customer_page(browser, live_server.url)
    booking = book_lab_day(lab_day=days(lab, 12, 10)[0], customer=user)
    page.goto(f"{live_server.url}/portal/bookings/{booking.uuid}/config/")
    page.click("#by-form summary")
    # Fresh, the form holds the lab's defaults and asks for what only the customer knows.
    assert page.input_value("#f-serving__gpu_memory_utilization") == "0.9"
    assert page.input_value("#f-model__path") == "/models/kimi-k2"
    assert "--moe-backend" in page.inner_text("#h-serving__moe_backend")
    screenshot(page, "customer-config-form")

    # Sent empty: each required field says so beside it, all at once.
    page.click("#by-form button[value=preview]")
    page.wait_for_selector("#form-problems")
    for name in ("engine__name", "engine__version", "model__id", "cluster__nodes", "parallel__tp"):
        block = page.locator(f".field[data-field='{name.replace('__', '.')}']")
        assert "is required" in block.locator(".field-error").inner_text(), name
    assert "5 problems" in page.inner_text("#form-problems")
    screenshot(page, "customer-config-form-empty")

    # Three mistakes at once: each at its own field, the typed values kept.
    page.select_option("#f-engine__name", "vllm")
    page.select_option("#f-engine__version", "0.34.0")
    page.fill("#f-model__id", "moonshotai/Kimi-K2-Instruct-0905")
    page.fill("#f-cluster__nodes", "eight")
    page.fill("#f-parallel__tp", "0")
    page.fill("#f-serving__gpu_memory_utilization", "1.5")
    page.click("#by-form button[value=preview]")
    page.wait_for_selector("#form-problems")
    assert "3 problems" in page.inner_text("#form-problems")
    errors = {
        name: page.locator(f".field[data-field='{name}'] .field-error").all_inner_texts()
        for name in ("cluster.nodes", "parallel.tp", "serving.gpu_memory_utilization")
    }
    assert "'eight' is not accepted" in errors["cluster.nodes"][0]
    assert "0 is not accepted" in errors["parallel.tp"][0]
    assert "1.5 is not accepted" in errors["serving.gpu_memory_utilization"][0]
    assert page.locator(".field-error").count() == 3
    assert page.input_value("#f-cluster__nodes") == "eight"
    assert page.input_value("#f-model__id") == "moonshotai/Kimi-K2-Instruct-0905"
    screenshot(page, "customer-config-form-three-errors")

    # The same three kinds of mistake in a YAML file: listed together, each with its line.
    page.goto(f"{live_server.url}/portal/bookings/{booking.uuid}/config/")
    page.click("#by-yaml summary")
    page.fill("#yaml_text", THREE_MISTAKES_YAML)
    page.click("#by-yaml button[value=preview]")
    items = page.locator("#yaml-error li").all_inner_texts()
    assert [i.split(":")[0] for i in items] == ["line 5", "line 7", "line 8"], items
    assert "parallel.tp" in items[0] and "gpu_memory_utilization" in items[1] and "kv_cache_dtype" in items[2]
    screenshot(page, "customer-config-yaml-three-errors")

    # Fixed: the preview.
    page.goto(f"{live_server.url}/portal/bookings/{booking.uuid}/config/")
    page.click("#by-form summary")
    page.select_option("#f-engine__name", "vllm")
    page.select_option("#f-engine__version", "0.34.0")
    page.fill("#f-model__id", "moonshotai/Kimi-K2-Instruct-0905")
    page.fill("#f-cluster__nodes", "8")
    page.fill("#f-parallel__tp", "8")
    page.click("#by-form button[value=preview]")
    assert "--tensor-parallel-size 8" in page.inner_text("#launch-command")
    page.context.close()


def test_the_job_page_while_the_day_runs_and_once_it_is_reported(
    browser: Any, live_server: Any, portal_settings: Any, screenshot: Any
) -> None:
    page, user, lab = customer_page(browser, live_server.url)
    booking = book_lab_day(lab_day=days(lab, 1)[0], customer=user)
    config = submit_configuration(raw_text=REFERENCE_CONFIG.read_text(), source="yaml", booking=booking,
                                  submitted_by=user)
    job = create_job(config=config, lab=lab, booking=booking, stages=None)
    now = timezone.now()
    DiagnosticJob.objects.filter(pk=job.pk).update(status="running", started_at=now - dt.timedelta(minutes=4))
    job.stage_runs.filter(name="preflight").update(
        status="succeeded", lab_seconds=13.0, result={"lab_dilation": 45.0}, progress_percent=100,
        started_at=now - dt.timedelta(minutes=4), finished_at=now - dt.timedelta(minutes=3))
    job.stage_runs.filter(name="reproduce").update(
        status="running", progress_percent=40, started_at=now - dt.timedelta(seconds=20),
        progress_message="measuring your configuration on code: run 6 of 15")

    page.goto(f"{live_server.url}/portal/jobs/{job.pk}/")
    assert page.inner_text("#current-stage") == "Reproducing your configuration"
    assert "40 %" in page.inner_text("#job-now")
    assert "run 6 of 15" in page.inner_text("#job-now")
    estimate = page.inner_text("#job-estimate")
    assert re.search(r"Expected to end around \d\d:\d\d UTC", estimate), estimate
    assert "preflight" not in page.inner_text("table.stages")  # stages in words, not slugs
    screenshot(page, "customer-job-running")

    # The day ends and staff approve the report: the open page follows without a reload.
    page.evaluate("window.__samePage = true")
    job.stage_runs.update(status="succeeded", progress_percent=100, lab_seconds=600.0)
    DiagnosticJob.objects.filter(pk=job.pk).update(status="succeeded", finished_at=timezone.now())
    folder = Path(portal_settings.OUT_DIR) / "jobs" / str(job.pk) / "versions" / "abcdefabcdef"
    folder.mkdir(parents=True)
    (folder / "report.pdf").write_bytes(b"%PDF-1.4\n% the report\n")
    shutil.copyfile(REFERENCE_DAY, folder / "findings.json")
    ReportVersion.objects.create(job=job, digest="abcdef" * 10 + "abcd", pdf_path=str(folder / "report.pdf"),
                                 pages=14).approve()
    page.wait_for_selector("#job-results", timeout=15000)
    assert page.evaluate("window.__samePage") is True
    assert page.inner_text("#job-status") == "succeeded"
    assert page.locator("#job-now").count() == 0
    headline = page.inner_text("#headline")
    assert "Decode rate, code (tok/s)" in headline and "Cold start" in headline
    assert re.search(r"\[[-\d.]+, [-\d.]+\]|±|–", headline), headline  # intervals beside the means
    titles = page.locator("#finding-titles li").all_inner_texts()
    assert len(titles) == 7
    assert "The default FP4 kernel (flashinfer_cutlass) gives fluent nonsense" in " ".join(titles)
    assert "does not apply" in page.inner_text("#money-back")
    for link in ("#download-report", "#download-tuned-config", "#download-tuned-command",
                 "#download-tuned-diff"):
        assert page.locator(link).is_visible(), link
    screenshot(page, "customer-job-finished")

    with page.expect_download() as got:
        page.click("#download-tuned-command")
    command = Path(got.value.path()).read_text()
    assert "vllm serve" in command or "--tensor-parallel-size" in command, command[:400]
    with page.expect_download() as got:
        page.click("#download-tuned-diff")
    diff = Path(got.value.path()).read_text()
    assert diff.startswith("---") and "+++ tuned-config.yaml" in diff
    with page.expect_download() as got:
        page.click("#download-tuned-config")
    assert "schema: diagnostic.config/1" in Path(got.value.path()).read_text()
    page.context.close()


def test_booking_cancelling_and_moving_each_show_a_summary_first(
    browser: Any, live_server: Any, portal_settings: Any, screenshot: Any
) -> None:
    portal_settings.PORTAL_LAB_DAY_PRICE = "EUR 1,234 per lab day (test price)"
    page, _, lab = customer_page(browser, live_server.url)
    Lab.objects.filter(pk=lab.pk).update(description="Our 8-node NVIDIA DGX Spark lab (simulated)")
    # Days from last week on: those before today are past, not "too soon".
    all_days = days(lab, 30, -6)
    today = timezone.localdate()
    ahead = next(d for d in all_days if d.date == today + dt.timedelta(days=10))

    page.goto(f"{live_server.url}/portal/book/")
    if today.weekday() > 0:
        assert "past" in page.inner_text("table.calendar td.past")
    assert page.locator("table.calendar td.soon").count() == 0  # same-day booking is on here
    screenshot(page, "customer-book-calendar")

    page.click(f"table.calendar button[data-date='{ahead.date.isoformat()}']")
    page.wait_for_selector("#booking-summary")
    summary = page.inner_text("#booking-summary")
    assert "Our 8-node NVIDIA DGX Spark lab (simulated)" in summary and "sim:" not in summary
    assert page.inner_text("#summary-price") == "EUR 1,234 per lab day (test price)"
    assert "Money back" in page.inner_text("#summary-money-back")
    assert "You can cancel or move it until" in page.inner_text("#summary-window")
    assert not Booking.objects.exists(), "nothing is booked before the confirmation"
    screenshot(page, "customer-book-summary")
    page.click("#confirm-booking")
    page.wait_for_url(re.compile(r"/portal/bookings/[0-9a-f-]+/$"))
    booking = Booking.objects.get()
    assert booking.lab_day == ahead and "Booked" in page.inner_text("main")
    screenshot(page, "customer-booking-booked")

    # Moving: pick a day, read the summary, confirm.
    later = next(d for d in all_days if d.date == today + dt.timedelta(days=12))
    page.select_option("#lab_day", str(later.pk))
    page.click("section.changes button:has-text('Move booking')")
    page.wait_for_selector("#move-summary")
    assert f"{later.date:%A}" in page.inner_text("#move-summary")
    booking.refresh_from_db()
    assert booking.lab_day == ahead
    screenshot(page, "customer-move-summary")
    page.click("#confirm-move")
    page.wait_for_url(re.compile(r"/portal/bookings/[0-9a-f-]+/$"))
    booking.refresh_from_db()
    assert booking.lab_day == later and "Moved from" in page.inner_text("main")

    # Cancelling: the summary, then the confirmation.
    page.click("#cancel-booking")
    page.wait_for_selector("#cancel-summary")
    booking.refresh_from_db()
    assert booking.is_active
    screenshot(page, "customer-cancel-summary")
    page.click("#confirm-cancel")
    page.wait_for_url(re.compile(r"/portal/bookings/[0-9a-f-]+/$"))
    booking.refresh_from_db()
    assert booking.status == Booking.Status.CANCELLED and "is cancelled" in page.inner_text("main")
    screenshot(page, "customer-cancelled")

    # Today: the summary says it cannot be changed once booked; the booking page shows no
    # deadline in the past.
    page.goto(f"{live_server.url}/portal/book/")
    page.click(f"table.calendar button[data-date='{today.isoformat()}']")
    assert "cannot be cancelled or moved online" in page.inner_text("#summary-window")
    screenshot(page, "customer-book-summary-today")
    page.click("#confirm-booking")
    page.wait_for_url(re.compile(r"/portal/bookings/[0-9a-f-]+/$"))
    window = page.inner_text("#change-window")
    assert "can no longer be cancelled or moved online" in window
    assert str(today.year) not in window, "no deadline (two days ago) shown as if it still held"
    screenshot(page, "customer-booking-today")
    page.context.close()
