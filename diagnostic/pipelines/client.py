"""A streaming client for OpenAI-compatible endpoints that times what it receives.

One request at a time: the client records when it sent the request and when the first
and last bytes of content arrived (on the monotonic clock, in wall seconds), the text
and any reasoning text (kept apart), the usage block, how many SSE events and content
chunks came, and the finish reason. It counts no tokens and converts no clock: token
counting is `tokens.py`'s, lab time is the caller's.

Chat completions (`/v1/chat/completions`) is the default API: the served models are
chat models, and reasoning text arrives as its own delta field only there. The plain
completions API (`/v1/completions`) is available for servers without a chat template.

A server started with an API key (vLLM and SGLang `--api-key`, vLLM `VLLM_API_KEY`)
answers 401 to every /v1 request without it: `api_key` is sent as `Authorization: Bearer`
on every request, and never appears in a message or a result. On the lab that is the
session's own key for the job (`session_api_key`), never the customer's.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

API_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# Wall seconds one streamed request may take when the caller sets no deadline of its own.
# SSE keepalive comments reset the read timeout, so without a deadline a server that only
# sends keepalives would hold the run (and the stage) open for ever. Generous: 512 tokens
# at a few tokens a second fit many times over.
DEFAULT_REQUEST_DEADLINE_S = 900.0
_EOL = re.compile(r"\r\n|\r|\n")  # the only line ends SSE knows


class EndpointError(RuntimeError):
    """The endpoint could not be reached or answered with an error; the message says which.

    `status` is the HTTP status of an error answer. `transient` says whether another try
    may go otherwise: a dropped or refused connection, a timeout, a 5xx or 429 answer may;
    a 4xx answer or an answer the client cannot read would come out the same again."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def transient(self) -> bool:
        if self.status is not None:
            return self.status >= 500 or self.status == 429
        return isinstance(self.__cause__, httpx.TransportError)


@dataclass
class SSEEvent:
    data: str
    event: str = "message"


class SSEParser:
    """Incremental parser of a `text/event-stream` body (the WHATWG rules).

    Lines end in LF, CRLF or CR; `:` starts a comment (keepalives); a field's value
    loses one leading space, so `data:x` and `data: x` are the same; several `data:`
    lines of one event join with LF; a blank line ends the event, and an unterminated
    event at the end of the stream is still delivered.
    """

    def __init__(self) -> None:
        self._buffer = ""
        self._data: list[str] = []
        self._event = ""
        self._pending_cr = False
        self.comments = 0

    def feed(self, text: str) -> list[SSEEvent]:
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]  # the LF of a CRLF split across two reads
        buffer = self._buffer + text
        # The common case (LF only) splits with str.split; CR or CRLF take the regex.
        lines = buffer.split("\n") if "\r" not in buffer else _EOL.split(buffer)
        self._buffer = lines.pop()  # the unterminated rest ("" after a line end)
        self._pending_cr = buffer.endswith("\r")
        events: list[SSEEvent] = []
        for line in lines:
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[SSEEvent]:
        """Deliver what is left when the stream ends without a final blank line."""
        events: list[SSEEvent] = []
        if self._buffer:
            event = self._line(self._buffer)
            self._buffer = ""
            if event is not None:
                events.append(event)
        event = self._dispatch()
        if event is not None:
            events.append(event)
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            self.comments += 1
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def _dispatch(self) -> SSEEvent | None:
        if not self._data:
            self._event = ""
            return None
        event = SSEEvent(data="\n".join(self._data), event=self._event or "message")
        self._data, self._event = [], ""
        return event


def event_payloads(event: SSEEvent) -> Iterator[dict[str, Any] | str]:
    """JSON objects carried by an event, or the string "[DONE]".

    A server that omits the blank line between events makes one event of several
    `data:` lines; if the joined data is not one JSON document, each line is tried alone.
    """
    data = event.data.strip()
    if not data:
        return
    if data == "[DONE]":
        yield "[DONE]"
        return
    try:
        payload = json.loads(data)
    except json.JSONDecodeError:
        for line in data.split("\n"):
            line = line.strip()
            if line == "[DONE]":
                yield "[DONE]"
            elif line:
                try:
                    part = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(part, dict):
                    yield part
        return
    if isinstance(payload, dict):
        yield payload


