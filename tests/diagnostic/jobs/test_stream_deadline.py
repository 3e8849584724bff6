"""A measurement run cannot be held open: a server that sends only SSE keepalives, or goes
silent mid-stream, is abandoned at the request deadline (the client's own when the
measurement sets none), and a dropped connection is a transient EndpointError.

The server is a real HTTP server on loopback writing the stream by hand."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from diagnostic.jobs.faults import classify
from diagnostic.pipelines.client import DEFAULT_REQUEST_DEADLINE_S, EndpointError, StreamClient

CHUNK = b'data: {"choices": [{"delta": {"content": "tok "}}]}\n\n'


class Misbehaving(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "keepalive"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if self.mode == "drop":
            # One chunk of a chunked body, then the connection goes: a reset mid-stream.
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            self.wfile.write(CHUNK)
            self.wfile.flush()
            for _ in range(400):  # 20 s at most
                if self.mode == "keepalive":
                    self.wfile.write(b": keepalive\n\n")
                    self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass  # the client gave up: what the test wants


@pytest.fixture
def server() -> Iterator[tuple[str, type[Misbehaving]]]:
    handler = type("Handler", (Misbehaving,), {})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("mode", ["keepalive", "silent"])
def test_a_stream_held_open_is_abandoned_at_the_client_deadline(
    server: tuple[str, type[Misbehaving]], mode: str
) -> None:
    url, handler = server
    handler.mode = mode
    with StreamClient(url, deadline_s=0.5) as client:
        started = time.monotonic()
        run = client.stream("hello", model="m", params={"max_tokens": 8})
        took = time.monotonic() - started
    assert run.abandoned
    assert run.text == "tok "
    assert 0.5 <= took < 2.0, took
    if mode == "keepalive":
        assert run.keepalives > 3


def test_the_measurement_deadline_wins_over_the_client_default(server: tuple[str, type[Misbehaving]]) -> None:
    url, handler = server
    handler.mode = "keepalive"
    with StreamClient(url) as client:
        assert client.deadline_s == DEFAULT_REQUEST_DEADLINE_S
        started = time.monotonic()
        run = client.stream("hello", model="m", params={}, deadline_s=0.3)
    assert run.abandoned and time.monotonic() - started < 1.5


def test_a_dropped_stream_is_a_transient_endpoint_error(server: tuple[str, type[Misbehaving]]) -> None:
    url, handler = server
    handler.mode = "drop"
    with StreamClient(url, deadline_s=5) as client, pytest.raises(EndpointError) as caught:
        client.stream("hello", model="m", params={})
    assert caught.value.transient
    assert classify(caught.value).kind == "endpoint"


def test_a_deadline_must_be_positive() -> None:
    with pytest.raises(ValueError, match="deadline_s"):
        StreamClient("http://127.0.0.1:1", deadline_s=0)
