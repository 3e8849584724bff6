"""A lab day a node's power cut stopped, on the simulated lab over real SSH: the day is held
for a lab fault (the firm's, never the customer's), the customer is told so in plain words
with nothing internal, the lab contact gets an email, and staff re-run it (from the stage
that stopped, on the same day, or moved to another free day) once the node is back: the
day completes with one customer report that tells its story once, the fault in its
audit trail. `diagnose` on a lab with a node down exits 0 with an incident note."""

from __future__ import annotations

import datetime as dt
import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core import mail
from django.core.management import call_command
from django.utils import timezone
from pypdf import PdfReader

from diagnostic.bookings.configs import submit_configuration
from diagnostic.bookings.models import Booking, Lab, LabDay
from diagnostic.jobs.labaccess import open_lab_session
from diagnostic.jobs.models import DiagnosticJob, JobEvent, ReportVersion, StageRun
from diagnostic.jobs.orchestration import create_job, run_until_done
from diagnostic.staff import actions
from lab.inventory import load_inventory
from lab.session import LabSession
from lab.sim.lab import SimLab
from lab.sim.scenario import load_scenario
from tests.diagnostic.conftest import REFERENCE_CONFIG, REFERENCE_SCENARIO, REPO, Cast, logged_in
from tests.diagnostic.doubles import fast_scenario

pytestmark = pytest.mark.django_db
NODE = "spark-05"
STAGES = ["preflight", "reproduce", "report"]
INTERNAL = ("spark-", "127.0.0.1", "/var/lib/diag", "NodeUnreachable", "preflight", "reproduce")


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimLab]:
    with SimLab(load_scenario(fast_scenario(tmp_path, REFERENCE_SCENARIO)), tmp_path / "labsim") as lab:
        yield lab


@pytest.fixture
def booked(sim: SimLab, cast: Cast, settings: Any, out_dir: Path) -> DiagnosticJob:
    """Alice's diagnostic on today's lab day of the simulated lab, not yet started."""
    settings.DIAG_MAX_STAGE_ATTEMPTS = 2
    settings.DIAG_RETRY_BASE_S = 0
    settings.DIAG_RETRY_MAX_S = 0
    lab = Lab.objects.create(name="fault-lab", inventory=str(sim.inventory_path),
                             contact_email="lab@firm.example")
    lab.sync_nodes(load_inventory(sim.inventory_path))
    day = LabDay.objects.create(lab=lab, date=timezone.localdate())
    booking = Booking.objects.create(lab_day=day, customer=cast.alice, organisation=cast.organisation_a,
                                     status=Booking.Status.CONFIRMED)
    config = submit_configuration(raw_text=REFERENCE_CONFIG.read_text(), source="yaml", booking=booking)
    return create_job(config=config, lab=lab, stages=STAGES)


@pytest.fixture
def out_dir(tmp_path: Path, settings: Any) -> Path:
    settings.DIAG_OUT_DIR = tmp_path / "out"
    return tmp_path / "out"


def power_off_at_launch(sim: SimLab) -> threading.Thread:
    """Cut a node's power once an engine starts on it (the reproduce stage's cold start),
    watching the node itself, as the power strip would."""
    node = sim.node(NODE)
    launched = node.launch_count

    def cut() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if node.launch_count > launched:
                time.sleep(0.2)
                sim.set_node_down(NODE)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=cut, daemon=True)
    thread.start()
    return thread


def run(job: DiagnosticJob) -> DiagnosticJob:
    run_until_done(str(job.pk), open_lab_session, sleep=lambda s: None)
    job.refresh_from_db()
    return job


def held_day(sim: SimLab, job: DiagnosticJob, on_commit: Any) -> DiagnosticJob:
    cutter = power_off_at_launch(sim)
    with on_commit(execute=True):  # the lab contact's email goes out once the hold commits
        job = run(job)
    cutter.join(timeout=5)
    return job


def assert_held_for_the_node(job: DiagnosticJob, cast: Cast) -> None:
    assert job.status == "held", job.status_message
    assert job.stop_side == "lab"
    assert job.fault["what"] == "node_unreachable" and job.fault["nodes"] == [NODE]
    assert job.fault["stage"] == "reproduce"
    assert not ReportVersion.objects.filter(job=job).exists(), "no customer report for a held day"
    assert StageRun.objects.get(job=job, name="preflight").status == "succeeded"
    assert StageRun.objects.get(job=job, name="reproduce").status == "pending"
    assert job.findings["money_back"]["rerun_due"] is True and job.findings["money_back"]["eligible"] is False
    # The customer: a plain message, no report, nothing internal.
    page = logged_in(cast.alice).get(f"/portal/jobs/{job.pk}/").content.decode()
    assert "One of our eight nodes stopped answering during your diagnostic." in page
    assert "re-run it at no cost" in page and "Download the report" not in page
    shown = page.split('<div id="job-stages"', 1)[1]
    for word in INTERNAL[:4]:
        assert word not in shown, word
    # Staff: at once, by email to the lab's contact, and on the job's page.
    [message] = [m for m in mail.outbox if "lab fault" in m.subject]
    assert message.to == ["lab@firm.example"] and NODE in message.body
    staff = logged_in(cast.staff).get(f"/staff/jobs/{job.pk}/").content.decode()
    assert 'id="held-for-lab-fault"' in staff and NODE in staff