@dataclass
class StreamRun:
    """What one streamed request delivered, timed on the monotonic clock (wall seconds)."""

    prompt: str
    sent: float
    first_content: float | None = None
    last_content: float | None = None
    done: float | None = None  # stream closed ([DONE] or end of body)
    text: str = ""
    reasoning_text: str = ""
    usage: dict[str, Any] | None = None
    events: int = 0  # SSE data events with a JSON payload
    content_chunks: int = 0  # events that carried content text
    keepalives: int = 0
    finish_reason: str | None = None
    abandoned: bool = False  # the client stopped reading before the stream ended
    error: str | None = None
    # (seconds since `sent`, characters of content received so far) at each content chunk
    timeline: list[tuple[float, int]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "first_content": self.first_content,
            "last_content": self.last_content,
            "done": self.done,
            "text_chars": len(self.text),
            "reasoning_chars": len(self.reasoning_text),
            "usage": self.usage,
            "events": self.events,
            "content_chunks": self.content_chunks,
            "keepalives": self.keepalives,
            "finish_reason": self.finish_reason,
            "abandoned": self.abandoned,
            "error": self.error,
        }


class StreamClient:
    """Streams completions from one OpenAI-compatible server, one request at a time."""

    def __init__(
        self,
        endpoint: str,
        *,
        api: str = "chat",
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 300.0,
        deadline_s: float | None = DEFAULT_REQUEST_DEADLINE_S,
        clock: Callable[[], float] = time.monotonic,
        headers: Mapping[str, str] | None = None,
        api_key: str | None = None,
    ) -> None:
        if api not in API_PATHS:
            raise ValueError(f"api: {api!r} is not one of {sorted(API_PATHS)}")
        if deadline_s is not None and deadline_s <= 0:
            raise ValueError(f"deadline_s: must be positive, got {deadline_s}")
        self.base = normalize_endpoint(endpoint)
        self.api = api
        self.clock = clock
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.deadline_s = deadline_s
        self._http = httpx.Client(
            base_url=self.base,
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
            headers={**dict(headers or {}), **bearer_headers(api_key)},
            trust_env=False,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> StreamClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def models(self) -> list[str]:
        """Model ids the server lists at /v1/models."""
        data = self._get_json("/v1/models")
        entries = data.get("data") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise EndpointError(f"{self.base}/v1/models: expected {{'data': [...]}}, got {str(data)[:200]}")
        return [str(e["id"]) for e in entries if isinstance(e, dict) and "id" in e]

    def _get_json(self, path: str) -> Any:
        try:
            response = self._http.get(path)
        except httpx.HTTPError as exc:
            raise EndpointError(f"cannot reach {self.base}{path}: {_describe(exc)}") from exc
        if response.status_code != 200:
            raise EndpointError(
                f"{self.base}{path} answered HTTP {response.status_code}: {response.text[:200]}",
                status=response.status_code,
            )
        try:
            return response.json()
        except ValueError as exc:
            raise EndpointError(
                f"{self.base}{path}: the answer is not JSON: {response.text[:200]!r}"
            ) from exc

    def request_body(self, prompt: str, model: str, params: Mapping[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, **params, "stream": True}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    def stream(
        self,
        prompt: str,
        *,
        model: str,
        params: Mapping[str, Any],
        deadline_s: float | None = None,
    ) -> StreamRun:
        """Send one streaming request and read it to the end (or to `deadline_s` wall seconds,
        the client's own deadline when None).

        A run past its deadline is abandoned: the client closes the connection, as an
        impatient user would, and the run says so. The deadline holds whatever arrives:
        each chunk (keepalive comments too) is checked against it, and no read waits longer
        than the deadline, so a silent server is abandoned within twice the deadline.
        """
        body = self.request_body(prompt, model, params)
        parser = SSEParser()
        run = StreamRun(prompt=prompt, sent=self.clock())
        deadline = deadline_s if deadline_s is not None else self.deadline_s
        read_s = self.read_timeout_s if deadline is None else min(self.read_timeout_s, deadline)
        timeout = httpx.Timeout(read_s, connect=self.connect_timeout_s)
        try:
            with self._http.stream("POST", API_PATHS[self.api], json=body, timeout=timeout) as response:
                if response.status_code != 200:
                    response.read()
                    raise EndpointError(
                        f"{self.base}{API_PATHS[self.api]} answered HTTP {response.status_code}: "
                        f"{response.text[:300]}",
                        status=response.status_code,
                    )
                for text in response.iter_text():
                    now = self.clock()
                    finished = self._consume(run, parser.feed(text), now)
                    if finished:
                        break
                    if deadline is not None and now - run.sent > deadline:
                        run.abandoned = True
                        break
                else:
                    self._consume(run, parser.close(), self.clock())
        except httpx.ReadTimeout as exc:
            if deadline is None or self.clock() - run.sent < deadline:
                raise EndpointError(
                    f"streaming from {self.base}{API_PATHS[self.api]} failed: {_describe(exc)}"
                ) from exc
            run.abandoned = True  # silent past the deadline: given up, as a user would
        except httpx.HTTPError as exc:
            raise EndpointError(
                f"streaming from {self.base}{API_PATHS[self.api]} failed: {_describe(exc)}"
            ) from exc
        run.done = self.clock()
        run.keepalives = parser.comments
        return run

    def _consume(self, run: StreamRun, events: list[SSEEvent], now: float) -> bool:
        """Fold events received at `now` into the run; True once [DONE] arrived."""
        for event in events:
            for payload in event_payloads(event):
                if payload == "[DONE]":
                    return True
                assert isinstance(payload, dict)
                if "error" in payload and not payload.get("choices"):
                    run.error = str(payload["error"])[:300]
                    continue
                run.events += 1
                if isinstance(payload.get("usage"), dict):
                    run.usage = payload["usage"]
                self._choices(run, payload.get("choices"), now)
        return False

    def _choices(self, run: StreamRun, choices: Any, now: float) -> None:
        if not isinstance(choices, list) or not choices:
            return
        choice = choices[0]
        if not isinstance(choice, dict):
            return
        if self.api == "chat":
            delta = choice.get("delta") or {}
            content = delta.get("content") or ""
            # vLLM names the field reasoning_content; newer servers call it reasoning.
            reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
        else:
            content = choice.get("text") or ""
            reasoning = ""
        if reasoning:
            run.reasoning_text += str(reasoning)
        if content:
            if run.first_content is None:
                run.first_content = now
            run.last_content = now
            run.text += str(content)
            run.content_chunks += 1
            run.timeline.append((now - run.sent, len(run.text)))
        if choice.get("finish_reason"):
            run.finish_reason = str(choice["finish_reason"])


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """The header that carries an API key to an OpenAI-compatible server (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def session_api_key(session: Any) -> str | None:
    """The key a lab session's engines ask of their clients (lab.session: derived for the
    job, put in place of the customer's masked key at launch); None for a stand-in session
    that has none. Sent whether or not the configuration turned authentication on: a server
    without a key ignores the header."""
    key = getattr(session, "engine_api_key", None)
    return key if isinstance(key, str) and key else None


def normalize_endpoint(endpoint: str) -> str:
    """The server's base URL: scheme and host, without a trailing `/v1`."""
    url = endpoint.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise EndpointError(f"endpoint {endpoint!r}: expected a URL such as http://127.0.0.1:8000")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def _describe(exc: httpx.HTTPError) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text
