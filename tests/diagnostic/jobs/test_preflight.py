"""Preflight checks from node facts: what blocks a job, what is only recorded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from diagnostic.bookings.configs import submit_configuration
from diagnostic.jobs.models import DiagnosticJob, Finding, StageRun
from diagnostic.jobs.orchestration import Next, orchestrate, run_until_done
from lab.session import NodeUnreachable
from tests.diagnostic.conftest import REFERENCE_CONFIG
from tests.diagnostic.doubles import FactsSession, healthy_facts

pytestmark = pytest.mark.django_db
MakeJob = Callable[..., DiagnosticJob]


def lab_facts(nodes: int = 8, **changes: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    facts: dict[str, Any] = {f"spark-{i + 1:02d}": healthy_facts(f"spark-{i + 1:02d}") for i in range(nodes)}
    for name, change in changes.items():
        replaced = change(facts[name.replace("_", "-")])
        if replaced is not None:
            facts[name.replace("_", "-")] = replaced
    return facts


def run_preflight(make_job: MakeJob, session: FactsSession, **job_args: Any) -> DiagnosticJob:
    job = make_job(["preflight", "report"], **job_args)
    run_until_done(str(job.pk), session.factory(), sleep=lambda s: None)
    job.refresh_from_db()
    return job


def codes(job: DiagnosticJob) -> list[tuple[str, bool]]:
    return list(Finding.objects.filter(job=job).values_list("code", "blocking"))


def test_a_healthy_lab_passes_preflight_without_findings(make_job: MakeJob) -> None:
    job = run_preflight(make_job, FactsSession(lab_facts()))
    assert job.status == "succeeded"
    assert codes(job) == []
    result = StageRun.objects.get(job=job, name="preflight").result
    assert result["used_nodes"] == [f"spark-{i:02d}" for i in range(1, 9)]
    assert all(check["ok"] for check in result["checks"])


def conditions(job: DiagnosticJob) -> list[dict[str, Any]]:
    """The lab's conditions preflight kept for staff (its result, not the findings)."""
    result = StageRun.objects.get(job=job, name="preflight").result or {}
    return list(result.get("lab_conditions") or [])


def test_an_unreachable_node_is_retried_then_holds_the_day_as_a_lab_fault(
    make_job: MakeJob, fast_retries: Any
) -> None:
    down = NodeUnreachable({"spark-05": OSError("connection refused")})
    session = FactsSession(lab_facts(spark_05=lambda f: down))
    job = run_preflight(make_job, session)
    assert session.facts_calls == 3
    # Held, not failed: the lab's fault is the firm's, and no customer finding says otherwise.
    assert job.status == "held"
    assert job.stop_side == "lab"
    assert codes(job) == []
    assert job.fault["what"] == "node_unreachable"
    assert job.fault["nodes"] == ["spark-05"]
    assert job.fault["stage"] == "preflight"
    assert "connection refused" in job.fault["evidence"]["nodes"]["spark-05"]
    # The stage waits to be re-run; the report is not written.
    assert StageRun.objects.get(job=job, name="preflight").status == "pending"
    assert StageRun.objects.get(job=job, name="report").status == "pending"
    assert job.findings["money_back"]["rerun_due"] is True
    assert job.findings["money_back"]["eligible"] is False
    assert job.findings["lab_fault"]["nodes"] == ["spark-05"]


def test_an_unreachable_node_the_configuration_does_not_need_is_only_recorded(
    make_job: MakeJob, fast_retries: Any
) -> None:
    text = REFERENCE_CONFIG.read_text().replace("tp: 8", "tp: 4")
    config = submit_configuration(raw_text=text, source="yaml")
    down = NodeUnreachable({"spark-08": OSError("connection refused")})
    session = FactsSession(lab_facts(spark_08=lambda f: down))
    job = run_preflight(make_job, session, config=config)
    assert session.facts_calls == 1
    assert job.status == "succeeded"
    assert codes(job) == []
    [unreachable] = conditions(job)
    assert (unreachable["code"], unreachable["nodes"], unreachable["blocking"]) == (
        "lab.node_unreachable", ["spark-08"], False)


def test_a_lab_with_too_few_nodes_blocks_before_asking_for_facts(make_job: MakeJob) -> None:
    session = FactsSession(lab_facts(4), nodes=4)
    job = run_preflight(make_job, session)
    assert session.facts_calls == 0
    assert job.status == "failed"
    # A layout bigger than the lab is the customer's configuration, not a lab fault.
    assert job.stop_side == "customer"
    finding = Finding.objects.get(job=job)
    assert (finding.code, finding.evidence["needed"], finding.evidence["available"]) == (
        "config.layout_exceeds_lab", 8, 4)


def test_a_node_clock_far_from_the_others_is_kept_for_staff(make_job: MakeJob) -> None:
    def ahead(f: dict[str, Any]) -> None:
        f["time"] += 42.0

    job = run_preflight(make_job, FactsSession(lab_facts(spark_03=ahead)))
    assert codes(job) == []
    [skew] = conditions(job)
    assert (skew["code"], skew["nodes"], skew["blocking"]) == ("lab.clock_skew", ["spark-03"], False)
    assert skew["evidence"]["spark-03"]["offset_s"] == 42.0
    assert job.status == "succeeded"


