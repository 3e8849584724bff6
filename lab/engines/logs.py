"""Reading engine logs line by line into the `parse-log` events of DESIGN.md.

The framework here is shared by both engines: it peels the prefixes that real
deployments put in front of a log message (docker compose `svc-1  | `, container
timestamps `2025-09-01T12:00:00.123456789Z `, process tags `(APIServer pid=1) `, vLLM's
`INFO 09-01 12:00:00 [file.py:N] ` or older `INFO 09-01 12:00:00 file.py:N] `, SGLang's
`[2025-09-01 12:00:00 TP0] `, Python logging's `2025-09-01 12:00:00,123 [INFO] name: `,
torch's C++ `[rank0]:[W318 08:42:30.204625808 file.cpp:715] `),
tracks Python tracebacks across lines (one `error` event per traceback, carrying its
final exception line, chained exceptions included), turns ERROR lines and argparse
failures into `error` events, and reads checkpoint-shard progress bars. Each engine
module supplies matchers for its own messages, and error matchers that also read the
message of every `error` (an engine's reason for refusing to start is usually the final
line of a traceback); `failure_event` picks the error that says why an engine stopped.

Every event has `kind` and `line` (1-based physical line; a line holding several
carriage-return-separated progress updates yields them all under one number). When the
line carries the engine's timestamp, `ts_text` is it as printed and `ts` is seconds
since 1 January 00:00 on a leap-year calendar, as printed (no time zone, no year), so
differences within one log are exact except across New Year. A container timestamp in
front gives `container_ts` (UTC epoch seconds). `process` is the process or rank tag
(`EngineCore_DP0 pid=123`, `TP0`) when present.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

Event = dict[str, Any]
# A matcher looks at one message; it returns the events it recognizes, or None.
Matcher = Callable[[str, "LogLine", dict[str, Any]], list[Event] | None]

_COMPOSE = re.compile(r"^[\w.-]+\s+\|\s?")
_CONTAINER_TS = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:?\d{2})\s+")
_PROCESS = re.compile(r"^\(([^()]*?pid=\d+)\)\s?")
_STAGE = re.compile(r"^\[Stage-\d+\]\s")
_LEVELS = "DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL"
_VLLM_HEADER = re.compile(
    rf"^({_LEVELS})\s+(\d{{2}})-(\d{{2}})\s+(\d{{2}}):(\d{{2}}):(\d{{2}})(?:[.,](\d+))?"
    r"(?:\s+\[([^\]\s]+)\]|\s+([\w./-]+:\d+)\])?(?:\s|$)")
_SGLANG_HEADER = re.compile(
    r"^\[(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?(?: ([^\]]*))?\]\s?")
_PYLOG_HEADER = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?\s+"
    rf"(?:\[({_LEVELS})\]|-\s+({_LEVELS})\s+-)\s+([\w.]+):\s?")
_GPU_ID = re.compile(r"^\[gpu_id=(\d+)\]\s?")
# torch's C++ logging (glog style): "[rank0]:[W318 08:42:30.204625808 ProcessGroupGloo.cpp:715] ".
_GLOG_HEADER = re.compile(r"^(?:\[rank(\d+)\]:)?\[([IWEF])(\d{1,2})(\d{2}) (\d{2}):(\d{2}):(\d{2})"
                          r"(?:\.(\d+))? +(?:\d+ +)?([^\]\s]+)\]\s?")
_GLOG_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}

_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = re.compile(r"^(During handling of the above exception|The above exception was the "
                      r"direct cause)")
_EXCEPTION = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning|"
    r"Failure|Timeout|Fault)|StopIteration))(?:\([^)]*\))?(?::\s*(?P<text>.*))?$")
_ARGPARSE_ERROR = re.compile(r"^(?P<prog>[\w./ -]+): error: (?P<text>.+)$")
_SHARDS = re.compile(
    r"(?:Loading (?P<loader>[\w-]+) checkpoint shards:\s*)?(?P<pct>\d{1,3})% Completed \| "
    r"(?P<done>\d+)/(?P<total>\d+)(?: \[(?P<elapsed>[\d:]+)<)?")


def number(text: str) -> float:
    """A logged figure: thousands separators and trailing punctuation tolerated."""
    return float(text.replace(",", "").rstrip(". "))


def seconds_of_year(month: int, day: int, h: int, m: int, s: int, frac: str | None) -> float | None:
    try:
        yday = date(2024, month, day).timetuple().tm_yday  # 2024: 29 February exists
    except ValueError:
        return None
    return (yday - 1) * 86400 + h * 3600 + m * 60 + s + (float("0." + frac) if frac else 0.0)


def _container_epoch(m: re.Match[str]) -> float | None:
    try:
        when = datetime(int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6]),
                        tzinfo=UTC)
    except ValueError:
        return None
    offset = 0
    if m[8] != "Z":
        sign = -1 if m[8][0] == "-" else 1
        digits = m[8][1:].replace(":", "")
        offset = sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return when.timestamp() - offset + (float("0." + m[7]) if m[7] else 0.0)


def _full_stamp(m: re.Match[str]) -> str:
    return f"{m[1]}-{m[2]}-{m[3]} {m[4]}:{m[5]}:{m[6]}" + (f".{m[7]}" if m[7] else "")


@dataclass(frozen=True)
class LogLine:
    number: int
    message: str
    level: str | None = None
    source: str | None = None
    process: str | None = None
    ts: float | None = None
    ts_text: str | None = None
    container_ts: float | None = None

    @property
    def has_header(self) -> bool:
        return self.level is not None or self.ts is not None

    @property
    def key(self) -> tuple[str | None, str | None, str | None]:
        """Lines of one multi-line record (a logged traceback) share this key."""
        return self.level, self.source, self.process

    def stamp(self) -> Event:
        out: Event = {"line": self.number}
        if self.ts_text is not None:
            out["ts_text"] = self.ts_text
            out["ts"] = self.ts
        if self.container_ts is not None:
            out["container_ts"] = self.container_ts
        if self.process is not None:
            out["process"] = self.process
        return out


def read_line(number: int, raw: str) -> LogLine:
    """Peel the prefixes off one line; the message keeps its own leading indentation."""
    text = raw.lstrip("\ufeff").rstrip()
    container_ts = None
    processes: list[str] = []
    if m := _COMPOSE.match(text):
        text = text[m.end():]
    changed = True
    while changed:
        changed = False
        if container_ts is None and (m := _CONTAINER_TS.match(text)):
            container_ts = _container_epoch(m)
            text, changed = text[m.end():], True
        if m := _PROCESS.match(text):
            processes.append(m[1])
            text, changed = text[m.end():], True
        if m := _STAGE.match(text):
            text, changed = text[m.end():], True
    level = source = ts_text = None
    ts = None
    if m := _VLLM_HEADER.match(text):
        level, source = m[1], m[8] or m[9]
        ts_text = f"{m[2]}-{m[3]} {m[4]}:{m[5]}:{m[6]}" + (f".{m[7]}" if m[7] else "")
        ts = seconds_of_year(int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6]), m[7])
        text = text[m.end():]
    elif m := _SGLANG_HEADER.match(text):
        ts_text = _full_stamp(m)
        ts = seconds_of_year(int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6]), m[7])
        if m[8]:
            processes.append(m[8])
        text = text[m.end():]
    elif m := _PYLOG_HEADER.match(text):
        level, source = m[8] or m[9], m[10]
        ts_text = _full_stamp(m)
        ts = seconds_of_year(int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6]), m[7])
        text = text[m.end():]
    elif m := _GLOG_HEADER.match(text):
        level, source = _GLOG_LEVELS[m[2]], m[9]
        ts_text = f"{int(m[3]):02d}-{m[4]} {m[5]}:{m[6]}:{m[7]}" + (f".{m[8]}" if m[8] else "")
        ts = seconds_of_year(int(m[3]), int(m[4]), int(m[5]), int(m[6]), int(m[7]), m[8])
        if m[1] is not None:
            processes.append(f"rank{m[1]}")
        text = text[m.end():]
    elif m := _GPU_ID.match(text):
        processes.append(f"gpu_id={m[1]}")
        text = text[m.end():]
    if level == "WARN":
        level = "WARNING"
    return LogLine(number=number, message=text, level=level, source=source,
                   process=" ".join(processes) or None, ts=ts, ts_text=ts_text,
                   container_ts=container_ts)


def normalize_backend(name: str) -> str:
    """A kernel backend name as logged -> snake_case (FlashInferCutlass -> flashinfer_cutlass,
    'VLLM_CUTLASS' -> cutlass, CutlassNvFp4LinearKernel -> cutlass)."""
    text = name.strip("'\" ")
    text = re.sub(r"(?:NvFp4|Fp4)?LinearKernel$", "", text)
    for word, fixed in (("FlashInfer", "Flashinfer"), ("TRTLLM", "Trtllm"), ("TrtLlm", "Trtllm"),
                        ("CuteDSL", "Cutedsl"), ("CuTeDSL", "Cutedsl"), ("DeepGemm", "Deepgemm")):
        text = text.replace(word, fixed)
    if any(c.islower() for c in text):  # CamelCase; ALL_CAPS names are split already
        text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", text)
    text = re.sub(r"[-\s]+", "_", text).lower()
    # vLLM calls its own CUTLASS kernels VLLM_CUTLASS; the override flag calls them cutlass.
    return {"vllm_cutlass": "cutlass", "deepgemm": "deep_gemm"}.get(text, text)


def _elapsed(text: str | None) -> float | None:
    if not text:
        return None
    total = 0
    for part in text.split(":"):
        total = total * 60 + int(part)
    return float(total)


def shard_progress(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    m = _SHARDS.search(message)
    if not m:
        return None
    event: Event = {"kind": "shard_progress", "done": int(m["done"]), "total": int(m["total"]),
                    "percent": int(m["pct"])}
    if m["loader"]:
        event["loader"] = m["loader"]
    elapsed = _elapsed(m["elapsed"])
    if elapsed is not None:
        event["elapsed_s"] = elapsed
    return [event]


@dataclass
class _Traceback:
    start: LogLine
    key: tuple[str | None, str | None, str | None]
    context: str
    state: str = "body"  # body | ended (exception seen) | chained (waiting for the next one)
    exception: LogLine | None = None
    last: LogLine | None = None

    def belongs(self, line: LogLine) -> bool:
        # A traceback printed by Python has no header; one logged through the engine's
        # logger repeats the ERROR header on every line.
        return line.key == self.key or not line.has_header

    @property
    def tail(self) -> LogLine:
        """The line the error is reported on: the final exception line when there is one."""
        return self.exception or self.last or self.start

    def event(self) -> Event:
        tail = self.tail
        # The start line may carry the stamp (SGLang logs "...: Traceback" on one line).
        out: Event = {"kind": "error", **self.start.stamp(), **tail.stamp(), "traceback": True,
                      "first_line": self.start.number}
        if self.exception is not None:
            m = _EXCEPTION.match(self.exception.message)
            out["exception"] = m["type"] if m else None
            out["message"] = self.exception.message
        else:
            out["exception"] = None
            out["message"] = tail.message.strip() or "traceback without a final exception line"
        if self.context:
            out["context"] = self.context
        return out

    def feed(self, line: LogLine) -> tuple[bool, Event | None]:
        """(consumed, finished-event) for the next line."""
        body = line.message
        if not self.belongs(line):
            return False, self.event()
        if self.state == "body":
            if body.strip() and not body[0].isspace() and _EXCEPTION.match(body):
                self.exception, self.state = line, "ended"
            elif body.strip():
                self.last = line
            return True, None
        if not body.strip():
            return True, None
        if self.state == "ended" and _CHAINED.match(body):
            self.state = "chained"
            return True, None
        if self.state == "chained" and body.startswith(_TRACEBACK):
            self.state = "body"
            return True, None
        return False, self.event()


_STAMP_KEYS = ("line", "ts_text", "ts", "container_ts", "process")


def _recognized(message: str, line: LogLine, stamp: Event, matchers: Sequence[Matcher],
                state: dict[str, Any]) -> list[Event]:
    """The events the first matcher that recognizes `message` returns, stamped."""
    for matcher in matchers:
        found = matcher(message, line, state)
        if found:
            return [{"kind": event.pop("kind"), **stamp, **event} for event in found]
    return []


# -- lines every engine's log can hold ----------------------------------------------------------
# NCCL's own INFO lines (written only with NCCL_DEBUG=INFO), after its "host:pid:tid [dev]"
# prefix: "NCCL INFO Bootstrap : Using enP2p1s0f0np0:10.10.0.1<0>" (newer releases
# "Bootstrap: Using ..."), "NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE ...", "NCCL INFO
# NET/Socket : Using [0]enp1s0f0np0:10.10.0.1<0>", connect retries "... retrying (3/20)",
# and "NCCL WARN ..." lines.
_NCCL_BOOTSTRAP = re.compile(r"NCCL INFO Bootstrap ?: Using (?P<iface>[^\s:<]+):(?P<addr>[^\s<]+)")
_NCCL_NET = re.compile(r"NCCL INFO NET/(?P<transport>\w+) ?: Using (?P<devices>.+)$")
_NCCL_RETRY = re.compile(r"NCCL INFO (?P<message>.*?retrying \((?P<n>\d+)/(?P<m>\d+)\).*)$")
_NCCL_WARN = re.compile(r"NCCL WARN (?P<message>.+)$")
# The engines' request for --trust-remote-code when a model's own code is needed (the
# tables' `trust_remote_code` lines): "Failed to load the tokenizer. If the tokenizer is a
# custom tokenizer ... using the `--trust-remote-code` flag in the CLI." and SGLang's
# "Tokenizer for X loaded as generic TokenizersBackend. Set --trust-remote-code ...".
_REMOTE_CODE = re.compile(r"Failed to load the (?P<what>[\w ]+?)\. If the .*trust[_-]remote[_-]code")
_REMOTE_CODE_GENERIC = re.compile(r"(?P<what>Tokenizer) for \S+ loaded as generic .*"
                                  r"--trust-remote-code")


def nccl_line(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    """NCCL's bootstrap interface, network devices, connect retries and warnings."""
    if "NCCL " not in message:
        return None
    if m := _NCCL_BOOTSTRAP.search(message):
        return [{"kind": "nccl", "what": "bootstrap", "interface": m["iface"],
                 "address": m["addr"]}]
    if m := _NCCL_RETRY.search(message):
        return [{"kind": "nccl", "what": "retry", "attempt": int(m["n"]), "of": int(m["m"]),
                 "message": m["message"].strip()}]
    if m := _NCCL_NET.search(message):
        return [{"kind": "nccl", "what": "net", "transport": m["transport"],
                 "devices": m["devices"].strip()}]
    if m := _NCCL_WARN.search(message):
        return [{"kind": "nccl", "what": "warning", "message": m["message"].strip()}]
    return None


