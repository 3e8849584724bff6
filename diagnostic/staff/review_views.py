"""The review page of a job's report (`/staff/reports/<job uuid>/`): findings in the
report's order with their words editable and their measurements read-only, the edit
history, the kept versions (newest first, the latest marked) with a diff between any two,
approval and sending through a confirmation that shows exactly what goes to whom, and the
money-back decision with its clauses, overrides and reverts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from diagnostic.jobs.findings_document import build_findings
from diagnostic.jobs.models import FindingEdit, ReportVersion
from diagnostic.jobs.report_versions import (
    current_edits,
    recipients,
    version_document,
    version_message,
)
from diagnostic.staff.access import (
    APPROVE,
    REFUND,
    abilities,
    staff_group_required,
    staff_may,
    staff_required,
)
from diagnostic.staff.job_views import get_job
from diagnostic.staff.rendering import RenderRefused, render_progress, request_render
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
from reports.models import MoneyBackOverride, override_money_back, revert_override
from reports.moneyback import impacts_of
from reports.sections.findings import build_finding, by_impact, impact_formatters, impact_sources, impact_unit
from reports.structure import FindingSection, cause_descriptions, value_text


def _as_printed(index: int, finding: Any, document: dict[str, Any]) -> FindingSection:
    """A finding's measured part as the report prints it (reports.sections.findings, the same
    labels, units and rounding): its evidence, the change as a diff of settings and
    environment variables with the launch flags as the engine takes them, and the impacts."""
    fp4 = document.get("fp4")
    speed_cost = fp4.get("speed_cost") if isinstance(fp4, dict) else None
    return build_finding(index, finding.as_document(), {},
                         described_causes=cause_descriptions(document.get("measurement")),
                         speed_cost=speed_cost if isinstance(speed_cost, dict) else None,
                         impact_sources=impact_sources(document))


def _impact_rows(finding: Any, printed: FindingSection) -> list[list[tuple[str, str]]]:
    """Each measured impact in the report's own words and figures (what the customer reads);
    where the report's table carries the unit in its column title (rates: "(tok/s)"), this
    one-line form puts it after each figure instead."""
    tables = []
    for raw, said in zip(impacts_of(finding.as_document()), printed.impacts, strict=False):
        label_unit = impact_formatters(impact_unit(raw))[2]
        unit = label_unit.strip(" ()")
        metric = said.metric.removesuffix(label_unit) if unit else said.metric

        def with_unit(figure: str, unit: str = unit) -> str:
            bare = not unit or figure in ("not measured", "no interval", "")
            return figure if bare else f"{figure} {unit}"

        rows = [(metric, f"{with_unit(said.before)} → {with_unit(said.after)}"
                 + (f" ({with_unit(said.change)})" if said.change else "")),
                ("95 % interval of the change", with_unit(said.interval) + (f", {said.n}" if said.n else "")),
                ("Verdict", said.verdict)]
        if raw.get("against"):
            rows.append(("Measured against", value_text("against", raw["against"])))
        tables.append(rows)
    return tables


def _ordered_findings(job: Any) -> list[Any]:
    """The job's findings in the order the report prints them (by measured impact)."""
    rows = list(job.finding_set.order_by("id"))
    documents = [f.as_document() for f in rows]
    order = by_impact(documents)
    position = {id(d): i for i, d in enumerate(documents)}
    return [rows[position[id(d)]] for d in order if id(d) in position]


def _version(job: Any, version: str) -> ReportVersion | None:
    return next((v for v in job.report_versions.all() if v.version == version), None)


def _newest_first(job: Any) -> list[ReportVersion]:
    return list(job.report_versions.select_related("approved_by").order_by("-created_at", "-id"))


def _state(version: ReportVersion, email: Any) -> str:
    """A version's state in words: draft, approved, or sent (to whom and when: the template)."""
    if email is not None and email.state == "sent":
        return "sent"
    return "approved" if version.is_approved else "draft"


