"""No speculation's screening trial may be the FP4 stage's runs of the same configuration:
taken when they follow the screening protocol on every workload, refused otherwise, and
recorded as a trial that names where its runs came from and cost no lab time here."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from diagnostic.pipelines.specdec.pipeline import CONFIRM, SCREEN, _Run
from diagnostic.pipelines.specdec.search import NO_SPECULATION

CONFIG = {"engine": {"name": "vllm", "version": "0.34.0"}, "workloads": ["code", "prose"],
          "speculative": {"method": "eagle3", "num_speculative_tokens": 4}}


def make_run() -> tuple[_Run, list[str]]:
    said: list[str] = []
    lab = SimpleNamespace(clock=SimpleNamespace(now=lambda: 0.0))

    def measure(*_a: Any, **_k: Any) -> dict[str, Any]:
        raise AssertionError("nothing is measured here")

    run = _Run(lab, CONFIG, log=said.append, progress=lambda _p, _m: None,  # type: ignore[arg-type]
               check_cancelled=lambda: None, budget_lab_s=4500.0, measure=measure, screen=SCREEN,
               confirm=CONFIRM)
    return run, said


def earlier(**protocol: int) -> dict[str, Any]:
    return {
        "source": "the FP4 stage (cutlass, without speculation)",
        "lab_s": 96.0,
        "protocol": {"n": 5, "warmup": 1, "max_tokens": 128, **protocol},
        "workloads": {
            "code": {"samples": [16.1, 16.3, 16.2, 16.0, 16.4], "mean_tps": 16.2, "ci95": [16.0, 16.4]},
            "prose": {"samples": [16.2, 16.1, 16.3, 16.2, 16.0], "mean_tps": 16.16, "ci95": [16.0, 16.3]},
        },
    }


def test_runs_with_the_screening_protocol_are_no_speculations_screen() -> None:
    run, said = make_run()
    assert run.adopt_screen(NO_SPECULATION, earlier())
    rows = run.screened[NO_SPECULATION]
    assert rows is not None and rows["code"]["samples"] == [16.1, 16.3, 16.2, 16.0, 16.4]
    assert all(r["measured_by"].startswith("the FP4 stage") and r["lab_s"] == 0.0 for r in run.trials)
    assert {r["workload"] for r in run.trials} == {"code", "prose"}
    assert run.runs_read()[NO_SPECULATION]["prose"] == [16.2, 16.1, 16.3, 16.2, 16.0]
    # Its runs price the trials to come (per-run overhead), with no restart observed.
    assert run.costs.per_run_fixed and not run.costs.restarts
    assert run.serving == NO_SPECULATION
    assert "not measured again" in said[-1]
    # Asking to screen it again reads the adopted runs: nothing is measured.
    got = run.screen(NO_SPECULATION, None)
    assert got is not None and got["code"] == pytest.approx(16.2) and got["prose"] == pytest.approx(16.16)


def test_runs_of_another_protocol_or_missing_a_workload_are_not_taken() -> None:
    run, _ = make_run()
    assert not run.adopt_screen(NO_SPECULATION, earlier(max_tokens=512))
    partial = earlier()
    del partial["workloads"]["prose"]
    assert not run.adopt_screen(NO_SPECULATION, partial)
    assert run.trials == [] and NO_SPECULATION not in run.screened


def test_the_specdec_stage_hands_on_the_fp4_stages_runs_of_its_chosen_backend() -> None:
    import json
    from pathlib import Path

    from diagnostic.jobs.stages.specdec import fp4_none_runs

    day = json.loads((Path(__file__).parents[3] / "reports" / "reference_day_28.json").read_text())
    ctx = SimpleNamespace(
        earlier_result=lambda name: {"sections": {"fp4": day["fp4"]}} if name == "fp4" else None)
    runs = fp4_none_runs(ctx)  # type: ignore[arg-type]
    assert runs is not None and runs["source"] == "the FP4 stage (cutlass, without speculation)"
    assert runs["protocol"] == {"n": 5, "warmup": 1, "max_tokens": 128}
    assert runs["workloads"]["code"]["samples"] == [15.7843, 16.7433, 16.1984, 16.8288, 17.4609]
    run, _ = make_run()
    assert run.adopt_screen(NO_SPECULATION, runs)
    # A day whose FP4 stage measured no rate (the default was correct) hands on nothing.
    quiet = {**day["fp4"], "backend_after": None}
    assert fp4_none_runs(SimpleNamespace(earlier_result=lambda _n: {"sections": {"fp4": quiet}})) is None  # type: ignore[arg-type]
