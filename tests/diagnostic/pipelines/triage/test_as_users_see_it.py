"""A configuration that keeps its JIT cache, measured as its users see it: the fresh lab's
first start (reproduce's) compiles once; the triage notes that compile and measures a
later true cold start (page cache dropped, cache volume kept) instead of calling the
one-time compile a fault. And reproduce's evidence is used only when it is a true cold
start of the very configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from diagnostic.pipelines.triage import run_triage
from lab.session import LabSession

from .labs import customer, finding_codes, lab, scenario
from .test_one_fault import FIXED_S, TOLERANCE_S


def reproduce_like(session: LabSession, config: dict[str, Any]) -> dict[str, Any]:
    """What the reproduce stage keeps of the customer's cold start (diagnostic/jobs/reproduce.py)."""
    session.push_agent()
    session.start_sampler()
    since = session.clock.now()
    launched = session.launch(config, cold=True)
    telemetry = session.telemetry(since=since)
    session.stop_sampler()
    return {
        "launched": True, "warm": launched.warm, "cold_start_s": launched.cold_start_s,
        "started_at": launched.started_at, "ready_at": launched.ready_at,
        "start_corrections_s": launched.start_corrections_s,
        "launch": [{k: s.get(k) for k in ("node", "role", "rank", "argv", "env", "log_file")}
                   for s in launched.specs],
        "telemetry": telemetry, "telemetry_stride": dict.fromkeys(telemetry, 1),
    }


def test_a_kept_jit_cache_compiles_once_and_that_is_a_note_not_a_finding(tmp_path: Path) -> None:
    scn = scenario(seed=21)
    config = customer(scn, ["load.rendezvous"])
    assert config["serving"]["jit_cache"] == "persisted"
    with lab(scn, tmp_path) as (_, session):
        first = reproduce_like(session, config)
        result = run_triage(session, config, reproduce=first)
    # The fresh lab's first start compiled: 140 s more than a start with a warm cache.
    assert first["cold_start_s"] == pytest.approx(FIXED_S + 60 + 140, abs=TOLERANCE_S)
    assert finding_codes(result) == ["load.rendezvous"]
    section = result["section"]
    assert section["before_s"] == pytest.approx(FIXED_S + 60, abs=TOLERANCE_S)
    assert section["waterfall"][0]["lab_s"] > 0, "measured again, not reproduce's first boot"
    assert any("compiled kernels for 150 s" in note for note in section["notes"])


def test_reproduce_evidence_of_another_configuration_is_not_used(tmp_path: Path) -> None:
    scn = scenario(seed=22)
    config = customer(scn, ["load.jit_compile"])
    with lab(scn, tmp_path) as (_, session):
        other = reproduce_like(session, customer(scn, ["load.weights_io"]))
        logs: list[str] = []
        result = run_triage(session, config, reproduce=other, log=logs.append)
    assert any("reproduce launched a different configuration" in line for line in logs)
    assert finding_codes(result) == ["load.jit_compile"]
    assert result["section"]["waterfall"][0]["lab_s"] > 0
