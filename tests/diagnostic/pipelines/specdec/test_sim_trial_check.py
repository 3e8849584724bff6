"""A trial measures only the setting it names: on the simulated lab over SSH, the stage reuses
the engine the previous stage left serving when its spec hash is the trial's (no restart),
and after a restart that did not take (the previous setting still serving) it sees the hash
mismatch on the nodes and restarts again before measuring; when the engine never runs the
trial's setting the trial is recorded unverified and nothing is measured."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diagnostic.pipelines.changes import apply_changes, change
from diagnostic.pipelines.specdec.pipeline import CONFIRM, SCREEN, _Run, speculative_block
from diagnostic.pipelines.specdec.search import Setting
from lab.session import LabSession
from lab.sim.lab import SimLab
from tests.diagnostic.pipelines.specdec.test_sim_specdec import SCENARIO, fixed_config

pytestmark = pytest.mark.ssh

DRAFT = "AQ-MedAI/Kimi-K2-Instruct-eagle3"


def with_setting(config: dict[str, Any], setting: Setting) -> dict[str, Any]:
    spec = speculative_block(setting, DRAFT, config.get("speculative"))
    return apply_changes(config, [change("speculative", config.get("speculative"), spec, finding="t")])


@pytest.fixture
def session(tmp_path: Path) -> Iterator[LabSession]:
    with SimLab(SCENARIO, tmp_path / "lab") as sim, LabSession.open(sim.inventory_path) as s:
        yield s


def make_run(session: LabSession, config: dict[str, Any]) -> _Run:
    def measure(_lab: LabSession, **options: Any) -> dict[str, Any]:
        return {w: {"mean_tps": 20.0, "ci95": [19.0, 21.0], "decode": {"samples": [19.5, 20.5]}}
                for w in options["workloads"]}

    return _Run(session, config, log=lambda _m: None, progress=lambda _p, _m: None,
                check_cancelled=lambda: None, budget_lab_s=4500.0, measure=measure,
                screen=SCREEN, confirm=CONFIRM)


def test_the_engine_already_serving_the_setting_is_measured_without_a_restart(session: LabSession) -> None:
    config = fixed_config(4)
    session.launch(config, cold=False)  # what the previous stage left serving
    run = make_run(session, config)
    launches: list[Any] = []
    real = session.launch
    session.launch = lambda *a, **k: launches.append(a) or real(*a, **k)  # type: ignore[method-assign]
    rows = run.trial(Setting("eagle3", 4), "confirm", config["speculative"])
    assert rows is not None and launches == []
    assert rows["code"]["restarted"] is False and rows["code"]["nodes_verified"] == 8
    assert rows["code"]["restart_s"] < 30.0  # two status round trips, not a warm start (~150)
    # Another setting restarts; then it is what serves.
    k2 = Setting("eagle3", 2)
    rows = run.trial(k2, "screen", speculative_block(k2, DRAFT, config["speculative"]))
    assert rows is not None and len(launches) == 1 and rows["code"]["restarted"] is True
    assert session.serves(with_setting(config, k2)) and not session.serves(config)


def test_a_restart_that_did_not_take_is_seen_and_taken_again(session: LabSession) -> None:
    config = fixed_config(4)
    session.launch(config, cold=False)
    run = make_run(session, config)
    real = session.launch
    calls: list[int] = []

    def flaky(*a: Any, **k: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            return None  # the restart "succeeded" but the old engine still runs
        return real(*a, **k)

    session.launch = flaky  # type: ignore[method-assign]
    k3 = Setting("eagle3", 3)
    served: list[bool] = []
    run.measure_fn = lambda lab, **o: (  # type: ignore[assignment]
        served.append(lab.serves(with_setting(config, k3)))
        or {w: {"mean_tps": 20.0, "ci95": None, "decode": {"samples": [19.5, 20.5]}} for w in o["workloads"]}
    )
    rows = run.trial(k3, "screen", speculative_block(k3, DRAFT, config["speculative"]))
    assert rows is not None and len(calls) == 2
    assert "different configuration" in rows["code"]["mismatch_after_restart"]
    assert served == [True]  # measured only once the nodes ran k = 3's spec


def test_an_engine_that_never_runs_the_setting_is_not_measured(session: LabSession) -> None:
    config = fixed_config(4)
    session.launch(config, cold=False)
    run = make_run(session, config)
    session.launch = lambda *a, **k: None  # type: ignore[method-assign]
    measured: list[int] = []
    run.measure_fn = lambda lab, **o: measured.append(1) or {}  # type: ignore[assignment]
    k2 = Setting("eagle3", 2)
    assert run.trial(k2, "screen", speculative_block(k2, DRAFT, config["speculative"])) is None
    assert measured == []
    failed = [t for t in run.trials if t.get("status") == "unverified"]
    assert {t["workload"] for t in failed} == {"code", "prose"}
    assert "different configuration" in failed[0]["error"]
