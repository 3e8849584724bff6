"""Reading a cold start's timeline from an engine log: stamps placed on the node's clock,
phases from the log's markers, stalls by the two rules (60 s silent, shards > 30 s apart)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from diagnostic.pipelines.triage import coldstart as cs
from diagnostic.pipelines.triage.timeline import Stall, merge, read_segment, stamp_epoch
from lab.engines.logs import seconds_of_year
from lab.sim.release import Release


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
    """A vLLM 0.34 start in the real order (LAB_MODEL.md section 5), its lines from the
    release table's format strings: the ranks meet right after the process starts (at INFO
    vLLM writes nothing of its own until model init), then model init logs its backends,
    then the weights (the shards' bar is rank 0's), compile, KV cache, graphs, API."""
    lines = [vllm_line(t0, "Automatically detected platform cuda."),
             vllm_line(t0 + 28, "Using FLASHINFER_CUTLASS NvFp4 MoE backend out of potential backends: "
                                "[FLASHINFER_CUTLASS, CUTLASS, MARLIN]."),
             vllm_line(t0 + 29, "Loading model from scratch...")]
    shards = [(t0 + 30, 0), (t0 + 30, 8), (t0 + 85, 24), (t0 + 140, 40), (t0 + 195, 64)]
    lines += [vllm_line(t, f"Loading safetensors checkpoint shards: {100 * d // 64}% Completed | "
                           f"{d}/64 [00:01<00:02,  3.88s/it]") for t, d in shards]
    lines += [vllm_line(t0 + 195, "Loading weights took 165.00 seconds"),
              vllm_line(t0 + 195, "Using cache directory: /c for vLLM's torch.compile"),
              vllm_line(t0 + 345, "torch.compile took 150.00 s in total"),
              vllm_line(t0 + 350, "Available KV cache memory: 20.5 GiB"),
              vllm_line(t0 + 360, "GPU KV cache size: 1,000 tokens, Maximum concurrency for 1,000 tokens "
                                  "per request: 1.00x"),
              vllm_line(t0 + 435, "Graph capturing finished in 75 secs, took 0.52 GiB"),
              vllm_line(t0 + 440, "Starting vLLM server on http://0.0.0.0:8000")]
    return lines


def test_phases_and_stalls_of_one_start_among_others() -> None:
    t0 = epoch(2026, 12, 3, 10, 0, 0)
    earlier = log_of_a_start(t0 - 3600)
    serving = vllm_line(t0 + 900, "Engine 000: Avg prompt throughput")
    text = "\n".join([*earlier, *log_of_a_start(t0), serving])
    timeline = read_segment("n1", "vllm", text, launched_near=t0 - 1, until=t0 + 442, version="0.34.0")
    assert timeline is not None and timeline.t0 == t0
    assert [(name, a - t0, b - t0) for name, a, b in timeline.phases] == [
        ("distributed_init", 0, 28), ("model_init", 28, 29),
        ("weights_load", 29, 195), ("kernel_jit", 195, 345), ("kv_cache", 345, 360),
        ("graph_capture", 360, 435), ("api_ready", 435, 440)]
    assert [(s.start - t0, s.end - t0, s.kinds) for s in timeline.stalls] == [
        (30, 195, ["shards"]), (195, 345, ["silence"]), (360, 435, ["silence"])]
    assert timeline.first_weights_line() == t0 + 28
    assert timeline.nccl_lines() == 0


def test_a_worker_without_the_shards_bar_still_closes_its_weights_phase() -> None:
    # Only rank 0 draws tqdm's bar (model_loader/weight_utils.py enable_tqdm): a worker's
    # weights are a silence between the runner's start line and "Loading weights took".
    t0 = epoch(2026, 12, 3, 10, 0, 0)
    lines = [x for x in log_of_a_start(t0) if "checkpoint shards" not in x]
    timeline = read_segment("n2", "vllm", "\n".join(lines), launched_near=t0 - 1, version="0.34.0")
    assert timeline is not None
    assert ("weights_load", t0 + 29, t0 + 195) in timeline.phases
    assert (29, 195, ["silence"]) in [(s.start - t0, s.end - t0, s.kinds) for s in timeline.stalls]


def test_a_headless_worker_ends_its_kv_phase_with_its_own_memory_line() -> None:
    # The cache's size in tokens comes from the head's engine core (core.py ->
    # update_kv_cache_capacity, the table's writers "rank 0"); a --headless worker writes
    # only its worker's "Available KV cache memory" line, and its phases stay in order.
    t0 = epoch(2026, 12, 3, 10, 0, 0)
    lines = [x for x in log_of_a_start(t0) if "checkpoint shards" not in x and "KV cache size" not in x
             and "Starting vLLM server" not in x]
    timeline = read_segment("n3", "vllm", "\n".join(lines), launched_near=t0 - 1, version="0.34.0")
    assert timeline is not None
    assert [(name, a - t0, b - t0) for name, a, b in timeline.phases][-3:] == [
        ("kernel_jit", 195, 345), ("kv_cache", 345, 350), ("graph_capture", 350, 435)]


def test_a_line_another_release_writes_does_not_end_a_phase() -> None:
    # 0.29.0's model runner said "Starting to load model %s..."; 0.34.0's does not.
    t0 = epoch(2026, 12, 3, 10, 0, 0)
    lines = [vllm_line(t0, "Automatically detected platform cuda."),
             vllm_line(t0 + 28, "Starting to load model /models/m..."),
             vllm_line(t0 + 200, "Loading weights took 170.00 seconds")]
    old = read_segment("n1", "vllm", "\n".join(lines), launched_near=t0 - 1, version="0.29.0")
    new = read_segment("n1", "vllm", "\n".join(lines), launched_near=t0 - 1, version="0.34.0")
    assert old is not None and new is not None
    assert ("model_init", t0 + 28, t0 + 28) not in new.phases
    assert [name for name, _, _ in old.phases][:2] == ["distributed_init", "model_init"]
    assert [name for name, _, _ in new.phases] == ["weights_load"]


def sglang_line(t: float, message: str) -> str:
    return f"[{datetime.fromtimestamp(t, UTC).strftime('%Y-%m-%d %H:%M:%S')} TP0] {message}"


@pytest.mark.parametrize(("version", "begin", "ends", "captured"), [
    ("0.5.12", "Init torch distributed begin.",
     "Init torch distributed ends. elapsed=78.00 s, mem usage=0.00 GB",
     "Capture piecewise CUDA graph end. Time elapsed: 20.00 s. mem usage=0.50 GB. avail mem=9.50 GB."),
    ("0.5.23", "Init parallel begin.", "Init parallel ends. elapsed=78.00 s",
     "Capture decode CUDA graph end. elapsed=20.00 s, mem usage=0.50 GB, avail mem=9.50 GB."),
])
def test_an_sglang_start_with_a_rendezvous_stall_and_no_nccl_lines(version: str, begin: str,
                                                                    ends: str, captured: str) -> None:
    """SGLang's lines (no compile line, `CUDA graph` capitalised), each version's own words
    for the rendezvous, a 78 s silence in it, and no NCCL line: NCCL writes none without
    NCCL_DEBUG=INFO. 0.5.23's MoE runner line comes while the arguments are read, before
    the rendezvous: it ends no phase."""
    t0 = epoch(2026, 12, 3, 10, 0, 0)
    lines = [sglang_line(t0, "server_args=ServerArgs(model_path='/models/m')"),
             sglang_line(t0 + 1, "Use flashinfer_cutlass as MoE runner backend on SM110/SM120 for "
                                 "modelopt_fp4 (trtllm-gen MoE kernels are SM100-only)"),
             sglang_line(t0 + 20, begin),
             sglang_line(t0 + 98, ends),
             sglang_line(t0 + 100, "Load weight begin. avail mem=110.00 GB"),
             sglang_line(t0 + 130, "Load weight end. elapsed=30.00 s, type=DeepseekV3ForCausalLM, "
                                   "avail mem=50.00 GB, mem usage=60.00 GB."),
             sglang_line(t0 + 150, "Memory pool end. avail mem=10.00 GB"),
             sglang_line(t0 + 170, captured),
             sglang_line(t0 + 175, "The server is fired up and ready to roll!")]
    timeline = read_segment("n1", "sglang", "\n".join(lines), launched_near=t0 - 1, version=version)
    assert timeline is not None
    phases = [(name, a - t0, b - t0) for name, a, b in timeline.phases]
    assert phases[:3] == [("process_start", 0, 20), ("distributed_init", 20, 98),
                          ("model_init", 98, 100)]
    assert phases[3:] == [("weights_load", 100, 130), ("kv_cache", 130, 150),
                          ("graph_capture", 150, 170), ("api_ready", 170, 175)]
    assert [(s.start - t0, s.end - t0) for s in timeline.stalls] == [(20, 98)]
    first = timeline.first_weights_line()
    assert first is not None and timeline.stalls[0].end <= first
    assert timeline.nccl_lines() == 0


def test_nccl_retry_lines_are_counted_in_their_own_form() -> None:
    t0 = epoch(2026, 12, 3, 10, 0, 0)
    nccl = "spark-03:1234:1290 [0] NCCL INFO socketPollConnect: connect to 10.0.0.1<40123> returned " \
           "Connection refused, retrying ({n}/34) after sleep for {ms} msec"
    lines = [vllm_line(t0, "Automatically detected platform cuda."),
             vllm_line(t0 + 19, "world_size=2 rank=1 local_rank=0 distributed_init_method=tcp://x "
                                "backend=nccl"),
             *[nccl.format(n=n, ms=100 * n) for n in range(1, 4)],
             vllm_line(t0 + 90, "rank 1 in world size 2 is assigned as DP rank 0, PP rank 0, TP rank 1"),
             "spark-03:1234:1290 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to enP7s7",
             vllm_line(t0 + 92, "Starting to load model /models/m...")]
    timeline = read_segment("n1", "vllm", "\n".join(lines), launched_near=t0 - 1)
    assert timeline is not None
    assert timeline.bootstrap_retries(t0 + 19, t0 + 90) == 3
    assert timeline.nccl_lines() == 4


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
    """A start in the real order whose rendezvous releases at `release`, then a fast
    loader (`load_s`)."""
    lines = [vllm_line(t0, "Automatically detected platform cuda."),
             vllm_line(t0 + 19, "world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://x "
                                "backend=nccl"),
             vllm_line(release, "rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, TP rank 0"),
             vllm_line(release + 2, "Starting to load model /models/m...")]
    lines += [vllm_line(release + 2 + i * load_s / 2, f"Loading safetensors checkpoint shards: "
                                                      f"{100 * d // 64}% Completed | {d}/64 "
                                                      "[00:01<00:02,  3.88s/it]")
              for i, d in enumerate((0, 32, 64))]
    lines.append(vllm_line(release + 2 + load_s, f"Loading weights took {load_s:.2f} seconds"))
    if head:
        lines.append(vllm_line(release + 20, "Starting vLLM server on http://0.0.0.0:8000"))
    return lines


def test_waiting_for_a_rank_that_started_later_is_not_a_stall() -> None:
    """The head started 80 s before the worker (a slow launcher): it sits silent at the
    rendezvous until the worker has started too. That wait is the launch's, not a
    rendezvous fault."""
    t0 = epoch(2026, 12, 3, 10, 0, 0)
    late = t0 + 80
    release = late + 19 + 8
    logs = {"head": "\n".join(eager_start(t0, release, head=True)),
            "worker": "\n".join(eager_start(late, release, head=False, load_s=10))}
    start = cs.build("before", {}, "vllm", cold_start_s=release + 20 - late, launched_from=t0 - 1,
                     started_at=late, ready_at=release + 20, corrections={}, logs=logs, samples={},
                     facts={}, nodes=["head", "worker"], lab_s=0.0)
    assert [s.seconds for s in start.timelines["head"].stalls] == [88.0]  # the log was silent...
    assert start.stalls == []  # ...waiting for the worker to start, not for a fault


@pytest.mark.parametrize("version", ["0.29.0", "0.34.0"])
def test_a_released_vllm_start_is_read_from_its_launch(version: str) -> None:
    """The lines a released vLLM writes at INFO, from its table's format strings: nothing
    stamped between the process start and model init's backend lines (NCCL's lines carry
    no stamp). A 60 s rendezvous stall is a silence that begins at the launch, which the
    launch itself reports; from the first line alone it would not show at all."""
    rel = Release("vllm", version)
    t0 = epoch(2026, 12, 3, 10, 0, 0)
    moe = rel.line("moe_backend")
    backends = ["FLASHINFER_CUTLASS", "VLLM_CUTLASS", "MARLIN"]
    retry = ("spark-03:1234:1445 [0] NCCL INFO socketStartConnect: connect to 10.0.0.11<43001> returned "
             "Connection timed out, retrying ({n}/34) after sleep for {ms} msec")
    shards = rel.line("shard_progress", contains="safetensors").text
    lines = ["spark-03:1234:1445 [0] NCCL INFO Bootstrap: Using enp1s0f0np0:10.11.0.13<0>",
             *[retry.format(n=n, ms=100 * n) for n in range(1, 5)],
             vllm_line(t0 + 90, moe.fmt({"backend.value": backends[0], "available_backend_strs": backends,
                                         "self.name": "NvFp4", "lora": "",
                                         "available": f" out of potential backends: {backends}"})),
             vllm_line(t0 + 90, rel.line("nvfp4_linear_kernel").pct("FlashInferCutlassNvFp4LinearKernel")),
             vllm_line(t0 + 90, f"{shards}:   0% Completed | 0/64 [00:00<?, ?it/s]"),
             vllm_line(t0 + 102, f"{shards}: 100% Completed | 64/64 [00:12<00:00,  5.15it/s]"),
             vllm_line(t0 + 102, rel.line("weights_loaded", file="default_loader.py").pct(12.4))]
    text = "\n".join(lines)
    alone = read_segment("n1", "vllm", text, launched_near=t0 - 2)
    assert alone is not None and alone.t0 == t0 + 90 and alone.stalls == []
    timeline = read_segment("n1", "vllm", text, launched_near=t0 - 2, started=t0)
    assert timeline is not None and timeline.t0 == t0
    assert [(s.start - t0, s.end - t0, s.kinds) for s in timeline.stalls] == [(0, 90, ["silence"])]
    assert [(name, a - t0, b - t0) for name, a, b in timeline.phases][:3] == [
        ("distributed_init", 0, 90), ("model_init", 90, 90), ("weights_load", 90, 102)]
    assert timeline.first_weights_line() == t0 + 90
    # NCCL's lines before the first stamped one are this start's: its bootstrap retries.
    assert timeline.nccl_lines() == 5
    assert timeline.bootstrap_retries(t0, t0 + 90) == 4
