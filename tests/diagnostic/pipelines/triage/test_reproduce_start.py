"""The customer's cold start is reproduce's own when its evidence names every stall: the
triage attributes on it and pays for no customer start of its own. The step before the
kept-JIT-cache step fills that cache with its own compile, so that step needs no warm-up
start; on a lab whose cache volume was filled already (an earlier day), that start is the
later step's and the step is measured again without the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from diagnostic.pipelines.triage import coldstart as cs
from diagnostic.pipelines.triage import run_triage
from lab.session import LabSession

from .labs import FAULTS, customer, finding_codes, lab, scenario
from .test_one_fault import FIXED_S, TOLERANCE_S


def reproduce_start(session: LabSession, config: dict[str, Any], *,
                    drop_telemetry: str = "") -> dict[str, Any]:
    """What the reproduce stage keeps of the customer's cold start, with the log ends and
    launch time it records before launching (diagnostic/jobs/reproduce.py)."""
    session.push_agent()
    session.start_sampler()
    since = session.clock.now()
    nodes = [spec["node"] for spec in session.specs_for(config)]
    offsets = cs.launch_offsets(nodes)
    launched_from = session.clock.now() - 2.0
    launched = session.launch(config, cold=True)
    telemetry = session.telemetry(since=since)
    session.stop_sampler()
    telemetry.pop(drop_telemetry, None)
    return {
        "launched": True, "warm": launched.warm, "cold_start_s": launched.cold_start_s,
        "started_at": launched.started_at, "ready_at": launched.ready_at,
        "start_corrections_s": launched.start_corrections_s,
        "launch": [{k: s.get(k) for k in ("node", "role", "rank", "argv", "env", "log_file")}
                   for s in launched.specs],
        "telemetry": telemetry, "telemetry_stride": dict.fromkeys(telemetry, 1),
        "log_offsets": offsets, "launched_from": launched_from,
    }


def _steps(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["step"]: s for s in result["section"]["steps"]}


def test_reproduces_start_decides_alone_and_the_step_before_fills_the_kept_cache(tmp_path: Path) -> None:
    scn = scenario(seed=31)
    config = customer(scn, FAULTS)
    logs: list[str] = []
    with lab(scn, tmp_path) as (_, session):
        first = reproduce_start(session, config)
        result = run_triage(session, config, reproduce=first, log=logs.append, baseline_repeats=1)
    section = result["section"]
    assert sorted(finding_codes(result)) == sorted(FAULTS)
    assert section["proved"] and sorted(section["proved"]) == sorted(FAULTS)
    base = section["waterfall"][0]
    assert base["n"] == 1 and base["samples_s"][0] == pytest.approx(first["cold_start_s"], abs=0.1)
    assert base["lab_s"] == 0.0, "no customer start of the triage's own"
    assert any("attributing on reproduce's start" in line for line in logs)
    steps = _steps(result)
    jit = steps["persisted JIT cache"]
    assert jit["warm_up_lab_s"] == 0.0, "the step before filled the cache: no warm-up start"
    filled = [s for s in steps.values() if s.get("fills_jit_cache")]
    assert len(filled) == 1
    # That start compiled as one without the cache does: its step shows the JIT stall, and
    # the cache-keeping step after it does not.
    compiling = [w for w in section["waterfall"][1:-1]]
    assert "load.jit_compile" in compiling[-1]["signatures"]
    assert section["waterfall"][-1]["signatures"] == []
    assert section["after_s"] == pytest.approx(FIXED_S, abs=TOLERANCE_S)
    # Four starts in all: one per step, and one for the proof of the phases (the last step
    # without the loader change: the loader's second start without it, the JIT cache's
    # second with it), taken before the last step so that the last start is the one handed on.
    assert sum(1 for s in steps.values() if s["lab_s"] > 0) == 4
    proof = [name for name in steps if name.startswith("proof: ")]
    assert proof == ["proof: every proved change but an eager safetensors loader"]
    assert list(steps)[-1] == "persisted JIT cache"


def test_a_cache_filled_on_an_earlier_day_is_the_later_steps_start(tmp_path: Path) -> None:
    scn = scenario(seed=32)
    config = customer(scn, FAULTS)
    logs: list[str] = []
    with lab(scn, tmp_path) as (_, session):
        run_triage(session, config, reproduce=reproduce_start(session, config), baseline_repeats=1)
        # The same lab on another day: its cache volume kept the compiled kernels.
        again = reproduce_start(session, config)
        result = run_triage(session, config, reproduce=again, log=logs.append, baseline_repeats=1)
    section = result["section"]
    assert sorted(section["proved"]) == sorted(FAULTS)
    assert any("the kept JIT cache was filled already" in line for line in logs)
    steps = _steps(result)
    jit = steps["persisted JIT cache"]
    assert jit.get("measured_by_step_before") is True and jit["lab_s"] == 0.0
    before_jit = [w for w in section["waterfall"] if w.get("fixes") != "load.jit_compile"][-1]
    assert "load.jit_compile" in before_jit["signatures"], "measured again without the cache"
    assert section["after_s"] == pytest.approx(FIXED_S, abs=TOLERANCE_S)


def test_reproduce_evidence_with_a_gap_is_checked_on_a_start_of_our_own(tmp_path: Path) -> None:
    scn = scenario(seed=33)
    # Without a kept JIT cache, so reproduce's start is the customer's (not a first boot).
    config = customer(scn, ["load.weights_io", "load.jit_compile"])
    logs: list[str] = []
    with lab(scn, tmp_path) as (_, session):
        node = session.specs_for(config)[-1]["node"]
        first = reproduce_start(session, config, drop_telemetry=node)
        result = run_triage(session, config, reproduce=first, log=logs.append, baseline_repeats=1)
    assert any("measuring one of our own to attribute on" in line for line in logs)
    base = result["section"]["waterfall"][0]
    assert base["n"] == 2 and base["lab_s"] > 0
    assert sorted(finding_codes(result)) == ["load.jit_compile", "load.weights_io"]
