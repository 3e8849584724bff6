"""The triage end to end on the simulated lab (in-process): pairs of faults, a lab whose
NICs are named differently (the fix names that lab's own devices), and SGLang's loader."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from diagnostic.pipelines.triage import run_triage

from .labs import FAULTS, customer, finding_codes, lab, scenario


@pytest.mark.parametrize("pair", list(itertools.combinations(FAULTS, 2)))
def test_two_faults_are_told_apart_and_proved_alone_and_together(pair: tuple[str, str],
                                                                  tmp_path: Path) -> None:
    scn = scenario(seed=5)
    with lab(scn, tmp_path) as (_, session):
        result = run_triage(session, customer(scn, pair))
    section = result["section"]
    assert finding_codes(result) == list(pair)
    modes = [w["mode"] for w in section["waterfall"]]
    assert modes == ["baseline", "alone", "alone", "all"]
    alone = section["waterfall"][1:3]
    assert [w["fixes"] for w in alone] == list(pair)
    # Each change alone removes its own signature and leaves the other one.
    for step, other in zip(alone, reversed(pair), strict=True):
        assert step["signature_gone"] is True
        assert step["signatures"] == [other]
    assert section["waterfall"][-1]["signatures"] == []
    assert section["after_s"] < min(w["cold_start_s"] for w in alone)
    assert [s["lab_s"] > 0 for s in section["steps"]] == [True] * len(section["steps"])


def test_renamed_nics_get_their_own_names_in_the_fix(tmp_path: Path) -> None:
    nics = {"mgmt": "eno1", "mgmt_gbps": 10, "data": ["enp3s0f1np1", "enP4p2s0f1np1"]}
    scn = scenario(seed=6, nics=nics)
    with lab(scn, tmp_path) as (_, session):
        result = run_triage(session, customer(scn, ["load.rendezvous"]))
    assert finding_codes(result) == ["load.rendezvous"]
    env = result["findings"][0]["change"]["env"]
    assert env["NCCL_SOCKET_IFNAME"] == "eno1"
    assert sorted(env["NCCL_IB_HCA"].split(",")) == ["roceP4p2s0f1", "rocep3s0f1"]
    assert result["section"]["proved"] == ["load.rendezvous"]
    assert result["section"]["waterfall"][-1]["signatures"] == []


def test_an_sglang_configuration_gets_the_loader_sglang_has(tmp_path: Path) -> None:
    scn = scenario(seed=14, engine="sglang")
    with lab(scn, tmp_path) as (_, session):
        result = run_triage(session, customer(scn, ["load.weights_io", "load.jit_compile"], engine="sglang"))
    assert finding_codes(result) == ["load.weights_io", "load.jit_compile"]
    loader = result["findings"][0]["change"]
    assert loader["config"] == {"serving.load_format": {"from": "auto", "to": "fastsafetensors"}}
    assert loader["flags"] == ["--load-format", "fastsafetensors"]
    assert result["section"]["proved"] == ["load.weights_io", "load.jit_compile"]
