"""The simulated engine's OpenAI-compatible HTTP endpoint, as vLLM serves it.

`ServingEngine` is what the simulated cold start brings up at "API ready": a threaded
HTTP server on the head node's API port answering /health, /version, /v1/models,
/v1/completions, /v1/chat/completions (streamed as SSE or whole) and /metrics, with
the request planning, pacing and server-side accounting of lab/sim/engine_core.py behind
it. Responses carry exactly the fields a real server sends; no header or field says
anything about the scenario's truth.

API keys are enforced as the engines do: launched with `--api-key` (or, for vLLM,
`VLLM_API_KEY`, which the flag overrides), vLLM answers 401 `{"error": "Unauthorized"}` to
any request under /v1, /v2, /inference or /cohere without `Authorization: Bearer <key>`
(vllm/entrypoints/serve/middleware/authenticate.py), and SGLang to any request but
/health*, /ready* and /metrics* (sglang/srt/utils/auth.py); /health and /metrics stay
open on both.
"""

from __future__ import annotations

import codecs
import hashlib
import hmac
import json
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple, cast

from lab.clock import LabClock
from lab.config import engine_api_keys
from lab.sim.engine_core import EngineCore, RequestRecord, ScenarioLike
from lab.sim.physics import Step
from lab.sim.release import Line, Release
from lab.sim.text import Workload, classify_prompt

# OpenAI's and vLLM's default for /v1/completions when the client names no limit.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# A chat reply with no client limit ends on its own after this many tokens of free text
# (a real model stops at its end-of-sequence token; the simulated one at this length).
CHAT_NATURAL_REPLY_TOKENS = 512
MAX_LOGPROBS = 20
_CHAT_MARKERS = {"system": "<|im_system|>", "user": "<|im_user|>", "assistant": "<|im_assistant|>"}
# The paths each engine holds behind its API key (see the module's docstring).
VLLM_GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
SGLANG_OPEN_PREFIXES = ("/health", "/ready", "/metrics")


