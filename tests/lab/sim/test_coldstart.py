"""Cold starts of the simulated engine against LAB_MODEL.md section 5's formulas."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from lab.scenarios import scenario_path
from lab.sim.engine import EngineProcess
from lab.sim.lab import SimLab
from lab.sim.scenario import load_scenario

from .conftest import launch, load_path_fixed, out_of_box, stop_all, wait_exit, wait_ready

# LAB_MODEL.md, the reference scenario's figures.
WEIGHTS_PER_NODE_GB = 597 / 8
PROC, RENDEZVOUS, STALL, JIT_COLD, JIT_WARM, KV, GRAPH, API = 20, 8, 60, 150, 10, 15, 75, 5
MODEL_INIT = 2  # LAB_MODEL.md section 5: model init, kernel backends chosen
OUT_OF_BOX_S = (PROC + RENDEZVOUS + STALL + MODEL_INIT + WEIGHTS_PER_NODE_GB / 0.33 + JIT_COLD + KV
                + GRAPH + API)
FIXED_S = PROC + RENDEZVOUS + MODEL_INIT + WEIGHTS_PER_NODE_GB / 6.0 + JIT_WARM + KV + GRAPH + API
# In-process launches of eight nodes take a few wall milliseconds: tens of lab seconds at
# this dilation. Every rank waits for the last one launched, so cold starts are measured
# from that launch; thread wake-ups add well under a lab second.
JITTER_S = 2.0

STAMP = re.compile(r"^(?:INFO|WARNING|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d) ")


def cold_start_s(head: EngineProcess) -> float:
    """Lab seconds from the last rank's launch to the head serving."""
    assert head.ready_at is not None, head.log_path.read_text()[-2000:]
    assert head.group is not None
    return head.ready_at - max(m.started for m in head.group.members.values())


def phase(proc: EngineProcess, name: str) -> float:
    return next(p.seconds for p in proc.phases if p.name == name)


def this_launch(proc: EngineProcess) -> str:
    """The log of this launch (each launch has its own file: the node moves the previous
    one aside)."""
    return proc.log_path.read_text()


def stamped(proc: EngineProcess) -> list[tuple[float, str]]:
    out = []
    for line in this_launch(proc).splitlines():
        m = STAMP.match(line)
        if m:
            out.append((datetime.strptime("2000-" + m.group(1), "%Y-%m-%d %H:%M:%S").timestamp(), line))
    return out


def restart_cold(lab: SimLab, config: dict) -> EngineProcess:
    stop_all(lab)
    for node in lab.nodes.values():
        node.drop_caches()
    return wait_ready(launch(lab, config))


def test_the_out_of_box_cold_start_takes_seven_and_a_half_minutes_and_more(sim_lab: SimLab) -> None:
    head = restart_cold(sim_lab, out_of_box())
    assert phase(head, "weights_load") == pytest.approx(WEIGHTS_PER_NODE_GB / 0.33)
    assert phase(head, "jit") == JIT_COLD
    assert phase(head, "graph_capture") == GRAPH
    assert phase(head, "rendezvous_wait") >= STALL
    measured = cold_start_s(head)
    print(f"out-of-box cold start: {measured:.1f} lab s (formula {OUT_OF_BOX_S:.1f})")
    assert OUT_OF_BOX_S - JITTER_S <= measured <= OUT_OF_BOX_S + JITTER_S
    assert measured > 7.5 * 60


def test_the_load_path_fixes_bring_a_cold_start_to_about_two_and_a_half_minutes(sim_lab: SimLab) -> None:
    first = restart_cold(sim_lab, load_path_fixed())
    assert phase(first, "jit") == JIT_COLD  # the first start with a kept cache still compiles
    assert "Directly load the compiled graph" not in first.log_path.read_text()
    head = restart_cold(sim_lab, load_path_fixed())
    assert phase(head, "jit") == JIT_WARM
    # vLLM 0.34.0's own words for a kept cache that held the graphs (compilation/backends.py).
    assert "Directly load the compiled graph(s) for compile range [1, 8192] from the cache, took 10.000 s" \
        in head.log_path.read_text()
    assert phase(head, "weights_load") == pytest.approx(WEIGHTS_PER_NODE_GB / 6.0)
    measured = cold_start_s(head)
    print(f"fixed cold start: {measured:.1f} lab s (formula {FIXED_S:.1f})")
    assert FIXED_S - JITTER_S <= measured <= FIXED_S + JITTER_S
    assert 2 * 60 < measured < 3 * 60


