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
from lab.config import ConfigError
from lab.engines import load_config_text, normalize_config

CONFIG_SCHEMA = "diagnostic.config/1"
Source = ClusterConfiguration.Source


def normalize_submission(raw_text: str, source: str) -> dict[str, Any]:
    """The normalized configuration for `raw_text`, or ValidationError naming the field."""
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
