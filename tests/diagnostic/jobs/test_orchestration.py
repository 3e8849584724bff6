"""Orchestration of a job's stages: order, retries, quarantine, cancel, and what is kept.

The stages here are small pipeline stages registered for the test, under a declared order
extended with their names; they never touch the lab, so the session factory refuses to
open one.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from diagnostic.jobs import registry
from diagnostic.jobs.findings_document import validate_findings
from diagnostic.jobs.models import DiagnosticJob, Finding, JobEvent, Measurement, StageRun
from diagnostic.jobs.orchestration import Next, orchestrate, retry_countdown, run_until_done
from diagnostic.jobs.registry import StageFn, StageRegistry, UnknownStage, select_stages
from diagnostic.jobs.stage_context import StageContext, StopJob
from lab.session import LabError, NodeUnreachable
from tests.diagnostic.doubles import no_lab

pytestmark = pytest.mark.django_db
MakeJob = Callable[..., DiagnosticJob]


class Probe:
    """A pipeline stage whose behaviour per attempt the test scripts."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    def __call__(self, ctx: StageContext) -> dict[str, Any]:
        self.calls += 1
        ctx.progress(50, f"probe call {self.calls}")
        ctx.add_finding("probe.seen", f"call {self.calls}", evidence={"attempt": ctx.attempt})
        outcome = self.outcomes.pop(0) if self.outcomes else "ok"
        if isinstance(outcome, BaseException):
            raise outcome
        if callable(outcome):
            outcome(ctx)
        return {"call": self.calls}


def add_test_stage(monkeypatch: pytest.MonkeyPatch, name: str, run: StageFn) -> None:
    """Swap in a registry whose declared order has `name` just before report, holding
    every other stage registered so far and `run` under that name; undone after the test."""
    registry.load_adapters()
    current = registry.REGISTRY
    order = [n for n in current.order if n not in (name, "report")]
    scratch = StageRegistry([*order, name, "report"])
    for stage in current.stages():
        if stage.name != name:
            scratch.register(stage.name, stage.run, required=stage.required, after_stop=stage.after_stop)
    scratch.register(name, run)
    monkeypatch.setattr(registry, "REGISTRY", scratch)


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Probe]:
    def register(*outcomes: Any, name: str = "probe") -> Probe:
        stage = Probe(*outcomes)
        add_test_stage(monkeypatch, name, stage)
        return stage

    return register


def unreachable() -> NodeUnreachable:
    return NodeUnreachable({"spark-05": OSError("connection refused")})


def stage(job: DiagnosticJob, name: str) -> StageRun:
    return StageRun.objects.get(job=job, name=name)


def test_stages_run_in_order_and_the_job_succeeds(make_job: MakeJob, probe: Callable[..., Probe]) -> None:
    probe()
    job = make_job(["probe", "report"])
    assert orchestrate(str(job.pk), no_lab).next is Next.FINISHED
    job.refresh_from_db()
    assert job.status == "succeeded"
    assert [s.status for s in job.stage_runs.order_by("order")] == ["succeeded", "succeeded"]
    assert stage(job, "probe").result == {"call": 1}
    assert stage(job, "probe").progress_percent == 100
    assert "probe call 1" in stage(job, "probe").log


def test_a_completed_stage_never_runs_again(make_job: MakeJob, probe: Callable[..., Probe]) -> None:
    counting = probe()
    job = make_job(["probe", "report"])
    assert orchestrate(str(job.pk), no_lab, max_stages=1).next is Next.MORE
    assert orchestrate(str(job.pk), no_lab).next is Next.FINISHED
    assert orchestrate(str(job.pk), no_lab).next is Next.FINISHED
    assert counting.calls == 1
    assert Finding.objects.filter(job=job, code="probe.seen").count() == 1


def test_a_transient_lab_error_releases_the_stage_for_a_retry_with_backoff(
    make_job: MakeJob, probe: Callable[..., Probe]
) -> None:
    probe(unreachable())
    job = make_job(["probe", "report"])
    outcome = orchestrate(str(job.pk), no_lab)
    assert outcome.next is Next.RETRY
    assert outcome.countdown == retry_countdown(1)
    probe_run = stage(job, "probe")
    assert (probe_run.status, probe_run.attempts, probe_run.lease_owner) == ("pending", 1, "")
    assert "spark-05" in probe_run.last_error


