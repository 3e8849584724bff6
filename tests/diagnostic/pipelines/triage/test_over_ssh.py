"""The reference story end to end over loopback SSH, the way `diagnose --lab sim:` reaches
the lab: the out-of-box configuration, three causes, each fix proved."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnostic.pipelines.triage import run_triage

from .labs import FAULTS, customer, lab, scenario


def test_the_reference_story_over_loopback_ssh(tmp_path: Path) -> None:
    """The out-of-box configuration on the reference lab: ~560 s, three causes, ~145 s."""
    scn = scenario(seed=7, dilation=200.0)
    with lab(scn, tmp_path, ssh=True) as (_, session):
        result = run_triage(session, customer(scn))
    section = result["section"]
    assert section["root_causes"] == list(FAULTS)
    assert section["before_s"] == pytest.approx(560, abs=25)
    assert section["after_s"] == pytest.approx(145, abs=20)
    assert [w.get("mode") for w in section["waterfall"]] == ["baseline", "alone", "cumulative", "all"]
    # The loader (the most seconds) first, the NCCL names next, the JIT cache last.
    assert [w["fixes"] for w in section["waterfall"][1:]] == [
        "load.weights_io", "load.rendezvous", "load.jit_compile"]
    assert section["waterfall"][-1]["signatures"] == []
    rendezvous = next(f for f in result["findings"] if f["code"] == "load.rendezvous")
    assert rendezvous["evidence"]["late_node"] in scn.node_names[1:]
    assert rendezvous["evidence"]["bootstrap_retries"] >= 2
    header, *rows = result["telemetry_csv"].splitlines()
    assert header.startswith("run,node,t_s,epoch,cpu_user_pct")
    assert {row.split(",")[0] for row in rows} == {"before", "after"}
    assert {row.split(",")[1] for row in rows} == set(scn.node_names)
