"""What the whole report says, before any PDF: sections from what is present, the summary
and its headline, the cover's lab line, and escaping."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema

from reports import content
from reports.report import render_html
from reports.structure import NOT_RUN
from tests.reports.conftest import report_content

SCHEMA = Path(__file__).resolve().parents[2] / "diagnostic" / "jobs" / "schemas" / "findings.schema.json"


def test_the_fixture_is_a_valid_findings_document(findings: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator(schema).validate(findings)


def test_a_null_section_is_stated_as_not_run(findings: dict[str, Any]) -> None:
    findings["fp4"] = None
    findings["cold_start"] = None
    report = report_content(findings)
    stages = {s.anchor: s for s in report.stages}
    assert stages["fp4"].ran is False
    assert [b.text for b in stages["fp4"].blocks] == [NOT_RUN]
    assert stages["cold-start"].ran is False
    assert stages["speculative"].ran is True
    assert [r.label for r in report.summary] == ["Decode rate, code (tok/s)", "Decode rate, prose (tok/s)"]


def test_without_a_tuned_configuration_the_after_column_says_not_measured(findings: dict[str, Any]) -> None:
    findings["speculative"] = None
    report = report_content(findings)
    code = report.summary[0]
    assert code.before == "26.0"
    assert code.after == "not measured"
    assert code.change == ""


def test_the_summary_takes_the_fp4_verdicts_as_the_pipeline_wrote_them(findings: dict[str, Any]) -> None:
    # A pass rate of 100 % with the pipeline's verdict "degraded": the report must not overrule it.
    findings["fp4"]["verdict_after"] = "degraded"
    report = report_content(findings)
    fp4 = next(r for r in report.summary if r.label == "FP4 output")
    assert (fp4.before, fp4.after, fp4.after_sub) == ("garbage", "degraded", "cutlass, 100 % of canaries")
    assert not any("correct again" in p for p in report.headline)
    assert any("canary prompts answered correctly go from 0 % to 100 %" in p for p in report.headline)


def test_without_an_fp4_verdict_after_the_summary_shows_the_pass_rate_only(findings: dict[str, Any]) -> None:
    del findings["fp4"]["verdict_after"]
    findings["fp4"]["canary_pass_rate"]["after"] = 0.7
    report = report_content(findings)
    fp4 = next(r for r in report.summary if r.label == "FP4 output")
    assert (fp4.after, fp4.after_sub) == ("70 % of canaries", "cutlass")
    assert any("canary prompts answered correctly go from 0 % to 70 %" in p for p in report.headline)


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
    html = render_html(report_content(hostile))
    assert '<img src="file:///etc/passwd">' not in html
    assert "&lt;img src=&quot;file:///etc/passwd&quot;&gt;" in html
