"""The money-back rule (METHODOLOGY.md): each clause on its own, then staff overrides."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from reports.moneyback import OverrideEntry, assess, better_direction, report_deadline

MONDAY = dt.date(2025, 12, 1)
FRIDAY = dt.date(2025, 11, 28)
ON_TIME = dt.datetime(2025, 12, 1, 16, 0, tzinfo=dt.UTC)


def _with_impacts(findings: dict[str, Any], *impacts: dict[str, Any] | None) -> dict[str, Any]:
    """The document with only these impacts: the measure stage's tuned-against-customer
    differences count as improvements too, so they go as well."""
    document = copy.deepcopy(findings)
    document["measurement"].pop("difference", None)
    document["findings"] = [
        {"code": f"test.finding_{i}", "title": "t", "evidence": {}, "change": {}, "impact": impact}
        for i, impact in enumerate(impacts)
    ]
    return document


def test_the_reference_story_is_not_free(findings: dict[str, Any]) -> None:
    decision = assess(findings, as_of=ON_TIME)
    assert decision.eligible is False
    held = {c.key: c.holds for c in decision.conditions}
    assert held == {"lab_side_failure": False, "no_demonstrated_improvement": False, "late_report": False}
    # Demonstrated: the FP4 pass rate, both speculative rates, and the tuned configuration's
    # difference on each workload; the cold starts (one run each) have no interval, and
    # metrics.server_overclaim no impact.
    assert sum(i.demonstrated for i in decision.improvements) == 5
    # Findings by code, the tuned configuration's rates in words (never a findings.json path).
    detail = next(c.detail for c in decision.conditions if c.key == "no_demonstrated_improvement")
    assert detail == (
        "5 measured improvements with the 95 % interval excluding zero (fp4.kernel_dispatch, "
        "specdec.suboptimal, the tuned configuration's code and prose decode rates)."
    )


def test_it_is_free_when_every_interval_includes_zero(findings: dict[str, Any]) -> None:
    document = _with_impacts(
        findings,
        {"metric": "decode_tps.code", "before": 26.0, "after": 26.3, "ci95": [-0.2, 0.8]},
        {"metric": "cold_start_s", "before": 300, "after": 290, "ci95": [-25.0, 4.0]},
    )
    decision = assess(document, as_of=ON_TIME)
    assert decision.eligible is True
    assert "No finding shows a measured improvement" in decision.reason


def test_an_impact_without_an_interval_does_not_count(findings: dict[str, Any]) -> None:
    document = _with_impacts(findings, {"metric": "cold_start_s", "before": 560, "after": 150}, None)
    assert assess(document, as_of=ON_TIME).eligible is True


def test_a_measured_regression_does_not_count_as_an_improvement(findings: dict[str, Any]) -> None:
    slower_start = {"metric": "cold_start_s", "before": 150, "after": 200, "ci95": [40.0, 60.0]}
    lower_rate = {"metric": "decode_tps.prose", "before": 23.8, "after": 19.5, "ci95": [-4.8, -3.7]}
    decision = assess(_with_impacts(findings, slower_start, lower_rate), as_of=ON_TIME)
    assert decision.eligible is True
    assert [i.demonstrated for i in decision.improvements] == [False, False]


def test_durations_improve_downwards_and_rates_upwards() -> None:
    assert better_direction({"metric": "cold_start_s"}) == "lower"
    assert better_direction({"metric": "ttft_s"}) == "lower"
    assert better_direction({"metric": "decode_tps.code"}) == "higher"
    assert better_direction({"metric": "canary_pass_rate"}) == "higher"
    assert better_direction({"metric": "decode_tps.code", "better": "lower"}) == "lower"


def test_it_is_free_when_our_lab_could_not_reproduce_the_configuration(findings: dict[str, Any]) -> None:
    document = copy.deepcopy(findings)
    document["findings"].append(
        {
            "code": "lab.node_unreachable",
            "title": "spark-05 refused SSH",
            "evidence": {},
            "change": {},
            "impact": None,
            "blocking": True,
        }
    )
    decision = assess(document, as_of=ON_TIME)
    assert decision.eligible is True
    assert "lab.node_unreachable" in decision.reason


def test_a_lab_warning_that_stopped_nothing_leaves_the_rule_to_the_improvements(
    findings: dict[str, Any],
) -> None:
    document = copy.deepcopy(findings)
    # Preflight's warnings: a slow data link, or a node the configuration does not use.
    for code in ("lab.link_speed", "lab.node_unreachable"):
        document["findings"].append(
            {"code": code, "title": code, "evidence": {}, "change": {}, "impact": None, "blocking": False}
        )
    document["findings"].append(
        {"code": "lab.clock_skew", "title": "skew", "evidence": {}, "change": {}, "impact": None}
    )
    decision = assess(document, as_of=ON_TIME)
    assert decision.eligible is False
    lab = next(c for c in decision.conditions if c.key == "lab_side_failure")
    assert lab.holds is False


def test_the_report_is_due_by_the_end_of_the_next_business_day() -> None:
    assert report_deadline(MONDAY) == dt.datetime(2025, 12, 3, 0, 0, tzinfo=dt.UTC)
    # A Friday lab day is due by the end of Monday; a holiday on Monday moves it to Tuesday.
    assert report_deadline(FRIDAY) == dt.datetime(2025, 12, 2, 0, 0, tzinfo=dt.UTC)
    assert report_deadline(FRIDAY, holidays={MONDAY}) == dt.datetime(2025, 12, 3, 0, 0, tzinfo=dt.UTC)


def test_it_is_free_when_the_report_is_sent_late(findings: dict[str, Any]) -> None:
    monday_night = dt.datetime(2025, 12, 1, 23, 30, tzinfo=dt.UTC)
    tuesday_morning = dt.datetime(2025, 12, 2, 9, 0, tzinfo=dt.UTC)
    assert assess(findings, lab_day=FRIDAY, sent_at=monday_night).eligible is False
    late = assess(findings, lab_day=FRIDAY, sent_at=tuesday_morning)
    assert late.eligible is True
    assert "deadline was the end of Monday 2025-12-01" in late.reason


def test_an_earlier_send_keeps_a_later_reissue_on_time(findings: dict[str, Any]) -> None:
    first_sent = dt.datetime(2025, 12, 1, 17, 0, tzinfo=dt.UTC)
    reissued_next_week = dt.datetime(2025, 12, 8, 9, 0, tzinfo=dt.UTC)
    assert assess(findings, sent_at=first_sent, as_of=reissued_next_week).eligible is False
    assert assess(findings, as_of=reissued_next_week).eligible is True


def test_an_unrecorded_lab_day_is_not_assessed_and_does_not_make_it_free(findings: dict[str, Any]) -> None:
    document = copy.deepcopy(findings)
    del document["job"]["lab_day"]
    decision = assess(document, as_of=dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
    late = next(c for c in decision.conditions if c.key == "late_report")
    assert late.holds is None
    assert decision.eligible is False


def test_the_latest_staff_override_decides_and_every_one_is_kept(findings: dict[str, Any]) -> None:
    first = OverrideEntry(
        True,
        "Customer's cluster was down half the day.",
        "alice",
        dt.datetime(2025, 12, 2, 9, 0, tzinfo=dt.UTC),
    )
    second = OverrideEntry(
        False,
        "Cluster outage was announced in advance by the customer.",
        "bob",
        dt.datetime(2025, 12, 2, 11, 0, tzinfo=dt.UTC),
    )
    decision = assess(findings, as_of=ON_TIME, overrides=[second, first])
    assert decision.computed_eligible is False
    assert [o.by for o in decision.overrides] == ["alice", "bob"]
    assert decision.override == second
    assert decision.eligible is False
    assert decision.reason.startswith("Staff override by bob: charged.")

    free = assess(findings, as_of=ON_TIME, overrides=[first])
    assert free.eligible is True
    assert free.as_findings()["override"]["by"] == "alice"


def test_the_measured_before_and_after_counts_only_where_its_interval_excludes_zero(
    findings: dict[str, Any],
) -> None:
    document = _with_impacts(findings)  # no finding shows an impact of its own
    document["measurement"] = {
        **document["measurement"],
        "difference": {
            "code": {
                "metric": "decode_tps",
                "before": 26.0,
                "after": 26.2,
                "diff": 0.2,
                "ci95": [-0.3, 0.7],
                "p": 0.4,
            },
        },
    }
    assert assess(document, as_of=ON_TIME).eligible is True
    document["measurement"]["difference"]["prose"] = {
        "metric": "decode_tps",
        "before": 19.6,
        "after": 23.7,
        "diff": 4.1,
        "ci95": [3.6, 4.6],
        "p": 1e-9,
    }
    decision = assess(document, as_of=ON_TIME)
    assert decision.eligible is False
    assert [i.code for i in decision.improvements if i.demonstrated] == ["measurement.difference.prose"]


def test_the_days_cold_start_counts_when_its_interval_is_below_zero(findings: dict[str, Any]) -> None:
    document = _with_impacts(findings)
    document["measurement"] = {k: v for k, v in document["measurement"].items() if k != "difference"}
    document["cold_start"] = {**document["cold_start"], "difference": {
        "metric": "cold_start_s", "better": "lower", "before": 559.5, "after": 146.0, "diff": -413.5,
        "ci95": [-430.0, -397.0], "p": 1e-4,
    }}
    decision = assess(document, as_of=ON_TIME)
    assert decision.eligible is False
    assert [i.code for i in decision.improvements if i.demonstrated] == ["cold_start.difference"]
    document["cold_start"]["difference"]["ci95"] = [-900.0, 60.0]
    assert assess(document, as_of=ON_TIME).eligible is True
