"""The report's figures: deterministic SVG with ids that cannot collide across plots."""

from __future__ import annotations

import re
from typing import Any

from reports import plots


def _runs(findings: dict[str, Any]) -> dict[str, list[plots.RunSeries]]:
    return {
        w: [
            plots.RunSeries(
                w,
                [r["decode_tps"] for r in findings["measurement"][w]["runs"]],
                findings["measurement"][w]["mean_tps"],
                findings["measurement"][w]["ci95"],
            )
        ]
        for w in ("code", "prose")
    }


def test_the_same_data_gives_byte_identical_svg_without_a_date(findings: dict[str, Any]) -> None:
    first = plots.decode_runs(_runs(findings), scope="a")
    second = plots.decode_runs(_runs(findings), scope="a")
    assert first == second
    assert first.startswith("<svg")
    assert "<dc:date>" not in first


def test_each_plot_prefixes_its_ids_so_two_plots_share_none(findings: dict[str, Any]) -> None:
    runs = plots.decode_runs(_runs(findings), scope="fig1")
    timeline = plots.cold_start_timeline(findings["cold_start"]["phases"], scope="fig2")
    ids_runs = set(re.findall(r'id="([^"]+)"', runs))
    ids_timeline = set(re.findall(r'id="([^"]+)"', timeline))
    assert ids_runs and ids_timeline
    assert all(i.startswith("fig1-") for i in ids_runs)
    assert not ids_runs & ids_timeline
    # Every reference points at an id of its own plot.
    for ref in re.findall(r'(?:href="#|url\(#)([^")]+)', runs):
        assert ref in ids_runs


def test_the_stall_plot_marks_a_signal_that_was_not_sampled(findings: dict[str, Any]) -> None:
    stalls = findings["cold_start"]["stalls"]
    for stall in stalls[1:]:
        del stall["telemetry"]["page_cache_gib"]
    svg = plots.stall_telemetry(stalls, ["a", "b", "c"], scope="s")
    # Page cache is left sampled only during the weights stall.
    assert svg.count("not sampled") == 2


def test_the_sweep_labels_your_setting_and_the_deployed_one(findings: dict[str, Any]) -> None:
    trials = [{**t, "stage": t["phase"]} for t in findings["speculative"]["trials"]]
    svg = plots.specdec_sweep(
        trials,
        customer=("eagle3", 4),
        best={"code": ("eagle3", 2), "prose": ("eagle3", 2)},
        scope="w",
    )
    assert svg.count("your setting") == 2
    assert svg.count("deployed") == 2
    assert "confirmation (n = 15)" in svg


def test_the_waterfall_plot_shows_each_start_and_what_it_still_showed(findings: dict[str, Any]) -> None:
    steps = [
        plots.WaterfallStep(s["step"], s["cold_start_s"], s["mode"], None, s["signatures"])
        for s in findings["cold_start"]["waterfall"]
    ]
    svg = plots.cold_start_waterfall(steps, scope="c")
    assert svg.count("still seen:") == len(steps)
    assert "still seen: none" in svg
    assert "(\u2212413 s)" in svg
