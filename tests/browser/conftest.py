"""Browser tier: Playwright for Python driving Debian's Chromium against pytest-django's
live server. Without Chromium the tests skip (fail under REQUIRE_SERVICES=1, as CI runs).

Playwright's sync API keeps an event loop in the test thread, so Django's guard against
database calls from async code would trip on plain test code: DJANGO_ALLOW_ASYNC_UNSAFE
says this thread is not async code. Screenshots of each page land in out/screenshots/.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "out" / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def _chromium() -> str:
    path = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if not path:
        reason = f"browser tier needs Debian's chromium package ({CHROMIUM} not found)"
        if os.environ.get("REQUIRE_SERVICES") == "1":
            pytest.fail(f"REQUIRE_SERVICES=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return path


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    executable = _chromium()
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        yield chromium
        chromium.close()


@pytest.fixture
def screenshot() -> Any:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(page: Any, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


@pytest.fixture
def portal_settings(settings: Any, tmp_path: Path, live_server: Any) -> Any:
    """The live server as the demo runs: jobs in a thread of this process (no broker),
    reports released at once, today bookable, invitation links pointing at the live server."""
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.PORTAL_AUTO_APPROVE = True
    # Today is bookable, so a job confirmed in the test starts at once (its lab day has begun).
    settings.BOOKING_SAME_DAY = True
    settings.SITE_URL = live_server.url
    settings.OUT_DIR = tmp_path / "out"
    settings.DIAG_SIM_STATE_DIR = tmp_path / "labsim"
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    # The pipeline stages beyond the required ones take minutes each on the simulated lab;
    # the path under test is the portal's, so the job runs preflight, reproduce, report.
    settings.PORTAL_JOB_STAGES = ["preflight", "reproduce", "report"]
    return settings
