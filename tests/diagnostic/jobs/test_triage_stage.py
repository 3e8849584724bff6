"""The triage stage in a whole diagnostic (`manage.py diagnose` on the simulated lab):
it takes reproduce's cold start as the customer's, proves its fixes, and its section and
findings land in findings.json, which the report reads."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command

from diagnostic.jobs.findings_document import validate_findings
from diagnostic.jobs.models import StageRun
from tests.diagnostic.conftest import REFERENCE_CONFIG, REFERENCE_SCENARIO
from tests.diagnostic.doubles import fast_scenario

pytestmark = pytest.mark.django_db(transaction=True)


def test_triage_proves_the_reference_story_from_reproduces_cold_start(tmp_path: Path,
                                                                      sim_state_dir: Path) -> None:
    scenario = fast_scenario(tmp_path, REFERENCE_SCENARIO)
    out = tmp_path / "out"
    call_command("diagnose", "--config", str(REFERENCE_CONFIG), "--lab", f"sim:{scenario}", "--out", str(out),
                 "--stages", "preflight,reproduce,triage", "--seed", "7", stdout=io.StringIO())
    document = json.loads((out / "findings.json").read_text())
    validate_findings(document)
    assert [s["name"] for s in document["job"]["stages"]] == ["preflight", "reproduce", "triage"]
    cold = document["cold_start"]
    reproduce = StageRun.objects.get(name="reproduce").result
    assert isinstance(reproduce, dict)
    # The customer's cold starts are reproduce's own and one more of ours (METHODOLOGY.md,
    # "Proof for cold starts": two a side), each start in the list of the day's starts.
    base = cold["waterfall"][0]
    assert base["n"] == 2 and base["samples_s"][0] == pytest.approx(reproduce["cold_start_s"], abs=0.1)
    assert cold["steps"][0]["lab_s"] == 0.0 and cold["steps"][1]["lab_s"] > 0
    names = [s["start"] for s in cold["starts"]]
    assert names[:2] == ["reproduce", "before"]  # in the order they were taken
    assert cold["starts"][0]["cold_start_s"] == pytest.approx(reproduce["cold_start_s"], abs=0.1)
    assert names[-2:] == ["proof: every proved change", "persisted JIT cache"]
    # One true cold start per step, each change added to the ones before it: the last step
    # is every change together, minutes faster, with no signature left.
    steps = cold["waterfall"][1:]
    assert [w.get("mode") for w in steps] == ["alone", "cumulative", "all"]
    # The last step's configuration was also the proof's start: two samples of the day's after.
    assert [w["n"] for w in steps] == [1, 1, 2]
    # The step before the kept-JIT-cache step filled that cache: no warm-up start.
    by_step = {s["step"]: s for s in cold["steps"]}
    assert by_step["persisted JIT cache"]["warm_up_lab_s"] == 0.0
    assert [len(w["cumulative"]) for w in steps] == [1, 2, 3]
    assert [w["fixes"] for w in steps] == ["load.weights_io", "load.rendezvous", "load.jit_compile"]
    assert all(w["signature_gone"] and w["proved"] and w["step_delta_s"] < 0 for w in steps)
    assert steps[-1]["signatures"] == [] and steps[-1]["delta_s"] < -300
    assert cold["after_samples_s"] == pytest.approx(steps[-1]["samples_s"], abs=0.06)
    assert cold["root_causes"] == ["load.weights_io", "load.jit_compile", "load.rendezvous"]
    assert cold["after_s"] == pytest.approx(145, abs=25)
    codes = [f["code"] for f in document["findings"]]
    assert codes == ["load.weights_io", "load.jit_compile", "load.rendezvous"]
    triage = StageRun.objects.get(name="triage").result
    assert isinstance(triage, dict)
    assert {c["finding"] for c in triage["config_changes"]} >= {"load.weights_io", "load.jit_compile"}
    csv = triage["artifacts"]["cold-start-telemetry.csv"]
    assert csv.startswith("run,node,t_s,epoch,")
    # diagnose writes it beside findings.json for the customer's own analysis.
    assert (out / "cold-start-telemetry.csv").read_text() == csv