def remote_code_needed(message: str, line: LogLine, state: dict[str, Any]) -> list[Event] | None:
    """The engine's request for --trust-remote-code (what it failed to load: tokenizer,
    model config, processor, ...)."""
    m = _REMOTE_CODE.search(message) or _REMOTE_CODE_GENERIC.search(message)
    if not m:
        return None
    return [{"kind": "trust_remote_code", "what": m["what"].lower()}]


COMMON_MATCHERS: tuple[Matcher, ...] = (nccl_line, remote_code_needed)


def parse_lines(lines: Iterable[str], matchers: Sequence[Matcher],
                error_matchers: Sequence[Matcher] = (), *,
                version: str | None = None) -> Iterator[Event]:
    """Events from `lines`, recognizing messages with `matchers` (first match wins), then
    the lines any engine's log holds (COMMON_MATCHERS).

    Each `error` is followed by what `error_matchers` (and remote_code_needed) recognize in
    its message, under the error's own stamp; a message that is no error goes to
    `matchers` only. `version` is the release that wrote the log, for the matchers whose
    lines differ between releases (None: any modelled release's)."""
    matchers = (*matchers, *COMMON_MATCHERS)
    error_matchers = (*error_matchers, remote_code_needed)
    state: dict[str, Any] = {"version": version}
    tb: _Traceback | None = None

    def error(event: Event, line: LogLine) -> Iterator[Event]:
        yield event
        stamp = {k: event[k] for k in _STAMP_KEYS if k in event}
        yield from _recognized(event["message"], line, stamp, error_matchers, state)

    for number, physical in enumerate(lines, 1):
        for segment in physical.rstrip("\r\n").split("\r"):
            line = read_line(number, segment)
            if tb is not None:
                consumed, finished = tb.feed(line)
                if finished is not None:
                    yield from error(finished, tb.tail)
                    tb = None
                if consumed:
                    continue
            message = line.message
            if not message.strip():
                continue
            if _TRACEBACK in message:
                context = message.split(_TRACEBACK, 1)[0].strip().rstrip(":").strip()
                tb = _Traceback(start=line, key=line.key, context=context)
                continue
            if line.level in ("ERROR", "CRITICAL"):
                yield from error({"kind": "error", **line.stamp(), "traceback": False,
                                  "message": message.strip()}, line)
                continue
            if m := _ARGPARSE_ERROR.match(message):
                yield from error({"kind": "error", **line.stamp(), "traceback": False,
                                  "message": message.strip(), "prog": m["prog"]}, line)
                continue
            yield from _recognized(message, line, line.stamp(), matchers, state)
    if tb is not None:
        yield from error(tb.event(), tb.tail)


