"""The three look-alike faults on every modelled release (LAB_MODEL.md sections 5 and 9):
vLLM 0.29.0 (0.34.0 is every other test's), SGLang 0.5.12 and 0.5.23, each speaking its
own lines in the real phase order (the ranks meet before any weight is read; no release
writes a stamped line while they wait). The triage finds each fault from that evidence,
proves each change, and leaves the lab serving the configuration it hands on: NCCL's
INFO lines are asked for only where a rendezvous may still show."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnostic.pipelines.changes import apply_changes
from diagnostic.pipelines.triage import run_triage

from .labs import FAULTS, customer, finding_codes, lab, late_node, scenario
from .test_one_fault import FIXED_S, TOLERANCE_S

# The loader first (the most seconds), the NCCL names next, the JIT cache last.
ORDER = ["load.weights_io", "load.rendezvous", "load.jit_compile"]


@pytest.mark.parametrize(("engine", "version"), [("vllm", "0.29.0"), ("sglang", "0.5.12"),
                                                 ("sglang", "0.5.23")])
def test_each_release_shows_the_three_faults_apart(engine: str, version: str, tmp_path: Path) -> None:
    scn = scenario(seed=15, engine=engine, version=version)
    config = customer(scn, engine=engine, version=version)
    assert config["engine"] == {"name": engine, "version": version}
    with lab(scn, tmp_path) as (_, session):
        result = run_triage(session, config)
        handed_on = apply_changes(config, result["config_changes"])
        # The last step's start was launched as the configuration renders (no NCCL_DEBUG),
        # so the next stage finds its configuration serving and starts nothing.
        assert session.serves(handed_on)
        assert all("NCCL_DEBUG" not in spec["env"] for spec in session.specs_for(handed_on))
    section = result["section"]
    assert finding_codes(result) == list(FAULTS)
    assert section["proved"] == ORDER
    assert [w["fixes"] for w in section["waterfall"][1:]] == ORDER
    assert section["waterfall"][-1]["signatures"] == []
    # 60 s of rendezvous stall, an mmap loader and a cold compile: ~560 s; ~150 s after.
    assert section["before_s"] == pytest.approx(560, abs=TOLERANCE_S)
    assert section["after_s"] == pytest.approx(FIXED_S, abs=TOLERANCE_S)
    rendezvous = next(f for f in result["findings"] if f["code"] == "load.rendezvous")
    assert rendezvous["evidence"]["late_node"] == late_node(scn)
    # The customer's start was the triage's own, with NCCL_DEBUG=INFO: the late node's
    # NCCL logged its bootstrap retries in its own `retrying (n/m)` form.
    assert rendezvous["evidence"]["bootstrap_retries"] >= 2
    env = rendezvous["change"]["env"]
    assert "NCCL_DEBUG" not in env
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == scn.node["nics"]["mgmt"]
