"""The job page's actions, each behind a confirmation page: cancel a running job, retry a
failed stage (with the stages after it that did not succeed, and the report), write the
report again, re-run or move a held day. Each changes what the customer receives, so each
is the `staff` group's (`acting`, a member, does them here): staff without the group look
only (no button, 403 and nothing changed when they try), customers get 404, anonymous
visitors the login page. Each action refuses, saying why, when it makes no sense, and the
job page shows what the job looks like afterwards."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from diagnostic.bookings.models import Lab, LabDay
from diagnostic.celery import app
from diagnostic.jobs.models import DiagnosticJob, ReportVersion, StageRun
from diagnostic.jobs.report_versions import render_version
from diagnostic.staff import review
from tests.diagnostic.conftest import Cast

pytestmark = pytest.mark.django_db


@pytest.fixture
def acting(approver_client: Client) -> Client:
    """A consultant in the `staff` group, who may run the day."""
    return approver_client


def follow_post(client: Client, url: str, data: dict[str, str] | None = None) -> str:
    response = client.post(url, data or {}, follow=True)
    assert response.status_code == 200
    job_page = url.rsplit("/", 2)[0] + "/"  # every action lands back on the job's page
    assert response.redirect_chain == [(job_page, 302)]
    return response.content.decode()


def test_cancel_asks_first_then_stops_the_running_job(
        cast: Cast, finished: DiagnosticJob, acting: Client) -> None:
    DiagnosticJob.objects.filter(pk=finished.pk).update(status=DiagnosticJob.Status.RUNNING, finished_at=None)
    StageRun.objects.filter(job=finished, name="reproduce").update(status=StageRun.Status.RUNNING,
                                                                  progress_percent=40)
    StageRun.objects.filter(job=finished, name="report").update(status=StageRun.Status.PENDING)
    job_page = acting.get(f"/staff/jobs/{finished.pk}/").content.decode()
    assert f'href="/staff/jobs/{finished.pk}/cancel/"' in job_page

    confirm = acting.get(f"/staff/jobs/{finished.pk}/cancel/")
    assert confirm.status_code == 200 and b"Cancel this job?" in confirm.content
    assert b'id="confirm-action"' in confirm.content
    finished.refresh_from_db()
    assert not finished.cancel_requested  # looking at the question changes nothing

    page = follow_post(acting, f"/staff/jobs/{finished.pk}/cancel/")
    finished.refresh_from_db()
    assert finished.cancel_requested
    assert "Cancel requested" in page and "cancel requested</strong>" in page

    # A job that ended has nothing to cancel: said so, nothing changes.
    DiagnosticJob.objects.filter(pk=finished.pk).update(status=DiagnosticJob.Status.SUCCEEDED,
                                                        cancel_requested=False)
    page = follow_post(acting, f"/staff/jobs/{finished.pk}/cancel/")
    assert "the job already ended (succeeded); nothing to cancel" in page
    finished.refresh_from_db()
    assert not finished.cancel_requested


def test_retry_a_failed_stage_requeues_it_and_the_stages_after(
        cast: Cast, finished: DiagnosticJob, acting: Client,
        django_capture_on_commit_callbacks: object) -> None:
    StageRun.objects.filter(job=finished, name="reproduce").update(
        status=StageRun.Status.FAILED, attempts=3, status_message="the engine did not start",
        last_error="Traceback ...\nLaunchFailed: spark-01: the engine did not start")
    StageRun.objects.filter(job=finished, name="report").update(status=StageRun.Status.SUCCEEDED)
    DiagnosticJob.objects.filter(pk=finished.pk).update(status=DiagnosticJob.Status.FAILED,
                                                        status_message="reproduce failed")
    job_page = acting.get(f"/staff/jobs/{finished.pk}/").content.decode()
    row = job_page.split('data-stage="reproduce"', 1)[1].split("</tr>", 1)[0]
    assert "LaunchFailed: spark-01: the engine did not start" in row
    assert f'href="/staff/jobs/{finished.pk}/retry/?stage=reproduce"' in row
    preflight_row = job_page.split('data-stage="preflight"', 1)[1].split("</tr>", 1)[0]
    assert "retry" not in preflight_row  # a stage that succeeded is not offered again

    confirm = acting.get(f"/staff/jobs/{finished.pk}/retry/?stage=reproduce")
    assert b"Retry the stage: reproduce?" in confirm.content
    assert b'name="stage" value="reproduce"' in confirm.content

    with django_capture_on_commit_callbacks(execute=False) as started:  # type: ignore[operator]
        page = follow_post(acting, f"/staff/jobs/{finished.pk}/retry/", {"stage": "reproduce"})
    assert "Retrying reproduce, then report." in page
    assert len(started) == 1  # the job is handed on to run (here: its thread, once committed)
    finished.refresh_from_db()
    assert finished.status == DiagnosticJob.Status.QUEUED and finished.released_at is not None
    stages = {s.name: s for s in finished.stage_runs.all()}
    assert stages["preflight"].status == StageRun.Status.SUCCEEDED  # kept
    assert stages["reproduce"].status == StageRun.Status.PENDING and stages["reproduce"].attempts == 0
    assert stages["report"].status == StageRun.Status.PENDING
    assert 'id="job-status">queued' in page

    # While it runs again, no second retry; a stage that did not fail is never retried.
    page = follow_post(acting, f"/staff/jobs/{finished.pk}/retry/", {"stage": "reproduce"})
    assert "the job is still running; cancel it or wait" in page
    DiagnosticJob.objects.filter(pk=finished.pk).update(status=DiagnosticJob.Status.SUCCEEDED)
    page = follow_post(acting, f"/staff/jobs/{finished.pk}/retry/", {"stage": "preflight"})
    assert ("preflight is succeeded; only a failed or stopped stage, or one that stopped the job, "
            "is retried") in page
    page = follow_post(acting, f"/staff/jobs/{finished.pk}/retry/", {"stage": "fp4"})
    assert "this job has no stage &#x27;fp4&#x27;" in page


def test_rerun_report_writes_a_new_version_awaiting_approval(
        cast: Cast, finished: DiagnosticJob, acting: Client, out_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The rendering task runs in this process, broker or not (a worker runs it in production).
    monkeypatch.setitem(app.conf, "task_always_eager", True)
    first = render_version(finished).row
    first.approve(by=cast.staff)
    confirm = acting.get(f"/staff/jobs/{finished.pk}/rerun-report/")
    assert b"Write the report again?" in confirm.content
    assert ReportVersion.objects.filter(job=finished).count() == 1

    # Written again from the same findings, the report is the same version, still approved.
    page = follow_post(acting, f"/staff/jobs/{finished.pk}/rerun-report/")
    assert "written again from the findings and the staff" in page and "already kept" in page
    assert list(ReportVersion.objects.filter(job=finished)) == [first] and "awaiting approval" not in page

    # After an edit it is a new version, which waits for approval.
    finding = finished.finding_set.get(code="load.weights_io")
    review.edit_finding(finding=finding, by=cast.staff, title="Weights stream from a network share",
                        narrative="The weights were read at 180 MB/s.", note="")
    page = follow_post(acting, f"/staff/jobs/{finished.pk}/rerun-report/")
    versions = list(ReportVersion.objects.filter(job=finished).order_by("created_at", "id"))
    assert len(versions) == 2
    newest = versions[-1]
    assert not newest.is_approved and Path(newest.pdf_path).stat().st_size > 0
    assert f"<code>{newest.version}</code>" in page and "awaiting approval" in page

    # Not while the job runs: its findings are not all in.
    DiagnosticJob.objects.filter(pk=finished.pk).update(status=DiagnosticJob.Status.RUNNING,
                                                        finished_at=None)
    page = follow_post(acting, f"/staff/jobs/{finished.pk}/rerun-report/")
    assert "the report is written when the job ends; it is still running" in page
    assert ReportVersion.objects.filter(job=finished).count() == 2


def test_actions_need_a_staff_login_and_a_known_action(
        cast: Cast, finished: DiagnosticJob, acting: Client) -> None:
    for action in ("cancel", "retry", "rerun-report"):
        url = f"/staff/jobs/{finished.pk}/{action}/"
        anonymous = cast.anonymous.post(url, {"stage": "reproduce"})
        assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")
        for customer in ("alice", "bob"):
            assert cast.client(customer).post(url, {"stage": "reproduce"}).status_code == 404
            assert cast.client(customer).get(url).status_code == 404
    finished.refresh_from_db()
    assert finished.status == DiagnosticJob.Status.SUCCEEDED and not finished.cancel_requested
    assert finished.stage_runs.filter(status=StageRun.Status.SUCCEEDED).count() == 3
    assert not ReportVersion.objects.filter(job=finished).exists()
    assert acting.get(f"/staff/jobs/{finished.pk}/delete/").status_code == 404
    assert acting.put(f"/staff/jobs/{finished.pk}/cancel/").status_code == 405
    assert finished.finished_at is not None and finished.finished_at <= timezone.now()


def job_state(job: DiagnosticJob) -> tuple[object, ...]:
    """Everything an action could change: the job, its stages, its booking's day, its
    report versions and its staff log."""
    job.refresh_from_db()
    day = job.booking.lab_day_id if job.booking else None
    return (job.status, job.cancel_requested, job.released_at, day,
            sorted(job.stage_runs.values_list("name", "status", "attempts")),
            ReportVersion.objects.filter(job=job).count(), job.events.count())


@pytest.mark.parametrize("status", ["running", "failed", "held"])
def test_look_only_staff_cannot_run_the_day(
        cast: Cast, finished: DiagnosticJob, lab: Lab, status: str) -> None:
    """The attack: a staff member without the group opens each action's page and posts
    it, as the form would, on a job where a member could do it. Refused with 403, saying
    why, nothing changed; the job page offers none of them."""
    StageRun.objects.filter(job=finished, name="reproduce").update(status=StageRun.Status.FAILED, attempts=3)
    DiagnosticJob.objects.filter(pk=finished.pk).update(status=status)
    free = LabDay.objects.create(lab=lab, date=timezone.localdate() + dt.timedelta(days=9))
    before = job_state(finished)
    look_only = cast.client("staff")
    for action, data in [("cancel", {}), ("retry", {"stage": "reproduce"}), ("resume", {}),
                         ("move", {"day": str(free.pk)}), ("rerun-report", {})]:
        url = f"/staff/jobs/{finished.pk}/{action}/"
        assert look_only.get(url, data).status_code == 403, (status, action)
        refused = look_only.post(url, data)
        assert refused.status_code == 403, (status, action)
        assert "Only the <code>staff</code> group may do this" in refused.content.decode()
        assert job_state(finished) == before, (status, action)
    page = look_only.get(f"/staff/jobs/{finished.pk}/").content.decode()
    for action in ("cancel", "retry", "resume", "move", "rerun-report"):
        assert f"/staff/jobs/{finished.pk}/{action}/" not in page, (status, action)
    assert 'id="look-only"' in page
    timeline = look_only.get(f"/staff/jobs/{finished.pk}/timeline/").content.decode()
    assert "/retry/" not in timeline


def test_the_group_is_offered_the_held_days_actions(
        cast: Cast, finished: DiagnosticJob, acting: Client) -> None:
    DiagnosticJob.objects.filter(pk=finished.pk).update(status=DiagnosticJob.Status.HELD)
    page = acting.get(f"/staff/jobs/{finished.pk}/").content.decode()
    assert f"/staff/jobs/{finished.pk}/resume/" in page and f"/staff/jobs/{finished.pk}/move/" in page
    assert 'id="look-only"' not in page
    assert acting.get(f"/staff/jobs/{finished.pk}/resume/").status_code == 200
    assert acting.get(f"/staff/jobs/{finished.pk}/move/").status_code == 200