def test_a_node_powered_off_mid_stage_holds_the_day_and_a_rerun_the_same_day_completes_it(
    sim: SimLab, booked: DiagnosticJob, cast: Cast, django_capture_on_commit_callbacks: Any,
) -> None:
    job = held_day(sim, booked, django_capture_on_commit_callbacks)
    assert_held_for_the_node(job, cast)
    with LabSession.open(sim.inventory_path) as session:
        up = {n: st for n, st in session.status().items() if isinstance(st, dict)}
    assert not any(st["running"] for st in up.values()), "the held job's engines were stopped"

    sim.set_node_down(NODE, down=False)
    with django_capture_on_commit_callbacks(execute=False):
        said = actions.resume_held(job, actor=cast.staff)
    assert said.startswith("Re-running reproduce, report")
    job.refresh_from_db()
    assert job.status == "queued"
    job = run(job)
    assert job.status == "succeeded", job.status_message
    # Preflight ran once; reproduce's log keeps both tries and the re-run.
    preflight = StageRun.objects.get(job=job, name="preflight")
    assert preflight.attempts == 1
    reproduce = StageRun.objects.get(job=job, name="reproduce")
    assert reproduce.attempts == 1 and reproduce.log.count("attempt ") == 3
    assert ReportVersion.objects.filter(job=job).count() == 1
    # The story once, the fault in the audit trail: re-run the same day, at no cost.
    [fault] = job.findings["lab_faults"]
    assert fault["nodes"] == [NODE] and fault["rerun_on"] == timezone.localdate().isoformat()
    assert job.findings["lab_fault"] is None
    conditions = job.findings["money_back"]["conditions"]
    assert conditions["lab_fault_not_rerun"] is False
    report = PdfReader(ReportVersion.objects.get(job=job).pdf_path)
    pdf = "".join(page.extract_text() for page in report.pages)
    flat = " ".join(pdf.split())
    assert f"re-run on {timezone.localdate():%Y-%m-%d}" in flat, "the fault is in the money-back audit trail"
    assert NODE not in flat, "the customer's report names none of our nodes"
    kinds = list(JobEvent.objects.filter(job=job).order_by("at", "id").values_list("kind", flat=True))
    assert kinds.count("lab_fault") == 1 and "retried" in kinds and kinds[-1] == "engines_stopped"


def test_a_held_day_moved_to_another_free_day_runs_there(
    sim: SimLab, booked: DiagnosticJob, cast: Cast, django_capture_on_commit_callbacks: Any,
) -> None:
    job = held_day(sim, booked, django_capture_on_commit_callbacks)
    assert_held_for_the_node(job, cast)
    tomorrow = LabDay.objects.create(lab=job.lab, date=timezone.localdate() + dt.timedelta(days=1))
    taken = LabDay.objects.create(lab=job.lab, date=timezone.localdate() + dt.timedelta(days=2))
    Booking.objects.create(lab_day=taken, customer=cast.bob, organisation=cast.organisation_b)
    assert actions.free_days(job) == [tomorrow]
    with pytest.raises(actions.ActionRefused, match="is not free"):
        actions.move_held(job, taken.pk, actor=cast.staff)

    with django_capture_on_commit_callbacks(execute=False):
        said = actions.move_held(job, tomorrow.pk, actor=cast.staff)
    assert "reproduce, report run that day" in said
    job.refresh_from_db()
    assert job.status == "queued" and job.booking.lab_day == tomorrow
    assert job.waits_for_lab_day(), "it waits for the new day"
    page = logged_in(cast.alice).get(f"/portal/jobs/{job.pk}/").content.decode()
    assert "Waiting for your lab day" in page

    # The new day comes; the lab is back.
    sim.set_node_down(NODE, down=False)
    later = timezone.now() + dt.timedelta(days=1)
    assert job.is_due(later)
    job = run(job)
    assert job.status == "succeeded", job.status_message
    [fault] = job.findings["lab_faults"]
    assert fault["rerun_on"] == tomorrow.date.isoformat()
    assert ReportVersion.objects.filter(job=job).count() == 1


def test_diagnose_on_a_lab_with_a_node_down_exits_0_with_an_incident_note(
    tmp_path: Path, settings: Any
) -> None:
    settings.DIAG_RETRY_BASE_S = 0
    settings.DIAG_RETRY_MAX_S = 0
    scenario = fast_scenario(tmp_path, REPO / "lab" / "scenarios" / "fault-node-down.yaml")
    out = tmp_path / "out"
    printed = io.StringIO()
    call_command("diagnose", "--config", str(REFERENCE_CONFIG), "--lab", f"sim:{scenario}",
                 "--out", str(out), stdout=printed)  # no CommandError: exit status 0
    document = json.loads((out / "findings.json").read_text())
    assert document["job"]["status"] == "held" and document["job"]["stop_side"] == "lab"
    assert document["lab_fault"]["nodes"] == ["spark-05"]
    assert document["lab_fault"]["what"] == "node_unreachable"
    assert "spark-05" in document["lab_fault"]["evidence"]["nodes"]
    assert document["money_back"]["rerun_due"] is True and document["money_back"]["eligible"] is False
    assert document["findings"] == [], "a lab fault is no finding of the customer's"
    assert not (out / "report.pdf").exists()
    note = (out / "incident.md").read_text()
    assert "spark-05" in note and "re-run" in note and "No customer report was written" in note
    assert "held for a lab fault" in printed.getvalue()
