"""`manage.py diagnose` end to end against the simulated lab, and its errors.

The scenarios run at a higher time dilation than their files say, so a cold start of
ten lab minutes takes seconds; lab-time figures are unaffected (the session converts).
"""

from __future__ import annotations

import email
import email.policy
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from diagnostic.bookings.models import Lab
from diagnostic.jobs.findings_document import validate_findings
from diagnostic.jobs.models import DiagnosticJob, Finding
from diagnostic.jobs.report_versions import NO_BOOKING_CUSTOMER
from lab.sim.lab import SimLab
from reports.render import render
from tests.diagnostic.conftest import REFERENCE_CONFIG, REFERENCE_SCENARIO, REPO
from tests.diagnostic.doubles import fast_scenario
from tests.reports.conftest import pdf_text, squash

pytestmark = pytest.mark.django_db(transaction=True)


def diagnose(*args: str) -> tuple[str, dict[str, Any] | None, Path]:
    out = Path(args[args.index("--out") + 1])
    stdout = io.StringIO()
    call_command("diagnose", *args, stdout=stdout)
    return stdout.getvalue(), json.loads((out / "findings.json").read_text()), out


def test_it_reproduces_the_reference_configuration_and_writes_findings(
    tmp_path: Path, sim_state_dir: Path
) -> None:
    scenario = fast_scenario(tmp_path, REFERENCE_SCENARIO)
    printed, document, out = diagnose(
        "--config", str(REFERENCE_CONFIG), "--lab", f"sim:{scenario}", "--out", str(tmp_path / "out"),
        "--stages", "preflight,reproduce,report", "--seed", "7",
    )
    assert document is not None
    validate_findings(document)
    assert document["job"]["lab"] == "sim:reference-kimi-k2-8spark"
    assert document["job"]["status"] == "succeeded"
    assert document["job"]["seed"] == 7
    assert [s["status"] for s in document["job"]["stages"]] == ["succeeded"] * 3
    # LAB_MODEL.md: the out-of-box configuration takes 7.5+ minutes to start cold.
    assert document["cold_start"]["before_s"] >= 450
    assert document["cold_start"]["after_s"] is None
    assert (document["fp4"], document["speculative"], document["measurement"]) == (None, None, None)
    assert document["config"]["parallel"]["tp"] == 8
    # The out-of-box configuration's own problems (weight loading, the JIT compile, the
    # rendezvous, FP4 dispatch, speculative k) are for triage, fp4 and specdec, which this
    # run leaves out. What preflight and reproduce can say is that the lab and the start
    # were sound: nothing blocking, nothing of the lab's, no context that does not fit.
    assert not [f["code"] for f in document["findings"]
                if f["blocking"] or f["code"].startswith("lab.") or f["code"] == "load.kv_budget"]
    assert "reproduce    succeeded" in printed
    assert (out / "logs" / "01-reproduce.log").read_text().count("Loading safetensors checkpoint shards") > 3

    job = DiagnosticJob.objects.get(pk=document["job"]["id"])
    # Every finding there is came from a stage that ran, and the report does not present
    # the stages left out as clean: each of their sections says it was not run.
    assert not job.finding_set.exclude(stage__name__in=["preflight", "reproduce", "report"]).exists()
    assert job.finding_set.count() == len(document["findings"])
    text = squash(pdf_text(out / "report.pdf", layout=False))
    for section in ("3.2 FP4 correctness", "3.3 Speculative decoding", "3.4 Delivered throughput"):
        assert f"{section} Not run in this engagement." in text
    reproduce = job.stage_runs.get(name="reproduce").result
    assert reproduce["endpoint"].startswith("http://127.0.0.1:")
    assert len(reproduce["launch"]) == 8
    # The nodes' clocks agree with the platform's: no node's start time needed holding.
    corrections = reproduce["start_corrections_s"]
    assert sorted(corrections) == [f"spark-0{i}" for i in range(1, 9)]
    assert all(abs(c) < 1 for c in corrections.values()), corrections
    # The findings.json written when the job ended names the report version the PDF and
    # email carry: rendering it again gives the same version.
    message = email.message_from_bytes((out / "email.eml").read_bytes(), policy=email.policy.default)
    again = render(document, tmp_path / "again", customer=NO_BOOKING_CUSTOMER)
    assert str(message["X-Report-Version"]).strip() == again.digest
    samples = reproduce["telemetry"]["spark-01"]
    assert samples and {"t", "cpu", "mem", "disk_read_mbps", "net"} <= samples[0].keys()
    # The sampler ran from before the launch: the series covers the whole cold start.
    assert samples[-1]["t"] - samples[0]["t"] >= document["cold_start"]["before_s"] * 0.9


def test_an_inventory_lab_is_used_as_it_is_and_its_nodes_are_mirrored(tmp_path: Path) -> None:
    with SimLab(fast_scenario(tmp_path, REFERENCE_SCENARIO), tmp_path / "served") as sim:
        _, document, _ = diagnose(
            "--config", str(REFERENCE_CONFIG), "--lab", f"inventory:{sim.inventory_path}",
            "--out", str(tmp_path / "out"), "--stages", "preflight,report",
        )
    assert document is not None
    assert document["job"]["lab"] == "reference-kimi-k2-8spark"
    assert document["job"]["simulated"] is False  # nothing but its inventory is known
    assert document["cold_start"] is None
    lab = Lab.objects.get(name="reference-kimi-k2-8spark")
    assert lab.inventory == str(sim.inventory_path.resolve())
    assert lab.nodes.count() == 8
    assert lab.nodes.get(role="head").name == "spark-01"