def _printed_verdict(document: dict[str, Any] | None) -> dict[str, Any] | None:
    """The money-back statement a version prints (and its email repeats)."""
    if document is None:
        return None
    printed = document.get("money_back") or {}
    return {"eligible": bool(printed.get("eligible")), "reason": str(printed.get("reason") or "")}


def _last_sent(versions: list[ReportVersion], sent: dict[str, Any]) -> tuple[ReportVersion, Any] | None:
    for version in versions:  # newest first
        email = sent.get(version.digest)
        if email is not None and email.state == "sent":
            return version, email
    return None


@staff_required
def report_review(request: HttpRequest, job_id: Any) -> HttpResponse:
    return _review_page(request, get_job(job_id))


def _errors_by_field(exc: ValidationError, default: str) -> dict[str, str]:
    """A ValidationError's messages by the form field they belong to ("field: problem"
    messages and dict errors are placed at their field; the rest at `default`)."""
    if hasattr(exc, "error_dict"):
        return {name: "; ".join(str(m) for e in errors for m in e.messages)
                for name, errors in exc.error_dict.items()}
    placed: dict[str, str] = {}
    for message in exc.messages:
        name, sep, problem = message.partition(": ")
        field = name if sep and name.isidentifier() else default
        text = problem if field == name else message
        placed[field] = f"{placed[field]}; {text}" if field in placed else text
    return placed


def _versions_context(request: HttpRequest, job: Any) -> dict[str, Any]:
    """The Versions section: the kept versions newest first, the latest render (its
    progress, the version it made, or why it failed) and the diff between two versions.
    The page polls it (`render_status`) while a render is under way."""
    versions = _newest_first(job)
    sent = sent_versions(job)
    rows = [{"v": v, "email": sent.get(v.digest), "state": _state(v, sent.get(v.digest)),
             "latest": i == 0, "has_document": version_document(v) is not None}
            for i, v in enumerate(versions)]
    older = _version(job, request.GET.get("from", "")) or (versions[1] if len(versions) > 1 else None)
    newer = _version(job, request.GET.get("to", "")) or (versions[0] if versions else None)
    diff = version_diff(older, newer) if older and newer and older.pk != newer.pk else None
    progress = render_progress(job)
    return {
        "job": job,
        "versions": rows,
        "older": older,
        "newer": newer,
        "diff": diff,
        "render": progress,
        "render_poll_ms": settings.STAFF_POLL_MS if progress is not None and progress.following else 0,
        **abilities(request),
    }


def _review_page(request: HttpRequest, job: Any, *, status: int = 200,
                 finding_form: dict[str, Any] | None = None,
                 override_form: dict[str, Any] | None = None) -> HttpResponse:
    """The review page; after a refused form, the same page (400) with the typed values
    kept and each problem next to its field (`finding_form` / `override_form`)."""
    edits = current_edits(job)
    document = build_findings(job)
    findings = []
    for index, finding in enumerate(_ordered_findings(job), start=1):
        typed = finding_form if finding_form and finding_form["pk"] == finding.pk else None
        printed = _as_printed(index, finding, document)
        findings.append({
            "finding": finding,
            "text": typed["values"] if typed else finding_text(finding, edits.get(finding.pk, {})),
            "errors": typed["errors"] if typed else {},
            "printed": printed,
            "impacts": _impact_rows(finding, printed),
            "history": list(finding.edits.select_related("edited_by").order_by("-edited_at", "-id")),
        })
    context = _versions_context(request, job)
    decision = decision_now(job, document) if job.is_terminal else None
    # What the customer was last told about the money back, when the record now says otherwise.
    told = _last_sent([row["v"] for row in context["versions"]],
                      {row["v"].digest: row["email"] for row in context["versions"] if row["email"]})
    disagreement = None
    if told is not None and decision is not None:
        printed_verdict = _printed_verdict(version_document(told[0]))
        if printed_verdict is not None and printed_verdict["eligible"] != decision.eligible:
            disagreement = {"version": told[0], "email": told[1], "printed": printed_verdict}
    trail = list(MoneyBackOverride.objects.filter(job_id=str(job.pk)).select_related(
        "decided_by", "reverts").order_by("decided_at", "id"))
    reverted = {row.reverts_id for row in trail if row.reverts_id}
    return render(request, "staff/review.html", {
        **context,
        "findings": findings,
        "decision": decision,
        "trail": trail,
        "reverted": reverted,
        "late": job.booking_id is not None and is_late(job),
        "deadline": deadline_of(job),
        "disagreement": disagreement,
        "override_form": override_form or {},
    }, status=status)


