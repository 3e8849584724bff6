"""The job page and its downloads: stages listed in their order with state, lab time
and summary; the stage that stopped a job with its reason; the polled fragment; the PDF
and tuned configuration only once a report version is approved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from diagnostic.bookings.models import LabDay, book_lab_day
from diagnostic.jobs.models import DiagnosticJob, Finding, ReportVersion, StageRun, record_report_version
from diagnostic.portal.job_views import lab_duration
from tests.diagnostic.conftest import Cast
from tests.diagnostic.portal.conftest import Owned, finished_job

pytestmark = pytest.mark.django_db


def test_the_page_lists_every_stage_run_in_its_order(cast: Cast, alices: Owned) -> None:
    StageRun.objects.create(job=alices.job, name="zz-extra", order=99, status_message="an added stage")
    page = cast.client("alice").get(f"/portal/jobs/{alices.job.pk}/").content.decode()
    names = [s.name for s in alices.job.stage_runs.order_by("order")]
    positions = [page.index(f'data-stage="{name}"') for name in names]
    assert positions == sorted(positions) and names[-1] == "zz-extra"
    timed = alices.job.stage_runs.exclude(lab_seconds=None).count()
    assert "12 s" in page and "an added stage" in page and f"lab time {lab_duration(12.0 * timed)}" in page


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (None, "—"),
        (14.4, "14 s"),
        (600, "10 min"),
        (691, "11 min 31 s"),
        (4843.8, "1 h 20 min"),
        (7200, "2 h"),
    ],
)
def test_lab_time_reads_as_people_say_it(seconds: float | None, said: str) -> None:
    assert lab_duration(seconds) == said


def test_a_running_job_page_polls_and_a_finished_one_does_not(cast: Cast, alices: Owned) -> None:
    page = cast.client("alice").get(f"/portal/jobs/{alices.job.pk}/").content.decode()
    assert 'data-poll-ms="0"' in page and 'data-terminal="1"' in page
    DiagnosticJob.objects.filter(pk=alices.job.pk).update(status="running")
    alices.job.stage_runs.filter(name="report").update(
        status="running", progress_percent=40, progress_message="rendering the PDF report"
    )
    page = cast.client("alice").get(f"/portal/jobs/{alices.job.pk}/").content.decode()
    assert 'data-poll-ms="3000"' in page and "job.js" in page
    fragment = cast.client("alice").get(f"/portal/jobs/{alices.job.pk}/stages/")
    assert fragment["Cache-Control"] == "no-store"
    assert (
        "rendering the PDF report" in fragment.content.decode() and "<html" not in fragment.content.decode()
    )


def test_the_stage_that_stopped_the_job_is_named_with_its_reason(cast: Cast, alices: Owned) -> None:
    DiagnosticJob.objects.filter(pk=alices.job.pk).update(status="partial")
    stage = alices.job.stage_runs.get(name="reproduce")
    stage.status, stage.status_message = "failed", "the engine crashed while loading weights"
    stage.save()
    page = cast.client("alice").get(f"/portal/jobs/{alices.job.pk}/").content.decode()
    stopped = ("Stopped at <strong>Reproducing your configuration</strong>: "
               "the engine crashed while loading weights")
    assert stopped in page
    Finding.objects.create(
        job=alices.job,
        stage=stage,
        code="lab.node_unreachable",
        blocking=True,
        title="Node spark-03 stopped answering during the cold start",
    )
    page = cast.client("alice").get(f"/portal/jobs/{alices.job.pk}/").content.decode()
    assert "Node spark-03 stopped answering during the cold start" in page


def test_the_report_downloads_for_its_owner(cast: Cast, alices: Owned) -> None:
    response = cast.client("alice").get(f"/portal/jobs/{alices.job.pk}/report.pdf")
    assert response.status_code == 200 and response["Content-Type"] == "application/pdf"
    assert b"".join(response.streaming_content).startswith(b"%PDF")  # type: ignore[attr-defined]
    assert "attachment" in response["Content-Disposition"]


def test_no_download_before_approval(cast: Cast, days_ahead: list[LabDay], out_dir: Path) -> None:
    owned = finished_job(book_lab_day(lab_day=days_ahead[0], customer=cast.alice), out_dir, approved=False)
    client = cast.client("alice")
    assert client.get(f"/portal/jobs/{owned.job.pk}/report.pdf").status_code == 404
    assert client.get(f"/portal/jobs/{owned.job.pk}/tuned-config.yaml").status_code == 404
    assert "being reviewed" in client.get(f"/portal/jobs/{owned.job.pk}/").content.decode()
    owned.version.approve(by=cast.staff)
    assert client.get(f"/portal/jobs/{owned.job.pk}/report.pdf").status_code == 200


def test_each_approved_version_is_listed_and_downloadable(cast: Cast, alices: Owned, out_dir: Path) -> None:
    pdf = out_dir / "jobs" / str(alices.job.pk) / "report-v2.pdf"
    pdf.write_bytes(b"%PDF-1.4\n% second version\n")
    second = ReportVersion.objects.create(job=alices.job, digest="cd" * 32, pdf_path=str(pdf), pages=2)
    second.approve(by=cast.staff)
    client = cast.client("alice")
    page = client.get(f"/portal/jobs/{alices.job.pk}/").content.decode()
    assert alices.version.version in page and second.version in page
    latest = client.get(f"/portal/jobs/{alices.job.pk}/report.pdf")
    assert b"second version" in b"".join(latest.streaming_content)  # type: ignore[attr-defined]
    first = client.get(f"/portal/jobs/{alices.job.pk}/report.pdf?version={alices.version.version}")
    assert b"a report" in b"".join(first.streaming_content)  # type: ignore[attr-defined]


def test_a_report_path_outside_the_output_folder_is_never_served(cast: Cast, alices: Owned) -> None:
    ReportVersion.objects.filter(pk=alices.version.pk).update(pdf_path="/etc/passwd")
    assert cast.client("alice").get(f"/portal/jobs/{alices.job.pk}/report.pdf").status_code == 404


def test_the_tuned_configuration_applies_the_proved_changes(cast: Cast, alices: Owned) -> None:
    response = cast.client("alice").get(f"/portal/jobs/{alices.job.pk}/tuned-config.yaml")
    text = response.content.decode()
    tuned = yaml.safe_load(text)
    assert tuned["serving"]["load_format"] == "fastsafetensors"
    assert tuned["schema"] == "diagnostic.config/1"
    assert "serving.load_format: 'auto' -> 'fastsafetensors'" in text


def test_report_versions_are_recorded_once_and_auto_approved_only_when_set(
    alices: Owned, settings: Any
) -> None:
    settings.PORTAL_AUTO_APPROVE = False
    held = record_report_version(job=alices.job, digest="ef" * 32, pdf_path="x.pdf", pages=3)
    assert not held.is_approved
    assert record_report_version(job=alices.job, digest="ef" * 32, pdf_path="x.pdf", pages=3).pk == held.pk
    settings.PORTAL_AUTO_APPROVE = True
    assert record_report_version(job=alices.job, digest="12" * 32, pdf_path="y.pdf", pages=3).is_approved
