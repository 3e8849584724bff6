"""What the customer takes away from a job: the approved report versions and the tuned
configuration (their configuration with every change the diagnostic proved)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.db.models import QuerySet

from diagnostic.jobs.models import DiagnosticJob, ReportVersion, StageRun
from diagnostic.pipelines.changes import apply_changes


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
        job.stage_runs.filter(status=StageRun.Status.SUCCEEDED)
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
