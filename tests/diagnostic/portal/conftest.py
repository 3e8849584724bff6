"""Portal fixtures on top of the shared cast: lab days ahead of today, a booking of
Alice's organisation with its confirmed configuration and a finished job whose report
staff approved, and the URLs of each."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from diagnostic.bookings.configs import submit_configuration
from diagnostic.bookings.models import Booking, Lab, LabDay, book_lab_day
from diagnostic.jobs.models import DiagnosticJob, ReportVersion, StageRun
from diagnostic.jobs.orchestration import create_job
from tests.diagnostic.conftest import REFERENCE_CONFIG, Cast


@pytest.fixture
def out_dir(tmp_path: Path, settings: Any) -> Path:
    settings.OUT_DIR = tmp_path / "out"
    settings.OUT_DIR.mkdir()
    return Path(settings.OUT_DIR)


@pytest.fixture
def days_ahead(lab: Lab) -> list[LabDay]:
    """Lab days from 5 to 20 days ahead (all outside the 48 h cutoff)."""
    today = timezone.localdate()
    return [LabDay.objects.create(lab=lab, date=today + dt.timedelta(days=n)) for n in range(5, 21)]


@dataclass
class Owned:
    booking: Booking
    job: DiagnosticJob
    version: ReportVersion


def finished_job(booking: Booking, out_dir: Path, *, approved: bool = True) -> Owned:
    config = submit_configuration(
        raw_text=REFERENCE_CONFIG.read_text(), source="yaml", booking=booking, submitted_by=booking.customer
    )
    job = create_job(config=config, lab=booking.lab_day.lab, booking=booking, stages=None)
    job.stage_runs.update(status=StageRun.Status.SUCCEEDED, lab_seconds=12.0, status_message="done")
    job.stage_runs.filter(name="reproduce").update(
        result={
            "config_changes": [
                {
                    "path": "serving.load_format",
                    "from": "auto",
                    "to": "fastsafetensors",
                    "finding": "load.weights_io",
                },
            ]
        }
    )
    DiagnosticJob.objects.filter(pk=job.pk).update(status=DiagnosticJob.Status.SUCCEEDED)
    job.refresh_from_db()
    pdf = out_dir / "jobs" / str(job.pk) / "report.pdf"
    pdf.parent.mkdir(parents=True)
    pdf.write_bytes(b"%PDF-1.4\n% a report\n")
    version = ReportVersion.objects.create(job=job, digest="ab" * 32, pdf_path=str(pdf), pages=1)
    if approved:
        version.approve()
    return Owned(booking, job, version)


@pytest.fixture
def alices(cast: Cast, days_ahead: list[LabDay], out_dir: Path) -> Owned:
    booking = book_lab_day(lab_day=days_ahead[3], customer=cast.alice)
    return finished_job(booking, out_dir)


@pytest.fixture
def booking(cast: Cast, days_ahead: list[LabDay]) -> Booking:
    """Alice's booking of the first bookable day ahead."""
    return book_lab_day(lab_day=days_ahead[0], customer=cast.alice)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[DiagnosticJob]:
    """Jobs handed on for running (not run here: the job page tests cover running)."""
    jobs: list[DiagnosticJob] = []
    monkeypatch.setattr("diagnostic.portal.config_views.start_job", jobs.append)
    return jobs