# Errors that only point at an earlier one: vLLM's API process after its engine core died
# ("Engine core initialization failed. See root cause above.", vllm/v1/engine/core_client.py;
# EngineDeadError's "See stack trace (above) for the root cause.").
_POINTS_ABOVE = re.compile(r"\bsee (?:the )?(?:root cause|stack trace|traceback|error) ?\(?above\)?",
                           re.IGNORECASE)


def failure_event(events: Iterable[Event]) -> Event | None:
    """The `error` among `events` that says why the engine stopped, or None if none does.

    An engine that fails prints its cause as a traceback, and then shutdown chatter
    ("AsyncLLM output_handler failed.", a worker "died unexpectedly") and, from the API
    process, an error that only points above. So: the last traceback with a final
    exception line that does not just point above; failing that the last such error of
    any form; failing that the last error."""
    errors = [e for e in events if e["kind"] == "error"]
    telling = [e for e in errors if not _POINTS_ABOVE.search(e["message"])]
    exceptions = [e for e in telling if e.get("exception")]
    found = exceptions or telling or errors
    return found[-1] if found else None


# -- crash families --------------------------------------------------------------------------
# Whether two failed starts failed the same way is decided by the family of the error, not
# its exact words: the same out-of-memory error names a different free-GiB figure each
# time, an NCCL error a different peer, a CUDA error a different address. The families, by
# what the engines' own errors say (PyTorch's "CUDA out of memory" / torch.OutOfMemoryError,
# vLLM's and SGLang's KV-cache refusals, NCCL's ncclSystemError / "NCCL error", the CUDA
# runtime's "CUDA error: ..."), then the Python exception type of the final traceback line,
# then a signal or the exit code.
_CRASH_FAMILIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("out_of_memory", re.compile(r"out of memory|OutOfMemoryError|Not enough memory|"
                                 r"Cannot allocate memory|KV cache is needed|"
                                 r"larger than the available KV cache memory|"
                                 r"No available memory for the cache blocks", re.IGNORECASE)),
    ("nccl", re.compile(r"\bNCCL\b|nccl[A-Z]\w*Error|ProcessGroupNCCL", re.IGNORECASE)),
    ("cuda", re.compile(r"CUDA error|cudaError\w*|CUBLAS_STATUS_\w+|illegal memory access|"
                        r"device-side assert", re.IGNORECASE)),
)
_EXCEPTION_TYPE = re.compile(r"^(?:[\w.]+\.)?(?P<type>[A-Z]\w*(?:Error|Exception|Exit|Interrupt|"
                             r"Warning|Failure))\b")
_SIGNALS = {-9: "SIGKILL", -15: "SIGTERM", -6: "SIGABRT", -11: "SIGSEGV", -7: "SIGBUS",
            137: "SIGKILL", 134: "SIGABRT", 139: "SIGSEGV", 135: "SIGBUS"}


def crash_family(engine_error: str | None, exit_code: int | None) -> str:
    """The family of an engine's failure to start: out_of_memory, nccl, cuda, the Python
    exception type of its final error line (python:ValueError), a signal (signal:SIGKILL),
    else its exit code (exit:1). Two starts that failed in one family failed the same way."""
    text = engine_error or ""
    for family, pattern in _CRASH_FAMILIES:
        if pattern.search(text):
            return family
    m = _EXCEPTION_TYPE.match(text.strip())
    if m:
        return f"python:{m['type']}"
    if exit_code in _SIGNALS:
        return f"signal:{_SIGNALS[exit_code]}"
    return f"exit:{exit_code}"
