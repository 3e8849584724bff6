"""Structured log lines: one `key=value` record per event, easy to grep and to parse.

Fields passed through `extra={...}` (job, stage, attempt, node...) are appended after
the fixed ones, so a line such as

    ts=2025-01-02T10:00:00.123Z level=INFO logger=diagnostic.jobs msg="stage claimed" job=4f.. stage=reproduce

carries its context without a log aggregator having to guess at free text.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
_BARE = re.compile(r"^[A-Za-z0-9_.:/@+\-]+$")


def format_value(value: Any) -> str:
    """A value as it appears after `key=`: bare when safe, double-quoted otherwise."""
    text = value if isinstance(value, str) else repr(value) if value is None else str(value)
    if text and _BARE.match(text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


class KeyValueFormatter(logging.Formatter):
    """Formats a record as `ts=... level=... logger=... msg=... key=value...`."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds")
        fields: list[tuple[str, Any]] = [
            ("ts", ts.replace("+00:00", "Z")),
            ("level", record.levelname),
            ("logger", record.name),
            ("msg", record.getMessage()),
        ]
        fields.extend(
            (key, value)
            for key, value in sorted(vars(record).items())
            if key not in _STANDARD_ATTRS and not key.startswith("_")
        )
        if record.exc_info:
            fields.append(("exc", self.formatException(record.exc_info)))
        return " ".join(f"{key}={format_value(value)}" for key, value in fields)
