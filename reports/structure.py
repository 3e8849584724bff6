"""The report's structure: plain dataclasses holding finished text, and the small
readers every section uses to take figures out of a findings document safely.

Templates only lay these out; every figure in them is already formatted by
`reports.figures`, so the report and the tests that read it back agree on each digit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from django.utils.safestring import SafeString, mark_safe

from reports import figures as fig

WORKLOAD_ORDER = ("code", "prose")
NOT_RUN = "Not run in this engagement."
# The words for a cause come from the pipeline that tested it; a cause it left undescribed
# is said to be so rather than described from a table of the report's own.
NO_CAUSE_DESCRIPTION = "This report has no description of this cause."
ACRONYMS = {
    w.lower(): w for w in ("CPU", "GPU", "NIC", "JIT", "KV", "NCCL", "TTFT", "FP4", "MoE", "NVMe", "API")
}


@dataclass(frozen=True)
class Row:
    """A labelled value."""

    label: str
    value: str
    note: str = ""


@dataclass(frozen=True)
class SummaryRow:
    """One measure before and after; each figure may carry a second, smaller line, and a
    third for how close it comes to the hardware's bound (or whether a change is noise)."""

    label: str
    before: str
    after: str
    change: str
    note: str = ""
    before_sub: str = ""
    after_sub: str = ""
    change_sub: str = ""
    before_third: str = ""
    after_third: str = ""
    change_third: str = ""


@dataclass(frozen=True)
class DiffLine:
    sign: str  # "-" removed, "+" added
    text: str


@dataclass(frozen=True)
class Change:
    diff: list[DiffLine]
    flags_add: str
    flags_remove: str
    notes: list[str]
    other: list[Row]

    @property
    def empty(self) -> bool:
        return not (self.diff or self.flags_add or self.flags_remove or self.notes or self.other)


@dataclass(frozen=True)
class Impact:
    metric: str
    before: str
    after: str
    change: str
    interval: str
    n: str
    demonstrated: bool
    verdict: str


@dataclass(frozen=True)
class Block:
    """One piece of a section: a paragraph, a table, a plot or a list of labelled values."""

    kind: str  # "paragraph" | "table" | "plot" | "rows" | "heading" | "code" (preformatted) | "diff"
    text: str = ""
    caption: str = ""
    columns: Sequence[str] = ()
    numeric: Sequence[bool] = ()
    rows: Sequence[Sequence[str]] = ()
    pairs: Sequence[Row] = ()
    svg: SafeString | None = None
    number: int = 0
    compact: bool = False
    groups: Sequence[tuple[str, int]] = ()  # a header row above the columns: (title, columns spanned)
    wrap: bool = False  # a table of text (prompts, answers): its cells wrap instead of staying on one line

    @property
    def head(self) -> list[tuple[str, bool]]:
        """Column titles with whether each column holds figures (right-aligned)."""
        return [
            (c, bool(self.numeric[i]) if i < len(self.numeric) else False) for i, c in enumerate(self.columns)
        ]

    @property
    def body(self) -> list[list[tuple[str, bool]]]:
        return [
            [(cell, bool(self.numeric[i]) if i < len(self.numeric) else False) for i, cell in enumerate(row)]
            for row in self.rows
        ]


@dataclass(frozen=True)
class FindingSection:
    anchor: str
    number: str
    code: str
    title: str
    lead: str
    evidence: list[Row]
    evidence_tables: list[Block]
    why: str
    change: Change
    impacts: list[Impact]
    impact_note: str
    see_also: tuple[str, str] | None
    impact_source: str = ""  # how the impact was measured, when the table alone does not say


@dataclass(frozen=True)
class StageSection:
    anchor: str
    number: str
    title: str
    ran: bool
    blocks: list[Block]


@dataclass(frozen=True)
class Cover:
    title: str
    subtitle: str
    customer: str
    date: str
    lab: str
    lab_note: str
    job_id: str
    version: str
    config: list[Row]


@dataclass(frozen=True)
class MoneyBackView:
    eligible: bool
    headline: str
    status: str
    reason: str
    computed_status: str
    conditions: list[Row]
    overrides: Sequence[Sequence[str]]


@dataclass
class ReportContent:
    cover: Cover
    headline: list[str]
    summary: list[SummaryRow]
    money_back: MoneyBackView
    findings: list[FindingSection]
    stages: list[StageSection]
    appendices: list[StageSection]
    notices: list[str] = field(default_factory=list)
    summary_notes: list[str] = field(default_factory=list)
    findings_order: str = ""
    # The exact changes, `setting: yours → ours (finding 2.n)`, beside the summary table.
    changes: list[str] = field(default_factory=list)

    @property
    def any_change(self) -> bool:
        """Whether any summary row has a measured change (the table note explains those)."""
        return any(row.change for row in self.summary)

    @property
    def any_bound(self) -> bool:
        """Whether any summary figure is set against the hardware's bound."""
        return any(row.before_third or row.after_third for row in self.summary)

    @property
    def audit_number(self) -> str:
        """The money-back appendix comes after the others."""
        return chr(ord("A") + len(self.appendices))


# --------------------------------------------------------------------------- readers


