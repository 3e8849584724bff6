"""The configuration page of a booking: three ways in (form, YAML, pasted command), a
preview of the normalized configuration and its launch command, and the confirmation
that creates the job. Every error is shown beside its input and the input is kept."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db import DataError, transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from diagnostic.bookings.configs import masked_submission, submit_configuration
from diagnostic.bookings.models import Booking
from diagnostic.controlchars import checks_control_characters
from diagnostic.jobs.models import cancel_waiting_jobs
from diagnostic.jobs.orchestration import create_job
from diagnostic.portal.configform import initial_values, sections, version_choices
from diagnostic.portal.jobrun import start_job
from diagnostic.portal.scoping import customer_required, get_booking_for_customer
from diagnostic.portal.submission import (
    NON_FIELD,
    STRUCTURED_FIELDS,
    YAML_MAX_BYTES,
    Source,
    Submission,
    SubmissionError,
    booked_catalog,
    from_command,
    from_form,
    from_yaml,
    input_name,
    launch_preview,
    normalized_yaml,
    yaml_text_from_upload,
)
from lab.catalog import Catalog
from lab.config import mask_text

# `replaces`: the waiting job a new confirmation replaces (named, so that a second click
# on the same confirmation does not replace the job the first one made).
KEPT_INPUTS = (
    "source", "yaml_text", "command", "replaces", *(input_name(d) for d, _ in STRUCTURED_FIELDS)
)


def _kept(request: HttpRequest) -> dict[str, str]:
    return {name: request.POST.get(name, "") for name in KEPT_INPUTS if name in request.POST}


def _submission(request: HttpRequest, values: dict[str, str], catalog: Catalog) -> Submission:
    """The submission checked against the booked lab's catalog (what that lab holds)."""
    source = values.get("source", "")
    if source == Source.YAML:
        upload = request.FILES.get("yaml_file")
        if upload is not None and upload.size:
            values["yaml_text"] = yaml_text_from_upload(upload.read(YAML_MAX_BYTES + 1), size=upload.size)
        return from_yaml(values.get("yaml_text", ""), catalog=catalog)
    if source == Source.COMMAND:
        return from_command(values.get("command", ""), catalog=catalog)
    if source == Source.FORM:
        return from_form(values, catalog=catalog)
    raise SubmissionError({NON_FIELD: ["choose how to give the configuration: form, YAML or command"]})


def _form_sections(values: dict[str, str], errors: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The form's sections, each field with its words, its value (as typed, or the lab's
    default on a fresh form) and its errors."""
    drawn = []
    for section in sections():
        rows: list[dict[str, Any]] = []
        for spec in section.fields:
            name = spec.name
            rows.append({
                "spec": spec,
                "name": name,
                "value": values.get(name, ""),
                "errors": errors.get(name, []),
                "checked": values.get(name) in ("on", "true", "1"),
            })
        drawn.append({"section": section, "rows": rows})
    return drawn


QUOTED = re.compile(r"'([^'\n]{1,200})'")


def token_in_command(command: str, messages: list[str]) -> dict[str, str] | None:
    """The line of the pasted command holding the token an error quotes, split around it,
    so the page can mark the token where the customer wrote it."""
    for message in messages:
        for token in QUOTED.findall(message):
            at = command.find(token)
            if at < 0:
                continue
            start = command.rfind("\n", 0, at) + 1
            end = command.find("\n", at)
            end = len(command) if end < 0 else end
            return {"before": command[start:at], "token": token, "after": command[at + len(token) : end]}
    return None


def _page(
    request: HttpRequest,
    booking: Booking,
    values: dict[str, str],
    errors: dict[str, list[str]],
    status: int = 200,
) -> HttpResponse:
    # A fresh structured form starts from the lab's defaults; a submitted one from what was typed.
    form_values = values if values.get("source") == Source.FORM else {**initial_values(), **values}
    drawn = _form_sections(form_values, errors)
    context = {
        "booking": booking,
        "replacing": _open_job(booking),
        "values": values,
        "errors": errors,
        "source": values.get("source", Source.COMMAND),
        "form_sections": drawn,
        "invalid_rows": [row for block in drawn for row in block["rows"] if row["errors"]],
        "versions": version_choices(),
        "problem_count": sum(len(m) for m in errors.values()),
        "non_field_errors": errors.get(NON_FIELD, []),
        "command_mark": token_in_command(values.get("command", ""), errors.get("command", [])),
    }
    return render(request, "portal/config.html", context, status=status)


def _initial(waiting: Any) -> dict[str, str]:
    """The page's first values: empty, or the configuration a waiting job would run, to
    change before the lab day (a form submission is offered as its normalized YAML)."""
    if waiting is None:
        return {"source": Source.COMMAND}
    config = waiting.config
    values = {"replaces": str(waiting.pk)}
    if config.source == Source.COMMAND:
        return {**values, "source": Source.COMMAND, "command": config.raw_text}
    text = config.raw_text if config.source == Source.YAML else normalized_yaml(config.normalized)
    return {**values, "source": Source.YAML, "yaml_text": text}


def _masked_values(values: dict[str, str], submission: Submission, catalog: Catalog) -> dict[str, str]:
    """The page's inputs with no secret in them: the configuration's own text as intake
    keeps it (masked_submission), every other input through mask_text."""
    masked = {name: mask_text(value) for name, value in values.items()}
    kept, _ = masked_submission(submission.raw_text, submission.source, catalog=catalog)
    if submission.source == Source.COMMAND:
        masked["command"] = kept
    elif submission.source == Source.YAML:
        masked["yaml_text"] = kept
    return masked


def _open_job(booking: Booking) -> Any:
    return booking.jobs.exclude(status="cancelled").order_by("-created_at").first()


# The configuration's own inputs are checked by the configuration layer, which refuses a
# control character beside its input and keeps what the customer wrote; the middleware
# (diagnostic.controlchars) checks the page's other fields.
@checks_control_characters("command", "yaml_text", *(input_name(d) for d, _ in STRUCTURED_FIELDS))
@customer_required
@require_http_methods(["GET", "POST"])
def booking_config(request: HttpRequest, booking_id: str) -> HttpResponse:
    booking = get_booking_for_customer(request, booking_id)
    job = _open_job(booking)
    if job is not None and not job.waits_for_lab_day():
        return redirect("portal:job", job_id=job.pk)
    if not booking.is_active:
        messages.error(request, "This booking is cancelled; book a new day to submit a configuration.")
        return redirect("portal:booking", booking_id=booking.uuid)
    if request.method == "GET":
        return _page(request, booking, _initial(job), {})
    values = _kept(request)
    action = request.POST.get("action", "preview")
    if action == "edit":
        return _page(request, booking, values, {})
    try:
        catalog = booked_catalog(booking.lab_day.lab)
        submission = _submission(request, values, catalog)
    except SubmissionError as exc:
        return _page(request, booking, values, exc.errors, status=400)
    if action == "confirm":
        return _confirm(request, booking, submission)
    context = {
        "booking": booking,
        # What the confirm button sends back: the submission with every secret masked, as
        # it will be stored (the lab's engine gets a key of the platform's own).
        "values": _masked_values(values, submission, catalog),
        "normalized_yaml": normalized_yaml(submission.normalized),
        "launch_command": launch_preview(submission.normalized, booking.lab_day.lab),
    }
    return render(request, "portal/config_preview.html", context)


def _store(request: HttpRequest, booking: Booking, submission: Submission) -> tuple[list[str], Any]:
    """The submission stored as the booking's configuration, or why the database refused it."""
    try:
        # A savepoint of its own, so that a value the database refuses (DataError) after
        # the checks let it through is an answer, not a 500.
        with transaction.atomic():
            return [], submit_configuration(
                raw_text=submission.raw_text,
                source=submission.source,
                booking=booking,
                submitted_by=request.user,
                label=f"{booking.lab_day.date.isoformat()} {submission.source}",
            )
    except ValidationError as exc:
        return list(exc.messages), None
    except DataError:
        return ["the configuration holds a value the database cannot store; remove unusual "
                "characters (NUL, control characters) and confirm again"], None