@staff_required
@require_GET
def render_status(request: HttpRequest, job_id: Any) -> HttpResponse:
    """The Versions section alone, which the review page polls while a render is under
    way: its progress, then the new version at the top of the list with its diff."""
    response = render(request, "staff/_versions.html", _versions_context(request, get_job(job_id)))
    response["Cache-Control"] = "no-store"
    return response


@staff_group_required
@require_POST
def finding_edit(request: HttpRequest, job_id: Any, finding_id: int) -> HttpResponse:
    job = get_job(job_id)
    finding = job.finding_set.filter(pk=finding_id).first()
    if finding is None:
        raise Http404("no such finding")
    typed = {name: request.POST.get(name, "") for name in ("title", "narrative", "note")}
    try:
        made = edit_finding(finding=finding, by=request.user, **typed)  # type: ignore[arg-type]
    except ValidationError as exc:
        # The page again, as typed, the problem beside its field: nothing the consultant
        # wrote is lost, and an emptied title is refused out loud, not reverted.
        return _review_page(request, job, status=400, finding_form={
            "pk": finding.pk, "values": typed, "errors": _errors_by_field(exc, "title")})
    else:
        fields = ", ".join(FindingEdit.Field(e.field).label for e in made)
        messages.success(request, f"Saved {fields} of “{finding.code}”; render a new version to see it "
                         "in the report." if made else "Nothing changed.")
    return redirect(f"/staff/reports/{job.pk}/#finding-{finding.pk}")


@staff_group_required
@require_POST
def render_new_version(request: HttpRequest, job_id: Any) -> HttpResponse:
    """Hand the render to the workers and answer at once: the review page shows its
    progress where the button was and, when it is written, the new version with its diff
    (or, when it failed, why, in the same place)."""
    job = get_job(job_id)
    try:
        made = request_render(job, by=request.user)
    except RenderRefused as exc:
        messages.error(request, str(exc))
        return redirect(f"/staff/reports/{job.pk}/#versions")
    if made.state == made.State.DONE:  # written already (eager mode: no workers)
        messages.success(request, f"Version {made.version} rendered ({made.pages} pages)." if made.new_version
                         else f"Rendered: the report is the same as version {made.version}, already kept.")
    elif made.is_active:
        messages.success(request, "Rendering a new version from the edits in the background: its progress is "
                                  "under Versions, and the new version appears there when it is written.",
                         extra_tags="gone-when-ended")
    return redirect(f"/staff/reports/{job.pk}/#versions")


@staff_may(APPROVE)
@require_GET
def approve_confirm(request: HttpRequest, job_id: Any, version: str) -> HttpResponse:
    """What approving `version` sends, before it is sent: the version, the recipients, the
    email as it will go (subject, body, its money-back statement, the attachment) and the
    PDF's first page. An older version than the latest is sent only by saying so."""
    job = get_job(job_id)
    chosen = _version(job, version)
    if chosen is None:
        raise Http404("no such version")
    versions = _newest_first(job)
    sent = sent_versions(job)
    to = recipients(job)
    document = version_document(chosen)
    message = None
    if document is not None:
        try:
            message = version_message(chosen, to)
        except FileNotFoundError:
            message = None
    return render(request, "staff/approve.html", {
        "job": job, "version": chosen, "latest": versions[0], "is_latest": versions[0].pk == chosen.pk,
        "recipients": to, "message": message, "printed": _printed_verdict(document),
        "email": sent.get(chosen.digest), "state": _state(chosen, sent.get(chosen.digest)),
        "attachment": Path(chosen.pdf_path).name,
        "page_preview": page_preview_possible(Path(chosen.pdf_path)),
    })


