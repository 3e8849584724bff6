"""Lab health against the simulated lab over real SSH: every node answers with its facts,
engine status and disk; a node powered off shows as unreachable, with the error, at the
next poll (the beat task's), well inside the minute; a lab that is not serving at all marks
every known node unreachable; the lab page shows colour and words, no raw JSON.

Whose failure it was decides what is stored: a node that times out while a job holds the
lab, a database error during the poll, an inventory that cannot be read are the platform's
side, recorded as "poll did not complete" with the nodes' last known state kept; only a
node that itself refuses (or is unreachable) while the poll runs is marked down. Each
engine links to the job its launch spec names as owner, else to the job whose
configuration has its spec hash, else says it was not started by this platform."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError
from django.utils import timezone

from diagnostic.bookings.models import Lab
from diagnostic.jobs.models import DiagnosticJob, LabHealth, LabLease, NodeHealth, StageRun
from diagnostic.pipelines.changes import apply_changes, change
from diagnostic.staff.labhealth import poll_lab
from diagnostic.staff.tasks import poll_lab_health
from lab.session import LabSession
from lab.sim.lab import SimLab
from lab.ssh import CommandTimeout, NodeConnection
from tests.diagnostic.conftest import REFERENCE_SCENARIO, Cast
from tests.diagnostic.doubles import fast_scenario
from tests.diagnostic.staff.conftest import make_finished_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimLab]:
    with SimLab(fast_scenario(tmp_path, REFERENCE_SCENARIO), tmp_path / "labsim") as lab:
        yield lab


Factory = Callable[[Lab], AbstractContextManager[LabSession]]


def sessions(sim: SimLab, busy: Sequence[str] = ()) -> Factory:
    """Lab sessions on `sim`; on the `busy` nodes every agent command times out, as it does
    on a node too loaded to answer within the platform's timeout."""

    @contextmanager
    def factory(_: Lab) -> Iterator[LabSession]:
        with LabSession.open(sim.inventory_path) as session:
            real = session._agent_call

            def agent_call(conn: NodeConnection, args: Sequence[str], timeout: float, *,
                           idempotent: bool = True) -> dict[str, Any]:
                if conn.node.name in busy:
                    raise CommandTimeout(conn.node.name, f"{args[0]} did not finish within {timeout:g} s")
                return real(conn, args, timeout, idempotent=idempotent)

            session._agent_call = agent_call  # type: ignore[method-assign]
            yield session

    return factory


def section(page: str, lab: Lab) -> str:
    return page.split(f'data-lab="{lab.name}"', 1)[1].split("</section>", 1)[0]


def row(page: str, node: str) -> str:
    return page.split(f'data-node="{node}"', 1)[1].split("</tr>", 1)[0]


def hold_lab(job: DiagnosticJob, *, stage_done_at: dt.datetime) -> None:
    """`job` runs and holds the lab: reproduce succeeded at `stage_done_at`, report runs."""
    DiagnosticJob.objects.filter(pk=job.pk).update(status=DiagnosticJob.Status.RUNNING, finished_at=None)
    StageRun.objects.filter(job=job, name="reproduce").update(finished_at=stage_done_at)
    earlier = stage_done_at - dt.timedelta(minutes=1)
    StageRun.objects.filter(job=job, name="preflight").update(finished_at=earlier)
    StageRun.objects.filter(job=job, name="report").update(status=StageRun.Status.RUNNING, finished_at=None,
                                                          progress_message="writing")
    LabLease.objects.update_or_create(lab=job.lab, defaults={
        "job": job, "owner": "worker-1", "acquired_at": stage_done_at - dt.timedelta(minutes=5),
        "expires_at": timezone.now() + dt.timedelta(minutes=5)})


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
    assert "/staff/jobs/" not in head and "not started by this platform" in head
    assert "names no owner and no recent job" in head


def test_a_timeout_while_a_job_holds_the_lab_is_a_poll_that_did_not_complete(
        sim: SimLab, cast: Cast, out_dir: Path) -> None:
    lab = Lab.objects.create(name="busy-lab", inventory=str(sim.inventory_path))
    names = sim.scenario.node_names
    assert poll_lab(lab, sessions(sim)).error == ""
    first = {h.node: h.checked_at for h in NodeHealth.objects.filter(lab=lab)}
    job = make_finished_job(cast, lab, lab_day=timezone.localdate())
    hold_lab(job, stage_done_at=timezone.now())

    # Two nodes too busy with the job to answer in time, one powered off: only the one
    # that refused is down; the busy ones keep what the last complete poll saw.
    busy, victim = names[1:3], names[5]
    sim.set_node_down(victim)
    health = poll_lab(lab, sessions(sim, busy=busy))
    assert health.error.startswith("poll did not complete: ")
    assert f"{busy[0]}, {busy[1]} did not answer in time while job {job.pk} holds the lab" in health.error
    assert f"({busy[0]}: facts did not finish within 60 s)" in health.error
    rows = {h.node: h for h in NodeHealth.objects.filter(lab=lab)}
    for name in busy:
        assert rows[name].reachable and rows[name].error == ""
        assert rows[name].checked_at == first[name]  # the last known state, with its own time
    assert not rows[victim].reachable and "Unable to connect" in rows[victim].error
    assert rows[victim].checked_at == health.checked_at
    assert all(rows[n].reachable and rows[n].checked_at == health.checked_at
               for n in names if n not in (*busy, victim))

    page = cast.client("staff").get("/staff/lab/").content.decode()
    lab_part = section(page, lab)
    assert 'class="badge incomplete">poll did not complete' in lab_part
    assert "8 nodes down" not in lab_part and "all nodes answer" not in lab_part
    assert f'href="/staff/jobs/{job.pk}/"' in lab_part.split('class="holder"', 1)[1].split("</p>", 1)[0]
    for name in busy:
        busy_row = row(page, name)
        assert 'class="badge reachable">reachable' in busy_row
        assert "last known state: the latest poll did not reach it" in busy_row
    assert 'class="badge unreachable">unreachable' in row(page, victim)
    assert "last known state" not in row(page, victim)

    # The same timeouts with no job on the lab are the nodes' own: they are down.
    LabLease.objects.filter(lab=lab).update(job=None, expires_at=None)
    health = poll_lab(lab, sessions(sim, busy=busy))
    assert health.error == ""
    for name in busy:
        node = NodeHealth.objects.get(lab=lab, node=name)
        assert not node.reachable and "did not finish within" in node.error
    page = cast.client("staff").get("/staff/lab/").content.decode()
    assert 'class="badge failed">3 nodes down' in section(page, lab)


