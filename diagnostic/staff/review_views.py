"""The review page of a job's report (`/staff/reports/<job uuid>/`): findings in the
report's order with their words editable and their measurements read-only, the edit
history, the kept versions with a diff between any two, approval and sending, and the
money-back decision with its clauses, overrides and reverts."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from diagnostic.jobs.models import FindingEdit, ReportVersion
from diagnostic.jobs.report import current_edits, render_version, version_document
from diagnostic.staff.access import (
    APPROVE,
    REFUND,
    abilities,
    staff_group_required,
    staff_may,
    staff_required,
)
from diagnostic.staff.job_views import get_job
from diagnostic.staff.review import (
    ApprovalRefused,
    approve_and_send,
    deadline_of,
    decision_now,
    edit_finding,
    finding_text,
    is_late,
    sent_versions,
    version_diff,
)
from reports.findings import build_impact, by_impact
from reports.models import MoneyBackOverride, override_money_back, revert_override
from reports.structure import humanize, value_text


def _read_only_rows(evidence: Any) -> list[tuple[str, str]]:
    if not isinstance(evidence, dict):
        return []
    return [(humanize(str(k)), value_text(str(k), v)) for k, v in evidence.items()
            if k not in ("summary", "consultant_note")]


def _impact_rows(code: str, impact: Any) -> list[tuple[str, str]]:
    """The measured impact in the report's own words (what the customer reads)."""
    if not isinstance(impact, dict) or not impact:
        return []
    said = build_impact(code, impact)
    rows = [(said.metric, f"{said.before} → {said.after}" + (f" ({said.change})" if said.change else "")),
            ("95 % interval of the change", said.interval + (f", {said.n}" if said.n else "")),
            ("Verdict", said.verdict)]
    if impact.get("against"):
        rows.append(("Measured against", value_text("against", impact["against"])))
    return rows


def _ordered_findings(job: Any) -> list[Any]:
    """The job's findings in the order the report prints them (by measured impact)."""
    rows = list(job.finding_set.order_by("id"))
    documents = [f.as_document() for f in rows]
    order = by_impact(documents)
    position = {id(d): i for i, d in enumerate(documents)}
    return [rows[position[id(d)]] for d in order if id(d) in position]


def _version(job: Any, version: str) -> ReportVersion | None:
    return next((v for v in job.report_versions.all() if v.version == version), None)


@staff_required
def report_review(request: HttpRequest, job_id: Any) -> HttpResponse:
    job = get_job(job_id)
    edits = current_edits(job)
    findings = []
    for finding in _ordered_findings(job):
        impact = finding.impact if isinstance(finding.impact, dict) else None
        findings.append({
            "finding": finding,
            "text": finding_text(finding, edits.get(finding.pk, {})),
            "evidence": _read_only_rows(finding.evidence),
            "change": _read_only_rows(finding.change),
            "impact": _impact_rows(finding.code, impact),
            "history": list(finding.edits.select_related("edited_by").order_by("-edited_at", "-id")),
        })
    versions = list(job.report_versions.select_related("approved_by").order_by("created_at", "id"))
    sent = sent_versions(job)
    rows = [{"v": v, "email": sent.get(v.digest), "has_document": version_document(v) is not None}
            for v in versions]
    older = _version(job, request.GET.get("from", "")) or (versions[-2] if len(versions) > 1 else None)
    newer = _version(job, request.GET.get("to", "")) or (versions[-1] if versions else None)
    diff = version_diff(older, newer) if older and newer and older.pk != newer.pk else None
    decision = decision_now(job) if job.is_terminal else None
    trail = list(MoneyBackOverride.objects.filter(job_id=str(job.pk)).select_related(
        "decided_by", "reverts").order_by("decided_at", "id"))
    reverted = {row.reverts_id for row in trail if row.reverts_id}
    return render(request, "staff/review.html", {
        "job": job,
        "findings": findings,
        "versions": rows,
        "older": older,
        "newer": newer,
        "diff": diff,
        "decision": decision,
        "trail": trail,
        "reverted": reverted,
        "late": job.booking_id is not None and is_late(job),
        "deadline": deadline_of(job),
        **abilities(request),
    })


