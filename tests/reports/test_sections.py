"""The measured sections (reports.sections) read their decisions from findings: the FP4
pipeline's verdicts and the measure stage's words for each cause, never their own."""

from __future__ import annotations

from typing import Any

from reports.sections.fp4 import fp4_section
from reports.structure import NO_CAUSE_DESCRIPTION
from tests.reports.conftest import report_content

OVERCLAIM_CAUSE = "metrics.server_counts_proposed"


def _throughput_paragraphs(document: dict[str, Any]) -> list[str]:
    (stage,) = [s for s in report_content(document).stages if s.anchor == "throughput"]
    return [b.text for b in stage.blocks if b.kind == "paragraph"]


def test_the_reconciliation_names_each_cause_in_the_measurement_s_own_words(findings: dict[str, Any]) -> None:
    findings["measurement"]["cause_descriptions"][OVERCLAIM_CAUSE] = "Words the measure stage wrote."
    assert f"{OVERCLAIM_CAUSE}: Words the measure stage wrote." in _throughput_paragraphs(findings)


def test_the_reconciliation_says_when_it_has_no_words_for_a_cause(findings: dict[str, Any]) -> None:
    del findings["measurement"]["cause_descriptions"][OVERCLAIM_CAUSE]
    assert f"{OVERCLAIM_CAUSE}: {NO_CAUSE_DESCRIPTION}" in _throughput_paragraphs(findings)


def test_the_fp4_section_prints_the_pipeline_s_verdict_after(findings: dict[str, Any]) -> None:
    findings["fp4"]["verdict_after"] = "degraded"
    (text, *_) = (b.text for b in fp4_section(findings["fp4"], "3.2").blocks)
    lo = findings["fp4"]["canary_ci95"]["after"][0]
    assert text.endswith(
        f"With the cutlass backend the output is degraded (100 % of 80 canaries, 95 % interval "
        f"{lo * 100:.1f}\u2013100 %)."
    )
    assert "0 % of 40 canary prompts were answered correctly, 95 % interval 0\u20138.8 %." in text


def test_without_a_verdict_after_the_fp4_section_gives_the_pass_rate_and_no_verdict(
    findings: dict[str, Any],
) -> None:
    del findings["fp4"]["verdict_after"]
    findings["fp4"]["canary_pass_rate"]["after"] = 0.7
    (text, *_) = (b.text for b in fp4_section(findings["fp4"], "3.2").blocks)
    total = findings["fp4"]["canaries"]
    assert text.endswith(f"With the cutlass backend, 70 % of {total} canary prompts were answered correctly.")
    assert not any(word in text.split("With the cutlass backend")[1] for word in ("garbage", "degraded"))
