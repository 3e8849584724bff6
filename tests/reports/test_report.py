"""The written report read back from its PDF: the job's figures exactly as findings.json
has them (printed by reports.figures), every raw run, every finding, page furniture,
every page rasterized, and the audit trail of a staff override."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pypdf import PdfReader

from diagnostic.jobs.findings import validate_findings
from reports import figures as fig
from reports.findings import impact_formatters
from reports.moneyback import OverrideEntry, assess
from reports.report import render, report_digest
from tests.reports.conftest import (
    CUSTOMER,
    ISSUED,
    ReferenceReport,
    minimal_findings,
    pdf_text,
    require_tool,
    squash,
)


def _has(flat: str, phrase: str) -> bool:
    return squash(phrase) in flat


def test_the_summary_shows_decode_rates_before_and_after_with_their_intervals(
    reference_report: ReferenceReport,
) -> None:
    f, flat = reference_report.findings, reference_report.flat
    for workload in ("code", "prose"):
        before, after = f["measurement"][workload], f["speculative"]["best"][workload]
        for block in (before, after):
            assert _has(flat, fig.tps(block["mean_tps"])), workload
            assert _has(flat, f"({fig.interval(block['ci95'], fig.tps)})"), workload
        impact = next(
            i["impact"]
            for i in f["findings"]
            if (i["impact"] or {}).get("metric") == f"decode_tps.{workload}"
        )
        assert _has(flat, fig.signed(after["mean_tps"] - before["mean_tps"], fig.tps))
        assert _has(flat, fig.signed_interval(impact["ci95"], fig.tps))


def test_the_summary_shows_cold_start_fp4_and_money_back(reference_report: ReferenceReport) -> None:
    f, flat = reference_report.findings, reference_report.flat
    cold = f["cold_start"]
    for seconds in (cold["before_s"], cold["after_s"]):
        assert _has(flat, fig.minutes(seconds))
        assert _has(flat, f"({fig.seconds(seconds)})")
    assert _has(flat, fig.signed(cold["after_s"] - cold["before_s"], fig.seconds))
    rates = f["fp4"]["canary_pass_rate"]
    assert _has(flat, f"{f['fp4']['backend_before']}, {fig.percent(rates['before'])} of canaries")
    assert _has(flat, f"{f['fp4']['backend_after']}, {fig.percent(rates['after'])} of canaries")
    assert _has(flat, "Does not apply: improvements demonstrated")


def test_the_cover_names_customer_lab_dilation_and_version(reference_report: ReferenceReport) -> None:
    flat = reference_report.flat
    assert _has(flat, f"Prepared for {CUSTOMER}")
    assert _has(flat, "Simulated lab \u201creference-kimi-k2-8spark\u201d")
    assert _has(flat, "30\u00d7 faster than real time")
    assert _has(flat, f"report version {reference_report.report.version}")
    assert _has(flat, "Issued 1 December 2025")


def test_every_finding_has_its_section_with_its_impact(reference_report: ReferenceReport) -> None:
    flat = reference_report.flat
    for finding in reference_report.findings["findings"]:
        assert _has(flat, finding["title"])
        assert _has(flat, finding["code"])
        impact = finding["impact"]
        if impact is None:
            continue
        fmt, _, _ = impact_formatters(fig.unit_for_key(impact["metric"]))
        assert _has(flat, fmt(impact["before"])), finding["code"]
        assert _has(flat, fmt(impact["after"])), finding["code"]


def test_the_server_claim_and_its_reconciliation_are_shown(reference_report: ReferenceReport) -> None:
    f, flat = reference_report.findings, reference_report.flat
    claimed = f["measurement"]["server_claimed_tps"]["code"]
    assert _has(flat, fig.tps(claimed))
    assert _has(flat, fig.ratio(claimed / f["measurement"]["code"]["mean_tps"]))
    assert _has(flat, "metrics.server_counts_proposed: The server counts every proposed position")
    text = reference_report.text
    detail = {w: f["measurement"]["reconciliation_detail"][w][0] for w in ("code", "prose")}
    for label, key in (("observed", "observed_ratio"), ("predicted", "predicted_ratio")):
        cells = [fig.ratio(detail[w][key]) for w in ("code", "prose")]
        assert re.search(rf"Server count / delivered, {label}\s+" + r"\s+".join(map(re.escape, cells)), text)
    rejected = [fig.number(detail[w]["evidence"]["rejected_drafts"]) for w in ("code", "prose")]
    assert re.search(r"Draft tokens rejected\s+" + r"\s+".join(map(re.escape, rejected)), text)
    assert _has(
        flat,
        "Also tested: metrics.server_busy_time (not testable here), metrics.client_counts_chunks "
        "(present, but does not explain the ratio).",
    )
    assert _has(flat, "38 log windows qualified.")


def test_the_overclaim_finding_sets_each_claim_beside_what_was_delivered(
    reference_report: ReferenceReport,
) -> None:
    f, text, flat = reference_report.findings, reference_report.text, reference_report.flat
    finding = next(x for x in f["findings"] if x["code"] == "metrics.server_overclaim")
    evidence = finding["evidence"]
    for w in ("code", "prose"):
        got, log = evidence["delivered"][w], evidence["claims"][w]["log"]
        cells = [
            w,
            fig.tps(got["mean_tps"]),
            fig.interval(got["ci95"], fig.tps),
            fig.tps(log["claimed_tps"]),
            f"({fig.ratio(log['claimed_tps'] / got['mean_tps'])})",
            "not measured",
        ]
        assert re.search(r"^\s*" + r"\s+".join(map(re.escape, cells)), text, flags=re.MULTILINE), cells
    assert _has(flat, "Explained by metrics.server_counts_proposed: The server counts every proposed")
    assert _has(flat, "No performance change: this finding corrects how throughput is counted")


def test_every_raw_run_is_printed_on_its_own_row(reference_report: ReferenceReport) -> None:
    f, text = reference_report.findings, reference_report.text
    for workload in ("code", "prose"):
        before = f["measurement"][workload]["runs"]
        after = f["speculative"]["best"][workload]["runs"]
        for run_before, run_after in zip(before, after, strict=True):
            cells = [str(run_before["index"] + 1), str(run_before["prompt_index"] + 1)]
            for run in (run_before, run_after):
                cells += [
                    fig.number(run["tokens"]),
                    fig.number(run["usage_completion_tokens"]),
                    fig.milliseconds(run["ttft_s"]),
                    fig.tps(run["decode_tps"]),
                    fig.tps(run["e2e_tps"]),
                ]
            pattern = r"\s+".join(re.escape(c) for c in cells)
            assert re.search(r"^\s*" + pattern + r"\s*$", text, flags=re.MULTILINE), (workload, cells)


def test_flagged_outliers_and_runs_without_a_rate_are_marked_and_explained(
    tmp_path: Path, findings: dict[str, Any]
) -> None:
    code = findings["measurement"]["code"]
    # The measure stage counts outlier positions among the runs that have a rate: with the
    # first run abandoned, position 2 is the fourth run and position 0 the second.
    code["runs"][0].update(abandoned=True, ttft_s=None, decode_tps=None, e2e_tps=None, tokens=37)
    code["outliers"] = [2]
    code["ttft"] = {"outliers": [0]}
    findings["measurement"]["warnings"] = ["the engine log had no stats lines over the measurement"]
    pdf = render(findings, tmp_path, customer=CUSTOMER, as_of=ISSUED).pdf_path
    text, flat = pdf_text(pdf), squash(pdf_text(pdf, layout=False))
    second, fourth = code["runs"][1], code["runs"][3]
    assert re.search(r"^\s*1\s+1\s+37\s+abandoned\s", text, flags=re.MULTILINE)
    assert re.search(
        r"^\s*2\s+2\s+512\s+512\s+" + re.escape(fig.milliseconds(second["ttft_s"])) + r" \*\s+"
        + re.escape(fig.tps(second["decode_tps"])) + r"\s",
        text,
        flags=re.MULTILINE,
    )
    assert re.search(
        r"^\s*4\s+4\s+512\s+512\s+" + re.escape(fig.milliseconds(fourth["ttft_s"])) + r"\s+"
        + re.escape(fig.tps(fourth["decode_tps"])) + r" \*",
        text,
        flags=re.MULTILINE,
    )
    for phrase in (
        "* marks a figure flagged as an outlier by median absolute deviation; it is kept in every summary.",
        "An abandoned or failed run has no rates and is left out of every summary.",
        "Code run 1: abandoned: no complete answer within the time limit",
        "The engine log had no stats lines over the measurement",
    ):
        assert _has(flat, phrase), phrase


def test_a_counting_correction_alone_is_not_called_something_standing_in_the_way(
    tmp_path: Path, findings: dict[str, Any]
) -> None:
    overclaim = [f for f in findings["findings"] if f["code"] == "metrics.server_overclaim"]
    document = minimal_findings(findings=overclaim)
    pdf = render(document, tmp_path, customer=CUSTOMER, as_of=ISSUED).pdf_path
    flat = squash(pdf_text(pdf, layout=False))
    assert "standing between" not in flat
    assert _has(flat, "this engagement measured no change to the serving. Section 2 has 1 finding on how")
    assert "under each change the 95 % interval of the change" not in flat


@pytest.mark.parametrize("rated", [0, 1])
def test_a_workload_with_fewer_than_two_rated_runs_is_valid_and_reported(
    tmp_path: Path, findings: dict[str, Any], rated: int
) -> None:
    prose = findings["measurement"]["prose"]
    for run in prose["runs"][rated:]:
        run.update(abandoned=True, ttft_s=None, decode_tps=None, e2e_tps=None)
    rates = [r["decode_tps"] for r in prose["runs"][:rated]]
    prose.update(n=rated, mean_tps=rates[0] if rates else None, ci95=None, outliers=[])
    findings["findings"].append(
        {
            "code": "measure.too_few_runs",
            "title": f"Only {rated} prose run(s) gave a decode rate; no interval",
            "evidence": {"workload": "prose", "n": rated, "warnings": []},
            "change": {},
            "impact": None,
        }
    )
    validate_findings(findings)
    pdf = render(findings, tmp_path, customer=CUSTOMER, as_of=ISSUED).pdf_path
    flat = squash(pdf_text(pdf, layout=False))
    assert _has(flat, f"Only {rated} prose run(s) gave a decode rate; no interval")


def test_pages_carry_numbers_and_a_running_header(reference_report: ReferenceReport) -> None:
    pages = reference_report.report.pages
    reader = PdfReader(reference_report.report.pdf_path)
    assert len(reader.pages) == pages
    second = squash(reader.pages[1].extract_text())
    assert f"Page 2 of {pages}" in second
    assert f"{CUSTOMER}: serving diagnostic" in second
    assert "1 Summary" in second


def test_every_page_rasterizes(reference_report: ReferenceReport, tmp_path: Path) -> None:
    tool = require_tool("pdftoppm")
    subprocess.run(
        [tool, "-png", "-r", "30", str(reference_report.report.pdf_path), str(tmp_path / "p")],
        check=True,
        capture_output=True,
    )
    pngs = sorted(tmp_path.glob("p-*.png"))
    assert len(pngs) == reference_report.report.pages
    assert all(p.read_bytes().startswith(b"\x89PNG") and p.stat().st_size > 1000 for p in pngs)


def test_the_plots_are_in_the_pdf_with_their_captions(reference_report: ReferenceReport) -> None:
    flat = reference_report.flat
    for number in range(1, 5):
        assert _has(flat, f"Figure {number}.")
    assert _has(flat, "seconds into the stall")  # text inside the telemetry SVG
    assert reference_report.report.refused_urls == ()


def test_a_report_is_the_same_version_and_bytes_when_rendered_again(tmp_path: Path) -> None:
    document = minimal_findings()
    first = render(document, tmp_path / "a", customer=CUSTOMER, as_of=ISSUED)
    second = render(document, tmp_path / "b", customer=CUSTOMER, as_of=ISSUED)
    assert first.digest == second.digest
    assert first.pdf_path.read_bytes() == second.pdf_path.read_bytes()


def test_a_missing_stage_reads_not_run_and_invents_nothing(tmp_path: Path) -> None:
    report = render(minimal_findings(), tmp_path, customer=CUSTOMER, as_of=ISSUED)
    flat = squash(pdf_text(report.pdf_path, layout=False))
    assert flat.count("Not run in this engagement.") == 3
    assert "Decode rate, code" not in flat
    assert "Cold start" in flat


def test_a_staff_override_is_printed_with_who_when_and_why(tmp_path: Path) -> None:
    override = OverrideEntry(
        eligible=True,
        reason="Our lab lost power for two hours during the measurements.",
        by="Dana Reyes",
        at=dt.datetime(2025, 12, 2, 9, 30, tzinfo=dt.UTC),
    )
    report = render(minimal_findings(), tmp_path, customer=CUSTOMER, as_of=ISSUED, overrides=[override])
    flat = squash(pdf_text(report.pdf_path, layout=False))
    assert report.money_back.eligible is True
    assert "2025-12-02 09:30 UTC Dana Reyes free of charge Our lab lost power" in flat
    assert "By the rule alone the engagement is charged as agreed." in flat
    assert "Applies: this engagement is free of charge" in flat


@pytest.mark.parametrize("late", [False, True])
def test_a_late_report_is_free(tmp_path: Path, late: bool) -> None:
    as_of = dt.datetime(2025, 12, 3, 9, 0, tzinfo=dt.UTC) if late else ISSUED
    report = render(minimal_findings(), tmp_path, customer=CUSTOMER, as_of=as_of)
    assert report.money_back.eligible is late


def test_writing_the_decision_back_into_the_findings_keeps_the_version() -> None:
    document = minimal_findings()
    decision = assess(document, as_of=ISSUED)
    before = report_digest(document, customer=CUSTOMER, lab_day=None, money_back=decision)
    document["money_back"] = decision.as_findings()
    assert report_digest(document, customer=CUSTOMER, lab_day=None, money_back=decision) == before
    document["findings"][0]["title"] = "A different title"
    assert report_digest(document, customer=CUSTOMER, lab_day=None, money_back=decision) != before


def test_the_job_moving_on_after_the_report_keeps_the_version() -> None:
    # The report stage renders while the job is running; findings.json is written again
    # when the job ends. Both must name the same report version.
    document = minimal_findings()
    document["job"].update(status="running", stages=[{"name": "report", "status": "running"}])
    decision = assess(document, as_of=ISSUED)
    during = report_digest(document, customer=CUSTOMER, lab_day=None, money_back=decision)
    document["job"].update(
        status="succeeded",
        stages=[{"name": "report", "status": "succeeded"}],
        lab_time_s=document["job"]["lab_time_s"] + 1.4,
        wall_time_s=document["job"]["wall_time_s"] + 1.1,
    )
    assert report_digest(document, customer=CUSTOMER, lab_day=None, money_back=decision) == during
    # Without a recorded dilation the report estimates it from those times: they count.
    del document["job"]["lab_dilation"]
    without = report_digest(document, customer=CUSTOMER, lab_day=None, money_back=decision)
    document["job"]["wall_time_s"] += 100
    assert report_digest(document, customer=CUSTOMER, lab_day=None, money_back=decision) != without


def test_a_lab_warning_reads_as_a_warning_and_a_blocking_lab_finding_as_ours(tmp_path: Path) -> None:
    warning = {"code": "lab.link_speed", "title": "spark-04's data link runs at 25 Gbps", "evidence": {},
               "change": {}, "impact": None, "blocking": False}
    document = minimal_findings()
    document["findings"].append(warning)
    flat = squash(pdf_text(render(document, tmp_path / "w", customer=CUSTOMER, as_of=ISSUED).pdf_path,
                           layout=False))
    assert _has(flat, "It did not stop your configuration from being reproduced")
    assert "could not reproduce the configuration (lab." not in flat
    document["findings"][-1] = {**warning, "code": "lab.node_unreachable", "blocking": True,
                                "title": "spark-05 refused SSH"}
    flat = squash(pdf_text(render(document, tmp_path / "b", customer=CUSTOMER, as_of=ISSUED).pdf_path,
                           layout=False))
    assert _has(flat, "Our lab could not reproduce the configuration (lab.node_unreachable).")


def test_the_stages_a_stopped_job_skipped_are_part_of_the_version() -> None:
    document = minimal_findings()
    decision = assess(document, as_of=ISSUED)
    ran = report_digest(document, customer=CUSTOMER, lab_day=None, money_back=decision)
    skipped = {"name": "measure", "status": "cancelled", "message": "not run: preflight: down"}
    document["job"]["stages"] = [skipped]
    assert report_digest(document, customer=CUSTOMER, lab_day=None, money_back=decision) != ran
