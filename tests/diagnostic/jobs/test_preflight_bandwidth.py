"""Preflight's memory bandwidth probe: every node in use runs the agent's mem-bw-probe at
once, before any engine starts; the result keeps each node's figure and raw repeats and the
lab-wide one, or why there is none, and nothing the probe answers fails the job."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from diagnostic.bookings.configs import submit_configuration
from diagnostic.jobs.models import DiagnosticJob, StageRun
from diagnostic.jobs.orchestration import run_until_done
from diagnostic.jobs.preflight import MEM_BW_PROBE_MIB, MEM_BW_PROBE_REPEATS, memory_bandwidth
from lab.agent.agent import MEM_BW_METHOD
from lab.clock import LabClock
from lab.session import AgentError, NodeUnreachable
from lab.sim.node import MEM_BW_SETUP_S
from tests.diagnostic.conftest import REFERENCE_CONFIG, REFERENCE_SCENARIO
from tests.diagnostic.doubles import FactsSession, fast_scenario, healthy_facts

MakeJob = Callable[..., DiagnosticJob]
NODES = [f"spark-{i:02d}" for i in range(1, 9)]


def answer(gbs: list[float]) -> dict[str, Any]:
    bytes_read = MEM_BW_PROBE_MIB * 2**20
    ordered = sorted(gbs)
    return {"device": "NVIDIA GB10", "size_mib": MEM_BW_PROBE_MIB, "repeats": len(gbs),
            "bytes_read": bytes_read, "seconds": [bytes_read / g / 1e9 for g in gbs], "gbs": gbs,
            "median_gbs": ordered[len(ordered) // 2],
            "method": MEM_BW_METHOD.format(size_mib=MEM_BW_PROBE_MIB)}


class ProbeSession(FactsSession):
    """A FactsSession whose nodes answer mem-bw-probe from a table (an exception entry is
    that node's failure), recording each call."""

    def __init__(self, probes: dict[str, Any], **kwargs: Any) -> None:
        super().__init__({n: healthy_facts(n) for n in NODES}, **kwargs)
        self.probes = probes
        self.calls: list[tuple[tuple[str, ...], list[str]]] = []

    def agent_all(self, *args: str, nodes: Any = None, timeout: float = 60.0,
                  tolerate: bool = False) -> dict[str, Any]:
        assert tolerate, "the probe's failures must come back per node, not raise"
        names = self._names(nodes)
        self.calls.append((args, names))
        return {n: self.probes[n] for n in names}


def run_preflight(make_job: MakeJob, session: FactsSession, **job_args: Any) -> tuple[DiagnosticJob, dict]:
    job = make_job(["preflight", "report"], **job_args)
    run_until_done(str(job.pk), session.factory(), sleep=lambda s: None)
    job.refresh_from_db()
    return job, StageRun.objects.get(job=job, name="preflight").result or {}


@pytest.mark.django_db
def test_every_node_in_use_is_probed_at_once_and_the_figures_are_kept(make_job: MakeJob) -> None:
    probes = {n: answer([200.0 + i, 201.0 + i, 199.0 + i]) for i, n in enumerate(NODES)}
    session = ProbeSession(probes)
    job, result = run_preflight(make_job, session)
    assert job.status == "succeeded"
    [(args, names)] = session.calls
    assert args == ("mem-bw-probe", "--size-mib", str(MEM_BW_PROBE_MIB),
                    "--repeats", str(MEM_BW_PROBE_REPEATS))
    assert names == NODES
    bw = result["memory_bandwidth"]
    assert bw["method"] == MEM_BW_METHOD.format(size_mib=MEM_BW_PROBE_MIB)
    assert set(bw["nodes"]) == set(NODES)
    assert bw["nodes"]["spark-03"]["gbs"] == [202.0, 203.0, 201.0]
    assert bw["nodes"]["spark-03"]["median_gbs"] == 202.0
    assert bw["median_gbs"] == pytest.approx(203.5)  # of the medians 200 ... 207
    assert (bw["min_gbs"], bw["min_node"]) == (200.0, "spark-01")
    assert bw["failed"] == {}
    assert bw["lab_s"] >= 0


@pytest.mark.django_db
def test_only_the_nodes_the_configuration_uses_are_probed(make_job: MakeJob) -> None:
    config = submit_configuration(raw_text=REFERENCE_CONFIG.read_text().replace("tp: 8", "tp: 4"),
                                  source="yaml")
    session = ProbeSession({n: answer([180.0]) for n in NODES})
    _, result = run_preflight(make_job, session, config=config)
    assert session.calls[0][1] == NODES[:4]
    assert set(result["memory_bandwidth"]["nodes"]) == set(NODES[:4])


@pytest.mark.django_db
def test_nodes_without_torch_leave_the_bandwidth_unavailable_and_the_job_goes_on(make_job: MakeJob) -> None:
    unsupported = {n: AgentError(n, "mem-bw-probe", "unsupported",
                                 "mem-bw-probe needs torch with a CUDA GPU; none here") for n in NODES}
    job, result = run_preflight(make_job, ProbeSession(unsupported))
    assert job.status == "succeeded"
    bw = result["memory_bandwidth"]
    assert bw["unavailable"] == ("mem-bw-probe unsupported: "
                                 "mem-bw-probe needs torch with a CUDA GPU; none here")
    assert set(bw["failed"]) == set(NODES)


@pytest.mark.django_db
def test_a_busy_or_unreachable_node_is_named_and_the_others_count(make_job: MakeJob) -> None:
    probes: dict[str, Any] = {n: answer([190.0]) for n in NODES}
    probes["spark-02"] = AgentError("spark-02", "mem-bw-probe", "busy", "an engine runs here")
    probes["spark-05"] = NodeUnreachable({"spark-05": OSError("connection reset")})
    probes["spark-06"] = {"gbs": "garbage"}
    job, result = run_preflight(make_job, ProbeSession(probes))
    assert job.status == "succeeded"
    bw = result["memory_bandwidth"]
    assert set(bw["nodes"]) == set(NODES) - {"spark-02", "spark-05", "spark-06"}
    assert bw["failed"]["spark-02"] == "mem-bw-probe busy: an engine runs here"
    assert "connection reset" in bw["failed"]["spark-05"]
    assert "malformed" in bw["failed"]["spark-06"]
    assert bw["median_gbs"] == 190.0


@pytest.mark.django_db
def test_a_session_that_cannot_probe_at_all_never_fails_preflight(make_job: MakeJob) -> None:
    # FactsSession has no agent_all: the call itself raises.
    job, result = run_preflight(make_job, FactsSession({n: healthy_facts(n) for n in NODES}))
    assert job.status == "succeeded"
    assert "unavailable" in result["memory_bandwidth"]


def test_memory_bandwidth_counts_the_lab_time_it_took() -> None:
    class Clock(LabClock):
        def now(self) -> float:
            self.__dict__["t"] = self.__dict__.get("t", 100.0) + 1.25
            return float(self.__dict__["t"])

    session = ProbeSession({"spark-01": answer([205.0])})
    session.clock = Clock()
    bw = memory_bandwidth(session, ["spark-01"])
    assert bw["lab_s"] == 1.25 and bw["median_gbs"] == 205.0
    assert memory_bandwidth(session, []) == {"unavailable": "no node to probe"}


@pytest.mark.django_db(transaction=True)
def test_the_reference_lab_s_preflight_measures_its_streaming_bandwidth(
        tmp_path: Path, sim_state_dir: Path) -> None:
    # The demo's dilation: lab seconds as `make demo` spends them (the sim's SSH round trips
    # cost wall time, which the dilation turns into lab seconds).
    scenario = fast_scenario(tmp_path, REFERENCE_SCENARIO, dilation=45)
    out = tmp_path / "out"
    call_command("diagnose", "--config", str(REFERENCE_CONFIG), "--lab", f"sim:{scenario}", "--out", str(out),
                 "--stages", "preflight,report", stdout=io.StringIO())
    document = json.loads((out / "findings.json").read_text())
    assert document["job"]["status"] == "succeeded"
    job = DiagnosticJob.objects.get(pk=document["job"]["id"])
    preflight = StageRun.objects.get(job=job, name="preflight")
    bw = preflight.result["memory_bandwidth"]
    assert set(bw["nodes"]) == set(NODES)
    assert bw["method"] == MEM_BW_METHOD.format(size_mib=MEM_BW_PROBE_MIB)
    assert all(len(n["gbs"]) == MEM_BW_PROBE_REPEATS for n in bw["nodes"].values())
    # 273 GB/s peak x 0.75 reachable when streaming (the scenario's cluster.node).
    assert bw["median_gbs"] == pytest.approx(204.75, rel=0.02)
    assert bw["min_gbs"] <= bw["median_gbs"]
    # All nodes at once: the probe's ~2 lab s of setup once, not eight times.
    assert MEM_BW_SETUP_S <= bw["lab_s"] < len(NODES) * MEM_BW_SETUP_S
    # The stage's own lab time is recorded; whether it fits its reserve is a speed figure:
    # the sim's SSH round trips are wall time turned into lab seconds by the dilation, which
    # a busy machine stretches (43 lab s against the 40 reserved, in a full CI run), so
    # `make bench-day` prints it against RESERVE_LAB_S instead.
    assert preflight.lab_seconds is not None and preflight.lab_seconds > bw["lab_s"]
