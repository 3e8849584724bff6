"""What the whole report says, before any PDF: sections from what is present, the summary
and its headline, the cover's lab line, and escaping."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema

from reports import content
from reports import figures as fig
from reports.render import render_html
from reports.sections import configurations
from reports.sections.configurations import SEARCH_NOTE
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


def test_the_after_column_is_the_tuned_measurement_and_the_change_its_welch_difference(
    findings: dict[str, Any],
) -> None:
    measurement = findings["measurement"]
    report = report_content(findings)
    for row, workload in zip(report.summary, ("code", "prose"), strict=False):
        tuned, difference = measurement["tuned"][workload], measurement["difference"][workload]
        assert row.label == f"Decode rate, {workload} (tok/s)"
        assert row.before == fig.tps(measurement[workload]["mean_tps"])
        # The tuned configuration as measured, not the speculative search's own runs.
        assert (
            row.after
            == fig.tps(tuned["mean_tps"])
            != fig.tps(findings["speculative"]["best"][workload]["mean_tps"])
        )
        assert row.change == fig.signed(difference["diff"], fig.tps)
        assert row.change_sub == fig.signed_interval(difference["ci95"], fig.tps)
        assert row.change_third == ""
        roofline = measurement["roofline"]
        assert (
            row.before_third
            == f"{fig.percent(roofline['customer'][workload]['fraction'])} of what this hardware allows"
        )
        assert (
            row.after_third
            == f"{fig.percent(roofline['tuned'][workload]['fraction'])} of what this hardware allows"
        )
    assert report.summary_notes == []
    code = fig.tps(measurement["code"]["mean_tps"]), fig.tps(measurement["tuned"]["code"]["mean_tps"])
    assert any(f"goes from {code[0]} to {code[1]}" in p for p in report.headline)


def test_a_difference_the_test_does_not_call_different_is_said_to_be_within_noise(
    findings: dict[str, Any],
) -> None:
    findings["measurement"]["difference"]["code"]["different"] = False
    report = report_content(findings)
    assert report.summary[0].change_third == "within noise (Welch, 5 %)"
    assert any(
        "to "
        + fig.tps(findings["measurement"]["tuned"]["code"]["mean_tps"])
        + " tok/s (a difference within noise)"
        in p
        for p in report.headline
    )


def test_without_a_tuned_measurement_the_search_s_runs_stand_in_and_the_report_says_so(
    findings: dict[str, Any],
) -> None:
    for key in ("tuned", "difference"):
        del findings["measurement"][key]
    del findings["measurement"]["roofline"]["tuned"]
    report = report_content(findings)
    code = report.summary[0]
    best = findings["speculative"]["best"]["code"]
    assert code.after == fig.tps(best["mean_tps"])
    assert code.note == "after: eagle3, k = 2, search runs only"
    impact = next(
        f["impact"] for f in findings["findings"] if (f["impact"] or {}).get("metric") == "decode_tps_code"
    )
    assert code.change_sub == fig.signed_interval(impact["ci95"], fig.tps)
    assert code.after_third == ""
    assert content.summary_notes(findings) == [SEARCH_NOTE]
    assert any(
        p.startswith("With the changes in this report (decode rates from the speculative search alone)")
        for p in report.headline
    )


def test_without_a_tuned_measurement_a_workload_that_kept_its_setting_shows_the_customers_runs(
    findings: dict[str, Any],
) -> None:
    # The search's fastest on prose was not proved faster: the customer's setting is kept, so
    # the "after" of the search is the customer's own confirmation, not the unproved setting.
    for key in ("tuned", "difference"):
        del findings["measurement"][key]
    del findings["measurement"]["roofline"]["tuned"]
    spec = findings["speculative"]
    spec["best"]["prose"] = {**spec["best"]["prose"], "kept_customer": True, "proved_faster": False}
    after = configurations.after_of(findings)
    assert after.workloads["prose"] == spec["baseline"]["prose"]
    assert after.workloads["code"] == spec["best"]["code"]


def test_without_any_after_measurement_the_after_column_says_not_measured(findings: dict[str, Any]) -> None:
    for key in ("tuned", "difference"):
        del findings["measurement"][key]
    findings["speculative"] = None
    report = report_content(findings)
    code = report.summary[0]
    assert code.before == fig.tps(findings["measurement"]["code"]["mean_tps"])
    assert code.after == "not measured"
    assert code.change == ""


def test_the_first_start_of_a_kept_jit_cache_is_noted(findings: dict[str, Any]) -> None:
    findings["cold_start"]["after_first_boot_s"] = 296.4
    notes = content.summary_notes(findings)
    assert notes == [
        "The first start after the change compiles the kernels once into the kept cache (4.9 min, 296 s); "
        "the cold start above is every start after it."
    ]


def test_the_cold_start_change_takes_the_measure_stage_s_welch_interval(findings: dict[str, Any]) -> None:
    findings["cold_start"]["difference"] = {
        "metric": "cold_start_s",
        "before": 559.6,
        "after": 146.1,
        "diff": -413.5,
        "ci95": [-416.0, -411.0],
        "p": 1e-9,
        "different": True,
        "n": [2, 3],
    }
    cold = next(r for r in report_content(findings).summary if r.label == "Cold start")
    assert (cold.change, cold.change_sub, cold.change_third) == (
        "\u2212414 s",
        "[\u2212416,\u00a0\u2212411] s",
        "",
    )


def test_findings_are_ordered_by_impact_blocking_first(findings: dict[str, Any]) -> None:
    report = report_content(findings)
    codes = [f.code for f in report.findings]
    # 0 -> 100 % of canaries; cold starts by the share of seconds saved; the prose rate's gain
    # (21 %) above the rendezvous' 11 % and the code rate's 10 %; the counting correction last.
    assert codes == [
        "fp4.kernel_dispatch",
        "load.weights_io",
        "load.jit_compile",
        "specdec.suboptimal",
        "load.rendezvous",
        "specdec.suboptimal",
        "metrics.server_overclaim",
    ]
    assert [f.number for f in report.findings] == [f"2.{i}" for i in range(1, 8)]
    assert "prose" in report.findings[3].title
    findings["findings"].append(
        {
            "code": "lab.node_unreachable",
            "title": "spark-05 refused SSH",
            "evidence": {},
            "change": {},
            "impact": None,
            "blocking": True,
        }
    )
    assert report_content(findings).findings[0].code == "lab.node_unreachable"


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
    estimate = job["lab_time_s"] / job["wall_time_s"]  # the real day: a little under its 30x
    assert f"about {estimate:.0f}\u00d7 faster than real time (lab time over wall time)" in note


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