def test_a_poll_failing_on_the_platforms_side_keeps_the_nodes_last_known_state(
        sim: SimLab, cast: Cast, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    lab = Lab.objects.create(name="db-lab", inventory=str(sim.inventory_path))
    factory = sessions(sim)
    assert poll_lab(lab, factory).error == ""
    before = {h.node: (h.reachable, h.checked_at) for h in NodeHealth.objects.filter(lab=lab)}
    assert before and all(up for up, _ in before.values())

    # The database drops mid-poll, in the beat task's run: recorded, nothing marked down,
    # the task itself does not fail.
    def lost(*_: Any, **__: Any) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(Lab, "sync_nodes", lost)
    monkeypatch.setattr("diagnostic.staff.labhealth.poll_all_labs.__defaults__", (factory,))
    assert poll_lab_health() == [str(lab.pk)]
    health = LabHealth.objects.get(lab=lab)
    assert health.error == ("poll did not complete: OperationalError: server closed the connection "
                            "unexpectedly")
    assert {h.node: (h.reachable, h.checked_at) for h in NodeHealth.objects.filter(lab=lab)} == before
    page = cast.client("staff").get("/staff/lab/").content.decode()
    lab_part = section(page, lab)
    assert 'class="badge incomplete">poll did not complete' in lab_part
    assert "server closed the connection unexpectedly" in lab_part
    assert 'class="badge unreachable"' not in lab_part and "nodes down" not in lab_part
    assert lab_part.count("last known state: the latest poll did not reach it") == len(before)
    monkeypatch.undo()

    # An inventory that cannot be read: no node was asked, so none is marked down.
    lab.inventory = str(tmp_path / "gone" / "inventory.yaml")
    lab.save(update_fields=["inventory"])
    health = poll_lab(lab)
    assert health.error.startswith("poll did not complete: the lab's inventory could not be read")
    assert {h.node: (h.reachable, h.checked_at) for h in NodeHealth.objects.filter(lab=lab)} == before

    # The manual poll says the same in its message.
    response = cast.client("staff").post("/staff/lab/refresh/", follow=True)
    text = response.content.decode()
    assert "Polled 1 lab(s) just now; the poll did not complete for: db-lab" in text


def test_an_engine_links_to_the_job_its_launch_spec_names(sim: SimLab, cast: Cast, out_dir: Path) -> None:
    lab = Lab.objects.create(name="owner-lab", inventory=str(sim.inventory_path))
    job = make_finished_job(cast, lab, lab_day=timezone.localdate())
    owner = {"platform": "gb10-diag", "job": str(job.pk)}
    with LabSession.open(sim.inventory_path) as session:
        session.owner = owner
        session.launch(job.config.normalized, cold=False, timeout_s=3600)
    poll_lab(lab, sessions(sim))
    head = NodeHealth.objects.get(lab=lab, node="spark-01")
    assert head.engine_owner == owner and head.engine_running
    page = cast.client("staff").get("/staff/lab/").content.decode()
    head_row = row(page, "spark-01")
    # The spec carries the owner, so its hash is no configuration's: the owner alone names the job.
    assert f'href="/staff/jobs/{job.pk}/"' in head_row and "its launch spec names this job" in head_row
    assert "not started by this platform" not in head_row

    # An owner naming a job this platform does not have: not ours, said so, no link.
    stranger = {"platform": "gb10-diag", "job": str(uuid.uuid4())}
    with LabSession.open(sim.inventory_path) as session:
        session.owner = stranger
        session.launch(job.config.normalized, cold=False, timeout_s=3600)
    poll_lab(lab, sessions(sim))
    page = cast.client("staff").get("/staff/lab/").content.decode()
    head_row = row(page, "spark-01")
    assert "/staff/jobs/" not in head_row and "not started by this platform" in head_row
    assert f"job {stranger['job']}, platform gb10-diag, which this platform does not have" in head_row