PAGE_PREVIEW_DPI = 60
PAGE_PREVIEW_TIMEOUT_S = 30


def page_preview_possible(pdf: Path) -> bool:
    """Whether the first page can be shown as an image: drawn already, or pdftoppm is here."""
    return pdf.with_name("page-1.png").is_file() or (shutil.which("pdftoppm") is not None and pdf.is_file())


@staff_required
@require_GET
def version_pdf(request: HttpRequest, job_id: Any, version: str) -> FileResponse:
    """A kept version's PDF, for staff to read before approving it."""
    job = get_job(job_id)
    chosen = _version(job, version)
    if chosen is None or not Path(chosen.pdf_path).is_file():
        raise Http404("no such version")
    return FileResponse(Path(chosen.pdf_path).open("rb"), content_type="application/pdf",
                        filename=f"report-{chosen.version}.pdf")


@staff_required
@require_GET
def version_page(request: HttpRequest, job_id: Any, version: str) -> FileResponse:
    """The first page of a kept version's PDF as a PNG (poppler's pdftoppm), kept beside it."""
    job = get_job(job_id)
    chosen = _version(job, version)
    if chosen is None:
        raise Http404("no such version")
    pdf = Path(chosen.pdf_path)
    image = pdf.with_name("page-1.png")
    if not image.is_file():
        tool = shutil.which("pdftoppm")
        if tool is None or not pdf.is_file():
            raise Http404("no preview: " + ("pdftoppm (poppler-utils) is not installed" if tool is None
                                            else "the version's PDF is missing"))
        done = subprocess.run(
            [tool, "-png", "-r", str(PAGE_PREVIEW_DPI), "-f", "1", "-l", "1", "-singlefile",
             str(pdf), str(image.with_suffix(""))],
            capture_output=True, timeout=PAGE_PREVIEW_TIMEOUT_S, check=False)
        if done.returncode != 0 or not image.is_file():
            raise Http404("no preview: pdftoppm could not read the version's PDF")
    return FileResponse(image.open("rb"), content_type="image/png")


@staff_may(APPROVE)
@require_POST
def approve_version(request: HttpRequest, job_id: Any) -> HttpResponse:
    job = get_job(job_id)
    version = _version(job, request.POST.get("version", ""))
    if version is None:
        raise Http404("no such version")
    confirm = reverse("staff:approve-confirm", kwargs={"job_id": job.pk, "version": version.version})
    if request.POST.get("confirmed") != "yes":
        # Approving sends email: only from the confirmation page, which shows what goes to whom.
        return redirect(confirm)
    latest = _newest_first(job)[0]
    if latest.pk != version.pk and request.POST.get("older") != "yes":
        messages.error(request, f"Version {version.version} is not the latest ({latest.version}); to send "
                                "it anyway, tick “Send this older version” below.")
        return redirect(confirm)
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
    reason = request.POST.get("reason", "")
    typed = {"eligible": choice, "reason": reason}
    if choice not in ("yes", "no"):
        return _review_page(request, job, status=400, override_form={
            **typed, "errors": {"eligible": "choose free of charge or charged"}})
    try:
        override_money_back(job_id=str(job.pk), eligible=choice == "yes",
                            reason=reason, by=request.user)  # type: ignore[arg-type]
    except ValidationError as exc:
        return _review_page(request, job, status=400, override_form={
            **typed, "errors": _errors_by_field(exc, "reason")})
    else:
        told = _last_sent(_newest_first(job), sent_versions(job))
        after = (f" The customer was already sent version {told[0].version}, which says what the rule said "
                 "then: render a new version and approve and send it, so that they hear this decision."
                 if told else " Then approve and send that version: the customer hears the decision with it.")
        messages.success(request, "Override recorded. It reaches the report only in a new version: render "
                                  "one (the button under Versions); its appendix prints the decision and "
                                  "its reason." + after)
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
