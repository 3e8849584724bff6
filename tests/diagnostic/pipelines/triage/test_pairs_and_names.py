"""The triage end to end on the simulated lab (in-process): pairs of faults, a lab whose
NICs are named differently (the fix names that lab's own devices), and SGLang's loader."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from diagnostic.pipelines.triage import run_triage
from lab.sim.scenario import rendezvous_needs

from .labs import FAULTS, customer, finding_codes, lab, scenario


@pytest.mark.parametrize("pair", list(itertools.combinations(FAULTS, 2)))
def test_two_faults_are_told_apart_and_proved_one_at_a_time_cumulatively(pair: tuple[str, str],
                                                                          tmp_path: Path) -> None:
    scn = scenario(seed=5)
    with lab(scn, tmp_path) as (_, session):
        result = run_triage(session, customer(scn, pair))
    section = result["section"]
    assert finding_codes(result) == list(pair)
    modes = [w["mode"] for w in section["waterfall"]]
    assert modes == ["baseline", "alone", "all"]
    first, last = section["waterfall"][1:]
    # The JIT-cache change goes last (its cache-filling start is cheapest then); otherwise
    # the cause that costs the most seconds first.
    expected = sorted(pair, key=lambda c: (c == "load.jit_compile", c != "load.weights_io"))
    assert [first["fixes"], last["fixes"]] == expected
    # The first change removes its own signature and leaves the other one; the second,
    # added to it, leaves none, and is every change together.
    assert first["signature_gone"] is True and first["signatures"] == [expected[1]]
    assert last["signatures"] == [] and last["cumulative"] == expected
    assert first["proved"] is last["proved"] is True
    assert last["step_delta_s"] < -5 and first["delta_s"] < -5
    assert section["after_s"] == last["cold_start_s"] < first["cold_start_s"]
    assert section["after_samples_s"] == pytest.approx(last["samples_s"], abs=0.06)
    # Each finding's impact is its own phase, on every true cold start without its change
    # against every one with it: two at least on each side, with Welch's interval
    # (METHODOLOGY.md, "Proof for cold starts"); one start was added for it.
    impact = {f["code"]: f["impact"] for f in result["findings"]}
    starts = {s["start"]: s for s in section["starts"]}
    for code in pair:
        shown = impact[code]
        assert shown["n_before"] >= 2 and shown["n_after"] >= 2, code
        assert shown["ci95"][1] < 0, code
        for side in ("before", "after"):
            for sample in shown["samples"][side]:
                assert starts[sample["start"]]["phases_s"][shown["metric"]] == sample["seconds"]
    assert sum(1 for s in section["starts"] if s["extra"]) == 1
    assert [s["lab_s"] > 0 for s in section["steps"]] == [True] * len(section["steps"])


def test_renamed_nics_get_their_own_names_in_the_fix(tmp_path: Path) -> None:
    nics = {"mgmt": "eno1", "mgmt_gbps": 10, "data": ["enp3s0f1np1", "enP4p2s0f1np1"]}
    scn = scenario(seed=6, nics=nics)
    with lab(scn, tmp_path) as (_, session):
        result = run_triage(session, customer(scn, ["load.rendezvous"]))
    assert finding_codes(result) == ["load.rendezvous"]
    env = result["findings"][0]["change"]["env"]
    assert env["NCCL_SOCKET_IFNAME"] == "eno1" and env["GLOO_SOCKET_IFNAME"] == "eno1"
    assert "NCCL_DEBUG" not in env  # the observation starts' variable stays out of the fix
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


def test_a_lab_whose_gloo_groups_need_their_interface_gets_gloo_socket_ifname(tmp_path: Path) -> None:
    """Nodes whose host name resolves to the wrong interface (LAB_MODEL.md section 5): the
    gloo CPU groups both engines open need GLOO_SOCKET_IFNAME too. A customer who set
    NCCL's two variables right still stalls at the rendezvous; the change is the gloo one."""
    nics = scenario(seed=16).node["nics"]
    needs = {**rendezvous_needs(nics), "GLOO_SOCKET_IFNAME": nics["mgmt"]}
    scn = scenario(seed=16, load={"rendezvous": {"needs": needs, "stall_s": 60.0}})
    config = customer(scn, [])  # NCCL's variables set the way the default lab needs them
    assert "GLOO_SOCKET_IFNAME" not in config["env"]
    with lab(scn, tmp_path) as (_, session):
        result = run_triage(session, config)
    assert finding_codes(result) == ["load.rendezvous"]
    change = result["findings"][0]["change"]
    assert change["env"] == {"GLOO_SOCKET_IFNAME": nics["mgmt"]}
    assert result["section"]["proved"] == ["load.rendezvous"]
    assert result["section"]["waterfall"][-1]["signatures"] == []
