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

from diagnostic.jobs.findings_document import validate_findings
from reports import figures as fig
from reports.moneyback import OverrideEntry, assess
from reports.render import render, report_digest
from reports.sections.findings import impact_formatters
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
    measurement = f["measurement"]
    for workload in ("code", "prose"):
        # After is the tuned configuration as the measure stage measured it, and the change
        # its Welch difference, not the speculative search's shorter runs.
        before, after = measurement[workload], measurement["tuned"][workload]
        difference = measurement["difference"][workload]
        for block in (before, after):
            assert _has(flat, fig.tps(block["mean_tps"])), workload
            assert _has(flat, f"({fig.interval(block['ci95'], fig.tps)})"), workload
        assert _has(flat, fig.signed(difference["diff"], fig.tps))
        assert _has(flat, fig.signed_interval(difference["ci95"], fig.tps))
        for side in ("customer", "tuned"):
            share = measurement["roofline"][side][workload]["fraction"]
            assert _has(flat, f"{fig.percent(share)} of what this hardware allows"), (workload, side)
    code = fig.tps(measurement["code"]["mean_tps"]), fig.tps(measurement["tuned"]["code"]["mean_tps"])
    assert _has(flat, f"single-stream decode on code goes from {code[0]} to {code[1]} tok/s")


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
        "Also tested: metrics.server_busy_time (not present), metrics.unseen_tokens (not present), "
        "metrics.orphaned_requests (not present), metrics.client_counts_chunks (present, but does not "
        "explain the ratio).",
    )
    windows = sum(f["measurement"][w]["server_claim"]["log"]["windows"] for w in ("code", "prose"))
    assert _has(flat, f"{windows} log windows qualified.")


def test_the_overclaim_finding_sets_each_claim_beside_what_was_delivered(
    reference_report: ReferenceReport,
) -> None:
    f, text, flat = reference_report.findings, reference_report.text, reference_report.flat
    finding = next(x for x in f["findings"] if x["code"] == "metrics.server_overclaim")
    evidence = finding["evidence"]
    for w in ("code", "prose"):
        got, claims = evidence["delivered"][w], evidence["claims"][w]
        cells = [w, fig.tps(got["mean_tps"]), fig.interval(got["ci95"], fig.tps)]
        for source in ("log", "metrics"):
            claimed = claims[source]["claimed_tps"]
            cells += [fig.tps(claimed), f"({fig.ratio(claimed / got['mean_tps'])})"]
        assert re.search(r"^\s*" + r"\s+".join(map(re.escape, cells)), text, flags=re.MULTILINE), cells
    assert _has(flat, "Explained by metrics.server_counts_proposed: The server counts every proposed")
    assert _has(flat, "No performance change: this finding corrects how throughput is counted")


