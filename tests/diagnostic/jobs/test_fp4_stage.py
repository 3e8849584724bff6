"""The fp4 stage in a whole diagnostic (`manage.py diagnose` on the simulated reference
lab): garbage from the default backend, the fastest correct one chosen, and the section,
finding and change landing in findings.json as the report reads them."""

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


def test_the_fp4_stage_finds_garbage_and_the_fix(tmp_path: Path, sim_state_dir: Path) -> None:
    scenario = fast_scenario(tmp_path, REFERENCE_SCENARIO)
    out = tmp_path / "out"
    call_command("diagnose", "--config", str(REFERENCE_CONFIG), "--lab", f"sim:{scenario}", "--out", str(out),
                 "--stages", "preflight,reproduce,fp4", "--seed", "7", stdout=io.StringIO())
    document = json.loads((out / "findings.json").read_text())
    validate_findings(document)
    fp4 = document["fp4"]
    assert fp4["verdict"] == "garbage" and fp4["verdict_after"] == "correct"
    assert fp4["backend_before"] == "flashinfer_cutlass" and fp4["backend_after"] == "cutlass"
    assert [f["code"] for f in document["findings"]] == ["fp4.kernel_dispatch"]
    finding = document["findings"][0]
    assert finding["change"]["config"] == {"serving.moe_backend": {"from": "auto", "to": "cutlass"}}
    stage = StageRun.objects.get(name="fp4").result
    assert isinstance(stage, dict)
    assert [c["path"] for c in stage["config_changes"]] == ["serving.moe_backend"]
    assert stage["lab_time_s"] == fp4["lab_time_s"] > 0
