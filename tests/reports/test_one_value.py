"""One figure, one source: the rendered PDF read back gives each quantity one value.

The check reads the text the customer reads (pdftotext of the real PDF, WeasyPrint
rendered), finds every place that prints a labelled quantity (the day's cold start before
and after and its change, each workload's rate before and after and its change, the
deployed speculative setting, whether the report was sent on time) and fails when two of
them disagree beyond their printed precision: "2.4 min" and "149 s" may be one value;
"2.4 min" and "162 s", or "−414 s" and "−415 s", are not.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import pytest

from reports.figures import MINUS
from tests.reports.conftest import ReferenceReport

DAYS = ["reference_report", "reference_report_28"]

NUMBER = rf"[+{MINUS}-]?\d[\d,]*(?:\.\d+)?"


@dataclass(frozen=True)
class Reading:
    """One printed value of a quantity: where it was read, and the range it stands for."""

    where: str
    text: str
    low: float
    high: float


def _parse(text: str) -> tuple[float, float]:
    """A printed number and its precision: `2.4` stands for [2.35, 2.45)."""
    clean = text.replace(MINUS, "-").replace(",", "")
    value = float(clean)
    decimals = len(clean.split(".")[1]) if "." in clean else 0
    return value, 0.5 * 10**-decimals


def reading(where: str, text: str, scale: float = 1.0) -> Reading:
    value, half = _parse(text)
    return Reading(where, text, (value - half) * scale, (value + half) * scale)


# (quantity, where, pattern, scale per group): each group of a match is one printed value
# of its quantity, times its scale (minutes to seconds). The patterns read the flat text
# (reading order, whitespace folded) unless marked `layout`.
PATTERNS: list[tuple[str, str, tuple[tuple[str, float], ...], bool]] = [
    (
        "headline",
        r"a cold start falls from (N) min to (N) min",
        (("cold start before", 60.0), ("cold start after", 60.0)),
        False,
    ),
    (
        "summary table",
        r"^\s*Cold start\s+(N) min\s+(N) min\s+(N) s\s*\n.*?\((N) s\)\s+\((N) s\)",
        (
            ("cold start before", 60.0),
            ("cold start after", 60.0),
            ("cold start change", 1.0),
            ("cold start before", 1.0),
            ("cold start after", 1.0),
        ),
        True,
    ),
    ("section 3.1", r"page cache dropped\) took (N) s", (("cold start before", 1.0),), False),
    ("timeline figure", r"your configuration: true cold start (N) s", (("cold start before", 1.0),), False),
    ("section 3.5", r"so the stage spent (N) s of lab time", (("gap stage lab time", 1.0),), False),
    (
        "section 3.6",
        r"On (code|prose), with our changes, one stream receives (N) tok/s",
        (("{} rate after", 1.0),),
        False,
    ),
    ("appendix C", r"^\s*gap\s+N.N min\s+(N) s\s", (("gap stage lab time", 1.0),), True),
    ("section 3.1", r"with the changes in this report it took (N) s", (("cold start after", 1.0),), False),
    (
        "waterfall table",
        r"^\s*customer configuration\s+none: your configuration\s+\d+\s+(N)\b",
        (("cold start before", 1.0),),
        True,
    ),
    (
        "waterfall table",
        r"with every change in this report (N) the tuned configuration: every change of this "
        r"report, its own true cold starts \d+ (?:N.N\u2013N.N )?(N)",
        (("cold start after", 1.0), ("cold start change", 1.0)),
        False,
    ),
    (
        "waterfall figure",
        r"^\s*with every change in this report\s+(N) s \((N) s\)",
        (("cold start after", 1.0), ("cold start change", 1.0)),
        True,
    ),
    (
        "summary table",
        r"^\s*Decode rate, (code|prose) \(tok/s\)\s+(N)\s+(N)\s+(N)\s*$",
        (("{} rate before", 1.0), ("{} rate after", 1.0), ("{} rate change", 1.0)),
        True,
    ),
    (
        "headline",
        r"single-stream decode on (code|prose) goes from (N) to (N) tok/s",
        (("{} rate before", 1.0), ("{} rate after", 1.0)),
        False,
    ),
    (
        "section 3.4 table",
        r"^\s*(code|prose)\s+your configuration \(.*?\)\s+\d+\s+(N)\s",
        (("{} rate before", 1.0),),
        True,
    ),
    (
        "section 3.4 table",
        r"^\s*(code|prose)\s+with our changes \(.*?\)\s+\d+\s+(N)\s",
        (("{} rate after", 1.0),),
        True,
    ),
    (
        "section 3.4 text",
        r"(?:against yours \(Welch's test, 5 %\): |; )(code|prose) (N) tok/s \[",
        (("{} rate change", 1.0),),
        False,
    ),
]


def _pattern(text: str) -> str:
    return text.replace("(N)", f"({NUMBER})").replace("N.N", NUMBER)


def readings(flat: str, layout: str) -> dict[str, list[Reading]]:
    """Every labelled quantity the PDF's text prints, with where it printed it. A pattern
    whose quantity names a workload (`{} rate`) takes the workload from its first group."""
    found: dict[str, list[Reading]] = defaultdict(list)
    for where, pattern, groups, on_layout in PATTERNS:
        source = layout if on_layout else flat
        for match in re.finditer(_pattern(pattern), source, flags=re.MULTILINE):
            values = list(match.groups())
            named = "{}" in groups[0][0]
            workload = values.pop(0) if named else ""
            for (quantity, scale), text in zip(groups, values, strict=True):
                found[quantity.format(workload)].append(reading(where, text, scale))
    return found


def disagreements(found: dict[str, list[Reading]]) -> list[str]:
    """The quantities whose printed values cannot be one value."""
    out = []
    for quantity, values in found.items():
        low, high = max(r.low for r in values), min(r.high for r in values)
        if low >= high - 1e-9:  # printed ranges are half-open: touching is not sharing
            shown = "; ".join(f"{r.text} ({r.where})" for r in values)
            out.append(f"{quantity}: {shown}")
    return out


def words(flat: str, pattern: str) -> set[str]:
    return {m.group(1) for m in re.finditer(pattern, flat)}


def test_the_check_finds_a_quantity_printed_with_two_values() -> None:
    """The disagreements issue 28 found: 2.4 min against 2.7 min, \u2212414 s against \u2212415 s."""
    flat = "a cold start falls from 9.4 min to 2.4 min."
    layout = (
        f"Cold start        9.4 min      {{after}} min     {MINUS}415 s\n"
        "   true cold starts  (562 s)    ({s} s)\n"
        f"with every change in this report      147 s ({MINUS}{{figure}} s)\n"
    )
    two_afters = disagreements(readings(flat, layout.format(after="2.7", s="162", figure="414")))
    assert [d.split(":")[0] for d in two_afters] == ["cold start after", "cold start change"]
    one_after = disagreements(readings(flat, layout.format(after="2.4", s="147", figure="414")))
    assert [d.split(":")[0] for d in one_after] == ["cold start change"]
    assert disagreements(readings(flat, layout.format(after="2.4", s="147", figure="415"))) == []


@pytest.mark.parametrize("day", DAYS)
def test_the_same_quantity_is_printed_with_one_value_throughout(
    day: str, request: pytest.FixtureRequest
) -> None:
    reference_report: ReferenceReport = request.getfixturevalue(day)
    found = readings(reference_report.flat, reference_report.text)
    # Each quantity is printed in several places, or the check checks nothing.
    for quantity in (
        "cold start before",
        "cold start after",
        "cold start change",
        "code rate before",
        "code rate after",
        "prose rate change",
    ):
        assert len(found.get(quantity, [])) >= 2, (quantity, found.get(quantity))
    assert disagreements(found) == []


@pytest.mark.parametrize("day", DAYS)
def test_the_deployed_setting_is_the_one_the_findings_and_the_summary_name(
    day: str, request: pytest.FixtureRequest
) -> None:
    reference_report: ReferenceReport = request.getfixturevalue(day)
    flat = reference_report.flat
    deployed = words(flat, r"we deploy (\w+, k = \d+)")
    assert len(deployed) == 1
    (setting,) = deployed
    method, k = setting.split(", k = ")
    # A title that calls a setting faster names the one deployed, the one its impact measured.
    for title_k in words(flat, rf"On (?:code|prose), {method} k = (\d+) is faster than"):
        assert title_k == k
    assert words(flat, r"after: (\w+, k = \d+)") <= deployed


@pytest.mark.parametrize("day", DAYS)
def test_on_time_is_said_only_where_the_deadline_was_checked(
    day: str, request: pytest.FixtureRequest
) -> None:
    reference_report: ReferenceReport = request.getfixturevalue(day)
    flat = reference_report.flat
    clause = words(
        flat,
        r"Report not sent within one business day of the lab day (applies|does not apply|not "
        r"assessed)",
    )
    assert len(clause) == 1
    if "and reported on time" in flat:
        assert clause == {"does not apply"}
    if clause == {"not assessed"}:
        assert "and reported on time" not in flat


@pytest.mark.parametrize("day", DAYS)
def test_the_summary_lists_each_change_from_yours_to_ours(day: str, request: pytest.FixtureRequest) -> None:
    reference_report: ReferenceReport = request.getfixturevalue(day)
    flat, f = reference_report.flat, reference_report.findings
    assert "The changes, each proved by the finding named (setting: yours \u2192 ours)" in flat
    changes = list(_flat(f["tuned"]["changes"]))
    assert changes
    for path, before, after in changes:
        assert f"{path}: {before} \u2192 {after}" in flat, path


def _flat(changes: Iterable[dict[str, object]]) -> Iterable[tuple[str, str, str]]:
    def text(value: object) -> str:
        return (
            "not set"
            if value is None
            else ("true" if value is True else "false" if value is False else str(value))
        )

    for change in changes:
        before, after = change.get("from"), change.get("to")
        if isinstance(before, dict) and isinstance(after, dict):
            for key in dict.fromkeys([*before, *after]):
                if before.get(key) != after.get(key):
                    yield f"{change['path']}.{key}", text(before.get(key)), text(after.get(key))
        else:
            yield str(change["path"]), text(before), text(after)


@pytest.mark.parametrize("code", ["load.weights_io", "load.jit_compile", "load.rendezvous"])
def test_each_cold_start_finding_is_demonstrated_with_an_interval(
    reference_report_28: ReferenceReport, code: str
) -> None:
    reference_report = reference_report_28
    finding = next(f for f in reference_report.findings["findings"] if f["code"] == code)
    impact = finding["impact"]
    assert impact["n_before"] >= 2 and impact["n_after"] >= 2
    assert impact["ci95"][1] < 0
    samples = impact["samples"]
    assert sum(s["seconds"] for s in samples["before"]) / len(samples["before"]) == pytest.approx(
        impact["before"], abs=0.06
    )
    # Every start named in the impact is listed in section 3.1 with its phases.
    starts = {s["start"] for s in reference_report.findings["cold_start"]["starts"]}
    assert {s["start"] for s in samples["before"] + samples["after"]} <= starts
    assert "Not demonstrated" not in _finding_text(reference_report.flat, finding["title"])


def _finding_text(flat: str, title: str) -> str:
    start = flat.rindex(title)
    end = flat.find("Evidence in detail", start)
    return flat[start:end]


def test_the_issue_28_day_is_a_valid_findings_document_and_its_cold_start_findings_count() -> None:
    from diagnostic.jobs.findings_document import validate_findings
    from reports.moneyback import assess
    from tests.reports.reference_story import reference_findings_28

    document = reference_findings_28()
    validate_findings(document)
    shown = {i.code for i in assess(document).improvements if i.demonstrated}
    assert {"load.weights_io", "load.jit_compile", "load.rendezvous"} <= shown
