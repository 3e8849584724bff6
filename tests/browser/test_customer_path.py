"""The whole customer path in a real browser: accept the invitation and set a password,
log in, book a day, paste a launch command with a mistake and see the error at the
token, fix it, preview, confirm, watch the stages advance without reloading, download
the PDF report and read it back."""

from __future__ import annotations

import datetime as dt
import io
import re
import time
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone
from pypdf import PdfReader

from diagnostic.bookings.models import SIM_PREFIX, Booking, Lab, LabDay
from diagnostic.jobs.models import DiagnosticJob
from diagnostic.staff.demo import SCENARIO, serving_sim_lab

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

EMAIL = "carol@initech.example"
PASSWORD = "correct horse battery 42"
COMMAND = (
    "NCCL_DEBUG=WARN vllm serve /models/kimi-k2 \\\n"
    "  --served-model-name moonshotai/Kimi-K2-Instruct-0905 \\\n"
    "  --tensor-parallel-size 8 --enable-expert-parallel \\\n"
    "  --max-model-len 262144 --kv-cache-dtype fp8 --gpu-memory-utilization 0.85 \\\n"
    '  --speculative-config \'{"method": "eagle3", "model": "AQ-MedAI/Kimi-K2-Instruct-eagle3", '
    '"num_speculative_tokens": 4}\''
)
MISTAKE = COMMAND.replace("--enable-expert-parallel", "--enable-expert-paralel")


def test_a_customer_goes_from_invitation_to_report(
    browser: Any, live_server: Any, portal_settings: Any, screenshot: Any
) -> None:
    lab = Lab.objects.create(name="sim:browser-lab", inventory=f"{SIM_PREFIX}{SCENARIO}")
    today = timezone.localdate()
    days = [LabDay.objects.create(lab=lab, date=today + dt.timedelta(days=n)) for n in range(0, 30)]
    LabDay.objects.filter(pk=days[6].pk).update(closed=True)
    out = StringIO()
    call_command("invite", EMAIL, "--org", "Initech Labs", stdout=out, stderr=StringIO())
    link = out.getvalue().strip()
    assert link.startswith(live_server.url)

    context = browser.new_context(viewport={"width": 1200, "height": 900}, accept_downloads=True)
    page = context.new_page()
    # Script errors and CSP refusals; the 400 answer of the page with the field error is
    # the browser reporting a status we chose, not a fault.
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on(
        "console",
        lambda m: errors.append(m.text) if m.type == "error" and "status of 400" not in m.text else None,
    )

    # The invitation: set a password, land in the portal.
    page.goto(link)
    screenshot(page, "01-accept-invite")
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/portal/")
    screenshot(page, "02-bookings-empty")

    # Log out and in again with the new password.
    page.click("header button:has-text('Log out')")
    page.goto(f"{live_server.url}/accounts/login/")
    screenshot(page, "03-login")
    page.fill("#id_username", EMAIL)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/portal/")

    # Book the first available day: today, so the diagnostic starts at confirmation.
    page.click("header nav >> text=Book a lab day")
    screenshot(page, "04-calendar")
    first = page.locator("table.calendar button").first
    date = first.get_attribute("data-date")
    assert date == today.isoformat()
    first.click()
    # The day's summary (lab, price, money back) before anything is booked.
    page.wait_for_selector("#booking-summary")
    assert not Booking.objects.exists()
    page.click("#confirm-booking")
    page.wait_for_url(re.compile(r"/portal/bookings/[0-9a-f-]+/$"))
    assert "Booked" in page.inner_text("main")
    screenshot(page, "05-booking")
    booking = Booking.objects.get()
    assert booking.lab_day.date.isoformat() == date

    # A command with a mistake: the error names the token; the text stays.
    page.click("a.button:has-text('Submit your configuration')")
    page.fill("#command", MISTAKE)
    page.click("#by-command button[value=preview]")
    error = page.locator("#command-error")
    assert "--enable-expert-paralel" in error.inner_text()
    assert page.inner_text("#command-mark mark") == "--enable-expert-paralel"
    assert page.input_value("#command") == MISTAKE
    screenshot(page, "06-command-error")

    # Fixed: the preview shows the normalized configuration and the launch command.
    page.fill("#command", COMMAND)
    page.click("#by-command button[value=preview]")
    command = page.inner_text("#launch-command")
    assert "--tensor-parallel-size 8" in command and "--enable-expert-parallel" in command
    assert "expert_parallel: true" in page.inner_text("#normalized")
    screenshot(page, "07-preview")

    with serving_sim_lab(lab):
        page.click("button[value=confirm]")
        page.wait_for_url(re.compile(r"/portal/jobs/[0-9a-f-]+/$"))
        job = DiagnosticJob.objects.get()
        assert job.booking == booking
        page.evaluate("window.__stillTheSamePage = true")
        screenshot(page, "08-job-queued")

        # Watch the stages advance on the same page (no reload): each state the table shows.
        seen: list[str] = []
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            states = page.eval_on_selector_all(
                "tr.stage", "rows => rows.map(r => r.dataset.stage + ':' + r.classList[1]).join(' ')"
            )
            if not seen or seen[-1] != states:
                seen.append(states)
                if len(seen) == 2:
                    screenshot(page, "09-job-running")
            if page.inner_text("#job-status") in ("succeeded", "partial", "failed"):
                break
            page.wait_for_timeout(500)
        # The job may have finished between reading the rows and reading its status: the rows
        # as the finished page shows them are the last state seen.
        states = page.eval_on_selector_all(
            "tr.stage", "rows => rows.map(r => r.dataset.stage + ':' + r.classList[1]).join(' ')")
        if seen[-1] != states:
            seen.append(states)
        assert page.evaluate("window.__stillTheSamePage") is True
        assert page.inner_text("#job-status") == "succeeded", seen[-1]
        assert len(seen) >= 3, seen  # queued, at least one change while it ran, finished
        assert "reproduce:running" in " ".join(seen) or "preflight:running" in " ".join(seen)
    screenshot(page, "10-job-finished")

    # The report: download it through the portal and read it back.
    with page.expect_download() as download_info:
        page.click("#download-report")
    download = download_info.value
    pdf = PdfReader(io.BytesIO(open(download.path(), "rb").read()))
    text = "\n".join(p.extract_text() or "" for p in pdf.pages)
    assert len(pdf.pages) >= 2
    assert "Initech Labs" in text
    page.goto(f"{live_server.url}/portal/")
    assert "Sunday" in page.inner_text("table.list") or booking.lab_day.date.strftime(
        "%b"
    ) in page.inner_text("table.list")
    screenshot(page, "11-bookings")
    assert errors == [], errors
    context.close()

    # Someone guessing the password: the account locks and says until when.
    stranger = browser.new_context(viewport={"width": 1200, "height": 900})
    guess = stranger.new_page()
    for attempt in range(portal_settings.AXES_FAILURE_LIMIT + 1):
        guess.goto(f"{live_server.url}/accounts/login/")
        guess.fill("#id_username", EMAIL)
        guess.fill("#id_password", f"wrong guess {attempt}")
        guess.click("button[type=submit]")
    assert "It unlocks at" in guess.inner_text("main")
    screenshot(guess, "12-locked-out")
    stranger.close()
