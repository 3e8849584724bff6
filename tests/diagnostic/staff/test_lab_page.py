"""The lab page says only what the stored records show: when the last poll ran and what it
found, whether a poll is due or beat has fallen silent (and, with no broker, that nothing
polls on its own), never "never polled" while polls arrive; which job holds the lab, with a
link; and a node found down before that job's latest successful stage is shown stale, not
down against the job's own evidence."""

from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from diagnostic.bookings.models import Lab
from diagnostic.jobs.models import LabHealth, LabLease, NodeHealth
from diagnostic.staff import lab_views
from tests.diagnostic.conftest import Cast
from tests.diagnostic.staff.conftest import make_finished_job
from tests.diagnostic.staff.test_lab_health import hold_lab, row, section

pytestmark = pytest.mark.django_db

INTERVAL_S = 60


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> dt.datetime:
    """The clock stands still for the test, so that the ages the page gives are exact."""
    frozen = timezone.now().replace(microsecond=0)
    monkeypatch.setattr(timezone, "now", lambda: frozen)
    return frozen


@pytest.fixture
def beat(settings: Any) -> Any:
    """A deployment with a broker: Celery beat is meant to poll every INTERVAL_S."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.STAFF_LAB_HEALTH_INTERVAL_S = INTERVAL_S
    return settings


def unmasked(html: str) -> str:
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "", html)


def page_of(cast: Cast, lab: Lab) -> str:
    page = cast.client("staff").get("/staff/lab/").content.decode()
    assert "never polled" not in page
    fragment = cast.client("staff").get("/staff/lab/sections/").content.decode()
    # The re-read says the same (but for the form's masked CSRF token).
    assert unmasked(section(fragment, lab)) == unmasked(section(page, lab))
    return section(page, lab)


def test_embedded_mode_says_nothing_polls_on_its_own(cast: Cast, lab: Lab, settings: Any,
                                                    now: dt.datetime) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = True
    text = page_of(cast, lab)
    assert "No poll has run since the platform started." in text
    assert "Celery beat does not run, so nothing polls the lab on its own" in text
    assert "every 60 s" not in text and "Celery beat polls" not in text
    assert 'class="poll-now">Poll the lab now</button>' in text
    assert 'class="badge pending">no poll yet' in text

    LabHealth.objects.create(lab=lab, checked_at=now - dt.timedelta(minutes=10), poll_seconds=1.5)
    text = page_of(cast, lab)
    assert "Celery beat does not run" in text and "Celery beat polls" not in text
    assert "(10 min ago)" in text and "Completed in 1.5 s: every node answered." in text


def test_with_a_broker_the_page_says_when_beat_is_due_or_silent(cast: Cast, lab: Lab, beat: Any,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               now: dt.datetime) -> None:
    # No poll yet, the server just up: beat's first is on its way.
    monkeypatch.setattr(lab_views, "SERVER_STARTED", time.time() - 20)
    text = page_of(cast, lab)
    assert "No poll has run since the platform started." in text
    assert f"Celery beat sends its first poll within {INTERVAL_S} s of starting" in text
    assert "is beat running?" not in text and 'class="poll-now"' in text

    # Up for ten minutes and still nothing: beat is not polling, and the page says so.
    monkeypatch.setattr(lab_views, "SERVER_STARTED", time.time() - 600)
    text = page_of(cast, lab)
    assert "none has arrived in the 10 min this server has been up: is beat running?" in text

    # A poll 30 s ago: the cadence holds, the next is due a minute after it.
    checked = now - dt.timedelta(seconds=30)
    health = LabHealth.objects.create(lab=lab, checked_at=checked, poll_seconds=2.0)
    NodeHealth.objects.create(lab=lab, node="spark-01", reachable=True, checked_at=checked,
                              last_seen_at=checked)
    text = page_of(cast, lab)
    assert f"Last poll:</strong> {checked:%-d %b %H:%M:%S} UTC (30 s ago)." in text
    assert f"Celery beat polls every {INTERVAL_S} s." in text
    due = checked + dt.timedelta(seconds=INTERVAL_S)
    assert f"The next poll is due by {due:%H:%M:%S} UTC." in text
    assert 'class="badge succeeded">all nodes answer' in text
    assert f"{checked:%H:%M:%S} UTC" in row(text, "spark-01") and "(30 s ago)" in row(text, "spark-01")
    assert "has not polled" not in text and 'class="poll-now"' not in text

    # Five minutes without a poll: no cadence is claimed.
    stale = now - dt.timedelta(minutes=5)
    LabHealth.objects.filter(pk=health.pk).update(checked_at=stale)
    text = page_of(cast, lab)
    assert (f"Celery beat has not polled within two intervals ({2 * INTERVAL_S} s; it should poll every "
            f"{INTERVAL_S} s): the last poll is 5 min old.") in text
    assert "Celery beat polls every" not in text and "next poll is due" not in text
    assert 'class="poll-now">Poll the lab now' in text


def test_a_node_down_before_the_jobs_latest_success_is_stale_not_down(cast: Cast, lab: Lab, out_dir: Path,
                                                                       beat: Any, now: dt.datetime) -> None:
    job = make_finished_job(cast, lab, lab_day=timezone.localdate())
    hold_lab(job, stage_done_at=now - dt.timedelta(minutes=5))
    LabHealth.objects.create(lab=lab, checked_at=now - dt.timedelta(seconds=40), poll_seconds=3.0)
    # spark-01 was found down ten minutes ago (last answering fifteen ago); the job's
    # reproduce stage has succeeded since. spark-02 was found down after that success.
    refused = "Unreachable: connection refused"
    minutes = dt.timedelta(minutes=1)
    NodeHealth.objects.create(lab=lab, node="spark-01", reachable=False, error=refused,
                              checked_at=now - 10 * minutes, last_seen_at=now - 15 * minutes)
    polled = now - dt.timedelta(seconds=40)
    NodeHealth.objects.create(lab=lab, node="spark-02", reachable=False, error=refused,
                              checked_at=polled, last_seen_at=now - 15 * minutes)
    NodeHealth.objects.create(lab=lab, node="spark-03", reachable=True, checked_at=polled,
                              last_seen_at=polled)
    text = page_of(cast, lab)
    holder = text.split('class="holder"', 1)[1].split("</p>", 1)[0]
    assert f'href="/staff/jobs/{job.pk}/"' in holder
    assert "is using the lab: stage report running (writing)" in holder
    assert "its latest stage to succeed, reproduce, finished 5 min ago" in holder
    first = row(text, "spark-01")
    assert 'class="node stale"' in text and 'class="badge stale">stale' in first
    assert "stale: last seen 15 min ago; job" in first and f'href="/staff/jobs/{job.pk}/"' in first
    assert 'class="badge unreachable"' not in first
    assert 'class="badge unreachable">unreachable' in row(text, "spark-02")
    # The lab's summary counts only the node down against the job's evidence.
    assert 'class="badge failed">1 node down' in text

    # With no job holding the lab, nothing contradicts the record: both are down.
    LabLease.objects.filter(lab=lab).update(job=None, expires_at=None)
    text = page_of(cast, lab)
    assert 'class="holder"' not in text
    assert 'class="badge unreachable">unreachable' in row(text, "spark-01")
    assert 'class="badge failed">2 nodes down' in text
