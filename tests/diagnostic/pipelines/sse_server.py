"""A small OpenAI-compatible streaming server on loopback, for the measurement tests.

It streams a fixed text as tokens of a real tokenizer, `tokens_per_step` tokens to a
chunk (several under speculation), on absolute deadlines, and keeps a server's own
accounting: /metrics counters named like vLLM's and vLLM-style stats log lines stamped
on a `LabClock` (so dilation can be exercised). Knobs give it each way of overclaiming
that the reconciliation must recognise: counting proposed positions, busy time, unseen
reasoning tokens, inflated usage, requests that run on after the client left.
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lab.clock import LabClock


@dataclass
class ServerPlan:
    pieces: Sequence[str]  # the token strings the server generates, in order (cycled)
    step_s: float = 0.01  # lab seconds per decode step
    ttft_s: float = 0.02  # lab seconds before the first token
    tokens_per_step: Sequence[int] = (1,)  # cycled; 1 + accepted drafts per step
    k: int = 0  # draft tokens per step (0: no speculation)
    counts: str = "emitted"  # emitted | proposed | emitted_busy
    reasoning_tokens: int = 0  # the first tokens go to delta.reasoning_content
    usage_extra: int = 0  # added to usage.completion_tokens
    abort_on_disconnect: bool = True
    keepalive: bool = False  # a ": keepalive" comment before every chunk
    style: str = "standard"  # standard | nospace | crlf | split | nodone
    api_model: str = "fake-model"
    dilation: float = 1.0
    log_interval_s: float = 10.0  # lab seconds


@dataclass
class _Counters:
    generation: int = 0
    prompt: int = 0
    accepted: int = 0
    drafted: int = 0
    drafts: int = 0
    busy_s: float = 0.0  # wall


@dataclass
class ServerState:
    totals: _Counters = field(default_factory=_Counters)
    window: _Counters = field(default_factory=_Counters)
    running: int = 0
    busy_since: float | None = None
    log: list[str] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class StreamServer:
    """Start with `serving(plan)`; `url`, `state`, `log_source()` for the tests."""

    def __init__(self, plan: ServerPlan) -> None:
        self.plan = plan
        self.clock = LabClock(plan.dilation, time.time())
        self.state = ServerState()
        self._stop = threading.Event()
        handler = _handler_for(self)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._threads = [
            threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True),
            threading.Thread(target=self._stats_loop, daemon=True),
        ]
        self._log_read = 0

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        for t in self._threads:
            t.join(timeout=5)

    def log_source(self) -> list[str]:
        with self.state.lock:
            new = self.state.log[self._log_read :]
            self._log_read = len(self.state.log)
        return new

    def to_lab(self, wall_s: float) -> float:
        return self.clock.lab_seconds(wall_s)

    # -- accounting -------------------------------------------------------------------
    def enter(self) -> None:
        with self.state.lock:
            if self.state.running == 0:
                self.state.busy_since = time.monotonic()
            self.state.running += 1

    def leave(self) -> None:
        with self.state.lock:
            self.state.running -= 1
            if self.state.running == 0 and self.state.busy_since is not None:
                self.state.window.busy_s += time.monotonic() - self.state.busy_since
                self.state.busy_since = None

    def account(self, emitted: int, drafted: int, accepted: int, prompt: int = 0) -> None:
        counted = emitted
        if self.plan.counts == "proposed" and drafted:
            counted = drafted + 1
        with self.state.lock:
            for c in (self.state.totals, self.state.window):
                c.generation += counted
                c.prompt += prompt
                c.accepted += accepted
                c.drafted += drafted
                c.drafts += 1 if drafted else 0

    def _stats_loop(self) -> None:
        interval_wall = self.plan.log_interval_s / self.plan.dilation
        start = time.monotonic()
        for n in itertools.count(1):
            if self._stop.wait(max(0.0, start + n * interval_wall - time.monotonic())):
                return
            self._log_window(interval_wall)

    def _log_window(self, interval_wall: float) -> None:
        with self.state.lock:
            w = self.state.window
            if self.state.busy_since is not None:
                now = time.monotonic()
                w.busy_s += now - self.state.busy_since
                self.state.busy_since = now
            self.state.window = _Counters()
            running = self.state.running
        seconds = self.plan.log_interval_s
        if self.plan.counts == "emitted_busy":
            seconds = w.busy_s * self.plan.dilation
        gen_tps = w.generation / seconds if seconds > 0 else 0.0
        stamp = datetime.fromtimestamp(self.clock.now(), UTC).strftime("%m-%d %H:%M:%S")
        lines = [
            f"INFO {stamp} [loggers.py:127] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
            f"Avg generation throughput: {gen_tps:.1f} tokens/s, Running: {running} reqs, Waiting: 0 reqs, "
            f"GPU KV cache usage: 0.1%, Prefix cache hit rate: 0.0%"
        ]
        if w.drafts:
            lines.append(
                f"INFO {stamp} [metrics.py:96] SpecDecoding metrics: Mean acceptance length: "
                f"{1 + w.accepted / w.drafts:.2f}, Accepted throughput: {w.accepted / seconds:.2f} tokens/s, "
                f"Drafted throughput: {w.drafted / seconds:.2f} tokens/s, Accepted: {w.accepted} tokens, "
                f"Drafted: {w.drafted} tokens, Per-position acceptance rate: 0.500, "
                f"Avg Draft acceptance rate: {100 * w.accepted / w.drafted:.1f}%"
            )
        with self.state.lock:
            self.state.log.extend(lines)

    def metrics_text(self) -> str:
        with self.state.lock:
            t = self.state.totals
            running = self.state.running
        labels = f'model_name="{self.plan.api_model}",engine="0"'
        rows = [
            ("vllm:num_requests_running", "gauge", running),
            ("vllm:generation_tokens_total", "counter", t.generation),
            ("vllm:prompt_tokens_total", "counter", t.prompt),
            ("vllm:spec_decode_num_accepted_tokens_total", "counter", t.accepted),
            ("vllm:spec_decode_num_draft_tokens_total", "counter", t.drafted),
        ]
        out = []
        for name, kind, value in rows:
            out += [
                f"# HELP {name} test server",
                f"# TYPE {name} {kind}",
                f"{name}{{{labels}}} {float(value)}",
            ]
        return "\n".join(out) + "\n"


def _handler_for(server: StreamServer) -> type[BaseHTTPRequestHandler]:
    plan = server.plan

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # Small writes at once: without this, Nagle's algorithm holds a chunk back until
            # the previous one is acknowledged, and the stream's timing becomes the kernel's.
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _json(self, code: int, payload: Any) -> None:
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": plan.api_model, "object": "model"}]})
            elif self.path == "/metrics":
                body = server.metrics_text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            chat = self.path == "/v1/chat/completions"
            if self.path not in ("/v1/chat/completions", "/v1/completions"):
                self._json(404, {"error": "not found"})
                return
            if body.get("model") != plan.api_model:
                self._json(404, {"error": {"message": f"model {body.get('model')!r} does not exist"}})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._stream(body, chat)

        def _send(self, text: str) -> bool:
            data = text.encode()
            try:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            except OSError:
                return False
            return True

        def _event(self, payload: dict[str, Any] | str) -> str:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            nl = "\r\n" if plan.style == "crlf" else "\n"
            if plan.style == "nospace":
                return f"data:{data}{nl}{nl}"
            if plan.style == "split" and isinstance(payload, dict):
                cut = data.index(",") + 1
                return f"data: {data[:cut]}{nl}data: {data[cut:]}{nl}{nl}"
            return f"data: {data}{nl}{nl}"

        def _chunk(self, chat: bool, content: str, reasoning: str) -> dict[str, Any]:
            if chat:
                delta: dict[str, Any] = {}
                if content:
                    delta["content"] = content
                if reasoning:
                    delta["reasoning_content"] = reasoning
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
            else:
                choice = {"index": 0, "text": content, "finish_reason": None}
            return {
                "id": "cmpl-test",
                "object": "chat.completion.chunk",
                "model": plan.api_model,
                "choices": [choice],
            }

        def _stream(self, body: dict[str, Any], chat: bool) -> None:
            max_tokens = int(body.get("max_tokens", 16))
            pieces = list(itertools.islice(itertools.cycle(plan.pieces), max_tokens))
            record = {"max_tokens": max_tokens, "outcome": "finished", "generated": 0}
            with server.state.lock:
                server.state.requests.append(record)
            server.enter()
            listening = True
            try:
                start = time.monotonic()
                due = plan.ttft_s
                cursor = 0
                steps = itertools.cycle(plan.tokens_per_step)
                first = True
                while cursor < len(pieces):
                    time.sleep(max(0.0, start + server.clock.wall_seconds(due) - time.monotonic()))
                    take = 1 if first else next(steps)
                    group = pieces[cursor : cursor + take]
                    drafted = 0 if first else plan.k
                    accepted = 0 if first else max(0, take - 1)
                    server.account(len(group), drafted, accepted, prompt=10 if first else 0)
                    record["generated"] = cursor + len(group)
                    text = "".join(group)
                    reasoning = ""
                    if cursor < plan.reasoning_tokens:
                        cut = max(0, min(len(group), plan.reasoning_tokens - cursor))
                        reasoning, text = "".join(group[:cut]), "".join(group[cut:])
                    cursor += len(group)
                    due += plan.step_s
                    first = False
                    if not listening:
                        continue
                    out = (": keepalive\n\n" if plan.keepalive else "") + self._event(
                        self._chunk(chat, text, reasoning)
                    )
                    if not self._send(out):
                        listening = False
                        record["outcome"] = "orphaned"
                        if plan.abort_on_disconnect:
                            record["outcome"] = "aborted"
                            return
                if not listening:
                    return
                final = self._chunk(chat, "", "")
                final["choices"][0]["finish_reason"] = "length"
                usage = {
                    "prompt_tokens": 10,
                    "completion_tokens": len(pieces) + plan.usage_extra,
                    "total_tokens": 10 + len(pieces) + plan.usage_extra,
                }
                tail = self._event(final) + self._event({"id": "cmpl-test", "choices": [], "usage": usage})
                if plan.style != "nodone":
                    tail += self._event("[DONE]")
                self._send(tail)
                self._send("")  # the zero-length chunk that ends a chunked body
            finally:
                server.leave()

    return Handler


@contextmanager
def serving(plan: ServerPlan) -> Iterator[StreamServer]:
    server = StreamServer(plan)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def main() -> None:
    """Serve a fixed stream in its own process (the overhead benchmark's server): prints the URL."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--step-s", type=float, required=True, help="seconds per token")
    parser.add_argument("--seconds", type=float, default=120.0, help="stop after this long")
    args = parser.parse_args()
    words = [" lorem", " ipsum", " dolor", " sit", " amet"]
    with serving(ServerPlan(pieces=words, step_s=args.step_s, ttft_s=0.0)) as server:
        print(server.url, flush=True)
        time.sleep(args.seconds)


if __name__ == "__main__":
    main()
