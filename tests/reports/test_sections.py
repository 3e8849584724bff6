"""The measured sections (reports.sections) read their decisions from findings: the FP4
pipeline's verdicts and the measure stage's words for each cause, never their own."""

from __future__ import annotations

import copy
from typing import Any

from reports import figures as fig
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


def test_the_cold_start_section_notes_the_one_time_compile_of_a_kept_cache(findings: dict[str, Any]) -> None:
    findings["cold_start"]["after_first_boot_s"] = 296.4
    (stage,) = [s for s in report_content(findings).stages if s.anchor == "cold-start"]
    texts = [b.text for b in stage.blocks if b.kind == "paragraph"]
    after = fig.seconds(findings["cold_start"]["after_s"])
    assert (
        "The first start of the tuned configuration compiled the kernels once into the kept cache and took "
        f"296 s; every start after it took {after}." in texts
    )
    # The triage's own warm-up of the kept cache before its proving run is said too.
    assert any(
        t.startswith("For \u201cpersisted JIT cache\u201d the engine was first started once") for t in texts
    )


def test_the_throughput_table_sets_each_rate_against_the_hardware_s_bound(findings: dict[str, Any]) -> None:
    (stage,) = [s for s in report_content(findings).stages if s.anchor == "throughput"]
    table = next(b for b in stage.blocks if b.kind == "table")
    assert table.columns[-1] == "Of the bound"
    roofline = findings["measurement"]["roofline"]
    assert [row[-1] for row in table.rows] == [
        fig.percent(roofline[side][w]["fraction"])
        for w in ("code", "prose")
        for side in ("customer", "tuned")
    ]


def test_a_cumulative_waterfall_is_told_as_fixes_added_to_the_ones_before() -> None:
    from reports.sections.findings import impact_sources
    from reports.structure import waterfall_proofs

    added_design = [{"mode": "baseline", "n": 2}, {"mode": "alone", "fixes": "load.weights_io", "n": 1},
                    {"mode": "cumulative", "fixes": "load.rendezvous", "n": 1},
                    {"mode": "all", "fixes": "load.jit_compile", "n": 1}]
    added, proofs = waterfall_proofs(added_design)
    assert added
    assert [w["fixes"] for w in proofs] == ["load.weights_io", "load.rendezvous", "load.jit_compile"]
    source = impact_sources({"cold_start": {"waterfall": added_design}})["load."]
    assert "added to the ones proved before it" in source

    alone_design = [{"mode": "baseline", "n": 2}, {"mode": "alone", "fixes": "load.weights_io", "n": 2},
                    {"mode": "alone", "fixes": "load.rendezvous", "n": 2},
                    {"mode": "all", "fixes": None, "n": 2}]
    added, proofs = waterfall_proofs(alone_design)
    assert not added and [w["fixes"] for w in proofs] == ["load.weights_io", "load.rendezvous"]
    assert "with this fix alone" in impact_sources({"cold_start": {"waterfall": alone_design}})["load."]


def _speculative_rows(document: dict[str, Any]) -> list[list[str]]:
    (stage,) = [s for s in report_content(document).stages if s.anchor == "speculative"]
    return [list(r) for b in stage.blocks if b.kind == "table" for r in b.rows]


def test_no_speculation_answered_by_its_screening_runs_is_labelled_so(findings: dict[str, Any]) -> None:
    none = findings["speculative"]["none"]
    none["code"] = {**none["code"], "phase": "screen", "n": 5}
    rows = _speculative_rows(findings)
    labels = {(r[0], r[1]) for r in rows}
    assert ("code", "no speculation (screening runs)") in labels
    # A confirmed one keeps its plain label.
    assert ("prose", "no speculation") in labels


def test_the_acceptance_models_curves_are_drawn_and_said_when_the_search_followed_them(
    findings: dict[str, Any],
) -> None:
    from reports.sections.speculative import model_curves, search_paragraph

    spec = findings["speculative"]
    assert "spec-decode lines" not in search_paragraph(spec)  # no model: no claim of one
    spec["rate_model"] = {"predicted_tps": {"eagle3/code": {"1": 24.3, "2": 27.5, "3": 27.7, "4": 25.9},
                                            "eagle3/prose": {"1": 22.9, "2": 23.7}, "bad": {"x": 1}}}
    curves = model_curves(spec)
    assert curves == {("eagle3", "code"): {1: 24.3, 2: 27.5, 3: 27.7, 4: 25.9},
                      ("eagle3", "prose"): {1: 22.9, 2: 23.7}}
    assert "every shorter one (dotted in the chart)" in search_paragraph(spec)
    from reports import plots

    trials = [{**t, "stage": t.get("phase", "screen")} for t in spec["trials"] if t.get("ci95")]
    svg = plots.specdec_sweep(trials, customer=("eagle3", 4), best={}, scope="t", predicted=curves)
    assert "acceptance model" in svg


def test_a_server_figure_that_agrees_with_delivery_is_said_to_agree(findings: dict[str, Any]) -> None:
    # The modelled releases count honestly: one request at a time the engine's figure is
    # what the client received, and the report says so rather than look for a cause.
    document = copy.deepcopy(findings)
    measurement = document["measurement"]
    measurement["reconciliation"] = []
    for workload in ("code", "prose"):
        measurement["server_claimed_tps"][workload] = measurement[workload]["mean_tps"] * 1.01
    paragraphs = _throughput_paragraphs(document)
    assert any(p.startswith("The server's figure agrees with what the client received (claimed / "
                            "delivered: code 1.01×, prose 1.01×, within 5%)") for p in paragraphs), paragraphs
    assert "No known cause was found to explain the difference." not in paragraphs
    measurement["server_claimed_tps"]["code"] = measurement["code"]["mean_tps"] * 1.3
    assert "No known cause was found to explain the difference." in _throughput_paragraphs(document)


def test_settings_that_hide_evidence_are_named_with_what_they_hide(findings: dict[str, Any]) -> None:
    document = copy.deepcopy(findings)
    document["config"]["extra_args"] = [*document["config"]["extra_args"], "--disable-log-stats"]
    [said] = [p for p in _throughput_paragraphs(document) if p.startswith("Your configuration hides")]
    assert "--disable-log-stats hides the engine's periodic stats lines" in said
    assert "We ran it with that evidence on" in said
