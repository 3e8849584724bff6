"""Report: the job's findings document, assembled from the stages before it and checked
against the schema. Rendering the PDF and emailing it belong to the reports app, which
builds on this document."""

from __future__ import annotations

from typing import Any

from diagnostic.jobs.context import StageContext
from diagnostic.jobs.findings import SECTIONS, build_findings, validate_findings
from diagnostic.jobs.models import DiagnosticJob


def run(ctx: StageContext) -> dict[str, Any]:
    ctx.progress(10, "assembling findings")
    document = build_findings(ctx.job)
    validate_findings(document)
    DiagnosticJob.objects.filter(pk=ctx.job.pk).update(findings=document)
    present = [name for name in SECTIONS if document[name] is not None]
    ctx.progress(100, f"findings assembled: {len(document['findings'])} findings")
    return {"findings": len(document["findings"]), "sections_present": present}