def test_a_configuration_whose_kv_cache_does_not_fit_is_the_customers_finding_with_the_fix(
    tmp_path: Path, sim_state_dir: Path
) -> None:
    scenario = fast_scenario(tmp_path, REPO / "lab" / "scenarios" / "fault-kv-budget.yaml")
    out = tmp_path / "out"
    printed = io.StringIO()
    call_command("diagnose", "--config", str(REFERENCE_CONFIG), "--lab", f"sim:{scenario}",
                 "--out", str(out), "--stages", "preflight,reproduce,measure,report", stdout=printed)
    document = json.loads((out / "findings.json").read_text())
    validate_findings(document)
    assert [(s["name"], s["status"]) for s in document["job"]["stages"]] == [
        ("preflight", "succeeded"), ("reproduce", "succeeded"), ("measure", "succeeded"),
        ("report", "succeeded")]
    (finding,) = [f for f in document["findings"] if f["code"] == "load.kv_budget"]
    # Not our lab's failure (lab.engine_crash would make the engagement free on our account):
    # the configuration's context does not fit, and the engine said what would.
    assert not finding["blocking"] and not Finding.objects.get(code="load.kv_budget").blocking
    assert not [f for f in document["findings"] if f["code"].startswith("lab.")]
    evidence = finding["evidence"]
    assert evidence["max_model_len"] == 262144
    assert 0 < evidence["kv_available_gib"] < evidence["kv_needed_gib"]
    fits = evidence["estimated_max_model_len"]
    assert 0 < fits < 262144
    assert "retry" not in evidence
    assert finding["change"]["config"] == {"serving.max_model_len": {"from": 262144, "to": fits}}
    # The native context was tried first (a higher memory fraction, predicted from the engine's
    # figures): the engine refused again with the same KV memory, so the fault's fixed budget,
    # not the fraction, limits it, and the finding says so.
    tried = evidence["context"]["tried"]
    assert tried["settings"]["gpu_memory_utilization"] > 0.85
    assert tried["kv_budget"]["kv_available_gib"] == evidence["kv_available_gib"]
    assert "gave the KV cache no more memory" in finding["change"]["note"]
    # The day went on at the length that fits: it started (cold), and it was measured there.
    reproduce = DiagnosticJob.objects.get(pk=document["job"]["id"]).stage_runs.get(name="reproduce").result
    assert any(f"--max-model-len {fits}" in " ".join(spec["argv"]) for spec in reproduce["launch"])
    assert document["cold_start"]["before_s"] > 0
    assert document["measurement"]["code"]["n"] == 15
    # The tuned configuration carries that length, justified by the finding, in every form.
    (kv_change,) = [c for c in document["tuned"]["changes"] if c["path"] == "serving.max_model_len"]
    assert (kv_change["to"], kv_change["finding"]) == (fits, "load.kv_budget")
    assert document["tuned"]["config"]["serving"]["max_model_len"] == fits
    assert f"max_model_len: {fits}" in (out / "tuned-config.yaml").read_text()
    assert f"--max-model-len {fits}" in (out / "tuned-command.txt").read_text()
    assert f"+  max_model_len: {fits}" in (out / "tuned.diff").read_text()
    text = squash(pdf_text(out / "report.pdf", layout=False))
    assert f"serving.max_model_len: {fits}" in text
    assert "load.kv_budget" in printed.getvalue()


def test_it_refuses_a_configuration_with_an_error_naming_the_field(tmp_path: Path, db: None) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(REFERENCE_CONFIG.read_text().replace("kv_cache_dtype: fp8", "kv_cache_dtype: fp3"))
    with pytest.raises(CommandError, match=r"serving\.kv_cache_dtype"):
        call_command("diagnose", "--config", str(config), "--lab", f"sim:{REFERENCE_SCENARIO}",
                     "--out", str(tmp_path / "out"), stdout=io.StringIO())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lab", "ssh:spark-01"], "--lab must be sim:SCENARIO.yaml or inventory:FILE"),
        (["--lab", "sim:/no/such/scenario.yaml"], "cannot read /no/such/scenario.yaml"),
        (["--lab", "inventory:/no/such/inventory.yaml"], "cannot read"),
        (["--stages", "preflight,fp5"], "unknown stage 'fp5'; accepted: preflight, reproduce"),
    ],
)
def test_bad_arguments_are_one_clear_error(tmp_path: Path, db: None, args: list[str], message: str) -> None:
    base = {"--config": str(REFERENCE_CONFIG), "--lab": f"sim:{REFERENCE_SCENARIO}", "--out": str(tmp_path)}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    with pytest.raises(CommandError, match=message.replace("(", r"\(")):
        call_command("diagnose", *[x for kv in base.items() for x in kv], stdout=io.StringIO())


def test_queue_without_a_broker_says_what_to_set(tmp_path: Path, settings: Any) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = True
    with pytest.raises(CommandError, match="--queue needs CELERY_BROKER_URL"):
        call_command("diagnose", "--config", str(REFERENCE_CONFIG), "--lab", f"sim:{REFERENCE_SCENARIO}",
                     "--out", str(tmp_path), "--queue", stdout=io.StringIO())


def test_a_failure_is_one_line_on_stderr_and_a_nonzero_exit(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["DIAG_DB"] = str(tmp_path / "db.sqlite3")
    done = subprocess.run(
        [sys.executable, "manage.py", "diagnose", "--config", str(tmp_path / "missing.yaml"),
         "--lab", f"sim:{REFERENCE_SCENARIO}", "--out", str(tmp_path / "out")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "missing.yaml: cannot read (No such file or directory)" in lines[0]