def test_an_ephemeral_cache_compiles_on_every_lab_start_and_a_home_cache_only_once(sim_lab: SimLab) -> None:
    # The lab's ephemeral cache is the cache volume's per-launch folder, emptied before
    # each launch. Without any cache variable the engines keep their caches under the
    # engine user's home (~/.cache/vllm), which survives a restart on bare metal.
    for _ in range(2):
        assert phase(restart_cold(sim_lab, out_of_box()), "jit") == JIT_COLD
    stop_all(sim_lab)
    first = wait_ready(launch(sim_lab, out_of_box(), per_launch_cache=False))
    assert phase(first, "jit") == JIT_COLD
    stop_all(sim_lab)
    again = wait_ready(launch(sim_lab, out_of_box(), per_launch_cache=False))
    assert phase(again, "jit") == JIT_WARM
    home = sim_lab.head.host_path(f"/home/{sim_lab.head.engine_user}/.cache/vllm")
    assert any(home.rglob("*")), "the compile cache landed under the engine user's home"


def test_a_warm_restart_without_dropping_caches_reads_the_weights_from_page_cache(sim_lab: SimLab) -> None:
    restart_cold(sim_lab, out_of_box())
    stop_all(sim_lab)
    head = wait_ready(launch(sim_lab, out_of_box()))
    assert phase(head, "weights_load") == pytest.approx(WEIGHTS_PER_NODE_GB / 20.0)


def test_dropping_caches_makes_the_next_start_read_from_disk_again(sim_lab: SimLab) -> None:
    restart_cold(sim_lab, out_of_box())
    head = restart_cold(sim_lab, out_of_box())
    assert phase(head, "weights_load") == pytest.approx(WEIGHTS_PER_NODE_GB / 0.33)


def test_a_start_stopped_mid_load_leaves_what_it_read_in_page_cache(sim_lab: SimLab) -> None:
    procs = launch(sim_lab, out_of_box())
    # Rendezvous (stalled) and model init come first, and the ranks meet only once the last
    # one launched has started; then 100 lab seconds of reading.
    last = max(p.started for p in procs)
    sim_lab.clock.sleep(PROC + RENDEZVOUS + STALL + MODEL_INIT + 100 - (sim_lab.clock.now() - last))
    stop_all(sim_lab)
    cached = sim_lab.head.weights_cached_gb
    assert 0.33 * 90 < cached < WEIGHTS_PER_NODE_GB


def test_cold_start_durations_are_the_same_for_the_same_seed(make_lab: Callable[..., SimLab]) -> None:
    runs = []
    for _ in range(2):
        lab = make_lab()
        head = restart_cold(lab, out_of_box())
        late = sorted(n.name for n in lab.nodes.values()
                      if any(p.name == "rendezvous_wait" and p.seconds >= STALL
                             for p in n.processes[-1].phases)
                      and n.processes[-1].rank == n.processes[-1].group.late_rank)  # type: ignore[union-attr]
        runs.append(([(p.name, round(p.seconds, 6)) for p in head.phases
                      if p.name not in ("rendezvous_wait", "kv_wait", "serving")], late))
        lab.stop()
    assert runs[0] == runs[1]
    assert len(runs[0][1]) == 1  # exactly one node is late


def test_the_rendezvous_stall_is_silent_on_the_head_and_retried_on_the_late_node(sim_lab: SimLab) -> None:
    head = restart_cold(sim_lab, out_of_box())
    # Without NCCL_DEBUG nothing is written between process start and model init: the
    # stall shows as silence before the first backend line, on every node.
    lines = stamped(head)
    first = next(t for t, line in lines if "NvFp4 MoE backend" in line)
    launched = datetime.fromtimestamp(head.stamp(head.started), UTC).strftime("%m-%d %H:%M:%S")
    started = datetime.strptime("2000-" + launched, "%Y-%m-%d %H:%M:%S").timestamp()
    assert first - started >= PROC + STALL + RENDEZVOUS - JITTER_S
    logs = {n.name: n.processes[-1].log_path.read_text() for n in sim_lab.nodes.values()}
    assert not any("NCCL" in text for text in logs.values())
    late = [n.name for n in sim_lab.nodes.values()
            if any(p.name == "rendezvous_wait" for p in n.processes[-1].phases)
            and n.processes[-1].rank == n.processes[-1].group.late_rank]  # type: ignore[union-attr]
    assert len(late) == 1 and late[0] != "spark-01"


