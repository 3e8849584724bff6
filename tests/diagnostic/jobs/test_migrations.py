"""The stage lifecycle's migration on rows that existed before it: a stage that stopped its
job (recorded then as succeeded, the reason in its result) becomes "stopped", in its row and
in its job's stored findings document; nothing else moves, and reversal moves it back."""

from __future__ import annotations

import pytest

from tests.diagnostic.portal.test_migrations import latest, migrate

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("jobs", "0009_node_engine_owner")]


def test_a_stage_that_stopped_its_job_becomes_stopped_and_back() -> None:
    old = migrate(BEFORE)
    # The bookings app stays at its newest migration: its rows are made with today's models.
    from diagnostic.bookings.models import ClusterConfiguration, Lab, Organisation

    Job = old.get_model("jobs", "DiagnosticJob")
    StageRun = old.get_model("jobs", "StageRun")
    org = Organisation.objects.create(name="Acme Inference")
    lab = Lab.objects.create(name="sim:old", inventory="sim:x.yaml")
    config = ClusterConfiguration.objects.create(source="yaml", raw_text="", normalized={}, organisation=org)
    stages = [{"name": n, "status": "succeeded", "attempts": 1} for n in ("preflight", "reproduce")]
    stages.append({"name": "report", "status": "succeeded", "attempts": 1})
    job = Job.objects.create(config_id=config.pk, lab_id=lab.pk, organisation_id=org.pk, status="failed",
                             findings={"job": {"stages": stages}})
    kept = StageRun.objects.create(job=job, name="preflight", order=0, status="succeeded",
                                   result={"ok": True})
    stopper = StageRun.objects.create(job=job, name="reproduce", order=1, status="succeeded",
                                      result={"stopped_job": "the engine refused the configuration"})
    report = StageRun.objects.create(job=job, name="report", order=2, status="succeeded", result={})

    new = migrate(latest())
    StageRun = new.get_model("jobs", "StageRun")
    Job = new.get_model("jobs", "DiagnosticJob")
    assert [StageRun.objects.get(pk=s.pk).status for s in (kept, stopper, report)] == [
        "succeeded", "stopped", "succeeded"]
    listed = [s["status"] for s in Job.objects.get(pk=job.pk).findings["job"]["stages"]]
    assert listed == ["succeeded", "stopped", "succeeded"]

    old = migrate(BEFORE)
    StageRun = old.get_model("jobs", "StageRun")
    Job = old.get_model("jobs", "DiagnosticJob")
    assert StageRun.objects.get(pk=stopper.pk).status == "succeeded"
    assert [s["status"] for s in Job.objects.get(pk=job.pk).findings["job"]["stages"]] == ["succeeded"] * 3
    migrate(latest())
