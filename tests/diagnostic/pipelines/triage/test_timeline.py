"""Reading a cold start's timeline from an engine log: stamps placed on the node's clock,
phases from the log's markers, stalls by the two rules (60 s silent, shards > 30 s apart)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from diagnostic.pipelines.triage import coldstart as cs
from diagnostic.pipelines.triage.timeline import Stall, merge, read_segment, stamp_epoch
from lab.engines.logs import seconds_of_year


def epoch(year: int, month: int, day: int, h: int = 0, m: int = 0, s: int = 0) -> float:
    return datetime(year, month, day, h, m, s, tzinfo=UTC).timestamp()


@pytest.mark.parametrize("when", [(2026, 3, 1, 12, 0, 0), (2028, 3, 1, 12, 0, 0), (2026, 12, 31, 23, 59, 50),
                                  (2027, 1, 1, 0, 0, 5)])
def test_a_stamp_without_a_year_lands_on_the_right_day(when: tuple[int, int, int, int, int, int]) -> None:
    year, month, day, h, m, s = when
    exact = epoch(year, month, day, h, m, s)
    ts = seconds_of_year(month, day, h, m, s, None)
    assert ts is not None
    # Near New Year the launch may be on the other side of it.
    assert stamp_epoch(ts, exact + 30) == exact
    assert stamp_epoch(ts, exact - 30) == exact


def vllm_line(t: float, message: str) -> str:
    return f"INFO {datetime.fromtimestamp(t, UTC).strftime('%m-%d %H:%M:%S')} [x.py:1] {message}"


def log_of_a_start(t0: float) -> list[str]:
    lines = [vllm_line(t0, "Automatically detected platform cuda."),
             vllm_line(t0 + 19, "Starting to load model /models/m...")]
    shards = [(t0 + 20, 0), (t0 + 20, 8), (t0 + 75, 24), (t0 + 130, 40), (t0 + 185, 64)]
    lines += [vllm_line(t, f"Loading safetensors checkpoint shards: {100 * d // 64}% Completed | "
                           f"{d}/64 [00:01<00:02,  3.88s/it]") for t, d in shards]
    lines += [vllm_line(t0 + 185, "Loading weights took 165.00 seconds"),
              vllm_line(t0 + 185, "world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://x "
                                  "backend=nccl"),
              vllm_line(t0 + 193, "vLLM is using nccl==2.27.3"),
              vllm_line(t0 + 193, "Using cache directory: /c for vLLM's torch.compile"),
              vllm_line(t0 + 343, "torch.compile takes 150.00 s in total"),
              vllm_line(t0 + 358, "GPU KV cache size: 1,000 tokens"),
              vllm_line(t0 + 433, "Graph capturing finished in 75 secs, took 0.52 GiB"),
              vllm_line(t0 + 438, "Starting vLLM API server 0 on http://0.0.0.0:8000")]
    return lines


def test_phases_and_stalls_of_one_start_among_others() -> None:
    t0 = epoch(2026, 12, 3, 10, 0, 0)
    earlier = log_of_a_start(t0 - 3600)
    serving = vllm_line(t0 + 900, "Engine 000: Avg prompt throughput")
    text = "\n".join([*earlier, *log_of_a_start(t0), serving])
    timeline = read_segment("n1", "vllm", text, launched_near=t0 - 1, until=t0 + 440)
    assert timeline is not None and timeline.t0 == t0
    assert [(name, a - t0, b - t0) for name, a, b in timeline.phases] == [
        ("process_start", 0, 19), ("weights_load", 19, 185), ("distributed_init", 185, 193),
        ("kernel_jit", 193, 343), ("kv_cache", 343, 358), ("graph_capture", 358, 433),
        ("api_ready", 433, 438)]
    assert [(s.start - t0, s.end - t0, s.kinds) for s in timeline.stalls] == [
        (20, 185, ["shards"]), (193, 343, ["silence"]), (358, 433, ["silence"])]


def test_a_log_in_local_time_is_placed_by_its_zone() -> None:
    t0 = epoch(2026, 12, 3, 10, 0, 0)
    local = "\n".join(log_of_a_start(t0 + 2 * 3600))  # the node logs UTC+2
    timeline = read_segment("n1", "vllm", local, launched_near=t0 - 1)
    assert timeline is not None and timeline.zone_offset_s == 7200 and timeline.t0 == t0


def test_touching_silences_stay_apart_and_a_chain_of_shard_gaps_is_one() -> None:
    merged = merge([Stall(0, 40, ["shards"], 40), Stall(40, 80, ["shards"], 40),
                    Stall(80, 150, ["silence"], 70), Stall(150, 300, ["silence"], 150)])
    assert [(s.start, s.end) for s in merged] == [(0, 80), (80, 150), (150, 300)]


def eager_start(t0: float, release: float, *, head: bool, load_s: float = 2.0) -> list[str]:
    """A start with a fast loader (`load_s`) whose rendezvous releases at `release`."""
    lines = [vllm_line(t0, "Automatically detected platform cuda."),
             vllm_line(t0 + 19, "Starting to load model /models/m...")]
    lines += [vllm_line(t0 + 20 + i * load_s / 2, f"Loading safetensors checkpoint shards: {100 * d // 64}% "
                                                  f"Completed | {d}/64 [00:01<00:02,  3.88s/it]")
              for i, d in enumerate((0, 32, 64))]
    loaded = t0 + 20 + load_s
    lines += [vllm_line(loaded, f"Loading weights took {load_s:.2f} seconds"),
              vllm_line(loaded, "world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://x "
                                 "backend=nccl"),
              vllm_line(release + 8, "vLLM is using nccl==2.27.3")]
    if head:
        lines.append(vllm_line(release + 20, "Starting vLLM API server 0 on http://0.0.0.0:8000"))
    return lines


def test_waiting_for_a_rank_that_started_later_is_not_a_stall() -> None:
    """The head started 80 s before the worker (a slow launcher): it sits silent until the
    worker has loaded its weights. That wait is the launch's, not a rendezvous fault."""
    t0 = epoch(2026, 12, 3, 10, 0, 0)
    late = t0 + 80
    release = late + 20 + 40
    logs = {"head": "\n".join(eager_start(t0, release, head=True)),
            "worker": "\n".join(eager_start(late, release, head=False, load_s=40))}
    start = cs.build("before", {}, "vllm", cold_start_s=release + 20 - late, launched_from=t0 - 1,
                     started_at=late, ready_at=release + 20, corrections={}, logs=logs, samples={},
                     facts={}, nodes=["head", "worker"], lab_s=0.0)
    assert [s.seconds for s in start.timelines["head"].stalls] == [126.0]  # the log was silent...
    assert start.stalls == []  # ...waiting for the worker to start and load, not at a rendezvous