def _confirm(request: HttpRequest, booking: Booking, submission: Submission) -> HttpResponse:
    refused: list[str] = []
    meanwhile: Any = None
    with transaction.atomic():
        locked = Booking.objects.select_for_update().get(pk=booking.pk)
        existing = _open_job(locked)
        if existing is not None:
            replaces = request.POST.get("replaces", "")
            repeated = (existing.config.raw_text == submission.raw_text
                        and existing.config.submitted_by_id == request.user.pk)
            if replaces and replaces != str(existing.pk) and existing.waits_for_lab_day() and not repeated:
                # Another confirmation replaced the configuration this one replaces: the
                # customer is told (409), not silently dropped, and keeps their text. (The
                # same confirmation sent twice is a double click: it goes to the job below.)
                meanwhile = existing
            elif not (existing.waits_for_lab_day() and replaces == str(existing.pk)):
                # A second confirm (double click, two tabs) adds nothing.
                return redirect("portal:job", job_id=existing.pk)
            else:
                cancel_waiting_jobs(locked, reason="replaced by a new configuration before the lab day",
                                    only=existing.pk)
        if meanwhile is None:
            refused, config = _store(request, locked, submission)
        if refused or meanwhile is not None:
            # Nothing of this confirmation stays (the waiting job it would replace included);
            # the page is drawn once the transaction is over.
            transaction.set_rollback(True)
        else:
            job = create_job(
                config=config,
                lab=locked.lab_day.lab,
                booking=locked,
                created_by=request.user,
                stages=settings.PORTAL_JOB_STAGES or None,
            )
            if locked.status == Booking.Status.REQUESTED:
                locked.status = Booking.Status.CONFIRMED
                locked.save(update_fields=["status", "updated_at"])
            started = start_job(job)
    if meanwhile is not None:
        by = meanwhile.config.submitted_by
        who = (getattr(by, "email", "") or getattr(by, "username", "")) if by is not None else "someone"
        when = timezone.localtime(meanwhile.config.created_at)
        values = {**_kept(request), "replaces": str(meanwhile.pk)}
        return _page(request, booking, values, {NON_FIELD: [
            f"Replaced meanwhile: {who} confirmed another configuration for this booking at "
            f"{when:%H:%M} UTC, after you opened this page, so yours was not saved. Yours is kept "
            "below: confirm it again to replace theirs, or open the booking to see theirs."]}, status=409)
    if refused:
        return _page(request, booking, _kept(request), {NON_FIELD: refused}, status=400)
    if started:
        messages.success(request, "Configuration confirmed; the diagnostic is queued. This page follows it.")
    else:
        day = locked.lab_day.date
        messages.success(
            request,
            f"Configuration confirmed. The diagnostic starts on your lab day, "
            f"{day:%A} {day.day} {day:%B %Y}; this page follows it from then.",
        )
    return redirect("portal:job", job_id=job.pk)
