"""One report, end to end: findings.json -> content -> HTML -> report.pdf beside it.

`render` writes report.pdf for a findings document (the job's report step,
diagnostic.jobs.report_versions, calls it for `diagnose`, `make demo` and the staff's re-render) and
returns the details (version digest, money-back decision, page count, timings) that the
email step and the staff views need. The PDF is written atomically (`write_atomically`): a failed write
leaves no truncated file at its final path. The report's version is a digest of what it
says (the findings, the customer, the lab day and the money-back outcome), not of the
PDF's bytes, so rendering the same job twice gives the same version and the email goes
out once.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from django.template import Context, Engine

from reports import content, pdf
from reports.moneyback import MoneyBackDecision, OverrideEntry, assess, lab_day_of
from reports.structure import as_number

log = logging.getLogger(__name__)

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
REPORT_TEMPLATE = "reports/report.html"


@dataclass(frozen=True)
class RenderedReport:
    """A written report on disk and what was decided while making it."""

    pdf_path: Path
    digest: str
    pages: int
    money_back: MoneyBackDecision
    refused_urls: tuple[str, ...]
    seconds: Mapping[str, float]

    @property
    def version(self) -> str:
        """The short form of the digest printed on the cover."""
        return self.digest[:12]


def write_atomically(path: Path, data: bytes) -> Path:
    """Write `data` to `path` so that `path` is either the old file or the whole new one.

    The bytes go to a temporary file beside it, reach the disk, then replace it by rename;
    a write that fails (a full disk, a killed worker) leaves no truncated PDF or message at
    `path`, and its temporary file is removed, freeing what it took for the retry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as sink:
            sink.write(data)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return path


@cache
def template_engine() -> Engine:
    """Templates for reports and their emails, independent of the project's TEMPLATES setting."""
    return Engine(dirs=[str(TEMPLATES_DIR)], autoescape=True, debug=False, string_if_invalid="")


def _setting(name: str, default: Any) -> Any:
    from django.conf import settings

    if not settings.configured:
        return default
    return getattr(settings, name, default)


def default_timezone() -> dt.tzinfo:
    """The firm's time zone (settings.TIME_ZONE), used for dates and the reporting deadline."""
    return ZoneInfo(str(_setting("TIME_ZONE", "UTC")))


def report_digest(
    findings: Mapping[str, Any], *, customer: str, lab_day: dt.date | None, money_back: MoneyBackDecision
) -> str:
    """SHA-256 of what the report says: equal digests mean the same report version."""
    outcome = {
        "eligible": money_back.eligible,
        "computed_eligible": money_back.computed_eligible,
        "conditions": {c.key: c.holds for c in money_back.conditions},
        "overrides": [[o.eligible, o.reason, o.by, o.at.isoformat()] for o in money_back.overrides],
    }
    # findings.json's own money_back is the platform's copy of this decision; the decision
    # itself is digested here, so the copy is left out and writing it back changes nothing.
    said = {k: v for k, v in findings.items() if k != "money_back"}
    # The job's bookkeeping moves on after the report stage (its status, its stages, the
    # time spent), so only what the report prints of it counts, and the findings.json written
    # when the job ends still gives the version of the report it carries: the stages it
    # says were skipped, and the lab and wall time when the dilation estimate is made from them.
    job = said.get("job")
    if isinstance(job, Mapping):
        moving = {"status", "status_message", "stages", "finished_at"}
        if any(as_number(job.get(k)) for k in content.DILATION_KEYS):
            moving |= {"lab_time_s", "wall_time_s"}
        said["job"] = {k: v for k, v in job.items() if k not in moving}
        said["job"]["stopped_early"] = content.stopped_early(job)
    canonical = json.dumps(
        {
            "findings": said,
            "customer": customer,
            "lab_day": lab_day.isoformat() if lab_day else None,
            "money_back": outcome,
        },
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def render_html(report: content.ReportContent) -> str:
    """The report's HTML, ready for WeasyPrint."""
    return template_engine().get_template(REPORT_TEMPLATE).render(Context({"report": report}, use_l10n=False))


def render(
    findings: Mapping[str, Any],
    out_dir: Path,
    *,
    customer: str,
    lab_day: dt.date | None = None,
    as_of: dt.datetime | None = None,
    sent_at: dt.datetime | None = None,
    overrides: Iterable[OverrideEntry] = (),
    holidays: Collection[dt.date] = (),
    timeout_s: float | None = None,
    filename: str = "report.pdf",
) -> RenderedReport:
    """Write the report for `findings` to `out_dir/filename` and say what it decided.

    `as_of` is the moment the report is issued (default now); `sent_at` the moment a
    previous version was first sent, if one was (the one-business-day rule looks at it).
    `overrides` are the staff's money-back decisions (`reports.models.overrides_for`).
    Raises pdf.ReportRenderError (with report.html left in `out_dir`) when the PDF fails.
    """
    timings: dict[str, float] = {}
    started = time.perf_counter()
    limit = float(
        timeout_s if timeout_s is not None else _setting("REPORT_RENDER_TIMEOUT_S", pdf.DEFAULT_TIMEOUT_S)
    )
    memory_mb = int(_setting("REPORT_RENDER_MEMORY_MB", pdf.DEFAULT_MEMORY_MB))
    # The child imports WeasyPrint while this process builds the content and plots.
    with pdf.PdfRenderer(timeout_s=limit, memory_mb=memory_mb) as renderer:
        tz = default_timezone()
        now = as_of or dt.datetime.now(dt.UTC)
        day = lab_day or lab_day_of(findings)
        decision = assess(
            findings, lab_day=day, sent_at=sent_at, as_of=now, overrides=overrides, holidays=holidays, tz=tz
        )
        digest = report_digest(findings, customer=customer, lab_day=day, money_back=decision)
        model = content.build_report(
            findings,
            customer=customer,
            money_back=decision,
            issued=now.astimezone(tz).date(),
            version=digest[:12],
            tz=tz,
        )
        timings["content_and_plots"] = time.perf_counter() - started

        mark = time.perf_counter()
        html = render_html(model)
        timings["html"] = time.perf_counter() - mark

        out_dir.mkdir(parents=True, exist_ok=True)
        mark = time.perf_counter()
        try:
            result = renderer.render(html, identifier=bytes.fromhex(digest[:32]))
        except pdf.ReportRenderError:
            write_atomically(out_dir / "report.html", html.encode("utf-8"))
            raise
        timings["pdf_after_html"] = time.perf_counter() - mark
    target = write_atomically(out_dir / filename, result.pdf)
    timings["total"] = time.perf_counter() - started
    if result.refused:
        log.warning("report rendered without refused resources: %s", ", ".join(result.refused))
    log.info(
        "report written path=%s pages=%d version=%s seconds=%.2f",
        target,
        result.pages,
        digest[:12],
        timings["total"],
    )
    return RenderedReport(target, digest, result.pages, decision, result.refused, timings)


