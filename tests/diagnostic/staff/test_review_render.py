"""Review without surprises, the render and the figures: "Render a new version" hands the
render to the workers and answers at once; the page shows it waiting, then being written
with its progress (polling the Versions section), then the new version with its diff; a
render that fails or whose worker stopped says so where the button was. The measured part
of each finding is printed as the report prints it: values in words and units, settings,
flags and environment variables exactly as the engine takes them."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from diagnostic.celery import app
from diagnostic.jobs.models import DiagnosticJob, Finding, ReportVersion
from diagnostic.jobs.report_versions import render_version
from diagnostic.staff import review, tasks
from diagnostic.staff.models import ReportRender
from diagnostic.staff.rendering import request_render

pytestmark = pytest.mark.django_db

NARRATIVE = "Rendered off the request: the weights came from a network share at 180 MB/s."


@pytest.fixture
def eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """The render runs in this process, broker or not (a worker runs it in production)."""
    monkeypatch.setitem(app.conf, "task_always_eager", True)


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """What was handed to the workers; nothing runs it until the test plays the worker."""
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks.render_report_version, "delay", lambda *args: sent.append(args))
    return sent


def live_part(page: str) -> str:
    """The polled part of the Versions section, as the review page has it."""
    return page.split('id="versions-live"', 1)[1].split('<section id="findings">', 1)[0]


def test_the_render_is_handed_to_the_workers_and_the_page_follows_it(
        finished: DiagnosticJob, approver: User, approver_client: Client, handed: list[tuple[Any, ...]],
        settings: Any) -> None:
    first = render_version(finished).row
    finding = finished.finding_set.get(code="load.weights_io")
    review.edit_finding(finding=finding, by=approver, title=finding.title, narrative=NARRATIVE, note="")

    answer = approver_client.post(f"/staff/reports/{finished.pk}/render/")
    assert answer.status_code == 302 and answer["Location"].endswith("#versions")
    row = ReportRender.objects.get(job=finished)
    assert handed == [(str(finished.pk), row.pk)]
    assert row.state == ReportRender.State.QUEUED and row.requested_by == approver
    assert list(ReportVersion.objects.filter(job=finished)) == [first]  # nothing written in the request

    page = approver_client.get(answer["Location"].split("#")[0]).content.decode()
    assert "Rendering a new version from the edits in the background" in page
    live = live_part(page)
    assert f'data-poll-ms="{settings.STAFF_POLL_MS}"' in page.split('id="versions-live"', 1)[1][:200]
    assert 'id="render-progress"' in live and "waiting for a worker" in live and 'data-terminal="0"' in live
    assert 'id="render-version"' not in live  # no second render while one is under way

    # A second click while it waits starts nothing.
    again = approver_client.post(f"/staff/reports/{finished.pk}/render/", follow=True).content.decode()
    assert "already being rendered" in again and ReportRender.objects.count() == 1 and len(handed) == 1

    # A worker took it three seconds ago: being written, with how far it is.
    ReportRender.objects.filter(pk=row.pk).update(state=ReportRender.State.RUNNING,
                                                  started_at=timezone.now() - dt.timedelta(seconds=3))
    status = approver_client.get(f"/staff/reports/{finished.pk}/render/status/")
    assert status.status_code == 200 and status["Cache-Control"] == "no-store"
    fragment = status.content.decode()
    assert "being written" in fragment and "so far" in fragment and 'data-terminal="0"' in fragment
    progress = re.search(r'<progress max="100" value="(\d+)"', fragment)
    assert progress is not None and 1 <= int(progress[1]) <= 95

    # The worker writes it; the next poll shows the new version on top, with its diff.
    assert tasks.render_report_version(str(finished.pk), row.pk)
    row.refresh_from_db()
    newest = ReportVersion.objects.filter(job=finished).exclude(pk=first.pk).get()
    assert row.state == ReportRender.State.DONE and row.digest == newest.digest and row.new_version
    fragment = approver_client.get(f"/staff/reports/{finished.pk}/render/status/").content.decode()
    assert 'data-terminal="1"' in fragment and 'id="render-progress"' not in fragment
    assert re.search(rf'<tr data-version="{newest.version}" class="latest">', fragment)
    assert f"Last render: version {newest.version}" in fragment
    assert NARRATIVE in fragment.split('id="version-diff"', 1)[1]
    assert 'id="render-version"' in fragment


def test_in_eager_mode_the_render_is_written_before_the_page_answers(
        finished: DiagnosticJob, approver_client: Client, eager: None) -> None:
    page = approver_client.post(f"/staff/reports/{finished.pk}/render/", follow=True).content.decode()
    made = ReportVersion.objects.get(job=finished)
    assert f"Version {made.version} rendered ({made.pages} pages)." in page
    assert 'data-poll-ms="0"' in page and 'id="render-progress"' not in page


def test_a_failing_render_shows_its_error_where_the_button_was(
        finished: DiagnosticJob, approver_client: Client, eager: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(job: DiagnosticJob, **_: Any) -> Any:
        raise RuntimeError("WeasyPrint failed\n"
                           "the renderer's child was stopped at its memory limit (3072 MB)")

    with monkeypatch.context() as patched:
        patched.setattr("diagnostic.jobs.report_versions.render_version", broken)
        page = approver_client.post(f"/staff/reports/{finished.pk}/render/", follow=True).content.decode()
    assert not ReportVersion.objects.filter(job=finished).exists()
    row = ReportRender.objects.get(job=finished)
    assert row.state == ReportRender.State.FAILED
    assert row.error == "RuntimeError: the renderer's child was stopped at its memory limit (3072 MB)"
    error = re.search(r'<p class="field-error error-text" id="render-error" role="alert">([^<]*)</p>', page)
    assert error is not None
    assert "failed: RuntimeError: the renderer&#x27;s child was stopped at its memory limit" in error[1]
    assert "No version was kept" in error[1]
    # In place: in the Versions section, right before the button that tries again.
    assert page.index('id="versions-live"') < error.start() < page.index('id="render-version"') \
        < page.index('<section id="findings">')
    assert ">Render again</button>" in page
    # The next render that works replaces the error with its version.
    page = approver_client.post(f"/staff/reports/{finished.pk}/render/", follow=True).content.decode()
    assert 'id="render-error"' not in page and "Last render: version" in page


def test_a_render_whose_worker_stopped_is_not_waited_for(
        finished: DiagnosticJob, approver: User, approver_client: Client, handed: list[tuple[Any, ...]],
        settings: Any) -> None:
    long_ago = timezone.now() - dt.timedelta(seconds=2 * settings.REPORT_RENDER_TIMEOUT_S + 3600)
    ReportRender.objects.create(job=finished, requested_by=approver, requested_at=long_ago,
                                started_at=long_ago, state=ReportRender.State.RUNNING)
    page = approver_client.get(f"/staff/reports/{finished.pk}/").content.decode()
    live = live_part(page)
    assert "its worker stopped" in live and 'id="render-error"' in live and 'data-terminal="1"' in live
    assert ">Render again</button>" in live
    fresh = request_render(finished, by=approver)
    assert fresh.state == ReportRender.State.QUEUED and len(handed) == 1
    # One that waited ten minutes for a worker (its message lost) does not block another either.
    ReportRender.objects.filter(pk=fresh.pk).update(requested_at=timezone.now() - dt.timedelta(minutes=11))
    live = live_part(approver_client.get(f"/staff/reports/{finished.pk}/").content.decode())
    assert "has waited 11 min" in live and "for a worker" in live and 'id="render-error"' in live
    assert request_render(finished, by=approver).state == ReportRender.State.QUEUED and len(handed) == 2


def test_no_render_while_the_job_runs(finished: DiagnosticJob, approver_client: Client,
                                      handed: list[tuple[Any, ...]]) -> None:
    DiagnosticJob.objects.filter(pk=finished.pk).update(status=DiagnosticJob.Status.RUNNING, finished_at=None)
    page = approver_client.post(f"/staff/reports/{finished.pk}/render/", follow=True).content.decode()
    assert "written when the job ends; it is still running" in page
    assert handed == [] and not ReportRender.objects.exists()


def test_the_measured_part_is_in_words_and_units_with_the_engines_names(
        finished: DiagnosticJob, approver_client: Client, out_dir: Path) -> None:
    reproduce = finished.stage_runs.get(name="reproduce")
    Finding.objects.create(
        job=finished, stage=reproduce, code="load.rendezvous", title="NCCL waits at the rendezvous",
        evidence={"summary": "Every node waited for spark-05.", "stall_s": 90.0, "cold_start_s": 148.0,
                  "nccl_socket_ifname": None, "gloo_socket_ifname": None, "late_node": "spark-05",
                  "late_node_mgmt_nic_mbps_p90": 1.1, "nodes": ["spark-01", "spark-02", "spark-03"],
                  "delivered": {"code": {"mean_tps": 27.6, "ci95": [27.1, 28.1]}},
                  "claims": {"code": {"log": {"claimed_tps": 40.0}}}},
        change={"config": {"serving.moe_backend": {"from": "auto", "to": "cutlass"}},
                "env": {"NCCL_SOCKET_IFNAME": {"from": None, "to": "enP7s7"}},
                "flags": {"add": ["--moe-backend", "cutlass"]}},
        impact={"metric": "decode_tps_code", "before": 26.0, "after": 27.6, "ci95": [1.1, 2.1], "n": 15,
                "better": "higher"},
    )
    page = approver_client.get(f"/staff/reports/{finished.pk}/").content.decode()
    finding = finished.finding_set.get(code="load.rendezvous")
    box = page.split(f'id="measured-{finding.pk}"', 1)[1].split("</article>", 1)[0]
    # Values in words and units, rounded as the report rounds them.
    assert "<th>Stall</th><td>90 s</td>" in box and "<th>Cold start</th><td>148 s</td>" in box
    assert "Late node&#x27;s management NIC, 90th percentile</th><td>1.1 Mbit/s" in box
    assert "spark-01 to spark-03 (3 nodes)" in box
    assert '<td class="r">27.6</td><td class="r">27.1–28.1</td>' in box and "(tok/s;" in box
    assert "<th>Decode rate, code</th><td>26.0 tok/s → 27.6 tok/s (+1.6 tok/s)</td>" in box
    assert "<td>[+1.1,\u00a0+2.1] tok/s, n = 15</td>" in box
    # Names as the engine writes them: settings, environment variables, launch flags.
    assert "<th>NCCL_SOCKET_IFNAME</th><td>not set</td>" in box
    assert "<th>GLOO_SOCKET_IFNAME</th><td>not set</td>" in box
    assert "<code>serving.moe_backend: auto</code>" in box
    assert "<code>serving.moe_backend: cutlass</code>" in box
    assert "<code>NCCL_SOCKET_IFNAME=enP7s7</code>" in box
    assert '<code class="flags-add">--moe-backend cutlass</code>' in box
    for raw in ("cold_start_s", "mean_tps", "ci95", "stall_s", "Nccl", "NCCL socket", "Gloo socket",
                "CI95", "Ci95", "moe backend"):
        assert raw not in box, raw


def test_the_diff_between_versions_says_values_in_units_and_names_as_written(
        finished: DiagnosticJob, out_dir: Path) -> None:
    first = render_version(finished).row
    finding = finished.finding_set.get(code="load.weights_io")
    Finding.objects.filter(pk=finding.pk).update(
        evidence={**finding.evidence, "disk_read_mbps": 240.0, "NCCL_SOCKET_IFNAME": "enP7s7"})
    second = render_version(finished).row
    lines = [(d.kind, d.text) for d in review.version_diff(first, second)]
    assert ("hunk", "finding load.weights_io › evidence › Disk read") in lines
    assert ("del", "180.0 MB/s") in lines and ("add", "240.0 MB/s") in lines
    assert ("hunk", "finding load.weights_io › evidence › NCCL_SOCKET_IFNAME") in lines
    assert not any("disk_read_mbps" in text or "NCCL SOCKET" in text for _, text in lines)
