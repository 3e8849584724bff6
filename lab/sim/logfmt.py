"""Engine log lines in the formats vLLM and SGLang write, stamped with lab time.

The simulated engine writes its log through these helpers: the prefixes the engines'
loggers put before a message (the messages themselves are the release's format strings,
lab/sim/release.py), NCCL's and torch's own line shapes, tqdm's progress bar and
Python's traceback.
Timestamps are lab time in UTC as the node's clock reads it: the lab clock, plus the
scenario's `clock_offset_s` fault on a skewed node.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def vllm(level: str, t: float, source: str, message: str) -> str:
    """`INFO 12-02 14:53:00 [api_server.py:1885] message`."""
    return f"{level} {_utc(t).strftime('%m-%d %H:%M:%S')} [{source}] {message}"


def sglang(t: float, message: str, *, tp_rank: int | None = None) -> str:
    """`[2025-12-02 14:53:00 TP0] message` (the scheduler's prefix names the TP rank)."""
    rank = f" TP{tp_rank}" if tp_rank is not None else ""
    return f"[{_utc(t).strftime('%Y-%m-%d %H:%M:%S')}{rank}] {message}"


def nccl(host: str, pid: int, message: str) -> str:
    """NCCL's own lines go to stderr without a timestamp: `host:pid:tid [dev] NCCL ...`."""
    return f"{host}:{pid}:{pid + 211} [0] {message}"


def glog(severity: str, t: float, pid: int, source: str, message: str) -> str:
    """torch's C++ (glog-style) lines: `[W1202 15:18:16.000000 8101 file.cpp:767] message`."""
    stamp = _utc(t).strftime("%m%d %H:%M:%S.%f")
    return f"[{severity}{stamp} {pid} {source}] {message}"


def clock_mmss(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s // 60:02d}:{s % 60:02d}"


def shard_progress(desc: str, done: int, total: int, elapsed_s: float) -> str:
    """tqdm's progress bar text as vLLM prints it while loading checkpoint shards; `desc`
    is the bar's description from the release's table ("Loading safetensors checkpoint
    shards"), the rest is tqdm's own format (vLLM's bar_format)."""
    pct = int(100 * done / total) if total else 100
    if done == 0:
        return f"{desc}: {pct:3d}% Completed | 0/{total} [00:00<?, ?it/s]"
    per = elapsed_s / done
    remaining = per * (total - done)
    rate = f"{per:6.2f}s/it" if per >= 1 else f"{1 / per if per else 0.0:6.2f}it/s"
    return (f"{desc}: {pct:3d}% Completed | {done}/{total} "
            f"[{clock_mmss(elapsed_s)}<{clock_mmss(remaining)},{rate}]")


def python_traceback(frames: Iterable[tuple[str, int, str, str]], exception: str) -> list[str]:
    """A Python traceback: frames are (file, line, function, source line)."""
    lines = ["Traceback (most recent call last):"]
    for path, lineno, func, source in frames:
        lines.append(f'  File "{path}", line {lineno}, in {func}')
        lines.append(f"    {source}")
    lines.append(exception)
    return lines