def test_with_nccl_debug_the_late_node_logs_nccls_retries(sim_lab: SimLab) -> None:
    config = out_of_box()
    config["env"] = {"NCCL_DEBUG": "INFO"}
    head = restart_cold(sim_lab, config)
    logs = {n.name: n.processes[-1].log_path.read_text() for n in sim_lab.nodes.values()}
    retrying = re.compile(r"NCCL INFO socketStartConnect: connect to [\d.]+<\d+> "
                          r"returned Connection timed out, "
                          r"retrying \((\d+)/34\) after sleep for (\d+) msec$", re.M)
    late = [name for name, text in logs.items() if retrying.search(text)]
    assert len(late) == 1 and late[0] != "spark-01"
    attempts = [int(m[0]) for m in retrying.findall(logs[late[0]])]
    assert attempts == list(range(1, len(attempts) + 1)) and len(attempts) >= 30
    for text in logs.values():  # every rank says which interface it bootstraps on
        assert re.search(r"NCCL INFO Bootstrap: Using enp1s0f0np0:[\d.]+<0>$", text, re.M)
        assert "NCCL INFO NET/IB : Using [0]" in text
    assert head.ready_at is not None


def test_the_right_nccl_variables_remove_the_stall(sim_lab: SimLab) -> None:
    head = restart_cold(sim_lab, load_path_fixed(nccl=True))
    spread = max(m.started for m in head.group.members.values()) - head.started  # type: ignore[union-attr]
    assert phase(head, "rendezvous_wait") <= spread + JITTER_S
    texts = [n.processes[-1].log_path.read_text() for n in sim_lab.nodes.values()]
    assert not any("retrying" in t for t in texts)


def bar_updates(proc: EngineProcess) -> list[float]:
    """The shard bar's updates, as tqdm writes them (one physical line, each update after a
    carriage return, no stamp): the elapsed seconds each shows."""
    raw = proc.log_path.read_bytes().decode()  # as written: text mode would turn \r into \n
    [bar] = [line for line in raw.split("\n") if "checkpoint shards" in line]
    assert bar.startswith("\r") and not STAMP.match(bar.lstrip("\r"))
    elapsed = []
    for update in bar.split("\r")[1:]:
        m = re.search(r"\| \d+/\d+ \[(\d\d):(\d\d)<", update)
        assert m and not STAMP.match(update), update
        elapsed.append(int(m[1]) * 60 + int(m[2]))
    return elapsed


def test_the_mmap_loader_prints_shard_progress_minutes_apart_on_rank_0_only(sim_lab: SimLab) -> None:
    head = restart_cold(sim_lab, out_of_box())
    times = sorted(set(bar_updates(head)))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) > 30 and len(times) <= 6
    # The bar is rank 0's (weight_utils.enable_tqdm); the other ranks load in silence.
    for node in sim_lab.nodes.values():
        if node.processes[-1] is not head:
            assert "checkpoint shards" not in this_launch(node.processes[-1])
    stop_all(sim_lab)
    head = restart_cold(sim_lab, load_path_fixed())
    elapsed = bar_updates(head)
    assert max(elapsed) - min(elapsed) <= WEIGHTS_PER_NODE_GB / 6.0 + 1


def test_the_jit_phase_is_silent_and_ends_with_the_compile_total(sim_lab: SimLab) -> None:
    head = restart_cold(sim_lab, out_of_box())
    lines = stamped(head)
    begin = next(t for t, line in lines if "Model loading took" in line)
    end = next(t for t, line in lines if "torch.compile took 150.00 s in total" in line)
    assert end - begin == pytest.approx(JIT_COLD, abs=1)
    assert not any(begin < t < end for t, _ in lines)
    # 0.34.0's wording; "takes" is no release's.
    assert "torch.compile takes" not in head.log_path.read_text()


def test_the_log_carries_the_loading_and_init_figures(sim_lab: SimLab) -> None:
    text = restart_cold(sim_lab, out_of_box()).log_path.read_text()
    assert f"Loading weights took {WEIGHTS_PER_NODE_GB / 0.33:.2f} seconds" in text
    assert "Graph capturing finished in 75 secs" in text
    init_s = JIT_COLD + KV + GRAPH
    assert (f"init engine (profile, create kv cache, warmup model) took {init_s:.2f} s "
            f"(compilation: {JIT_COLD:.2f} s)") in text
    # The server line closes the start-up; periodic stats lines may follow it, as in vLLM.
    messages = [line.split("] ", 1)[1] for line in text.splitlines() if "] " in line]
    api = next(i for i, m in enumerate(messages) if m.startswith("Starting vLLM server on http://0.0.0.0:"))
    # Lines of no modelled release are never written.
    assert "Starting vLLM API server" not in text and "vLLM API server version" not in text
    assert all(m.startswith("Engine 000:") for m in messages[api + 1:])
    assert api > next(i for i, m in enumerate(messages) if m.startswith("init engine"))