@staff_group_required
@require_POST
def finding_edit(request: HttpRequest, job_id: Any, finding_id: int) -> HttpResponse:
    job = get_job(job_id)
    finding = job.finding_set.filter(pk=finding_id).first()
    if finding is None:
        raise Http404("no such finding")
    try:
        made = edit_finding(finding=finding, by=request.user,  # type: ignore[arg-type]
                            title=request.POST.get("title", ""), narrative=request.POST.get("narrative", ""),
                            note=request.POST.get("note", ""))
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        fields = ", ".join(FindingEdit.Field(e.field).label for e in made)
        messages.success(request, f"Saved {fields} of “{finding.code}”; render a new version to see it "
                         "in the report." if made else "Nothing changed.")
    return redirect(f"/staff/reports/{job.pk}/#finding-{finding.pk}")


@staff_group_required
@require_POST
def render_new_version(request: HttpRequest, job_id: Any) -> HttpResponse:
    """Render here, in the request (a few seconds, in the renderer's own limited child
    process): the consultant who asked reads the new version and its diff on the page that
    answers, whether or not workers are busy with lab days."""
    job = get_job(job_id)
    if not job.is_terminal:
        messages.error(request, "The report is written when the job ends; it is still running.")
        return redirect("staff:report", job_id=job.pk)
    before = set(job.report_versions.values_list("digest", flat=True))
    made = render_version(job).row
    if made.digest not in before:
        messages.success(request, f"Version {made.version} rendered ({made.pages} pages).")
    else:
        messages.success(request, f"Rendered: the report is the same as version {made.version}, "
                                  "already kept.")
    return redirect("staff:report", job_id=job.pk)


@staff_may(APPROVE)
@require_POST
def approve_version(request: HttpRequest, job_id: Any) -> HttpResponse:
    job = get_job(job_id)
    version = _version(job, request.POST.get("version", ""))
    if version is None:
        raise Http404("no such version")
    try:
        done = approve_and_send(version, by=request.user)  # type: ignore[arg-type]
    except ApprovalRefused as exc:
        messages.error(request, str(exc))
    else:
        if done.sent:
            messages.success(request, f"Version {version.version} approved and emailed to "
                                      f"{', '.join(done.recipients)}.")
        else:
            messages.success(request, f"Version {version.version} is approved; its email had already gone, "
                                      "so none was sent again.")
    return redirect("staff:report", job_id=job.pk)


@staff_may(REFUND)
@require_POST
def money_back_override(request: HttpRequest, job_id: Any) -> HttpResponse:
    job = get_job(job_id)
    choice = request.POST.get("eligible", "")
    if choice not in ("yes", "no"):
        messages.error(request, "Choose whether the engagement is free (eligible) or charged.")
        return redirect("staff:report", job_id=job.pk)
    try:
        override_money_back(job_id=str(job.pk), eligible=choice == "yes",
                            reason=request.POST.get("reason", ""), by=request.user)  # type: ignore[arg-type]
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        messages.success(request, "Override recorded; render a new version so the report's appendix "
                                  "shows it.")
    return redirect(f"/staff/reports/{job.pk}/#money-back")


@staff_may(REFUND)
@require_POST
def money_back_revert(request: HttpRequest, job_id: Any, override_id: int) -> HttpResponse:
    job = get_job(job_id)
    row = MoneyBackOverride.objects.filter(job_id=str(job.pk), pk=override_id).first()
    if row is None:
        raise Http404("no such decision")
    try:
        revert_override(override=row, reason=request.POST.get("reason", ""), by=request.user)  # type: ignore[arg-type]
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        messages.success(request, "Override reverted; the computed decision applies again.")
    return redirect(f"/staff/reports/{job.pk}/#money-back")