def test_a_retried_stage_starts_over_and_keeps_only_its_successful_findings(
    make_job: MakeJob, probe: Callable[..., Probe], fast_retries: Any
) -> None:
    flaky = probe(unreachable(), "ok")
    job = make_job(["probe", "report"])
    waits: list[float] = []
    done = run_until_done(str(job.pk), no_lab, sleep=waits.append)
    assert done.status == "succeeded"
    assert flaky.calls == 2
    assert waits == [0.0]
    assert list(Finding.objects.filter(job=job).values_list("title", "evidence")) == [
        ("call 2", {"attempt": 2})
    ]


def test_backoff_doubles_and_is_capped(settings: Any) -> None:
    settings.DIAG_RETRY_BASE_S = 10
    settings.DIAG_RETRY_MAX_S = 35
    assert [retry_countdown(a) for a in (1, 2, 3, 4)] == [10, 20, 35, 35]


def disk_full() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", "/srv/out/jobs/x/report.pdf")


def test_a_stage_failing_transiently_on_every_attempt_is_quarantined(
    make_job: MakeJob, probe: Callable[..., Probe], fast_retries: Any
) -> None:
    probe(disk_full(), disk_full(), disk_full())
    job = make_job(["probe", "report"])
    done = run_until_done(str(job.pk), no_lab, sleep=lambda s: None)
    probe_run = stage(job, "probe")
    assert probe_run.status == "quarantined"
    assert probe_run.attempts == 3
    assert probe_run.status_message.startswith("quarantined after 3 attempts (limit 3); not retried again")
    # A pipeline stage is optional: the report still runs and says what is missing.
    assert done.status == "partial"
    assert "probe quarantined" in done.status_message
    assert stage(job, "report").status == "succeeded"


def test_a_lab_fault_on_every_attempt_holds_the_day_instead_of_failing_it(
    make_job: MakeJob, probe: Callable[..., Probe], fast_retries: Any
) -> None:
    probe(unreachable(), unreachable(), unreachable())
    job = make_job(["probe", "report"])
    done = run_until_done(str(job.pk), no_lab, sleep=lambda s: None)
    assert done.status == "held"
    assert done.stop_side == "lab"
    assert (done.fault["what"], done.fault["nodes"], done.fault["stage"]) == (
        "node_unreachable", ["spark-05"], "probe")
    probe_run = stage(job, "probe")
    # Waiting for staff to re-run it, with every attempt in its log; the report waits too.
    assert (probe_run.status, probe_run.attempts) == ("pending", 3)
    assert probe_run.status_message.startswith("held: spark-05 did not answer")
    assert stage(job, "report").status == "pending"
    assert orchestrate(str(job.pk), no_lab).next is Next.HELD, "a held job is not run on its own"
    [event] = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.LAB_FAULT)
    assert event.data["nodes"] == ["spark-05"]
    assert done.findings["money_back"]["rerun_due"] is True
    assert done.findings["lab_fault"]["what"] == "node_unreachable"