def test_enforce_eager_skips_graph_capture(sim_lab: SimLab) -> None:
    config = load_path_fixed()
    config["serving"]["enforce_eager"] = True
    head = restart_cold(sim_lab, config)
    assert "graph_capture" not in [p.name for p in head.phases]
    assert "Graph capturing finished" not in head.log_path.read_text()


def test_an_unknown_flag_fails_with_argparses_message_and_exit_2(sim_lab: SimLab) -> None:
    head = launch(sim_lab, out_of_box(), extra_argv=["--frobnicate"])[0]
    assert wait_exit(head) == 2
    lines = head.log_path.read_text().splitlines()
    assert lines[-2].startswith("usage: vllm serve")
    assert lines[-1] == "vllm serve: error: unrecognized arguments: --frobnicate"
    assert sim_lab.head.status() == {"running": False, "pid": head.pid, "exit_code": 2,
                                     "spec_sha256": head.spec_sha256, "owner": None,
                                     "log_file": "/var/lib/diag/logs/engine.log"}


def _on(make_lab: Callable[..., SimLab], fs: str, checkpoint_gb: float | None = None) -> SimLab:
    base = load_scenario(scenario_path("reference-kimi-k2-8spark"))
    model = base.model if checkpoint_gb is None else {**base.model, "checkpoint_gb": checkpoint_gb}
    return make_lab(dataclasses.replace(base, node={**base.node, "model_fs": fs}, model=model))


def _strategy(strategy: str | None) -> dict:
    config = out_of_box()
    config["serving"]["safetensors_load_strategy"] = strategy
    return config


def test_vllms_unset_strategy_prefetches_a_checkpoint_that_fits_on_nfs_and_lazy_does_not(
    make_lab: Callable[..., SimLab],
) -> None:
    # vLLM's safetensors_weights_iterator: unset prefetches on nfs/nfs4/lustre when every
    # file fits in 90 % of the available memory; each rank prefetches its share of the files
    # (rank::world_size), so across eight nodes an eighth of what a rank maps is read fast.
    lab = _on(make_lab, "nfs4", checkpoint_gb=80.0)
    unset = restart_cold(lab, _strategy(None))
    procs = [n.processes[-1] for n in lab.nodes.values()]
    for proc in procs:
        log = this_launch(proc)
        assert "Filesystem type for checkpoints: NFS4. Checkpoint size: 74.51 GiB." in log
        assert "Prefetching checkpoint files into page cache started (in background, num_threads=8, " \
               "block_size=16777216 bytes)" in log
        assert "Prefetching checkpoint files into page cache finished in" in log
    prefetched = phase(unset, "weights_load")
    lazy = restart_cold(lab, _strategy("lazy"))
    log = this_launch(lazy)
    assert "Filesystem type for checkpoints: NFS4" in log and "Prefetching" not in log
    assert "auto-prefetch" not in log.lower()  # an explicit strategy decides nothing
    share = 1 / 8
    expected = 1 / (share / 6.0 + (1 - share) / 0.33) / 0.33
    assert phase(lazy, "weights_load") / prefetched == pytest.approx(expected, rel=0.05)


@pytest.mark.parametrize(("fs", "said"), [
    ("nfs4", "WARNING .*Network filesystem \\(NFS4\\) detected but checkpoint total size \\(556\\.00 GiB\\) "
             "exceeds 90% of available RAM \\(\\d+\\.\\d\\d GiB\\)\\. Skipping auto-prefetch\\."),
    ("ext4", "INFO .*Auto-prefetch is disabled because the filesystem \\(EXT4\\) is not a recognized network "
             "FS \\(NFS/Lustre\\) and the checkpoint size"),
])
def test_a_checkpoint_larger_than_memory_is_never_auto_prefetched(
    make_lab: Callable[..., SimLab], fs: str, said: str,
) -> None:
    lab = _on(make_lab, fs)
    restart_cold(lab, _strategy(None))
    for node in lab.nodes.values():
        log = this_launch(node.processes[-1])
        assert re.search(said, log), log[-3000:]
        assert "Prefetching" not in log
