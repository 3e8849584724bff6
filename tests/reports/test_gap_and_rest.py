"""The gap stage's section (`diagnostic.gap/1`, hand-made here in the shape the contract
gives it) and the measure stage's split of the step ("where the rest goes"), as the report
prints them; and the split itself, which must add up to the measured step."""

from __future__ import annotations

from typing import Any

import pytest

from diagnostic.pipelines.explain import explain_step
from lab.catalog import reference_catalog
from reports.sections.gap import gap_section, printed_parts, rest_section
from reports.structure import Block
from tests.reports.conftest import report_content

GAP: dict[str, Any] = {
    "schema": "diagnostic.gap/1",
    "baseline": {
        "source": "calibrate",
        "version": 3,
        "made_at": "2026-12-01T10:00:00Z",
        "stale": None,
        "path": None,
        "rates": {
            "code": {"n": 15, "mean_tps": 32.4, "ci95": [31.9, 32.9]},
            "prose": {"n": 15, "mean_tps": 27.1, "ci95": [26.5, 27.7]},
        },
        "cold_start": {"n": 2, "mean_s": 148.0, "samples": [147.1, 149.0]},
    },
    "candidates": [
        {"path": "serving.enforce_eager", "customer": True, "baseline": False},
        {"path": "parallel.pp", "customer": 2, "baseline": 1},
    ],
    "excluded": [{"path": "serving.max_model_len", "why": "a requirement: context"}],
    "steps": [
        {
            "applied": ["serving.enforce_eager", "parallel.pp"],
            "rates": {"code": {"n": 5, "mean_tps": 32.0, "ci95": [31.2, 32.8]}},
            "lab_s": 412.0,
            "verdict": "closes the gap",
        },
        {
            "applied": ["serving.enforce_eager"],
            "rates": {"code": {"n": 5, "mean_tps": 31.8, "ci95": [31.0, 32.6]}},
            "lab_s": 398.0,
            "verdict": "closes the gap",
        },
    ],
    "proved": [{"path": "serving.enforce_eager", "from": True, "to": False, "impact": [], "welch": {}}],
    "checked": [{"path": "parallel.pp", "why": "no measurable effect: change +0.1 tok/s [-0.4, 0.6]"}],
    "context": {"native": 262144, "target": 262144, "customer": 131072, "fits": True},
    "restarts": 3,
    "exhaustive_restarts": 6,
    "lab_time_s": 1234.0,
}


def _text(blocks: list[Block]) -> str:
    parts = []
    for b in blocks:
        parts.append(b.text + " " + b.caption)
        parts += [" ".join(row) for row in b.rows]
    return " ".join(" ".join(parts).split())


def test_the_gap_section_says_what_was_compared_split_proved_and_checked() -> None:
    section = gap_section(GAP, "3.5")
    text = _text(section.blocks)
    assert section.ran
    assert "the configuration we tuned on this lab (version 3, made 2026-12-01)" in text
    assert "code 32.4 tok/s (31.9\u201332.9, n = 15)" in text
    assert "serving.enforce_eager true false" in text
    assert "serving.max_model_len (a requirement: context)" in text
    assert "serving.enforce_eager: true \u2192 false" in text
    assert "parallel.pp (no measurable effect" in text
    assert (
        "The model's native context is 262,144 tokens, your configuration asks for 131,072; 262,144 fits"
        in text
    )
    assert "restarted the engine 3 times, where testing each difference alone would have taken 6" in text


def test_a_gap_stage_with_nothing_to_compare_says_so() -> None:
    text = _text(
        gap_section(
            {**GAP, "candidates": [], "steps": [], "proved": [], "checked": [], "lab_time_s": 0.0}, "3.5"
        ).blocks
    )
    assert "differs from the baseline in no field we may change, so the stage spent 0 s of lab time" in text


def test_a_stale_baseline_says_why() -> None:
    stale = {**GAP, "baseline": {**GAP["baseline"], "stale": "made on vLLM 0.29.0, the lab runs 0.34.0"}}
    assert "This baseline is stale: made on vLLM 0.29.0, the lab runs 0.34.0." in _text(
        gap_section(stale, "3.5").blocks
    )


FACTS = {f"spark-0{i}": {"gpus": [{"name": "NVIDIA GB10"}]} for i in range(1, 9)}
CONFIG: dict[str, Any] = {
    "parallel": {"tp": 8, "pp": 1},
    "model": {"id": "moonshotai/Kimi-K2-Instruct-0905"},
    "speculative": {"method": "eagle3", "num_speculative_tokens": 2},
}


def _profile() -> Any:
    model = reference_catalog().served({"model": {"id": "moonshotai/Kimi-K2-Instruct-0905"}})
    assert model is not None
    return model.profile


@pytest.mark.parametrize("no_spec", [16.2, None])
def test_the_step_split_adds_up_to_the_measured_step(no_spec: float | None) -> None:
    entry = explain_step(
        27.9,
        acceptance_len=2.52,
        k=2,
        profile=_profile(),
        nodes_facts=FACTS,
        config=CONFIG,
        no_spec_tps=no_spec,
    )
    assert entry["step_ms"] == pytest.approx(1000 / 27.9 * 2.52, abs=1e-3)
    assert entry["sum_ms"] == pytest.approx(entry["step_ms"], abs=0.01)
    kinds = {p["part"]: p["kind"] for p in entry["parts"]}
    assert kinds["weights_read"] == "estimate"
    assert kinds["communication_and_overhead"] == "measured"
    assert ("speculation" in kinds) is (no_spec is not None)
    # Printed to 0.1 ms, the parts still add up to the printed step.
    shown = printed_parts(entry)
    assert sum(ms for _, ms in shown) == pytest.approx(round(entry["step_ms"], 1), abs=1e-9)