def test_clocks_within_the_limit_are_not_reported(make_job: MakeJob) -> None:
    def slightly_ahead(f: dict[str, Any]) -> None:
        f["time"] += 4.0

    job = run_preflight(make_job, FactsSession(lab_facts(spark_03=slightly_ahead)))
    assert codes(job) == []
    assert conditions(job) == []


def test_a_data_link_slower_than_the_customers_is_kept_with_its_speed(make_job: MakeJob) -> None:
    def degraded(f: dict[str, Any]) -> None:
        f["nics"][2]["speed_mbps"] = 25000

    job = run_preflight(make_job, FactsSession(lab_facts(spark_06=degraded)))
    [link] = conditions(job)
    assert link["code"] == "lab.link_speed"
    assert link["evidence"] == {"spark-06": {"nic": "enP2p1s0f0np0", "speed_mbps": 25000,
                                             "operstate": "up", "config_link_gbps": 100.0}}
    assert "25 Gbps" in link["summary"]


def test_identical_conditions_on_many_nodes_are_one_entry_naming_them(make_job: MakeJob) -> None:
    def old_engine(f: dict[str, Any]) -> None:
        f["engines"]["vllm"] = "0.11.0"

    every_node = {f"spark_{i:02d}": old_engine for i in range(1, 9)}
    job = run_preflight(make_job, FactsSession(lab_facts(**every_node)))
    [engine] = conditions(job)
    assert engine["nodes"] == [f"spark-{i:02d}" for i in range(1, 9)]
    assert engine["summary"].startswith("8 nodes: spark-01, spark-02")
    assert codes(job) == []


def test_a_missing_model_directory_holds_the_day(make_job: MakeJob) -> None:
    def no_model(f: dict[str, Any]) -> None:
        f["model_dir"] = {"path": "/models/kimi-k2", "exists": False, "free_bytes": None}

    job = run_preflight(make_job, FactsSession(lab_facts(spark_02=no_model)))
    assert codes(job) == []
    assert job.status == "held"
    assert (job.fault["what"], job.fault["nodes"]) == ("model_missing", ["spark-02"])


def test_a_node_without_gpu_holds_the_day(make_job: MakeJob) -> None:
    def no_gpu(f: dict[str, Any]) -> None:
        f["gpus"] = []

    job = run_preflight(make_job, FactsSession(lab_facts(spark_07=no_gpu)))
    assert job.status == "held"
    assert (job.fault["what"], job.fault["nodes"]) == ("gpu_missing", ["spark-07"])


def test_a_node_that_would_run_engines_as_root_holds_the_day(make_job: MakeJob) -> None:
    # The agent refuses such a launch; preflight says so before any start is tried.
    def as_root(f: dict[str, Any]) -> None:
        f["engine_user"] = {"name": "root", "uid": 0, "problem": "launch: engine_user 'root' in "
                            "/etc/gb10-diag/agent.json is root; engines run customers' configurations "
                            "and never as root: name an unprivileged service user (useradd --system diag)"}

    job = run_preflight(make_job, FactsSession(lab_facts(spark_03=as_root)))
    assert codes(job) == []
    assert job.status == "held"
    assert (job.fault["what"], job.fault["nodes"]) == ("engine_user", ["spark-03"])
    [condition] = job.fault["evidence"]["conditions"]
    assert "would run engines as 'root'" in condition["summary"], condition


def test_memory_held_by_something_else_is_kept_from_meminfo(make_job: MakeJob) -> None:
    def busy(f: dict[str, Any]) -> None:
        f["mem_available_kib"] = 40_000_000

    job = run_preflight(make_job, FactsSession(lab_facts(spark_04=busy)))
    [memory] = conditions(job)
    assert memory["code"] == "lab.memory_unavailable"
    assert memory["evidence"]["spark-04"]["mem_available_kib"] == 40_000_000
    assert codes(job) == []
    assert job.status == "succeeded"


def test_another_architecture_or_engine_version_is_recorded_not_blocking(make_job: MakeJob) -> None:
    def other(f: dict[str, Any]) -> None:
        f["gpus"][0]["compute_capability"] = "10.0"
        f["engines"]["vllm"] = "0.11.0"

    job = run_preflight(make_job, FactsSession(lab_facts(spark_01=other)))
    assert sorted(c["code"] for c in conditions(job)) == ["lab.compute_capability", "lab.engine_version"]
    assert job.status == "succeeded"


def test_preflight_retry_outcome_carries_the_backoff(make_job: MakeJob) -> None:
    down = NodeUnreachable({"spark-05": OSError("connection refused")})
    job = make_job(["preflight"])
    outcome = orchestrate(str(job.pk), FactsSession(lab_facts(spark_05=lambda f: down)).factory())
    assert outcome.next is Next.RETRY
    assert outcome.countdown == 15.0
