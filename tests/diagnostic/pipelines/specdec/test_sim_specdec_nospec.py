"""The specdec pipeline on the simulated lab over SSH: a configuration without speculation, on
a lab whose EAGLE-3 draft accepts more than the reference's, where speculation helps both
workloads. The stage must find it with the catalog's draft (the customer names none), prove
it faster than no speculation, deploy it, and give the money-back rule an improvement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from diagnostic.pipelines.specdec import run_specdec
from lab.engines import normalize_config
from lab.session import LabSession
from lab.sim.lab import SimLab
from reports.moneyback import assess
from tests.diagnostic.pipelines.specdec.test_sim_specdec import SCENARIO, fixed_config

pytestmark = pytest.mark.ssh

# Higher acceptance than the reference on code (by the formula 30.4 tok/s at k = 3, 29.6 at
# k = 4) and lower on prose (22.2 and 22.3 tok/s at k = 1 and 2); no speculation stays 16.2.
ACCEPTANCE = {
    "code": [0.9, 0.84, 0.76, 0.62, 0.45, 0.3, 0.2],
    "prose": [0.7, 0.48, 0.3, 0.2, 0.12],
}


def test_speculation_is_found_for_a_configuration_without_it(tmp_path: Path) -> None:
    data: dict[str, Any] = yaml.safe_load(SCENARIO.read_text())
    # Below the other specdec tests' dilation: a 128-token screen is ~50 ms of wall time at
    # 120, where a busy machine's stall made prose's five no-speculation runs too spread to
    # prove a 37 % gain once in a full run; at 60 the same stall weighs half as much.
    data["dilation"] = 60
    data["seed"] = 23
    data["truth"]["specdec"]["acceptance"]["eagle3"] = ACCEPTANCE
    path = tmp_path / "no-speculation.yaml"
    path.write_text(yaml.safe_dump(data))
    raw = fixed_config(4)
    raw["speculative"] = None
    config = normalize_config(raw)
    assert config["speculative"] is None
    with SimLab(path, tmp_path / "lab") as sim, LabSession.open(sim.inventory_path) as session:
        session.launch(config, cold=False)
        # The simulated lab's own catalog (written beside its inventory) holds the draft.
        held = session.inventory.catalog.model(config["model"]["id"]).draft(  # type: ignore[union-attr]
            "AQ-MedAI/Kimi-K2-Instruct-eagle3", "eagle3")
        assert held is not None
        result = run_specdec(
            session, config, log=lambda _l: None, progress=lambda _p, _m: None, check_cancelled=lambda: None
        )
    section = result["section"]
    assert section["customer"]["method"] == "none"
    assert "draft catalog" in section["space"]["notes"]["eagle3"]
    assert "the lab's copy of AQ-MedAI/Kimi-K2-Instruct-eagle3" in section["space"]["notes"]["eagle3"]
    assert section["verdicts"] == {"code": "suboptimal", "prose": "suboptimal"}
    for w in ("code", "prose"):
        best = section["best"][w]
        assert best["method"] == "eagle3" and not best["kept_customer"]
        assert best["customer_vs_none"] is None  # the customer's setting is no speculation
        assert best["vs_none"]["faster"] and best["vs_customer"]["faster"]
    # Within 5 % of each workload's peak by the formula (code k = 2..5, prose k = 1..3):
    # five screening runs of 128 tokens at this dilation are a few wall milliseconds each, so
    # how close to the peak the search lands is the benchmark's question (bench_specdec.py).
    assert 2 <= section["best"]["code"]["k"] <= 5
    assert 1 <= section["best"]["prose"]["k"] <= 3
    chosen = section["chosen"]
    assert chosen["method"] == "eagle3"
    [config_change] = result["config_changes"]
    assert config_change["path"] == "speculative" and config_change["from"] is None
    # Named by the lab's path: the nodes run offline, where the hub id would not load.
    assert config_change["to"]["draft_model"] == held.path
    assert config_change["to"]["num_speculative_tokens"] == chosen["k"]
    assert "--speculative-config" in section["deployed"]["launch_syntax"]
    assert "speculation off" in section["customer_launch_syntax"]
    assert [f["code"] for f in result["findings"]] == ["specdec.suboptimal", "specdec.suboptimal"]
    for finding in result["findings"]:
        assert finding["change"]["config"] == {"speculative": {"from": None, "to": config_change["to"]}}
        flags = finding["change"]["flags"]  # the deployed setting in the customer's launch syntax
        assert flags[0] == "--speculative-config" and f'"num_speculative_tokens": {chosen["k"]}' in flags[1]
        assert finding["impact"]["ci95"][0] > 0
    money_back = assess({"findings": result["findings"], "speculative": section})
    shown = [i for i in money_back.improvements if i.demonstrated]
    assert {i.code for i in shown} == {"specdec.suboptimal"} and len(shown) == 2
    assert section["lab_time_s"] <= 4500
    assert section["lab_time_s"] < section["sweep_estimate_s"] / 3