def test_without_speculation_the_step_is_the_measured_rate_s_inverse() -> None:
    config = {**CONFIG, "speculative": None}
    entry = explain_step(
        16.2, acceptance_len=None, k=None, profile=_profile(), nodes_facts=FACTS, config=config
    )
    assert entry["tokens_per_step"] == 1.0
    assert entry["step_ms"] == pytest.approx(1000 / 16.2, abs=1e-3)
    assert [p["part"] for p in entry["parts"]] == ["weights_read", "communication_and_overhead"]


def test_where_the_rest_goes_is_a_section_and_a_summary_note(findings: dict[str, Any]) -> None:
    entry = explain_step(
        27.9, acceptance_len=2.52, k=2, profile=_profile(), nodes_facts=FACTS, config=CONFIG, no_spec_tps=16.2
    )
    entry["to_bound"] = {"tuned_tps": 27.9, "other_tps": 215.0, "gap_tps": 187.1, "share": 0.1298}
    entry["to_baseline"] = {"tuned_tps": 27.9, "other_tps": 32.4, "gap_tps": 4.5, "share": 0.8611}
    findings["measurement"]["explain"] = {"configuration": "tuned", "code": entry}
    findings["gap"] = GAP
    content = report_content(findings)
    rest = next(s for s in content.stages if s.anchor == "rest")
    text = _text(rest.blocks)
    assert (
        "13.0 % of what this hardware allows (215.0 tok/s), and 86.1 % of the lab's baseline (32.4 tok/s)"
        in text
    )
    assert "estimate" in text and "measured" in text
    assert [s.number for s in content.stages if s.anchor in ("gap", "rest")] == ["3.5", "3.6"]
    assert any("Section 3.6 splits each measured step" in n for n in content.summary_notes)
    assert rest_section({"measurement": {}}, "3.6").ran is False


PROBED: dict[str, Any] = {
    "method": "torch.sum over a 2048 MiB float32 buffer on the GPU",
    "size_mib": 2048, "repeats": 3,
    "nodes": {"spark-01": {"median_gbs": 204.1, "gbs": [204.1, 203.8, 204.4]},
              "spark-02": {"median_gbs": 205.3, "gbs": [205.3, 205.0, 205.9]}},
    "median_gbs": 204.7, "min_gbs": 204.1, "min_node": "spark-01", "failed": {}, "lab_s": 6.4,
}


def test_the_weights_line_says_the_measured_bandwidth_and_the_appendix_lists_each_repeat(
    findings: dict[str, Any]
) -> None:
    entry = explain_step(
        16.2, acceptance_len=None, k=None, profile=_profile(), nodes_facts=FACTS,
        config={**CONFIG, "speculative": None}, measured_bw=PROBED,
    )
    findings["measurement"]["explain"] = {"configuration": "tuned", "code": entry, "memory_bandwidth": PROBED}
    content = report_content(findings)
    rest = next(s for s in content.stages if s.anchor == "rest")
    text = _text(rest.blocks)
    assert "Weights read for one step" in text and "measured bandwidth, catalog bytes" in text
    assert "reached 205 GB/s of the 273 specified" in text
    assert ("205 GB/s, the median over 2 nodes of each node's median of 3 streaming reads of a GPU buffer "
            "(our node agent's memory bandwidth probe; the slowest node reached 204 GB/s)") in text
    assert "The hardware's bound stays on the specified peak" in text
    raw = next(a for a in content.appendices if a.anchor == "raw-runs")
    table = next(b for b in raw.blocks if b.kind == "table" and b.columns[0] == "Node")
    assert table.columns == ["Node", "Repeat 1", "Repeat 2", "Repeat 3", "Median"]
    assert table.rows == [["spark-01", "204.1", "203.8", "204.4", "204.1"],
                          ["spark-02", "205.3", "205.0", "205.9", "205.3"]]
    assert "Memory bandwidth probe" in _text(raw.blocks)
    assert "The probe took 6.4 s of lab time" in _text(raw.blocks)


def test_without_a_measurement_the_rest_says_the_weights_are_at_the_peak(findings: dict[str, Any]) -> None:
    bw = {"unavailable": "mem-bw-probe unsupported: mem-bw-probe needs torch with a CUDA GPU; none here"}
    entry = explain_step(
        16.2, acceptance_len=None, k=None, profile=_profile(), nodes_facts=FACTS,
        config={**CONFIG, "speculative": None}, measured_bw=bw,
    )
    findings["measurement"]["explain"] = {"configuration": "tuned", "code": entry, "memory_bandwidth": bw}
    content = report_content(findings)
    text = _text(next(s for s in content.stages if s.anchor == "rest").blocks)
    assert "estimate" in text and "273 GB/s each, the specified peak" in text
    assert ("The weights' read is at the specified peak: preflight could not measure the memory bandwidth: "
            "mem-bw-probe unsupported: mem-bw-probe needs torch with a CUDA GPU; none here.") in text
    assert "measured on this lab before any engine started" not in text
    raw = next(a for a in content.appendices if a.anchor == "raw-runs")
    assert "Memory bandwidth probe" not in _text(raw.blocks)
