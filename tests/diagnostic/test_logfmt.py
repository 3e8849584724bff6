"""Structured log lines: key=value, context fields included, values quoted when needed."""

from __future__ import annotations

import logging

from diagnostic.logfmt import KeyValueFormatter, format_value


def record(msg: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("diagnostic.jobs", logging.WARNING, __file__, 1, msg, None, None)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_a_record_becomes_one_line_of_key_value_pairs_with_its_context() -> None:
    line = KeyValueFormatter().format(record("stage claimed", job="4f2a", stage="reproduce", attempt=2))
    assert line.startswith("ts=")
    assert " level=WARNING logger=diagnostic.jobs msg=\"stage claimed\" " in line
    assert line.endswith("attempt=2 job=4f2a stage=reproduce")
    assert "\n" not in line


def test_values_with_spaces_quotes_or_newlines_are_quoted_and_escaped() -> None:
    assert format_value("spark-01") == "spark-01"
    assert format_value('said "hi"\nthen left') == '"said \\"hi\\"\\nthen left"'
    assert format_value("") == '""'
    assert format_value(None) == "None"


def test_exceptions_stay_on_the_same_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = record("failed")
        rec.exc_info = sys.exc_info()
    line = KeyValueFormatter().format(rec)
    assert "exc=\"Traceback" in line
    assert "\n" not in line
