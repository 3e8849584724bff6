"""The specdec pipeline on the simulated lab over SSH: n-gram with a long draft (k = 8) is
slower than no speculation on both workloads, and the deployed setting is proved faster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from diagnostic.pipelines.specdec import run_specdec
from lab.engines import normalize_config
from lab.session import LabSession
from lab.sim.lab import SimLab
from tests.diagnostic.pipelines.specdec.test_sim_specdec import DILATION, SCENARIO, fixed_config

pytestmark = pytest.mark.ssh


def test_a_long_ngram_draft_is_harmful_on_both_workloads(tmp_path: Path) -> None:
    data: dict[str, Any] = yaml.safe_load(SCENARIO.read_text())
    data["dilation"] = DILATION
    data["seed"] = 11
    path = tmp_path / "ngram.yaml"
    path.write_text(yaml.safe_dump(data))
    raw = fixed_config(4)
    raw["speculative"] = {"method": "ngram", "num_speculative_tokens": 8}
    config = normalize_config(raw)
    with SimLab(path, tmp_path / "lab") as sim, LabSession.open(sim.inventory_path) as session:
        session.launch(config, cold=False)
        result = run_specdec(
            session, config, log=lambda _l: None, progress=lambda _p, _m: None, check_cancelled=lambda: None
        )
    section = result["section"]
    assert section["verdicts"] == {"code": "harmful", "prose": "harmful"}
    # Harm is the open question, so no speculation was confirmed: the verdict rests on n = 15 a side.
    for w in ("code", "prose"):
        assert section["none"][w]["phase"] == "confirm" and section["none"][w]["n"] == 15
    assert [f["code"] for f in result["findings"]] == ["specdec.harmful", "specdec.harmful"]
    for finding in result["findings"]:
        impact = finding["impact"]
        assert impact["ci95"][0] > 0  # the deployed setting is proved faster than the customer's
    assert section["chosen"]["method"] == "eagle3"  # the catalog's draft, not named by the customer
    assert [c["path"] for c in result["config_changes"]] == ["speculative"]
    # The budget is 4,500 lab s; confirmations are priced from the trials measured so far, and
    # with the machine's two cores busy (the suite's second worker) the last ones run longer
    # than priced: 4,580 seen once, 4,410 alone. The overshoot is an open item of issue 13.
    assert section["lab_time_s"] <= 4650
