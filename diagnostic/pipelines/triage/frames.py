"""Cold-start telemetry as pandas frames: one 1 Hz frame per node on its own clock, the
windows of a stall cut from it, and the figures a signature is decided on.

A node's samples (docs/lab-contracts.md, "Telemetry sample") are resampled onto whole
seconds, so a second the sampler missed is a row of NaN rather than a silent gap: the
coverage of a window is how much of it was actually sampled, and a window covered too
thinly is "evidence incomplete", never a guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

KIB_PER_GIB = 1024**2
# A stall window whose seconds were sampled less than this is not evidence enough.
MIN_COVERAGE = 0.8

# The columns every node frame has, in this order (also the CSV's).
COLUMNS = (
    "cpu_user_pct", "cpu_system_pct", "cpu_iowait_pct", "cpu_idle_pct",
    "page_cache_gib", "mem_available_gib", "disk_read_mbps", "compilers", "gpu_util_pct",
    "mgmt_nic_mbps", "data_nic_mbps",
)


@dataclass(frozen=True)
class NicRoles:
    """Which of a node's NICs carry management traffic and which the data path, from its
    facts (the default route; the RDMA devices' net devices)."""

    mgmt: tuple[str, ...]
    data: tuple[str, ...]


def _nic_mbps(net: Mapping[str, Any], names: Iterable[str]) -> float | None:
    """Megabits per second through `names`, both directions; None when none was sampled."""
    total, seen = 0.0, False
    for name in names:
        counters = net.get(name)
        if isinstance(counters, Mapping):
            seen = True
            total += float(counters.get("rx_mbps") or 0.0) + float(counters.get("tx_mbps") or 0.0)
    return total if seen else None


def _row(sample: Mapping[str, Any], roles: NicRoles) -> dict[str, Any]:
    cpu = sample.get("cpu") or {}
    mem = sample.get("mem") or {}
    net = sample.get("net") or {}
    gpu = sample.get("gpu_util")
    cached = mem.get("cached_kib")
    available = mem.get("available_kib")
    return {
        "t": float(sample["t"]),
        "cpu_user_pct": cpu.get("user"),
        "cpu_system_pct": cpu.get("system"),
        "cpu_iowait_pct": cpu.get("iowait"),
        "cpu_idle_pct": cpu.get("idle"),
        "page_cache_gib": None if cached is None else float(cached) / KIB_PER_GIB,
        "mem_available_gib": None if available is None else float(available) / KIB_PER_GIB,
        "disk_read_mbps": sample.get("disk_read_mbps"),
        "compilers": sample.get("compilers"),
        "gpu_util_pct": None if gpu is None else float(gpu),
        "mgmt_nic_mbps": _nic_mbps(net, roles.mgmt),
        "data_nic_mbps": _nic_mbps(net, roles.data),
    }


def node_frame(samples: Sequence[Mapping[str, Any]], roles: NicRoles) -> pd.DataFrame:
    """The node's samples on a whole-second grid of its own clock (index: epoch seconds,
    int). Seconds without a sample are NaN rows; two samples in one second average."""
    rows = [_row(s, roles) for s in samples if isinstance(s, Mapping) and s.get("t") is not None]
    if not rows:
        return pd.DataFrame(columns=list(COLUMNS), index=pd.Index([], dtype="int64", name="t"), dtype=float)
    frame = pd.DataFrame(rows).astype(float)
    frame["t"] = frame["t"].round().astype("int64")
    frame = frame.groupby("t").mean()
    grid = pd.RangeIndex(int(frame.index.min()), int(frame.index.max()) + 1, name="t")
    return frame.reindex(grid)[list(COLUMNS)]


def window(frame: pd.DataFrame, start: float, end: float) -> pd.DataFrame:
    """The frame's seconds in [start, end] (node clock), NaN where nothing was sampled."""
    lo, hi = int(np.floor(start)), int(np.ceil(end))
    grid = pd.RangeIndex(lo, hi + 1, name="t")
    return frame.reindex(grid)


def _num(value: Any, digits: int = 2) -> float | None:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return None
    return round(float(value), digits)


def _climb_per_min(series: pd.Series) -> float | None:
    """How fast a level climbs, GiB per minute: the median of its 30 s rolling mean rate,
    so that a jump at either end of the window (a cache dropped, a load finishing) does
    not set it."""
    if series.notna().sum() < 3:
        return None
    rate = series.interpolate(limit_area="inside").diff().rolling(30, min_periods=5).mean().dropna()
    if rate.empty:
        rate = series.dropna().diff().dropna()
    return float(rate.median() * 60.0) if len(rate) else None


def summarize(win: pd.DataFrame) -> dict[str, Any]:
    """What a stall window's telemetry says, in the figures a signature is decided on.

    Levels are medians so that the few seconds in which the stall ends (the burst that
    finishes a rendezvous, say) do not set them; disk reads keep their mean, spread and
    burstiness, because a bursty reader is exactly what the mean alone hides."""
    seconds = max(0, len(win) - 1)
    sampled = int(win["cpu_user_pct"].notna().sum()) if len(win) else 0
    coverage = sampled / len(win) if len(win) else 0.0
    out: dict[str, Any] = {"seconds": seconds, "samples": sampled, "coverage": round(coverage, 3)}
    if sampled == 0:
        return out
    disk = win["disk_read_mbps"].dropna()
    disk_mean = float(disk.mean()) if len(disk) else None
    cache = win["page_cache_gib"]
    known_cache = cache.dropna()
    out.update({
        "disk_read_mbps_mean": _num(disk_mean),
        "disk_read_mbps_median": _num(disk.median() if len(disk) else None),
        "disk_read_mbps_p90": _num(disk.quantile(0.9) if len(disk) else None),
        # Second-to-second spread against the mean: a reader in storms swings by more than
        # its mean, a streaming one by a few tenths of it.
        "disk_read_cv": _num(disk.std() / disk_mean if disk_mean and len(disk) > 2 else None, 3),
        "page_cache_gib_start": _num(known_cache.iloc[0] if len(known_cache) else None),
        "page_cache_gib_end": _num(known_cache.iloc[-1] if len(known_cache) else None),
        "page_cache_gib_per_min": _num(_climb_per_min(cache)),
        "cpu_user_pct_median": _num(win["cpu_user_pct"].median()),
        "cpu_system_pct_median": _num(win["cpu_system_pct"].median()),
        "cpu_iowait_pct_median": _num(win["cpu_iowait_pct"].median()),
        "cpu_user_pct_mean": _num(win["cpu_user_pct"].mean()),
        "cpu_system_pct_mean": _num(win["cpu_system_pct"].mean()),
        "compilers_median": _num(win["compilers"].median()),
        "compilers_peak": _num(win["compilers"].max(), 0),
        "gpu_util_pct_median": _num(win["gpu_util_pct"].median()),
        "data_nic_mbps_median": _num(win["data_nic_mbps"].median(), 3),
        "data_nic_mbps_mean": _num(win["data_nic_mbps"].mean(), 3),
        "mgmt_nic_mbps_median": _num(win["mgmt_nic_mbps"].median(), 3),
        "mgmt_nic_mbps_p90": _num(win["mgmt_nic_mbps"].quantile(0.9), 3),
    })
    return out


def trace(win: pd.DataFrame, start: float) -> dict[str, list[float]]:
    """A window as the report plots it: `t_s` seconds into the stall for each sampled second,
    and one list per signal. Seconds the sampler missed are left out (their absence is
    the coverage figure's to tell), and so is a signal the node did not report."""
    sampled = win[win["cpu_user_pct"].notna()]
    out: dict[str, list[float]] = {"t_s": [float(t - int(np.floor(start))) for t in sampled.index]}
    for column in ("disk_read_mbps", "page_cache_gib", "cpu_user_pct", "cpu_system_pct", "compilers",
                   "gpu_util_pct", "data_nic_mbps", "mgmt_nic_mbps"):
        values = sampled[column]
        if len(values) and values.notna().all():
            out[column] = [round(float(v), 2) for v in values]
    return out


def telemetry_table(frames: Mapping[tuple[str, str], tuple[pd.DataFrame, float]]) -> pd.DataFrame:
    """Every run's every node in one long table: run, node, t_s (seconds since that node's
    launch), epoch (node clock) and the columns of a node frame."""
    parts = []
    for (run, node), (frame, t0) in frames.items():
        if frame.empty:
            continue
        part = frame.reset_index().rename(columns={"t": "epoch"})
        part.insert(0, "t_s", part["epoch"] - round(t0))
        part.insert(0, "node", node)
        part.insert(0, "run", run)
        parts.append(part)
    if not parts:
        return pd.DataFrame(columns=["run", "node", "t_s", "epoch", *COLUMNS])
    return pd.concat(parts, ignore_index=True)
