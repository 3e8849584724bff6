"""Stalls the triage must not force into a class: one whose telemetry matches no known
signature, and stalls on a node whose telemetry sampler died mid-start (simulator faults
`silent_hang_s` and `sampler_dies_after_s`, lab/scenarios/README.md)."""

from __future__ import annotations

from pathlib import Path

from diagnostic.pipelines.triage import run_triage

from .labs import customer, finding_codes, lab, late_node, scenario

HANG_S = 120.0


def test_a_stall_with_no_known_signature_is_reported_unexplained_with_its_telemetry(tmp_path: Path) -> None:
    scn = scenario(seed=12, faults=[{"silent_hang_s": HANG_S}])
    with lab(scn, tmp_path) as (_, session):
        result = run_triage(session, customer(scn, []))
    assert finding_codes(result) == ["load.unexplained_stall"]
    assert result["config_changes"] == []
    finding = result["findings"][0]
    assert finding["change"] is None and finding["evidence"]["evidence_incomplete"] is False
    assert finding["evidence"]["silent_s"] >= HANG_S
    why = finding["evidence"]["why_not"]
    assert any("CPU is busy" in str(reasons) for reasons in why.values())
    stall = result["section"]["unexplained"][0]
    assert stall["cause"] == "unexplained" and len(stall["nodes"]) == 8
    # The head's window starts when the last rank had loaded (ranks start seconds apart).
    assert len(stall["telemetry"]["cpu_user_pct"]) >= HANG_S - 15
    assert result["section"]["root_causes"] == []


def test_a_node_whose_sampler_died_is_named_and_never_guessed(tmp_path: Path) -> None:
    base = scenario(seed=13)
    late = late_node(base)
    # The ranks meet right after the process starts (LAB_MODEL.md section 5): the sampler
    # dies inside the rendezvous stall, so the late node's window is mostly missing.
    scn = scenario(seed=13, faults=[{"sampler_dies_after_s": 30.0, "node": late}])
    with lab(scn, tmp_path) as (_, session):
        result = run_triage(session, customer(scn))
    codes = finding_codes(result)
    # The rendezvous needs the late node's own telemetry; it died, so no guess is made.
    assert "load.rendezvous" not in codes
    assert codes[:2] == ["load.weights_io", "load.jit_compile"]
    for finding in result["findings"][:2]:
        assert late in finding["evidence"]["evidence_incomplete"]
        assert late not in finding["evidence"]["attributed_from"]
    gap = next(f for f in result["findings"] if f["code"] == "load.unexplained_stall")
    assert gap["evidence"]["evidence_incomplete"] is True
    assert gap["evidence"]["nodes_without_telemetry"] == [late]
    assert "incomplete" in gap["title"]
    assert {c["finding"] for c in result["config_changes"]} == {"load.weights_io", "load.jit_compile"}
