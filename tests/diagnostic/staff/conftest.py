"""Staff fixtures on the shared cast: an approver (a staff member in the `staff` group),
a finished job of Alice's organisation with findings, its lab day yesterday, and a real
SMTP receiver (aiosmtpd on 127.0.0.1) for the email the approval sends."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from diagnostic.bookings.configs import submit_configuration
from diagnostic.bookings.models import Booking, Lab, LabDay
from diagnostic.jobs.models import DiagnosticJob, Finding, StageRun
from diagnostic.jobs.orchestration import create_job
from diagnostic.staff.apps import STAFF_GROUP
from tests.diagnostic.conftest import REFERENCE_CONFIG, Cast, logged_in

STAGES = ["preflight", "reproduce", "report"]


@pytest.fixture
def out_dir(tmp_path: Path, settings: Any) -> Path:
    settings.OUT_DIR = tmp_path / "out"
    settings.OUT_DIR.mkdir()
    settings.PORTAL_AUTO_APPROVE = False
    return Path(settings.OUT_DIR)


@pytest.fixture
def approver(db: None) -> User:
    user = User.objects.create_user(username="consultant", email="consultant@lab.example", is_staff=True)
    user.groups.add(Group.objects.get(name=STAFF_GROUP))
    return user


@pytest.fixture
def approver_client(approver: User) -> Client:
    return logged_in(approver)


def make_finished_job(cast: Cast, lab: Lab, *, lab_day: dt.date) -> DiagnosticJob:
    day = LabDay.objects.create(lab=lab, date=lab_day)
    cast.alice.email = "alice@acme.example"
    cast.alice.save(update_fields=["email"])
    booking = Booking.objects.create(lab_day=day, customer=cast.alice, organisation=cast.organisation_a,
                                     status=Booking.Status.CONFIRMED)
    config = submit_configuration(raw_text=REFERENCE_CONFIG.read_text(), source="yaml", booking=booking,
                                  submitted_by=cast.alice, label="acme out-of-box")
    job = create_job(config=config, lab=lab, booking=booking, stages=STAGES)
    now = timezone.now()
    job.stage_runs.update(status=StageRun.Status.SUCCEEDED, lab_seconds=30.0, attempts=1,
                          started_at=now, finished_at=now, log="12:00:00 started\n12:00:30 done\n")
    reproduce = job.stage_runs.get(name="reproduce")
    Finding.objects.create(
        job=job, stage=reproduce, code="load.weights_io", title="Weights load from a slow disk",
        evidence={"summary": "The weights were read at 180 MB/s.", "disk_read_mbps": 180.0},
        change={"config": {"serving.load_format": {"from": "auto", "to": "fastsafetensors"}}},
        impact={"metric": "cold_start_s", "before": 480.0, "after": 300.0, "ci95": [-200.0, -160.0],
                "better": "lower"},
    )
    Finding.objects.create(
        job=job, stage=reproduce, code="metrics.overclaim", title="The server counts drafted tokens",
        evidence={"summary": "Reported 40 tok/s, delivered 15.", "claimed_tps": 40.0, "delivered_tps": 15.0},
        change={}, impact=None,
    )
    DiagnosticJob.objects.filter(pk=job.pk).update(status=DiagnosticJob.Status.SUCCEEDED, started_at=now,
                                                   finished_at=now)
    job.refresh_from_db()
    return job


@pytest.fixture
def finished(cast: Cast, lab: Lab, out_dir: Path) -> DiagnosticJob:
    """A finished job whose lab day was today: its report is due by the end of the next
    business day, so it is on time."""
    return make_finished_job(cast, lab, lab_day=timezone.localdate())


@dataclass
class Mailbox:
    host: str
    port: int
    messages: list[email.message.Message] = field(default_factory=list)


@pytest.fixture
def smtp(settings: Any) -> Iterator[Mailbox]:
    """A real SMTP server in this process; Django's SMTP backend points at it."""
    from aiosmtpd.controller import Controller

    with socket.socket() as probe:  # the Controller checks its own port, so it needs a real one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    box = Mailbox("127.0.0.1", port)

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            box.messages.append(email.message_from_bytes(envelope.content, policy=email.policy.default))
            return "250 OK"

    controller = Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = box.host, box.port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    try:
        yield box
    finally:
        controller.stop()
