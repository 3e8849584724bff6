"""Turning what a customer submits (form fields, a YAML file, a pasted launch command) into
a validated `diagnostic.config/1` configuration.

Validation and normalization belong to the lab layer (lab.config, lab.engines); this
module maps its errors onto Django's ValidationError so forms and the admin show the
message, which names the configuration field (`parallel.tp: must be ...`).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError

from diagnostic.bookings.models import Booking, ClusterConfiguration
from lab.config import (
    COMMAND_WHITESPACE,
    CONTROL_ACCEPTED,
    ConfigError,
    control_character,
    control_name,
    control_problem,
    shown,
)
from lab.engines import load_config_text, normalize_config

CONFIG_SCHEMA = "diagnostic.config/1"
Source = ClusterConfiguration.Source
# How each source's text is named in its messages.
TEXT_NAMES: dict[str, str] = {Source.YAML: "file", Source.COMMAND: "launch_command", Source.FORM: "form data"}


def text_control_problem(text: str, name: str) -> str | None:
    """Why a submitted text cannot be kept: the line and column of its first control
    character (lines and tabs are the text's own), or None."""
    found = control_character(text, allowed=COMMAND_WHITESPACE)
    if found is None:
        return None
    index, char = found
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return (f"{name}: line {line}, column {column} holds a control character ({control_name(char)}); "
            "give plain text: lines, spaces and tabs, no NUL, escape or other control character")


def _control_in(value: Any, path: str) -> str | None:
    """The first string of a normalized configuration (keys included) that holds a control
    character, as a message naming its field; None when there is none."""
    if isinstance(value, str):
        problem = control_problem(value)
        return None if problem is None else f"{path}: {shown(value)} {problem}; {CONTROL_ACCEPTED}"
    if isinstance(value, dict):
        for key, item in value.items():
            found = _control_in(key, path or "config") if isinstance(key, str) else None
            found = found or _control_in(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _control_in(item, f"{path}[{index}]")
            if found:
                return found
    return None


def normalize_submission(raw_text: str, source: str) -> dict[str, Any]:
    """The normalized configuration for `raw_text`, or ValidationError naming the field.

    No control character is kept: the text may hold lines and tabs only, and no value of
    the configuration any (lab.config refuses them field by field; this checks the
    result again, since it is stored and reaches the lab's argv and environment)."""
    problem = text_control_problem(raw_text, TEXT_NAMES.get(source, "raw_text"))
    if problem is not None:
        raise ValidationError({"raw_text": problem}, code="control_character")
    normalized = _normalize(raw_text, source)
    problem = _control_in(normalized, "")
    if problem is not None:
        raise ValidationError({"raw_text": problem}, code="control_character")
    return normalized


def _normalize(raw_text: str, source: str) -> dict[str, Any]:
    try:
        if source == Source.YAML:
            return load_config_text(raw_text)
        if source == Source.COMMAND:
            command = raw_text.strip()
            if not command:
                raise ValidationError({"raw_text": "launch_command: is empty; paste the full command"})
            return normalize_config({"schema": CONFIG_SCHEMA, "launch_command": command})
        if source == Source.FORM:
            try:
                fields = json.loads(raw_text)
            except (ValueError, RecursionError) as exc:
                # JSONDecodeError, or the decoder's own limits (a 5,000-digit number, a
                # list nested past the recursion limit): a field error, never a traceback.
                why = exc.msg if isinstance(exc, json.JSONDecodeError) else \
                    "a value is too large or too deeply nested"
                raise ValidationError({"raw_text": f"form data is not JSON ({why})"}) from None
            if not isinstance(fields, dict):
                raise ValidationError({"raw_text": "form data must be a JSON object of configuration fields"})
            return normalize_config({"schema": CONFIG_SCHEMA, **fields})
    except ConfigError as exc:
        raise ValidationError({"raw_text": str(exc)}, code="invalid_config") from exc
    accepted = ", ".join(choice.value for choice in Source)
    raise ValidationError({"source": f"unknown source {source!r}; accepted: {accepted}"})


def submit_configuration(
    *,
    raw_text: str,
    source: str,
    booking: Booking | None = None,
    submitted_by: Any = None,
    label: str = "",
) -> ClusterConfiguration:
    """Validate and store a submitted configuration; ValidationError when it is not usable."""
    normalized = normalize_submission(raw_text, source)
    return ClusterConfiguration.objects.create(
        raw_text=raw_text,
        source=source,
        normalized=normalized,
        booking=booking,
        submitted_by=submitted_by,
        label=label,
    )


def form_text(fields: dict[str, Any]) -> str:
    """The raw text kept for a form submission: its fields as stable, readable JSON."""
    return json.dumps(fields, indent=2, sort_keys=True)
