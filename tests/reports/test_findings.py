"""Section 2's finding sections (reports.sections.findings): any code through the generic section,
a change as a configuration diff, and causes in the measurement's own words."""

from __future__ import annotations

from typing import Any

from reports import figures as fig
from reports.sections import findings as finding_sections
from reports.structure import NO_CAUSE_DESCRIPTION
from tests.reports.conftest import report_content

OVERCLAIM_CAUSE = "metrics.server_counts_proposed"


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
    (section,) = report_content(findings).findings
    assert section.code == "kv.prefix_cache_disabled"
    assert section.lead == "Every request re-reads its system prompt."
    assert section.why == finding_sections.GENERIC_WHY
    assert [(r.label, r.value) for r in section.evidence] == [("Hit rate", "0 %"), ("Prefill", "1.3 s")]
    assert section.change.flags_add == "--enable-prefix-caching"
    (impact,) = section.impacts
    assert (impact.metric, impact.before, impact.after) == ("Time to first token", "1.4 s", "0.35 s")
    assert impact.demonstrated is True


def test_a_change_renders_as_a_configuration_and_environment_diff() -> None:
    change = finding_sections.build_change(
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
    assert change.notes == ["Set it on every node.", finding_sections.NCCL_NOTE]
    assert [(r.label, r.value) for r in change.other] == [("Restart", "rolling")]


def test_an_environment_change_written_twice_is_printed_once() -> None:
    # The triage writes the NCCL names both as configuration paths and as `env`.
    change = finding_sections.build_change(
        {
            "config": {"env.NCCL_SOCKET_IFNAME": {"from": None, "to": "enP7s7"}},
            "env": {"NCCL_SOCKET_IFNAME": "enP7s7"},
        }
    )
    assert [(d.sign, d.text) for d in change.diff] == [("+", "NCCL_SOCKET_IFNAME=enP7s7")]
    assert "ip route show default" in change.notes[-1] and "ibdev2netdev" in change.notes[-1]


def test_the_readings_that_decided_a_finding_are_shown_once_with_their_range(
    findings: dict[str, Any],
) -> None:
    (section,) = [s for s in report_content(findings).findings if s.code == "load.weights_io"]
    rows = {r.label: r.value for r in section.evidence}
    decided = next(f for f in findings["findings"] if f["code"] == "load.weights_io")["evidence"][
        "decided_by"
    ]
    lo, hi = decided["disk_read_mbps_mean_range"]
    assert rows["Disk read, mean"] == f"328.7 MB/s (from {lo:,.1f} MB/s to {hi:,.1f} MB/s across the nodes)"
    assert rows["Page cache growth"] == "27.1 GiB/min"
    assert rows["Nodes where we saw it"] == "spark-01 to spark-08 (8 nodes)"
    assert rows["Loader"] == "load format auto, safetensors load strategy lazy"
    assert "Decided by" not in rows
    text = " ".join(f"{r.label} {r.value}" for r in section.evidence)
    for raw in ("_range", "disk_read_mbps", "{", ": "):
        assert raw not in text, raw


def test_node_lists_fold_runs_of_numbered_names() -> None:
    names = ["spark-01", "spark-02", "spark-03", "spark-04", "spark-06", "spark-07", "spark-08"]
    assert finding_sections.node_list(names) == "spark-01 to spark-04, spark-06 to spark-08 (7 nodes)"
    assert finding_sections.node_list(["a", "b"]) == "a, b"


def test_the_fp4_change_gives_its_speed_cost_with_the_interval_and_says_when_it_is_noise(
    findings: dict[str, Any],
) -> None:
    (section,) = [s for s in report_content(findings).findings if s.code == "fp4.kernel_dispatch"]
    notes = " ".join(section.change.notes)
    assert "+1.60 tok/s (+6.2 %)" not in notes
    code = findings["fp4"]["speed_cost"]["code"]
    interval = fig.signed_interval(code["diff_ci95"], fig.tps)
    change = fig.signed(code["diff_tps"], fig.tps)
    assert f"code {change} tok/s (95 % interval {interval}), within noise" in notes
    assert "within noise" in notes and "Correct output costs no measurable speed." in notes
    (impact,) = section.impacts
    assert (impact.before, impact.after, impact.change) == ("0 %", "100 %", "+100.0 pp")


def _explained_by(document: dict[str, Any]) -> str:
    (section,) = [s for s in report_content(document).findings if s.code == "metrics.server_overclaim"]
    return next(r.value for r in section.evidence if r.label == "Explained by")


def test_the_overclaim_is_explained_in_the_measurement_s_own_words(findings: dict[str, Any]) -> None:
    findings["measurement"]["cause_descriptions"][OVERCLAIM_CAUSE] = "Words the measure stage wrote."
    assert _explained_by(findings) == f"{OVERCLAIM_CAUSE}: Words the measure stage wrote."


def test_a_cause_the_measurement_did_not_describe_is_said_to_have_no_description(
    findings: dict[str, Any],
) -> None:
    del findings["measurement"]["cause_descriptions"]
    assert _explained_by(findings) == f"{OVERCLAIM_CAUSE}: {NO_CAUSE_DESCRIPTION}"
