"""SSE parsing: line endings, `data:` spacing, keepalive comments, multi-line data, [DONE]."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from diagnostic.pipelines.client import SSEParser, event_payloads


def _payloads(chunks: list[str]) -> list[object]:
    parser = SSEParser()
    events = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.close()
    return [p for e in events for p in event_payloads(e)]


STREAM = (
    ": keepalive\n\n"
    'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\n'
    'data:{"choices": [{"delta": {"content": "lo"}}]}\r\n\r\n'
    'data: {"choices": [{"delta":\n'
    'data: {"content": " world"}}]}\n\n'
    "event: message\n"
    'data: {"choices": [], "usage": {"completion_tokens": 3}}\r\r'
    "data: [DONE]\n\n"
)


def test_it_reads_every_variant_of_a_stream() -> None:
    got = _payloads([STREAM])
    assert got[-1] == "[DONE]"
    contents = [p["choices"][0]["delta"]["content"] for p in got[:-1] if isinstance(p, dict) and p["choices"]]
    assert contents == ["Hel", "lo", " world"]
    assert isinstance(got[-2], dict) and got[-2]["usage"] == {"completion_tokens": 3}


def test_keepalive_comments_are_counted_not_parsed() -> None:
    parser = SSEParser()
    assert parser.feed(": ping\n\n: ping\n\n") == []
    assert parser.comments == 2


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=12))
def test_any_split_of_the_byte_stream_gives_the_same_events(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    pieces = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert _payloads(pieces) == _payloads([STREAM])


def test_a_final_event_without_a_blank_line_is_still_delivered() -> None:
    assert _payloads(['data: {"a": 1}']) == [{"a": 1}]


def test_events_run_together_without_blank_lines_are_separated() -> None:
    # Some servers forget the blank line; each data line is then its own JSON document.
    text = 'data: {"a": 1}\ndata: {"b": 2}\ndata: [DONE]\n'
    assert _payloads([text]) == [{"a": 1}, {"b": 2}, "[DONE]"]


def test_a_json_document_split_over_data_lines_is_joined() -> None:
    doc = {"choices": [{"delta": {"content": "x"}}]}
    text = json.dumps(doc)
    cut = text.index(",") if "," in text else len(text) // 2
    stream = f"data: {text[:cut]}\ndata: {text[cut:]}\n\n"
    assert _payloads([stream]) == [doc]