class RequestError(Exception):
    """A request the API refuses, with the HTTP status and OpenAI error type to send."""

    def __init__(
        self, message: str, *, status: int = 400, kind: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param


class _Prompt(NamedTuple):
    """What a request's prompt part says, for either API."""

    text: str
    ids: list[int]
    question: str
    workload: Workload
    echo: bool
    logprobs: int | None
    raw_limit: Any


@dataclass
class Prepared:
    """A parsed API request, ready to admit."""

    chat: bool
    question: str  # what the model answers (the prompt, or the last user message)
    prompt_text: str  # what the engine prefills
    prompt_ids: list[int]
    workload: Workload
    max_tokens: int
    limit_given: bool
    ignore_eos: bool
    sampled: bool
    stream: bool
    include_usage: bool
    echo: bool
    logprobs: int | None  # top-n per token, None for no log-probabilities


def render_chat(messages: Sequence[Mapping[str, Any]]) -> str:
    """The chat as the engine prefills it, in Kimi K2's template markers."""
    parts = []
    for message in messages:
        role = str(message["role"])
        marker = _CHAT_MARKERS.get(role, "<|im_system|>")
        parts.append(f"{marker}{role}<|im_middle|>{_content_text(message.get('content'))}<|im_end|>")
    parts.append("<|im_assistant|>assistant<|im_middle|>")
    return "".join(parts)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    raise RequestError("messages[].content: expected a string or a list of text parts", param="messages")


class ServingEngine:
    """The engine's HTTP endpoint and everything behind it, for one launch."""

    def __init__(
        self,
        *,
        scenario: ScenarioLike,
        config: dict[str, Any],
        backend: str,
        backend_state: str,
        error_rate: float,
        clock: LabClock,
        log: Callable[[str], None],
        tokenizer_path: Path,
        host: str,
        port: int,
        seed: int,
        kv_capacity_tokens: int | None = None,
        release: Release | None = None,
        argv: Sequence[str] = (),
        log_line: Callable[[Line, str], None] | None = None,
    ) -> None:
        self.core = EngineCore(
            scenario=scenario,
            config=config,
            backend=backend,
            backend_state=backend_state,
            error_rate=error_rate,
            clock=clock,
            log=log,
            tokenizer_path=tokenizer_path,
            seed=seed,
            kv_capacity=kv_capacity_tokens,
            release=release,
            argv=argv,
            log_line=log_line,
        )
        self.version = str(config["engine"].get("version", ""))
        self.engine_name = str(config["engine"].get("name", "vllm"))
        # What the engine was started with, as it reads it: the key itself (lab.session
        # puts the job's key in the uploaded spec), hashed as vLLM keeps it.
        self._api_keys = [hashlib.sha256(k.encode()).digest() for k in engine_api_keys(config)]
        self._host = host
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._server = _Server((self._host, self._port), _Handler, self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="labsim-http", daemon=True
        )
        self._thread.start()
        self.core.start()

    def stop(self) -> None:
        """Stop serving: in-flight requests end at their next step, connections close."""
        self.core.stop()
        server = self._server
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.close_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def guarded(self, path: str) -> bool:
        """Whether a request for `path` needs the API key (none without one)."""
        if not self._api_keys:
            return False
        if self.engine_name == "sglang":
            return not path.startswith(SGLANG_OPEN_PREFIXES)
        return path.startswith(VLLM_GUARDED_PREFIXES)

    def authorized(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header carries one of the engine's keys (Bearer,
        compared in constant time, as the engines do)."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(token.encode("utf-8", errors="replace")).digest()
        match = False
        for key in self._api_keys:
            match |= hmac.compare_digest(digest, key)
        return match

    @property
    def url(self) -> str:
        if self._server is None:
            return f"http://{self._host}:{self._port}"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> ServingEngine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[_Handler], engine: ServingEngine) -> None:
        self.engine = engine
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections[request] = threading.current_thread()
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._connections_lock:
                self._connections.pop(request, None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up (or a connection closed by stop()) is ordinary here.
        if isinstance(sys.exc_info()[1], ConnectionError | OSError):
            return
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        """Unblock and end every connection thread (idle keep-alives included)."""
        with self._connections_lock:
            connections = list(self._connections.items())
        for sock, _ in connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for _, thread in connections:
            thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"  # what vLLM's and SGLang's API servers announce
    sys_version = ""
    arrival = 0.0

    def setup(self) -> None:
        super().setup()
        # Each SSE event is a small write; Nagle's algorithm would hold one back until the
        # previous is acknowledged (tens of ms with delayed ACKs), skewing token timing.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def engine(self) -> ServingEngine:
        return cast(_Server, self.server).engine

    @property
    def core(self) -> EngineCore:
        return self.engine.core

    def log_message(self, format: str, *args: Any) -> None:
        # The engine log belongs to the simulated node; stderr stays quiet.
        return

    # -- routing -----------------------------------------------------------------------

    def _refused(self, path: str) -> bool:
        """Answer 401 (and True) when `path` needs the API key and the request lacks it."""
        engine = self.engine
        if not engine.guarded(path) or engine.authorized(self.headers.get("Authorization")):
            return False
        self._send_json(401, {"error": "Unauthorized"})
        return True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if self._refused(path):
            return
        if path == "/health":
            self._send(200, b"", "application/json")
        elif path == "/version":
            self._send_json(200, {"version": self.engine.version})
        elif path == "/v1/models":
            self._send_json(200, self._models())
        elif path == "/metrics" and self.core.metrics_enabled:
            # SGLang mounts /metrics only when launched with --enable-metrics.
            self._send(200, self.core.metrics_text().encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path in ("/v1/completions", "/v1/chat/completions"):
            self._send_json(405, {"detail": "Method Not Allowed"})
        else:
            self._send_json(404, {"detail": "Not Found"})

    def parse_request(self) -> bool:
        # Called as soon as the request line is in: the request's arrival, from which
        # its first token is paced.
        self.arrival = time.monotonic()
        return super().parse_request()

    def do_POST(self) -> None:
        arrival = self.arrival
        path = self.path.split("?", 1)[0]
        if self.engine.guarded(path) and not self.engine.authorized(self.headers.get("Authorization")):
            self._discard_body()
            self._refused(path)
            return
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._discard_body()
            if path in ("/health", "/version", "/v1/models", "/metrics"):
                self._send_json(405, {"detail": "Method Not Allowed"})
            else:
                self._send_json(404, {"detail": "Not Found"})
            return
        try:
            body = self._json_body()
            prepared = self._prepare(body, chat=path == "/v1/chat/completions")
        except RequestError as err:
            self._send_error(err)
            return
        self._serve(prepared, arrival)

    # -- parsing -----------------------------------------------------------------------

    def _body_length(self) -> int:
        try:
            return max(0, int(self.headers.get("Content-Length") or 0))
        except ValueError:
            self.close_connection = True
            return 0

    def _discard_body(self) -> None:
        length = self._body_length()
        if length:
            self.rfile.read(length)

    def _json_body(self) -> dict[str, Any]:
        length = self._body_length()
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            raise RequestError(f"request body: not valid JSON ({exc})") from exc
        if not isinstance(body, dict):
            raise RequestError("request body: expected a JSON object")
        return body

    def _prepare(self, body: dict[str, Any], *, chat: bool) -> Prepared:
        core = self.core
        model = body.get("model")
        if model is not None and model != core.model_name:
            raise RequestError(
                f"The model `{model}` does not exist.", status=404, kind="NotFoundError", param="model"
            )
        if body.get("n", 1) not in (1, None):
            raise RequestError("n: this server returns one choice per request; use n = 1", param="n")
        prompt = self._chat_prompt(body) if chat else self._completion_prompt(body)
        prompt_text, prompt_ids, question = prompt.text, prompt.ids, prompt.question
        workload, echo, logprobs, raw_limit = prompt.workload, prompt.echo, prompt.logprobs, prompt.raw_limit
        if not prompt_ids:
            raise RequestError("prompt: empty", param="prompt")

        limit_given = raw_limit is not None
        max_tokens = self._max_tokens(raw_limit, chat=chat, echo=echo, prompt_ids=prompt_ids)
        self._check_length(prompt_ids, max_tokens)
        temperature = body.get("temperature", 1.0)
        if temperature is None:
            temperature = 1.0
        if not isinstance(temperature, int | float) or isinstance(temperature, bool) or temperature < 0:
            raise RequestError(
                f"temperature: expected a number >= 0, got {temperature!r}", param="temperature"
            )
        stream = _flag(body, "stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise RequestError("stream_options: expected an object", param="stream_options")
        include_usage = bool(options.get("include_usage")) and stream
        return Prepared(
            chat=chat,
            question=question,
            prompt_text=prompt_text,
            prompt_ids=prompt_ids,
            workload=workload,
            max_tokens=max_tokens,
            limit_given=limit_given,
            ignore_eos=_flag(body, "ignore_eos"),
            sampled=float(temperature) > 0,
            stream=stream,
            include_usage=include_usage,
            echo=echo,
            logprobs=logprobs,
        )

    def _chat_prompt(self, body: dict[str, Any]) -> _Prompt:
        core = self.core
        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) for m in messages)
        ):
            raise RequestError("messages: expected a non-empty list of messages", param="messages")
        for i, m in enumerate(messages):
            if "role" not in m:
                raise RequestError(f"messages[{i}].role: missing", param="messages")
        prompt_text = render_chat(messages)
        users = [_content_text(m.get("content")) for m in messages if m["role"] == "user"]
        question = users[-1] if users else _content_text(messages[-1].get("content"))
        workload = classify_prompt("\n".join(_content_text(m.get("content")) for m in messages))
        prompt_ids = core.text.encode(prompt_text)
        echo = False
        logprobs = _top_n(body.get("top_logprobs"), "top_logprobs") if _flag(body, "logprobs") else None
        raw_limit = body.get("max_completion_tokens", body.get("max_tokens"))
        return _Prompt(prompt_text, prompt_ids, question, workload, echo, logprobs, raw_limit)

    def _completion_prompt(self, body: dict[str, Any]) -> _Prompt:
        core = self.core
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            vocab = len(core.text.token_bytes)
            if not all(0 <= t < vocab for t in prompt):
                raise RequestError(f"prompt: token ids must be in 0..{vocab - 1}", param="prompt")
            prompt_ids = [int(t) for t in prompt]
            prompt_text = core.text.decode(prompt_ids)
        elif isinstance(prompt, str):
            prompt_text = prompt
            prompt_ids = core.text.encode(prompt)
        else:
            raise RequestError("prompt: expected one string or one list of token ids", param="prompt")
        question = prompt_text
        workload = classify_prompt(prompt_text)
        echo = _flag(body, "echo")
        raw = body.get("logprobs")
        logprobs = None if raw is None else _top_n(raw, "logprobs")
        raw_limit = body.get("max_tokens")
        return _Prompt(prompt_text, prompt_ids, question, workload, echo, logprobs, raw_limit)

    def _max_tokens(self, raw_limit: Any, *, chat: bool, echo: bool, prompt_ids: list[int]) -> int:
        """The tokens asked for: the request's limit, checked, or the API's default."""
        core = self.core
        if raw_limit is not None:
            if not isinstance(raw_limit, int) or isinstance(raw_limit, bool) or raw_limit < 0:
                raise RequestError(
                    f"max_tokens: expected an integer >= 0, got {raw_limit!r}", param="max_tokens"
                )
            max_tokens = int(raw_limit)
            if max_tokens == 0 and not echo:
                raise RequestError("max_tokens: must be at least 1 (0 only with echo)", param="max_tokens")
        elif chat:
            max_tokens = min(CHAT_NATURAL_REPLY_TOKENS, max(1, core.max_model_len - len(prompt_ids)))
        else:
            max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
        return max_tokens

    def _check_length(self, prompt_ids: list[int], max_tokens: int) -> None:
        """Refuse a request longer than the context, or than SGLang's KV pool, in each
        engine's own words."""
        core = self.core
        if core.engine == "sglang":
            # SGLang's tokenizer manager checks the context length first, in its own words.
            n, total = len(prompt_ids), len(prompt_ids) + max_tokens
            values = {"input_token_num": n, "self.context_len": core.max_model_len, "total_tokens": total,
                      "max_new_tokens": max_tokens}
            if n >= core.max_model_len:
                raise RequestError(core.release.line("context_too_long", startswith="The input").fmt(values))
            if total > core.max_model_len:
                raise RequestError(core.release.line("context_too_long", startswith="Requested").fmt(values))
        if len(prompt_ids) + max_tokens > core.max_model_len:
            raise RequestError(
                f"This model's maximum context length is {core.max_model_len} tokens. However, you "
                f"requested {len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or completion.",
                param="max_tokens",
            )
        if core.engine == "sglang" and core.kv_capacity:
            # SGLang's scheduler (tp_worker.py, managers/utils.py validate_input_length):
            # max_req_len = min(context length - 1, KV pool - 1), the input at most 5 fewer.
            max_req_input_len = min(core.max_model_len - 1, int(core.kv_capacity) - 1) - 5
            if len(prompt_ids) >= max_req_input_len:
                raise RequestError(core.release.line("input_too_long").fmt(
                    {"len(req.origin_input_ids)": len(prompt_ids), "max_req_input_len": max_req_input_len}))

    # -- serving -----------------------------------------------------------------------

    def _serve(self, req: Prepared, arrival: float) -> None:
        core = self.core
        record = core.admit(
            question=req.question,
            prompt_text=req.prompt_text,
            workload=req.workload,
            prompt_tokens=len(req.prompt_ids),
            max_tokens=req.max_tokens,
            ignore_eos=req.ignore_eos,
            sampled=req.sampled,
            prefix="chatcmpl" if req.chat else "cmpl",
        )
        reply = record.reply
        # A reply cut at the simulator's natural length, with no client limit, is the
        # model ending its answer, not running out of budget.
        finish = reply.finish_reason
        if not req.limit_given and req.chat and finish == "length":
            finish = "stop"
        response = _ResponseBuilder(self, req, record, finish)
        if req.stream:
            self._start_stream()
            emit: Callable[[int, Step, Sequence[int]], bool] = response.stream_step
        else:
            emit = response.collect_step
        outcome = core.run(record, emit, self._peer_gone, arrival)
        if outcome in ("aborted", "orphaned", "stopped"):
            self.close_connection = True
            return
        if req.stream:
            response.stream_end()
        else:
            self._send_json(200, response.whole())

    def _peer_gone(self) -> bool:
        """Whether the client closed its end: readable with nothing to read is EOF."""
        sock = self.connection
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return False
            return sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # -- writing -----------------------------------------------------------------------

    def _models(self) -> dict[str, Any]:
        core = self.core
        created = int(core.clock.now())
        return {
            "object": "list",
            "data": [
                {
                    "id": core.model_name,
                    "object": "model",
                    "created": created,
                    "owned_by": core.engine,
                    "root": str(core.config["model"]["path"]),
                    "parent": None,
                    "max_model_len": core.max_model_len,
                }
            ],
        }

    def _send(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _send_json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _send_error(self, err: RequestError) -> None:
        self._send_json(
            err.status,
            {"error": {"message": str(err), "type": err.kind, "param": err.param, "code": err.status}},
        )

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def write_event(self, payload: str) -> bool:
        """One SSE event as one HTTP chunk; False when the client is gone."""
        data = f"data: {payload}\n\n".encode()
        try:
            self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))
            return True
        except OSError:
            return False

    def end_stream(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True


class _ResponseBuilder:
    """Builds one request's OpenAI-shaped output, streamed step by step or whole."""

    def __init__(self, handler: _Handler, req: Prepared, record: RequestRecord, finish: str) -> None:
        self.handler = handler
        self.req = req
        self.record = record
        self.finish = finish
        core = handler.core
        self.core = core
        self.created = int(core.clock.now())
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.texts: list[str] = []
        self.ids: list[int] = []
        self.total = len(record.reply.token_ids)
        self.offset = 0  # characters of text already delivered, echo included
        self.logprob_salt = f"{record.index}"
        # Only when asked for: a long reply's log-probabilities cost time before its first token.
        self.completion_lps = (
            core.text.completion_logprobs(record.reply.token_ids, salt=self.logprob_salt)
            if req.logprobs is not None
            else []
        )
        self.sent_role = False

    # Log-probability blocks -----------------------------------------------------------

    def _completion_block(
        self, ids: Sequence[int], lps: Sequence[float | None], start: int
    ) -> dict[str, Any]:
        """The /v1/completions `logprobs` object for tokens `ids` at position `start`."""
        text = self.core.text
        n = self.req.logprobs or 0
        tokens: list[str] = []
        offsets: list[int] = []
        tops: list[dict[str, float] | None] = []
        for j, (token_id, lp) in enumerate(zip(ids, lps, strict=True)):
            piece = text.token_text(token_id)
            tokens.append(piece)
            offsets.append(self.offset)
            self.offset += len(piece)
            if lp is None:
                tops.append(None)
            else:
                alts = text.alternatives(token_id, lp, max(1, n), start + j)
                tops.append({text.token_text(t): v for t, v in alts})
        return {"text_offset": offsets, "token_logprobs": list(lps), "tokens": tokens, "top_logprobs": tops}

    def _chat_block(self, ids: Sequence[int], lps: Sequence[float], start: int) -> dict[str, Any]:
        text = self.core.text
        n = self.req.logprobs or 0
        content = []
        for j, (token_id, lp) in enumerate(zip(ids, lps, strict=True)):
            piece = text.token_text(token_id)
            alts = text.alternatives(token_id, lp, n, start + j) if n else []
            content.append(
                {
                    "token": piece,
                    "logprob": lp,
                    "bytes": list(text.token_bytes[token_id]),
                    "top_logprobs": [
                        {"token": text.token_text(t), "logprob": v, "bytes": list(text.token_bytes[t])}
                        for t, v in alts
                    ],
                }
            )
        return {"content": content}

    def _prompt_block(self) -> dict[str, Any]:
        text = self.core.text
        lps = text.prompt_logprobs(
            self.req.prompt_ids, backend_state=self.core.backend_state, error_rate=self.core.error_rate
        )
        return self._completion_block(self.req.prompt_ids, lps, 0)

    # Steps ----------------------------------------------------------------------------

    def _step_text(self, ids: Sequence[int]) -> tuple[str, bool]:
        """The step's text (bytes of a character split across steps wait for the rest)
        and whether it is the reply's last step."""
        table = self.core.text.token_bytes
        final = len(self.ids) + len(ids) >= self.total
        piece = self.decoder.decode(b"".join(table[t] for t in ids), final=final)
        self.texts.append(piece)
        self.ids.extend(ids)
        return piece, final

    def collect_step(self, index: int, step: Step, ids: Sequence[int]) -> bool:
        self._step_text(ids)
        return True

    def stream_step(self, index: int, step: Step, ids: Sequence[int]) -> bool:
        start = len(self.ids)
        piece, final = self._step_text(ids)
        events: list[str] = []
        if self.req.chat:
            if not self.sent_role:
                self.sent_role = True
                events.append(self._chat_chunk({"role": "assistant", "content": ""}, None, None))
            if piece or final:
                lps = (
                    self._chat_block(ids, self.completion_lps[start : start + len(ids)], start)
                    if (self.req.logprobs is not None)
                    else None
                )
                events.append(self._chat_chunk({"content": piece}, lps, self.finish if final else None))
        else:
            text = piece
            block: dict[str, Any] | None = None
            if self.req.echo and index == 0:
                text = self.req.prompt_text + piece
                if self.req.logprobs is not None:
                    block = self._prompt_block()
            if self.req.logprobs is not None:
                gen = self._completion_block(ids, self.completion_lps[start : start + len(ids)], start)
                block = gen if block is None else {k: block[k] + gen[k] for k in block}
            if text or final or block:
                events.append(self._completion_chunk(text, block, self.finish if final else None))
        return all(self.handler.write_event(e) for e in events)

    def stream_end(self) -> None:
        if self.req.include_usage:
            usage = {
                "id": self.record.request_id,
                "object": self._object(),
                "created": self.created,
                "model": self.core.model_name,
                "choices": [],
                "usage": self._usage(),
            }
            self.handler.write_event(json.dumps(usage))
        self.handler.write_event("[DONE]")
        self.handler.end_stream()

    # Shapes ---------------------------------------------------------------------------

    def _object(self) -> str:
        return "chat.completion.chunk" if self.req.chat else "text_completion"

    def _usage(self) -> dict[str, int]:
        prompt = len(self.req.prompt_ids)
        completion = len(self.ids)
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}

    def _completion_chunk(self, text: str, logprobs: dict[str, Any] | None, finish: str | None) -> str:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish,
            "stop_reason": None,
        }
        return json.dumps(
            {
                "id": self.record.request_id,
                "object": "text_completion",
                "created": self.created,
                "model": self.core.model_name,
                "choices": [choice],
            }
        )

    def _chat_chunk(self, delta: dict[str, Any], logprobs: dict[str, Any] | None, finish: str | None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return json.dumps(
            {
                "id": self.record.request_id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.core.model_name,
                "choices": [choice],
            }
        )

    def whole(self) -> dict[str, Any]:
        text = "".join(self.texts)
        ids = self.ids
        lps = self.completion_lps[: len(ids)]
        base = {
            "id": self.record.request_id,
            "created": self.created,
            "model": self.core.model_name,
            "usage": self._usage(),
        }
        if self.req.chat:
            block = self._chat_block(ids, lps, 0) if self.req.logprobs is not None else None
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": block,
                "finish_reason": self.finish,
                "stop_reason": None,
            }
            return {**base, "object": "chat.completion", "choices": [choice]}
        block = None
        if self.req.echo:
            text = self.req.prompt_text + text
            if self.req.logprobs is not None:
                block = self._prompt_block()
        if self.req.logprobs is not None:
            gen = self._completion_block(ids, lps, 0)
            block = gen if block is None else {k: block[k] + gen[k] for k in block}
        choice = {
            "index": 0,
            "text": text,
            "logprobs": block,
            "finish_reason": self.finish,
            "stop_reason": None,
        }
        return {**base, "object": "text_completion", "choices": [choice]}


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{name}: expected true or false, got {value!r}", param=name)
    return value


def _top_n(value: Any, name: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_LOGPROBS:
        raise RequestError(f"{name}: expected an integer 0..{MAX_LOGPROBS}, got {value!r}", param=name)
    return int(value)
