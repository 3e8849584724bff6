"""What the report says, before any PDF: sections from what is present, the generic
finding section, configuration diffs, the cover's lab line, and escaping."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

import jsonschema

from reports import content
from reports.moneyback import assess
from reports.report import render_html
from reports.structure import NO_CAUSE_DESCRIPTION, NOT_RUN

ISSUED = dt.datetime(2025, 12, 1, 16, 0, tzinfo=dt.UTC)
SCHEMA = Path(__file__).resolve().parents[2] / "diagnostic" / "jobs" / "schemas" / "findings.schema.json"


def _build(findings: dict[str, Any]) -> content.ReportContent:
    return content.build_report(
        findings,
        customer="Northwind",
        money_back=assess(findings, as_of=ISSUED),
        issued=ISSUED.date(),
        with_plots=False,
    )


def test_the_fixture_is_a_valid_findings_document(findings: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator(schema).validate(findings)


def test_a_null_section_is_stated_as_not_run(findings: dict[str, Any]) -> None:
    findings["fp4"] = None
    findings["cold_start"] = None
    report = _build(findings)
    stages = {s.anchor: s for s in report.stages}
    assert stages["fp4"].ran is False
    assert [b.text for b in stages["fp4"].blocks] == [NOT_RUN]
    assert stages["cold-start"].ran is False
    assert stages["speculative"].ran is True
    assert [r.label for r in report.summary] == ["Decode rate, code (tok/s)", "Decode rate, prose (tok/s)"]


def test_without_a_tuned_configuration_the_after_column_says_not_measured(findings: dict[str, Any]) -> None:
    findings["speculative"] = None
    report = _build(findings)
    code = report.summary[0]
    assert code.before == "26.0"
    assert code.after == "not measured"
    assert code.change == ""


def test_an_unknown_finding_code_renders_through_the_generic_section(findings: dict[str, Any]) -> None:
    findings["findings"] = [
        {
            "code": "kv.prefix_cache_disabled",
            "title": "Prefix caching is off",
            "evidence": {
                "summary": "Every request re-reads its system prompt.",
                "hit_rate": 0.0,
                "prefill_s": 1.3,
            },
            "change": {"flags": ["--enable-prefix-caching"]},
            "impact": {"metric": "ttft_s", "before": 1.4, "after": 0.35, "ci95": [-1.1, -1.0], "n": 15},
        }
    ]
    (section,) = _build(findings).findings
    assert section.code == "kv.prefix_cache_disabled"
    assert section.lead == "Every request re-reads its system prompt."
    assert section.why == content.GENERIC_WHY
    assert [(r.label, r.value) for r in section.evidence] == [("Hit rate", "0 %"), ("Prefill", "1.3 s")]
    assert section.change.flags_add == "--enable-prefix-caching"
    (impact,) = section.impacts
    assert (impact.metric, impact.before, impact.after) == ("Time to first token", "1.4 s", "0.35 s")
    assert impact.demonstrated is True


def test_a_change_renders_as_a_configuration_and_environment_diff() -> None:
    change = content.build_change(
        {
            "config": {
                "serving.moe_backend": {"from": "auto", "to": "cutlass"},
                "serving.enforce_eager": False,
            },
            "env": {"VLLM_USE_FLASHINFER_MOE_FP4": None, "NCCL_SOCKET_IFNAME": "enP7s7"},
            "flags": {"add": ["--moe-backend", "cutlass"], "remove": ["--enforce-eager"]},
            "note": "Set it on every node.",
            "restart": "rolling",
        }
    )
    assert [(d.sign, d.text) for d in change.diff] == [
        ("-", "serving.moe_backend: auto"),
        ("+", "serving.moe_backend: cutlass"),
        ("+", "serving.enforce_eager: false"),
        ("-", "VLLM_USE_FLASHINFER_MOE_FP4  (unset it)"),
        ("+", "NCCL_SOCKET_IFNAME=enP7s7"),
    ]
    assert change.flags_add == "--moe-backend cutlass"
    assert change.flags_remove == "--enforce-eager"
    assert change.notes == ["Set it on every node."]
    assert [(r.label, r.value) for r in change.other] == [("Restart", "rolling")]


def test_the_cover_names_a_simulated_lab_and_its_speed_up(findings: dict[str, Any]) -> None:
    lab, note = content.lab_description(findings["job"])
    assert lab == "Simulated lab \u201creference-kimi-k2-8spark\u201d"
    assert "30\u00d7 faster than real time" in note
    assert "Every duration in this report is lab time." in note


def test_without_a_recorded_dilation_the_cover_estimates_it_and_says_so(findings: dict[str, Any]) -> None:
    job = dict(findings["job"], lab="reference-kimi-k2-8spark")
    del job["lab_dilation"]
    _, note = content.lab_description(job)
    assert "about 30\u00d7 faster than real time (lab time over wall time)" in note


def test_a_real_lab_is_named_without_a_simulation_note() -> None:
    lab, note = content.lab_description({"lab": "inventory:lab-a", "lab_time_s": 10, "wall_time_s": 10})
    assert lab == "lab-a"
    assert "simulated" not in note


def test_findings_text_is_escaped_in_the_html(findings: dict[str, Any]) -> None:
    hostile = copy.deepcopy(findings)
    hostile["findings"][0]["title"] = '<img src="file:///etc/passwd">'
    html = render_html(_build(hostile))
    assert '<img src="file:///etc/passwd">' not in html
    assert "&lt;img src=&quot;file:///etc/passwd&quot;&gt;" in html


def _overclaim_row(report: content.ReportContent) -> str:
    (section,) = [s for s in report.findings if s.code == "metrics.server_overclaim"]
    return next(r.value for r in section.evidence if r.label == "Explained by")


def _paragraphs(report: content.ReportContent, anchor: str) -> list[str]:
    (stage,) = [s for s in report.stages if s.anchor == anchor]
    return [b.text for b in stage.blocks if b.kind == "paragraph"]


def test_a_cause_is_described_in_the_measurement_s_own_words(findings: dict[str, Any]) -> None:
    code = "metrics.server_counts_proposed"
    findings["measurement"]["cause_descriptions"][code] = "Words the measure stage wrote."
    report = _build(findings)
    assert f"{code}: Words the measure stage wrote." in _paragraphs(report, "throughput")
    assert _overclaim_row(report) == f"{code}: Words the measure stage wrote."


def test_a_cause_without_a_description_says_the_report_has_none(findings: dict[str, Any]) -> None:
    del findings["measurement"]["cause_descriptions"]
    report = _build(findings)
    code = "metrics.server_counts_proposed"
    assert f"{code}: {NO_CAUSE_DESCRIPTION}" in _paragraphs(report, "throughput")
    assert _overclaim_row(report) == f"{code}: {NO_CAUSE_DESCRIPTION}"


def test_the_fp4_verdict_after_is_the_pipeline_s_not_the_report_s(findings: dict[str, Any]) -> None:
    # A pass rate of 100 % with the pipeline's verdict "degraded": the report must not overrule it.
    findings["fp4"]["verdict_after"] = "degraded"
    report = _build(findings)
    fp4_row = next(r for r in report.summary if r.label == "FP4 output")
    assert (fp4_row.before, fp4_row.after) == ("garbage", "degraded")
    text = _paragraphs(report, "fp4")[0]
    assert text.endswith("With the cutlass backend the output is degraded (100 % of canaries).")
    assert not any("correct again" in p for p in report.headline)


def test_without_an_fp4_verdict_after_the_report_shows_the_pass_rate_only(findings: dict[str, Any]) -> None:
    del findings["fp4"]["verdict_after"]
    findings["fp4"]["canary_pass_rate"]["after"] = 0.7
    report = _build(findings)
    fp4_row = next(r for r in report.summary if r.label == "FP4 output")
    assert (fp4_row.after, fp4_row.after_sub) == ("70 % of canaries", "cutlass")
    text = _paragraphs(report, "fp4")[0]
    assert text.endswith("With the cutlass backend, 70 % of 42 canary prompts were answered correctly.")
    assert "degraded" not in text
    assert any("canary prompts answered correctly go from 0 % to 70 %" in p for p in report.headline)
