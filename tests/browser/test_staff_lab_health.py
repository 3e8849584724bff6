"""The lab page in a real browser on the real polling path: `celery beat` (its own
process, the schedule settings.py gives) sends the lab-health poll every
STAFF_LAB_HEALTH_INTERVAL_S (a minute in production, 10 s here), a real worker runs it
against the simulated lab over SSH, and the open page re-reads what was stored. A node
powered off shows as unreachable, with its error, within one beat period and without a
reload; brought back, the page's "Poll the lab now" shows it answering at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from diagnostic.bookings.models import Lab
from diagnostic.celery import app
from diagnostic.jobs.models import NodeHealth
from lab.sim.lab import SimLab
from tests.browser.test_staff_review import browser_as

# The worker as the services tier starts it, and the fixtures it needs.
from tests.diagnostic.conftest import REFERENCE_SCENARIO, REPO, postgres, redis_url, sim_state_dir  # noqa: F401
from tests.diagnostic.doubles import fast_scenario
from tests.diagnostic.jobs.test_worker import Worker, start_worker  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.services, pytest.mark.django_db(transaction=True)]

# The beat's period for this test; production's is a minute (settings.py, checked below).
# A shorter one proves the same path, beat -> worker -> page, in a sixth of the wait.
INTERVAL_S = 10  # the settings' minimum


def test_the_beat_polls_the_lab_every_minute_by_default(settings: Any) -> None:
    if "STAFF_LAB_HEALTH_INTERVAL_S" not in os.environ:
        assert settings.STAFF_LAB_HEALTH_INTERVAL_S == 60
    entry = settings.CELERY_BEAT_SCHEDULE["poll-lab-health"]
    assert entry["schedule"] == float(settings.STAFF_LAB_HEALTH_INTERVAL_S)


@pytest.fixture
def beat(redis_url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:  # noqa: F811
    """`celery beat` with the project's schedule; it only publishes, the worker runs."""
    log = (tmp_path / "beat.log").open("w")
    env = {**os.environ, "CELERY_BROKER_URL": redis_url, "DIAG_QUEUE": app.conf.task_default_queue,
           "STAFF_LAB_HEALTH_INTERVAL_S": str(INTERVAL_S)}
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "diagnostic", "beat", "--loglevel=INFO",
         "-s", str(tmp_path / "beat-schedule")],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    yield process
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    log.close()


def wait_until(page: Any, check: Callable[[], bool], timeout_s: float, what: str,
               logs: Callable[[], str]) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if check():
            return time.monotonic() - started
        page.wait_for_timeout(500)
    raise AssertionError(f"not within {timeout_s:g} s: {what}\n{logs()}")


def test_a_node_taken_down_shows_unreachable_within_one_beat_period(
    browser: Any, live_server: Any, screenshot: Any, start_worker: Callable[[str], Worker],  # noqa: F811
    beat: subprocess.Popen[bytes], tmp_path: Path,
) -> None:
    worker = start_worker("lab-health")

    def logs() -> str:
        beat_log = (tmp_path / "beat.log").read_text()[-2000:]
        return f"--- worker ---\n{worker.output()[-2000:]}\n--- beat ---\n{beat_log}"

    with SimLab(fast_scenario(tmp_path, REFERENCE_SCENARIO), tmp_path / "labsim-health") as sim:
        lab = Lab.objects.create(name="health-lab", inventory=str(sim.inventory_path))
        consultant = User.objects.create_user(username="consultant", is_staff=True)
        context = browser_as(browser, live_server, consultant)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(f"{live_server.url}/staff/lab/")
        page.evaluate("window.__same = true")
        section = page.inner_text(f"section[data-lab='{lab.name}']")
        assert "No poll has run since the platform started" in section

        # Beat's first poll: every node answers.
        names = sim.scenario.node_names
        wait_until(page, lambda: page.locator("tr.node.reachable").count() == len(names),
                   INTERVAL_S + 30, "the first beat poll", logs)
        assert "all nodes answer" in page.inner_text(f"section[data-lab='{lab.name}'] h2")
        screenshot(page, "staff-lab-01-all-up")

        victim = names[2]
        polled = NodeHealth.objects.get(lab=lab, node=victim).checked_at
        sim.set_node_down(victim)
        row = f"tr.node[data-node='{victim}']"
        took = wait_until(page, lambda: "unreachable" in page.get_attribute(row, "class").split(),
                          INTERVAL_S + 10, f"{victim} unreachable on the open page", logs)
        # Within one beat period (plus the page's own re-read), by a later beat poll.
        assert took <= INTERVAL_S + 10
        down = NodeHealth.objects.get(lab=lab, node=victim)
        assert not down.reachable and down.checked_at > polled
        text = page.inner_text(row)
        assert "unreachable" in text and down.error[:40] in text, text
        assert "last answered" in text
        assert "1 node down" in page.inner_text(f"section[data-lab='{lab.name}'] h2")
        assert page.locator("tr.node.reachable").count() == len(names) - 1
        assert page.evaluate("window.__same") is True  # no reload
        screenshot(page, "staff-lab-02-node-down")

        # Back on: the on-demand poll shows it at once.
        sim.set_node_down(victim, down=False)
        page.click("#refresh-lab")
        assert "Polled 1 lab(s) just now" in page.inner_text("main")
        assert "reachable" in page.get_attribute(row, "class").split()
        assert errors == [], errors
        context.close()
