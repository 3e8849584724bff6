"""What the customer takes away from a job: the approved report versions, what the latest
says (its headline rows, findings and money-back statement, read from the document it was
written from, so the page, the PDF and the email agree), and the tuned files (the tuned
configuration, its launch command and the diff against theirs)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.db.models import QuerySet

from diagnostic.jobs import tuning
from diagnostic.jobs.labaccess import job_lab_catalog
from diagnostic.jobs.models import DiagnosticJob, ReportVersion, StageRun
from diagnostic.pipelines.changes import apply_changes
from lab.config import mask_config
from reports.content import summary_rows
from reports.sections.findings import by_impact
from reports.structure import SummaryRow


def approved_versions(job: DiagnosticJob) -> QuerySet[ReportVersion]:
    """Report versions released to the customer, oldest first."""
    return job.report_versions.filter(approved_at__isnull=False).order_by("approved_at", "id")


def report_file(version: ReportVersion) -> Path | None:
    """The PDF of a version, if it is still where the report stage wrote it (under OUT_DIR,
    never a public static path)."""
    path = Path(version.pdf_path)
    out = Path(settings.OUT_DIR).resolve()
    try:
        resolved = path.resolve()
    except OSError:
        return None
    if not resolved.is_relative_to(out) or not resolved.is_file():
        return None
    return resolved


def proved_changes(job: DiagnosticJob) -> list[dict[str, Any]]:
    rows = (
        job.stage_runs.filter(status__in=StageRun.WITH_RESULT)
        .order_by("order")
        .values_list("result", flat=True)
    )
    changes: list[dict[str, Any]] = []
    for result in rows:
        if isinstance(result, dict):
            changes.extend(c for c in result.get("config_changes") or [] if isinstance(c, dict))
    return changes


def tuned_configuration_yaml(job: DiagnosticJob) -> str:
    """The tuned diagnostic.config/1 as a YAML file, each change listed in its header."""
    changes = proved_changes(job)
    tuned = apply_changes(job.config.normalized, changes) if changes else dict(job.config.normalized)
    header = [f"# Tuned configuration of diagnostic job {job.pk}"]
    if changes:
        header.append("# Changes from the configuration you submitted:")
        for item in changes:
            header.append(
                f"#   {item.get('path')}: {item.get('from')!r} -> {item.get('to')!r}"
                f"  ({item.get('finding', '')})"
            )
    else:
        header.append("# The diagnostic proved no change to the configuration you submitted.")
    return "\n".join(header) + "\n" + yaml.safe_dump(tuned, sort_keys=False, allow_unicode=True)


# -- what the approved report says, for the job page ---------------------------------------
def version_document(version: ReportVersion) -> dict[str, Any] | None:
    """The findings document an approved version was written from (`findings.json` beside
    its PDF, under OUT_DIR), or None when it is not there (a version from before versions
    kept their documents). Read once per file version: the job page is opened often."""
    pdf = report_file(version)
    if pdf is None:
        return None
    path = pdf.parent / "findings.json"
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return None
    return _read_document(str(path), stamp)


@lru_cache(maxsize=64)
def _read_document(path: str, _stamp: int) -> dict[str, Any] | None:
    try:
        data = json.loads(Path(path).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class Results:
    """The approved report's headline as the job page shows it: the same rows, findings and
    money-back statement as the PDF and the email, read from the version's own document."""

    rows: list[SummaryRow]
    findings: list[str]
    free: bool | None
    money_back: str
    changed: bool


def results(version: ReportVersion) -> Results | None:
    document = version_document(version)
    if document is None:
        return None
    found = [f for f in document.get("findings") or [] if isinstance(f, Mapping)]
    money = document.get("money_back") if isinstance(document.get("money_back"), Mapping) else {}
    try:
        rows = summary_rows(document)
    except (KeyError, TypeError, ValueError):
        rows = []  # a document the report code reads differently today: the PDF has them
    eligible = money.get("eligible") if money else None
    return Results(
        rows=rows,
        findings=[str(f.get("title") or f.get("code")) for f in by_impact(found)],
        free=eligible if isinstance(eligible, bool) else None,
        money_back=str(money.get("reason") or "") if money else "",
        changed=bool((document.get("tuned") or {}).get("changes")),
    )


def _tuned_of(job: DiagnosticJob, version: ReportVersion | None) -> Mapping[str, Any] | None:
    document = version_document(version) if version is not None else None
    tuned = (document or {}).get("tuned")
    return tuned if isinstance(tuned, Mapping) and tuned.get("config") else None


def tuned_files(job: DiagnosticJob, version: ReportVersion | None) -> dict[str, str]:
    """The three files a customer launches the tuned configuration from, as the approved
    version states them (tuned-config.yaml, tuned-command.txt, tuned.diff). Without a proved
    change: their own configuration, its command, and a diff saying there is none."""
    tuned = _tuned_of(job, version)
    if tuned is not None:
        config = dict(tuned["config"])
        return {
            "yaml": tuning.config_yaml(config, list(tuned.get("changes") or [])),
            "command": str(tuned.get("command") or ""),
            "diff": str(tuned.get("diff") or ""),
        }
    config = mask_config(job.config.normalized)
    command = tuning.command_text(config, catalog=job_lab_catalog(job.lab))
    return {
        "yaml": tuned_configuration_yaml(job),
        "command": command,
        "diff": "# The diagnostic proved no change to the configuration you submitted.\n",
    }
