"""`manage.py calibrate`: one real calibration day on a simulated lab writes the lab's
baseline with exactly what the day measured (the tuned configuration's rates, its true
cold starts, the configuration itself and the nodes it ran on); bad input is told in one
line naming the option, before any lab starts."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

from diagnostic.jobs.management.commands.calibrate import CALIBRATE_STAGES
from diagnostic.jobs.models import DiagnosticJob, StageRun
from diagnostic.jobs.tuning import tuned_section
from lab.baseline import baseline_dir_for, best_known, find_baseline, node_fingerprint
from tests.diagnostic.conftest import REFERENCE_CONFIG, REFERENCE_SCENARIO

KIMI = "moonshotai/Kimi-K2-Instruct-0905"
# Lab seconds per wall second: the whole day in about a minute. The test checks that the
# file holds what the job measured, not the figures themselves. At 400 a busy machine's
# wall-time overheads (a few seconds) spent the triage's lab-time budget (1,870 of 2,029 lab
# s on the customer's two starts) before it proved the lab's NCCL names, and nothing was
# tuned to measure.
DILATION = 150


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    """The reference scenario in a folder of the test's own, so its baselines land there."""
    path = tmp_path / "scenarios" / REFERENCE_SCENARIO.name
    path.parent.mkdir()
    path.write_text(REFERENCE_SCENARIO.read_text())
    return path


@pytest.mark.django_db(transaction=True)
@pytest.mark.ssh
def test_calibrate_writes_what_the_day_measured(scenario: Path, tmp_path: Path, sim_state_dir: Path) -> None:
    out = io.StringIO()
    call_command("calibrate", "--lab", f"sim:{scenario}", "--model", KIMI, "--dilation", str(DILATION),
                 "--seed", "2", "--out", str(tmp_path / "cal"), stdout=out)
    text = out.getvalue()
    folder = baseline_dir_for(None, scenario)
    lookup = find_baseline(folder, model=KIMI, nodes=8, engine="vllm", version="0.34.0")
    baseline = lookup.baseline
    assert baseline is not None and lookup.problems == [] and baseline.version == 1
    assert baseline.path == folder / "moonshotai-kimi-k2-instruct-0905-8n-vllm-0.34.0" / "v1.yaml"
    assert f"wrote {baseline.path}" in text and "cold start" in text

    # The day started from the firm's best-known configuration and ran the day's stages.
    start = yaml.safe_load((tmp_path / "cal" / "start-config.yaml").read_text())
    assert start == best_known(KIMI, 8, "vllm")
    assert baseline.job is not None
    job = DiagnosticJob.objects.get(pk=baseline.job)
    assert job.status == DiagnosticJob.Status.SUCCEEDED
    assert list(job.stage_runs.order_by("order").values_list("name", flat=True)) == list(CALIBRATE_STAGES)
    assert baseline.lab == "reference-kimi-k2-8spark" and baseline.source == "calibrate"

    # Rates: the measure stage's tuned measurement, as recorded.
    measure: dict[str, Any] = job.stage_runs.get(name="measure").result or {}
    assert measure["tuned_measured"]  # the lab's own NCCL names at least were proved
    section = measure["sections"]["measurement"]["tuned"]
    for workload in ("code", "prose"):
        row = job.measurements.get(configuration="tuned", workload=workload)
        rate = baseline.rates[workload]
        assert rate["n"] == row.n == 15
        assert rate["mean_tps"] == pytest.approx(row.mean_tps, abs=1e-9)
        assert rate["ci95"] == pytest.approx([row.ci95_low, row.ci95_high], abs=1e-9)
        assert rate["samples"] == pytest.approx(section[workload]["decode"]["samples"], abs=1e-9)
        assert len(rate["samples"]) == 15
        assert rate["ci95"][0] <= rate["mean_tps"] <= rate["ci95"][1]

    # The cold starts and the lab time are the findings' own; the configuration is the tuned one.
    findings = json.loads((tmp_path / "cal" / "day" / "findings.json").read_text())
    samples = findings["cold_start"]["after_samples_s"]
    assert baseline.cold_start["samples"] == pytest.approx(samples)
    assert baseline.cold_start["n"] == len(samples) >= 2
    assert baseline.cold_start_s == pytest.approx(findings["cold_start"]["after_s"], abs=1e-3)
    assert baseline.lab_time_s == pytest.approx(findings["job"]["lab_time_s"], abs=0.1)
    tuned = tuned_section(job)
    assert tuned is not None and baseline.config == tuned["config"]
    assert set(baseline.config["env"]) >= {"NCCL_SOCKET_IFNAME", "NCCL_IB_HCA"}

    # The fingerprint is the one of the nodes the preflight saw.
    preflight = job.stage_runs.get(name="preflight", status=StageRun.Status.SUCCEEDED).result
    assert isinstance(preflight, dict)
    assert baseline.nodes_fingerprint == node_fingerprint(preflight["nodes"])
    for line in (f"code   {baseline.rates['code']['mean_tps']:.2f} tok/s",
                 f"cold start {baseline.cold_start['mean_s']:.1f} lab s"):
        assert line in text


@pytest.mark.parametrize(("argv", "words"), [
    (["--lab", "lab/scenarios/nowhere"], "--lab must be sim:SCENARIO.yaml"),
    (["--lab", "sim:/no/such/scenario.yaml"], "--lab sim:/no/such/scenario.yaml: cannot read the scenario"),
    (["--lab", "inventory:/no/such/inventory.yaml"], "--lab inventory:/no/such/inventory.yaml"),
    (["--engine", "trt==1.0"], "--engine must be NAME or NAME==VERSION with NAME one of vllm, sglang"),
    (["--engine", "vllm=="], "--engine must be NAME or NAME==VERSION"),
    (["--dilation", "0"], "--dilation must be a positive number"),
    (["--model", "someone/unknown"], "--model someone/unknown: the firm has no best-known configuration "
                                     "for 8 nodes with vllm (it has none for someone/unknown); give a "
                                     "starting one with --config FILE"),
    (["--engine", "sglang"], "--engine sglang: the lab runs vllm 0.34.0; give its version too"),
    (["--config", str(REFERENCE_CONFIG), "--engine", "sglang==0.5.23"],
     "runs vllm 0.34.0, but --engine is sglang==0.5.23"),
    (["--config", str(REFERENCE_CONFIG), "--model", "nvidia/DeepSeek-V3-0324-FP4"],
     "model.id is moonshotai/Kimi-K2-Instruct-0905, but --model is nvidia/DeepSeek-V3-0324-FP4"),
    (["--config", "/no/such/config.yaml"], "--config /no/such/config.yaml: cannot read"),
])
def test_bad_input_names_the_option(argv: list[str], words: str, tmp_path: Path) -> None:
    options = {"--lab": f"sim:{REFERENCE_SCENARIO}", "--model": KIMI}
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        options[flag] = value
    flat = [x for pair in options.items() for x in pair]
    with pytest.raises(CommandError) as caught:
        call_command("calibrate", *flat, "--out", str(tmp_path / "cal"), stdout=io.StringIO())
    assert words in str(caught.value)
    assert not (tmp_path / "cal").exists()  # told before anything was started or written