def test_every_raw_run_is_printed_on_its_own_row(reference_report: ReferenceReport) -> None:
    f, text = reference_report.findings, reference_report.text
    for workload in ("code", "prose"):
        blocks = f["measurement"][workload], f["measurement"]["tuned"][workload]
        for idx, (run_before, run_after) in enumerate(zip(blocks[0]["runs"], blocks[1]["runs"], strict=True)):
            cells = [str(run_before["index"] + 1), str(run_before["prompt_index"] + 1)]
            for block, run in zip(blocks, (run_before, run_after), strict=True):
                # Every run here has a rate, so outlier positions are run positions.
                slow = " *" if idx in block["ttft"]["outliers"] else ""
                odd = " *" if idx in block["outliers"] else ""
                cells += [
                    fig.number(run["tokens"]),
                    fig.number(run["usage_completion_tokens"]),
                    fig.milliseconds(run["ttft_s"]) + slow,
                    fig.tps(run["decode_tps"]) + odd,
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
        r"^\s*2\s+2\s+512\s+512\s+"
        + re.escape(fig.milliseconds(second["ttft_s"]))
        + r" \*\s+"
        + re.escape(fig.tps(second["decode_tps"]))
        + r"\s",
        text,
        flags=re.MULTILINE,
    )
    assert re.search(
        r"^\s*4\s+4\s+512\s+512\s+"
        + re.escape(fig.milliseconds(fourth["ttft_s"]))
        + r"\s+"
        + re.escape(fig.tps(fourth["decode_tps"]))
        + r" \*",
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
    for number in range(1, 6):
        assert _has(flat, f"Figure {number}.")
    assert _has(flat, "seconds into the stall")  # text inside the telemetry SVG
    assert reference_report.report.refused_urls == ()


def test_the_findings_follow_their_impact_and_the_contents_number_them_so(
    reference_report: ReferenceReport,
) -> None:
    flat = reference_report.flat
    titles = {f["code"]: f["title"] for f in reference_report.findings["findings"]}
    assert _has(flat, f"2.1 {titles['fp4.kernel_dispatch']}")
    assert _has(flat, f"2.2 {titles['load.weights_io']}")
    assert _has(flat, f"2.7 {titles['metrics.server_overclaim']}")
    assert _has(flat, "Findings are in order of impact")


def test_no_raw_keys_or_structures_reach_the_page(reference_report: ReferenceReport) -> None:
    flat = reference_report.flat
    for raw in (
        "decided_by",
        "_range",
        "diff_tps",
        "disk_read_mbps",
        "{'",
        "': ",
        "share of canaries",
        "Decided by",
    ):
        assert raw not in flat, raw
    # The rendezvous change prints each NCCL variable once, and says whose names they are.
    rendezvous = next(f for f in reference_report.findings["findings"] if f["code"] == "load.rendezvous")
    for name, value in rendezvous["change"]["env"].items():
        assert flat.count(f"+ {name}={value}") == 1, name
        assert f"env.{name}: (unset)" not in flat
    assert _has(flat, "The interface names above are our lab's")
    assert _has(flat, "ip route show default") and _has(flat, "ibdev2netdev")


def test_the_cold_start_waterfall_shows_each_signature_gone_after_its_fix(
    reference_report: ReferenceReport,
) -> None:
    text, flat = reference_report.text, reference_report.flat
    for step in reference_report.findings["cold_start"]["waterfall"]:
        assert _has(flat, f"{fig.seconds(step['cold_start_s'])}".replace(" s", "")), step["step"]
        assert _has(
            flat,
            "still seen: "
            + (", ".join(c.removeprefix("load.").replace("_", " ") for c in step["signatures"]) or "none"),
        )
    assert re.search(
        r"data-path NCCL\s+env\.NCCL_SOCKET_IFNAME: not set \u2192\s+1\s+499\s+\u221260\s+seen\s+seen\s+gone",
        text,
    )
    assert _has(
        flat, "Each fix removed its own signature: load.weights_io, load.jit_compile, load.rendezvous"
    )
    assert _has(flat, "was first started once to compile its kernels into the kept cache (346 s of lab time)")


def test_the_fp4_section_sets_the_answers_side_by_side_and_the_speed_cost_against_noise(
    reference_report: ReferenceReport,
) -> None:
    f, text, flat = reference_report.findings, reference_report.text, reference_report.flat
    for before, after in zip(f["fp4"]["examples"]["before"], f["fp4"]["examples"]["after"], strict=True):
        if "\n" in before["prompt"] or len(before["prompt"]) > 30:
            continue
        assert re.search(
            re.escape(before["prompt"][:20])
            + r".*\u2717 ?"
            + re.escape(before["got"])
            + r"\s+\u2713 ?"
            + re.escape(after["got"]),
            text,
        ), before["id"]
    assert _has(flat, "\u2717 " + f["fp4"]["examples"]["before"][0]["got"])
    for workload, cost in f["fp4"]["speed_cost"].items():
        cells = [workload, fig.tps(cost["before_tps"]), fig.tps(cost["after_tps"])]
        assert re.search(
            r"^\s*" + r"\s+".join(map(re.escape, cells)) + r".*within noise\s*$", text, flags=re.MULTILINE
        ), workload
    assert _has(flat, "correct output costs no measurable speed")


def test_the_speculative_section_gives_the_deployed_setting_in_the_customer_s_syntax(
    reference_report: ReferenceReport,
) -> None:
    spec, flat = reference_report.findings["speculative"], reference_report.flat
    assert _has(flat, "Your launch command has: " + spec["customer_launch_syntax"])
    assert _has(flat, "Replace it with: " + spec["deployed"]["launch_syntax"])
    assert _has(
        flat,
        f"{fig.percent(spec['lab_time_vs_sweep'])} of the {fig.hours(spec['sweep_estimate_s'])} "
        "an exhaustive sweep of all 33 settings",
    )
    assert _has(flat, f"we deploy eagle3, k = 2: {fig.tps(spec['deployed']['mix_tps'])} tok/s over the mix")
    assert _has(flat, "eagle3, k = 1 not confirmed: lab-time budget")
    assert _has(flat, "diamonds are confirmation runs")


def test_the_appendices_carry_the_tuned_configuration_the_lab_time_and_the_bound(
    reference_report: ReferenceReport,
) -> None:
    f, text, flat = reference_report.findings, reference_report.text, reference_report.flat
    for line in f["tuned"]["command"].splitlines():
        if line.startswith("  --"):
            assert _has(flat, line), line
    for line in f["tuned"]["diff"].splitlines():
        if line.startswith(("+ ", "- ")) or line.startswith(("+  ", "-  ")):
            assert squash(line) in flat, line
    assert _has(flat, "speculative.num_speculative_tokens 4 2 2.4, 2.6")
    job = f["job"]
    for stage in job["stages"]:
        assert _has(flat, fig.seconds(stage["lab_seconds"])), stage["name"]
    total = [fig.minutes(job["lab_time_s"]), fig.seconds(job["lab_time_s"]), "100 %"]
    assert re.search(r"The whole day\s+" + r"\s+".join(map(re.escape, total)), text)
    bound = f["measurement"]["roofline"]["tuned"]["code"]
    assert _has(flat, fig.tps(bound["bound_tps"]))
    assert _has(flat, "(specifications: 128 GB LPDDR5x unified memory, 273 GB/s)")
    assert _has(
        flat,
        "Formula: bound = tensor-parallel group × memory bandwidth per GPU / weights read per token × "
        "tokens per step.",
    )


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
    warning = {
        "code": "lab.link_speed",
        "title": "spark-04's data link runs at 25 Gbps",
        "evidence": {},
        "change": {},
        "impact": None,
        "blocking": False,
    }
    document = minimal_findings()
    document["findings"].append(warning)
    flat = squash(
        pdf_text(render(document, tmp_path / "w", customer=CUSTOMER, as_of=ISSUED).pdf_path, layout=False)
    )
    assert _has(flat, "It did not stop your configuration from being reproduced")
    assert "could not reproduce the configuration (lab." not in flat
    document["findings"][-1] = {
        **warning,
        "code": "lab.node_unreachable",
        "blocking": True,
        "title": "spark-05 refused SSH",
    }
    flat = squash(
        pdf_text(render(document, tmp_path / "b", customer=CUSTOMER, as_of=ISSUED).pdf_path, layout=False)
    )
    assert _has(flat, "Our lab could not reproduce the configuration (lab.node_unreachable).")


def test_the_stages_a_stopped_job_skipped_are_part_of_the_version() -> None:
    document = minimal_findings()
    decision = assess(document, as_of=ISSUED)
    ran = report_digest(document, customer=CUSTOMER, lab_day=None, money_back=decision)
    skipped = {"name": "measure", "status": "cancelled", "message": "not run: preflight: down"}
    document["job"]["stages"] = [skipped]
    assert report_digest(document, customer=CUSTOMER, lab_day=None, money_back=decision) != ran
