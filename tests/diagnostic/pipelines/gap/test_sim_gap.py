"""The gap stage on a simulated lab over SSH: configurations that differ from the lab's
best in one or two fields the four pipelines do not look at (the parallel layout, eager
mode, the memory fraction, the KV cache dtype, an extra flag), and one already at the
baseline. Every costly difference is found, proved alone with Welch's interval and put in
the tuned configuration; where nothing costs there is no finding, and where nothing
differs no lab time is spent.

One lab serves the module: the baseline is measured on it once, as calibration would
(two true cold starts, n = 15 per workload), and each test starts from whatever the
previous one left serving, as a stage does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from diagnostic.pipelines.gap import GapBaseline, run_gap
from lab.session import LabSession
from lab.sim.lab import SimLab
from reports.moneyback import assess
from tests.diagnostic.pipelines.gap.simgap import best_config, measure_baseline, scenario_file, variant

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LabSession, GapBaseline]]:
    tmp = tmp_path_factory.mktemp("gap")
    with SimLab(scenario_file(tmp), tmp / "lab") as sim, LabSession.open(sim.inventory_path) as session:
        yield session, measure_baseline(session, best_config())


def gap(lab: tuple[LabSession, GapBaseline], config: dict[str, Any], **options: Any) -> dict[str, Any]:
    session, baseline = lab
    options.setdefault("current_cold", baseline.cold_samples()[:1])
    return run_gap(session, config, baseline, log=lambda _l: None, progress=lambda _p, _m: None,
                   check_cancelled=lambda: None, **options)


def proved_paths(result: dict[str, Any]) -> set[str]:
    return {p["path"] for p in result["section"]["proved"]}


def check_proved(result: dict[str, Any], codes: set[str]) -> None:
    assert {f["code"] for f in result["findings"]} == codes
    for finding in result["findings"]:
        impact = finding["impact"]
        assert impact["ci95"][0] > 0 and impact["after"] > impact["before"] and impact["better"] == "higher"
        assert impact["n_before"] == impact["n_after"] == 15
    money = assess({"findings": result["findings"]})
    assert {i.code for i in money.improvements if i.demonstrated} == codes


def test_eager_mode_is_found_proved_and_changed(lab: tuple[LabSession, GapBaseline]) -> None:
    result = gap(lab, variant(serving__enforce_eager=True))
    section = result["section"]
    assert section["candidates"] == [{"path": "serving.enforce_eager", "customer": True, "baseline": False}]
    assert proved_paths(result) == {"serving.enforce_eager"}
    check_proved(result, {"gap.serving.enforce_eager"})
    assert result["config_changes"] == [{"path": "serving.enforce_eager", "from": True, "to": False,
                                         "finding": "gap.serving.enforce_eager"}]
    # The current rate is significantly below the baseline's; one difference: its restart is its proof.
    assert any(g["below"] for g in section["gap"].values())
    searched = [s for s in section["steps"] if s["phase"] != "current"]
    assert [s["phase"] for s in searched] == ["all"]
    assert searched[0]["verdict"] == "closes the gap; proved alone"
    assert section["exhaustive_restarts"] == 1
    assert section["cold_start"]["searched"] is False
    assert 0 < result["lab_time_s"] <= 1500


def test_a_parallel_layout_and_eager_mode_are_both_found(lab: tuple[LabSession, GapBaseline]) -> None:
    result = gap(lab, variant(parallel__tp=4, parallel__pp=2, serving__enforce_eager=True,
                              serving__gpu_memory_utilization=0.8))
    assert proved_paths(result) == {"parallel", "serving.enforce_eager"}
    check_proved(result, {"gap.parallel", "gap.serving.enforce_eager"})
    changed = {c["path"]: c["to"] for c in result["config_changes"]}
    assert changed == {"parallel.tp": 8, "parallel.pp": 1, "serving.enforce_eager": False}
    checked = {c["path"] for c in result["section"]["checked"]}
    assert checked == {"serving.gpu_memory_utilization"}
    first = next(s for s in result["section"]["steps"] if s["phase"] == "all")
    assert first["verdict"] in ("closes the gap", "narrows the gap")
    assert first["applied"][:2] == ["parallel", "serving.enforce_eager"]


def test_an_extra_flag_that_costs_nothing_is_checked_beside_the_costly_one(
    lab: tuple[LabSession, GapBaseline],
) -> None:
    result = gap(lab, variant(serving__enforce_eager=True,
                              extra_args=["--trust-remote-code", "--max-num-seqs", "4"]))
    assert proved_paths(result) == {"serving.enforce_eager"}
    assert {c["path"] for c in result["section"]["checked"]} == {"extra_args.--max-num-seqs"}
    assert [c["path"] for c in result["config_changes"]] == ["serving.enforce_eager"]


def test_a_memory_fraction_that_costs_nothing_gives_no_finding(lab: tuple[LabSession, GapBaseline]) -> None:
    result = gap(lab, variant(serving__gpu_memory_utilization=0.8))
    section = result["section"]
    assert result["findings"] == [] and result["config_changes"] == [] and section["proved"] == []
    assert [c["path"] for c in section["checked"]] == ["serving.gpu_memory_utilization"]
    assert section["restarts"] <= 1


@pytest.mark.parametrize("config", [best_config(), variant(serving__kv_cache_dtype="auto")],
                         ids=["at-the-baseline", "kv-cache-quality"])
def test_nothing_to_compare_spends_no_lab_time(lab: tuple[LabSession, GapBaseline],
                                               config: dict[str, Any]) -> None:
    result = gap(lab, config)
    section = result["section"]
    assert result["lab_time_s"] == 0.0 and section["steps"] == [] and section["restarts"] == 0
    assert result["findings"] == [] and result["config_changes"] == []
    assert section["summary"].startswith("Nothing to compare")
    assert section["schema"] == "diagnostic.gap/1"


def test_a_slower_loader_is_found_on_true_cold_starts(lab: tuple[LabSession, GapBaseline]) -> None:
    session, _ = lab
    config = variant(serving__safetensors_load_strategy="lazy")
    first = session.launch(config, cold=True).cold_start_s  # as reproduce would have taken it
    result = gap(lab, config, current_cold=[first])
    section = result["section"]
    assert section["cold_start"]["searched"] is True
    assert section["cold_start"]["current"]["n"] == 2  # a second start before any test
    assert proved_paths(result) == {"serving.safetensors_load_strategy"}
    [finding] = result["findings"]
    impact = finding["impact"]
    assert impact["metric"] == "cold_start_s" and impact["better"] == "lower" and impact["ci95"][1] < 0
    assert result["config_changes"][0]["to"] == "eager"
    # The loader costs no decode speed: not restarted for decode.
    assert [c["metric"] for c in section["checked"]] == ["decode"]
