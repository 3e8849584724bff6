"""Lab health against the simulated lab over real SSH: every node answers with its facts,
engine status and disk; a node powered off shows as unreachable, with the error, at the
next poll (the beat task's), well inside the minute; a lab that is not serving at all marks
every known node unreachable; the lab page shows colour and words, no raw JSON."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.utils import timezone

from diagnostic.bookings.models import Lab
from diagnostic.jobs.models import LabHealth, NodeHealth, StageRun
from diagnostic.pipelines.changes import apply_changes, change
from diagnostic.staff.labhealth import poll_lab
from diagnostic.staff.tasks import poll_lab_health
from lab.session import LabSession
from lab.sim.lab import SimLab
from tests.diagnostic.conftest import REFERENCE_SCENARIO, Cast
from tests.diagnostic.doubles import fast_scenario
from tests.diagnostic.staff.conftest import make_finished_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimLab]:
    with SimLab(fast_scenario(tmp_path, REFERENCE_SCENARIO), tmp_path / "labsim") as lab:
        yield lab


def test_a_node_taken_down_shows_unreachable_at_the_next_poll(sim: SimLab, cast: Cast,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    lab = Lab.objects.create(name="health-lab", inventory=str(sim.inventory_path))

    @contextmanager
    def factory(_: Lab) -> Iterator[LabSession]:
        with LabSession.open(sim.inventory_path) as session:
            yield session

    health = poll_lab(lab, factory)
    assert health.error == ""
    rows = {h.node: h for h in NodeHealth.objects.filter(lab=lab)}
    assert set(rows) == set(sim.scenario.node_names)
    head = rows[sim.scenario.node_names[0]]
    assert all(h.reachable for h in rows.values())
    assert head.engine_running is False and head.spec_sha256 == ""
    assert head.disk_free_bytes and head.disk_free_bytes > 0
    assert head.mem_total_kib and head.gpu_name
    assert head.gpu_temperature_c is None  # the agent's facts carry no temperature

    victim = sim.scenario.node_names[2]
    sim.set_node_down(victim)
    # The beat task polls every lab through the default factory; point it at this one.
    monkeypatch.setattr("diagnostic.staff.labhealth.open_lab_session", factory)
    monkeypatch.setattr("diagnostic.staff.labhealth.poll_all_labs.__defaults__", (factory,))
    assert poll_lab_health() == []
    down = NodeHealth.objects.get(lab=lab, node=victim)
    assert not down.reachable and down.error
    assert down.last_seen_at is not None
    assert LabHealth.objects.get(lab=lab).poll_seconds < 60
    assert all(h.reachable for h in NodeHealth.objects.filter(lab=lab).exclude(node=victim))

    page = cast.client("staff").get("/staff/lab/").content.decode()
    assert f'data-node="{victim}"' in page
    row = page.split(f'data-node="{victim}"', 1)[1].split("</tr>", 1)[0]
    assert 'class="badge unreachable">unreachable' in row
    assert "not reported" in page  # GPU temperature
    assert "{&quot;" not in page and '{"' not in page
    # The fragment the open page re-reads says the same.
    fragment = cast.client("staff").get("/staff/lab/sections/").content.decode()
    assert 'class="badge unreachable">unreachable' in fragment.split(f'data-node="{victim}"', 1)[1]

    sim.set_node_down(victim, down=False)
    poll_lab(lab, factory)
    assert NodeHealth.objects.get(lab=lab, node=victim).reachable


def test_a_lab_that_is_not_serving_marks_its_nodes(cast: Cast, lab: Lab, sim_state_dir: Path) -> None:
    NodeHealth.objects.create(lab=lab, node="spark-01", reachable=True)
    health = poll_lab(lab)
    assert "not serving" in health.error
    node = NodeHealth.objects.get(lab=lab, node="spark-01")
    assert not node.reachable and "not serving" in node.error
    page = cast.client("staff").get("/staff/lab/").content.decode()
    assert "not serving" in page and 'class="badge failed">unreachable' in page


def test_the_lab_page_names_the_job_whose_configuration_a_node_runs(
        sim: SimLab, cast: Cast, out_dir: Path) -> None:
    lab = Lab.objects.create(name="serving-lab", inventory=str(sim.inventory_path))
    job = make_finished_job(cast, lab, lab_day=timezone.localdate())
    # The reproduce stage proved a change; the measure stage would run the changed configuration.
    proved = change("serving.load_format", "auto", "fastsafetensors", finding="load.weights_io")
    StageRun.objects.filter(job=job, name="reproduce").update(result={"config_changes": [proved]})
    StageRun.objects.filter(job=job, name="report").update(status=StageRun.Status.RUNNING)

    @contextmanager
    def factory(_: Lab) -> Iterator[LabSession]:
        with LabSession.open(sim.inventory_path) as session:
            yield session

    with LabSession.open(sim.inventory_path) as session:
        session.launch(job.config.normalized, cold=False, timeout_s=3600)
    poll_lab(lab, factory)
    page = cast.client("staff").get("/staff/lab/").content.decode()
    head = page.split('data-node="spark-01"', 1)[1].split("</tr>", 1)[0]
    assert f'href="/staff/jobs/{job.pk}/"' in head
    assert "the customer&#x27;s configuration</span>" in head and "Acme" in head

    # The proved change running: the same job, the configuration with reproduce's change.
    with LabSession.open(sim.inventory_path) as session:
        session.launch(apply_changes(job.config.normalized, [proved]), cold=False, timeout_s=3600)
    poll_lab(lab, factory)
    page = cast.client("staff").get("/staff/lab/").content.decode()
    head = page.split('data-node="spark-01"', 1)[1].split("</tr>", 1)[0]
    assert f'href="/staff/jobs/{job.pk}/"' in head and "with the changes reproduce proved" in head

    # An engine no recent job started (another configuration, by hand): said so, no link.
    by_hand = change("speculative.num_speculative_tokens", 4, 3, finding="x")
    other = apply_changes(job.config.normalized, [by_hand])
    with LabSession.open(sim.inventory_path) as session:
        session.launch(other, cold=False, timeout_s=3600)
    poll_lab(lab, factory)
    page = cast.client("staff").get("/staff/lab/").content.decode()
    head = page.split('data-node="spark-01"', 1)[1].split("</tr>", 1)[0]
    assert "/staff/jobs/" not in head and "no recent job launched it" in head