class FigureCounter:
    """Numbers plots in order of appearance and keeps each plot's ids unique."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.count = 0

    def plot(self, svg_maker: Any, caption: str, **kwargs: Any) -> Block | None:
        if not self.enabled:
            return None
        self.count += 1
        svg = svg_maker(scope=f"fig{self.count}", **kwargs)
        # The SVG comes from matplotlib, never from findings text, so it is safe to inline.
        return Block(kind="plot", svg=mark_safe(svg), caption=caption, number=self.count)  # noqa: S308


def present(section: Any) -> TypeGuard[Mapping[str, Any]]:
    """A findings section that was produced: a non-empty mapping (null means not run)."""
    return isinstance(section, Mapping) and bool(section)


def waterfall_proofs(waterfall: Sequence[Any]) -> tuple[bool, list[Mapping[str, Any]]]:
    """(added, steps) of a cold-start waterfall: whether it adds each fix to the ones proved
    before it (one `alone` step at most) rather than trying each alone and then all together,
    and the steps that each prove one fix (every step after the customer's start, or in the
    each-alone design the `alone` ones)."""
    steps = [w for w in waterfall if isinstance(w, Mapping) and w.get("mode") != "baseline"]
    alone = [w for w in steps if w.get("mode") == "alone"]
    added = len(alone) <= 1
    return added, steps if added else alone


def as_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def as_interval(value: Any) -> tuple[float, float] | None:
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        lo, hi = as_number(value[0]), as_number(value[1])
        if lo is not None and hi is not None:
            return (lo, hi)
    return None


def humanize(key: str) -> str:
    words = key.replace(".", " ").split("_")
    unit_words = {"s", "ms", "tps", "mbps", "pct", "gib", "gb", "gbs"}
    qualifiers = {"mean", "peak", "max", "min", "median"}
    kept = [w for w in words if w not in unit_words]
    qualifier = ""
    if kept and kept[-1] in qualifiers:
        qualifier = kept.pop()
    kept = [ACRONYMS.get(w, w) for w in kept]
    text = " ".join(kept).strip() or key
    text = text[0].upper() + text[1:]
    return f"{text}, {qualifier}" if qualifier else text


def value_text(key: str, value: Any) -> str:
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return fig.formatter_for(fig.unit_for_key(key))(value)
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return mapping_text(value)
    if isinstance(value, Sequence):
        items = list(value)
        if len(items) > 6 and all(as_number(v) is not None for v in items):
            nums = [float(v) for v in items]
            fmt = fig.formatter_for(fig.unit_for_key(key))
            return f"{len(nums)} values, {fmt(min(nums))} to {fmt(max(nums))}"
        return ", ".join(value_text(key, v) for v in items)
    return str(value)


def p_value(p: float) -> str:
    """A p-value as people read it: `p = 0.00084`, `p < 0.0001`."""
    return "p < 0.0001" if p < 0.0001 else f"p = {p:.2g}"


def comparison_text(value: Mapping[str, Any]) -> str:
    """A pipeline's comparison of two rates ({diff_tps, ci95, p, alpha, significant}) in words."""
    parts = [fig.signed(float(value["diff_tps"]), fig.tps) + " tok/s"]
    ci = as_interval(value.get("ci95"))
    if ci:
        parts.append(f"95 % interval {fig.signed_interval(ci, fig.tps)}")
    p = as_number(value.get("p"))
    if p is not None:
        parts.append(p_value(p))
    if isinstance(value.get("significant"), bool):
        alpha = as_number(value.get("alpha"))
        at = f" at the {fig.percent(round(alpha, 3))} level" if alpha is not None else ""
        parts.append(("significant" if value["significant"] else "within noise, not significant") + at)
    return ", ".join(parts)


def mapping_text(value: Mapping[str, Any]) -> str:
    """A nested findings value in words: a setting, a comparison, or labelled parts."""
    if "method" in value and "k" in value and len(value) <= 3:
        return setting_label(value.get("method"), value.get("k"))
    if as_number(value.get("diff_tps")) is not None:
        return comparison_text(value)
    return ", ".join(f"{_lowered(humanize(str(k)))} {value_text(str(k), v)}" for k, v in value.items())


def _lowered(label: str) -> str:
    """A label inside a sentence: its first letter small unless it begins an acronym."""
    return label if label[1:2].isupper() else label[:1].lower() + label[1:]


def workloads_in(*sections: Any) -> list[str]:
    found: list[str] = []
    for section in sections:
        if isinstance(section, Mapping):
            for key, value in section.items():
                if (
                    isinstance(value, Mapping)
                    and ("mean_tps" in value or "runs" in value)
                    and key not in found
                ):
                    found.append(str(key))
    return sorted(found, key=lambda w: (WORKLOAD_ORDER.index(w) if w in WORKLOAD_ORDER else 99, w))


def cause_descriptions(measurement: Any) -> dict[str, str]:
    """{cause code: plain words} as the measure stage writes them (`measurement.cause_descriptions`,
    one entry per cause it tested); empty when the measurement did not run or wrote none."""
    described = measurement.get("cause_descriptions") if isinstance(measurement, Mapping) else None
    if not isinstance(described, Mapping):
        return {}
    return {str(code): str(words) for code, words in described.items() if words}


def describe_cause(descriptions: Mapping[str, str], code: str) -> str:
    """The measurement's words for `code`, or a sentence saying the report has none."""
    return descriptions.get(code) or NO_CAUSE_DESCRIPTION


def setting_label(method: Any, k: Any) -> str:
    if method in (None, "none") or not k:
        return "no speculation"
    return f"{method}, k = {k}"