def test_a_required_stage_quarantined_fails_the_job(
    make_job: MakeJob, fast_retries: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(lab: Any) -> Any:
        raise disk_full()

    job = make_job(["preflight", "report"])
    done = run_until_done(str(job.pk), full_disk, sleep=lambda s: None)
    assert done.status == "failed"
    assert done.stop_side == "platform"
    assert stage(job, "preflight").status == "quarantined"
    assert stage(job, "report").status == "cancelled"
    assert stage(job, "report").status_message.startswith("not run: preflight: quarantined")


def test_a_required_stage_that_cannot_reach_the_lab_holds_the_job(
    make_job: MakeJob, fast_retries: Any
) -> None:
    def unreachable_lab(lab: Any) -> Any:
        raise unreachable()

    job = make_job(["preflight", "report"])
    done = run_until_done(str(job.pk), unreachable_lab, sleep=lambda s: None)
    assert done.status == "held"
    assert stage(job, "preflight").status == "pending"
    assert stage(job, "report").status == "pending"


def test_a_failing_pipeline_stage_is_recorded_and_the_job_goes_on(
    make_job: MakeJob, probe: Callable[..., Probe]
) -> None:
    probe(KeyError("workload"))
    job = make_job(["probe", "report"])
    assert orchestrate(str(job.pk), no_lab).next is Next.FINISHED
    job.refresh_from_db()
    probe_run = stage(job, "probe")
    assert probe_run.status == "failed"
    assert probe_run.status_message == "KeyError: 'workload'"
    assert "Traceback" in probe_run.log
    assert not Finding.objects.filter(job=job).exists()
    assert job.status == "partial"


def test_a_non_transient_lab_error_is_not_retried_and_holds_the_day(
    make_job: MakeJob, probe: Callable[..., Probe]
) -> None:
    once = probe(LabError("spark-02: agent launch failed (launch_failed)"))
    job = make_job(["probe", "report"])
    assert orchestrate(str(job.pk), no_lab).next is Next.HELD
    assert once.calls == 1
    assert stage(job, "probe").status == "pending"
    job.refresh_from_db()
    assert job.status == "held"


def test_a_stage_that_stops_the_job_keeps_its_findings_skips_the_rest_and_still_reports(
    make_job: MakeJob, probe: Callable[..., Probe]
) -> None:
    def stop(ctx: StageContext) -> None:
        ctx.add_finding("lab.node_unreachable", "spark-05 is down", evidence={}, blocking=True)
        raise StopJob("preflight-like stop: spark-05 is down", {"blocking": ["lab.node_unreachable"]})

    probe(stop)
    later = probe(name="later")
    job = make_job(["probe", "later", "report"])
    orchestrate(str(job.pk), no_lab)
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.status_message == "preflight-like stop: spark-05 is down"
    assert stage(job, "probe").status == "stopped"  # not "succeeded": it ended the day
    assert stage(job, "probe").result == {
        "blocking": ["lab.node_unreachable"], "stopped_job": "preflight-like stop: spark-05 is down",
        "stop_side": "customer"}
    assert Finding.objects.get(job=job, code="lab.node_unreachable").blocking
    assert later.calls == 0
    assert stage(job, "later").status == "cancelled"
    assert stage(job, "later").status_message == "not run: preflight-like stop: spark-05 is down"
    # The customer still gets the written report: what stopped the job, and that it is free.
    report = stage(job, "report")
    assert report.status == "succeeded"
    assert Path(report.result["report_pdf"]).is_file()
    validate_findings(job.findings)
    assert [f["code"] for f in job.findings["findings"]] == ["probe.seen", "lab.node_unreachable"]
    assert job.findings["money_back"]["eligible"] is True


def test_a_stop_is_honoured_by_a_worker_that_takes_over_after_it(
    make_job: MakeJob, probe: Callable[..., Probe]
) -> None:
    probe(StopJob("stopped by the first worker"))
    later = probe(name="later")
    job = make_job(["probe", "later", "report"])
    # The first worker ran only the stopping stage, then went away.
    assert orchestrate(str(job.pk), no_lab, max_stages=1).next is Next.MORE
    assert stage(job, "later").status == "pending"
    orchestrate(str(job.pk), no_lab)
    job.refresh_from_db()
    assert later.calls == 0
    assert (stage(job, "later").status, stage(job, "report").status) == ("cancelled", "succeeded")
    assert (job.status, job.status_message) == ("failed", "stopped by the first worker")


def test_cancel_between_stages_stops_the_job(make_job: MakeJob, probe: Callable[..., Probe]) -> None:
    first = probe()
    job = make_job(["probe", "report"])
    orchestrate(str(job.pk), no_lab, max_stages=1)
    assert job.request_cancel()
    assert orchestrate(str(job.pk), no_lab).next is Next.FINISHED
    job.refresh_from_db()
    assert job.status == "cancelled"
    assert first.calls == 1
    assert stage(job, "report").status == "cancelled"
    assert not job.request_cancel()


def test_cancel_seen_by_the_heartbeat_stops_a_running_stage(
    make_job: MakeJob, probe: Callable[..., Probe]
) -> None:
    from diagnostic.jobs.orchestration import Heartbeat

    def cancelled_mid_way(ctx: StageContext) -> None:
        DiagnosticJob.objects.filter(pk=ctx.job.pk).update(cancel_requested=True)
        Heartbeat(stage_id=ctx.stage.pk, job_id=str(ctx.job.pk), owner=ctx.owner,
                  cancel=ctx.cancel_event).beat()
        ctx.check_cancelled()

    probe(cancelled_mid_way)
    job = make_job(["probe", "report"])
    orchestrate(str(job.pk), no_lab)
    job.refresh_from_db()
    assert job.status == "cancelled"
    assert stage(job, "probe").status == "cancelled"
    assert not Finding.objects.filter(job=job).exists()


def test_a_stage_taken_over_by_another_worker_discards_its_result(
    make_job: MakeJob, probe: Callable[..., Probe]
) -> None:
    def taken_over(ctx: StageContext) -> None:
        StageRun.objects.filter(pk=ctx.stage.pk).update(lease_owner="another-worker")

    probe(taken_over)
    job = make_job(["probe", "report"])
    assert orchestrate(str(job.pk), no_lab).next is Next.ELSEWHERE
    probe_run = stage(job, "probe")
    assert (probe_run.status, probe_run.lease_owner, probe_run.result) == ("running", "another-worker", None)
    assert not Finding.objects.filter(job=job).exists()


def test_a_second_job_waits_while_the_first_holds_the_lab(
    make_job: MakeJob, probe: Callable[..., Probe]
) -> None:
    probe(unreachable())
    first, second = make_job(["probe", "report"]), make_job(["probe", "report"])
    assert orchestrate(str(first.pk), no_lab).next is Next.RETRY
    busy = orchestrate(str(second.pk), no_lab)
    assert busy.next is Next.LAB_BUSY
    assert str(first.pk) in busy.message
    second.refresh_from_db()
    assert second.status == "queued"
    assert orchestrate(str(first.pk), no_lab).next is Next.FINISHED
    assert orchestrate(str(second.pk), no_lab).next is Next.FINISHED


def test_a_stage_this_worker_does_not_know_fails_with_a_clear_message(make_job: MakeJob) -> None:
    job = make_job(["report"])
    StageRun.objects.filter(job=job).update(name="fp4-from-newer-code")
    orchestrate(str(job.pk), no_lab)
    job.refresh_from_db()
    assert job.status == "failed"
    assert "no stage named 'fp4-from-newer-code' is registered in this worker" in job.status_message


def test_measurements_are_saved_with_their_stage(make_job: MakeJob, probe: Callable[..., Probe]) -> None:
    def measure(ctx: StageContext) -> None:
        ctx.add_measurement(workload="code", configuration="customer", n=15, mean_tps=25.9,
                            ci95=(25.1, 26.7), ttft_s=0.8, samples=[25.0, 26.0])

    probe(measure)
    job = make_job(["probe"])
    orchestrate(str(job.pk), no_lab)
    row = Measurement.objects.get(job=job)
    assert (row.stage.name, row.mean_tps, row.ci95_low, row.ci95_high) == ("probe", 25.9, 25.1, 26.7)


def test_sections_come_from_stage_results_and_missing_ones_stay_null(
    make_job: MakeJob, probe: Callable[..., Probe], monkeypatch: pytest.MonkeyPatch
) -> None:
    def with_fp4(ctx: StageContext) -> dict[str, Any]:
        return {"sections": {"fp4": {"verdict": "garbage", "backend_before": "flashinfer_cutlass",
                                     "backend_after": "cutlass",
                                     "canary_pass_rate": {"before": 0.05, "after": 1.0}}}}

    add_test_stage(monkeypatch, "fp4-test", with_fp4)
    job = make_job(["fp4-test", "report"])
    orchestrate(str(job.pk), no_lab)
    job.refresh_from_db()
    document = job.findings
    validate_findings(document)
    assert document["fp4"]["verdict"] == "garbage"
    assert (document["cold_start"], document["speculative"], document["measurement"]) == (None, None, None)
    # The report stage decides money back: no finding here shows a measured improvement.
    assert document["money_back"]["eligible"] is True
    assert "No finding shows a measured improvement" in document["money_back"]["reason"]
    assert document["job"]["id"] == str(job.pk)
    assert [s["name"] for s in document["job"]["stages"]] == ["fp4-test", "report"]


def test_selecting_an_unknown_stage_lists_the_accepted_ones() -> None:
    with pytest.raises(UnknownStage, match=r"unknown stage 'fp5'; accepted: preflight, reproduce, .*report"):
        select_stages(["preflight", "fp5"])


def test_the_task_in_eager_mode_runs_the_job_to_the_end_in_process(
    make_job: MakeJob, probe: Callable[..., Probe], fast_retries: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diagnostic.jobs import tasks

    flaky = probe(unreachable(), "ok")
    monkeypatch.setattr(tasks, "open_lab_session", no_lab)
    job = make_job(["probe", "report"])
    assert tasks.run_diagnostic.apply(args=[str(job.pk)]).get() == "succeeded"
    assert flaky.calls == 2
