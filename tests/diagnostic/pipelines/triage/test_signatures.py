"""The telemetry-only classifier: windows recorded from the simulator are attributed to
their fault; hand-written windows of other trouble (slow NFS reads, an I/O-bound compiler,
a hang with one busy core, a sampler that stopped) are refused, each with the reason."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from diagnostic.pipelines.triage import coldstart as cs
from diagnostic.pipelines.triage import frames as fr
from diagnostic.pipelines.triage import signatures as sig

from .labs import customer, lab, scenario

NODES = [f"node-{i}" for i in range(1, 5)]
ROLES = fr.NicRoles(mgmt=("eth0",), data=("ib0", "ib1"))


def sample(t: float, *, user: float = 1.0, system: float = 0.5, iowait: float = 0.1,
           cache_gib: float = 2.0, disk: float = 0.2, compilers: int = 0, gpu: float = 0.0,
           mgmt: float = 0.05, data: float = 0.0) -> dict[str, Any]:
    """One sample in the agent's shape (docs/lab-contracts.md)."""
    return {"t": t, "cpu": {"user": user, "system": system, "iowait": iowait,
                            "idle": max(0.0, 100 - user - system - iowait)},
            "mem": {"available_kib": 90 * 1024**2, "cached_kib": int(cache_gib * 1024**2),
                    "swap_used_kib": 0},
            "disk_read_mbps": disk, "net": {"eth0": {"rx_mbps": mgmt, "tx_mbps": mgmt / 2},
                                            "ib0": {"rx_mbps": data, "tx_mbps": data},
                                            "ib1": {"rx_mbps": data, "tx_mbps": data}},
            "compilers": compilers, "gpu_util": gpu}


def window_of(make: Callable[[int, random.Random], dict[str, Any]], seconds: int = 120,
              seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    samples = [make(t, rng) for t in range(1000, 1000 + seconds + 1)]
    frame = fr.node_frame(samples, ROLES)
    return fr.summarize(fr.window(frame, 1000, 1000 + seconds))


def verdict(make: Callable[[int, random.Random], dict[str, Any]], *,
            after_weights: bool = True) -> sig.Verdict:
    return sig.classify({"node-1": window_of(make)}, ["node-1"], after_weights=after_weights)


# -- what the simulator records -------------------------------------------------------------

@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> cs.ColdStart:
    """One out-of-box cold start on the simulated lab, all three faults in it."""
    scn = scenario(seed=9)
    with lab(scn, tmp_path_factory.mktemp("lab")) as (_, session):
        facts = session.facts()
        return cs.observe(session, customer(scn), "before", facts=facts, check_cancelled=lambda: None)


def test_recorded_windows_are_attributed_to_their_fault(recorded: cs.ColdStart) -> None:
    causes = [g.cause for g in recorded.stalls]
    # The real order (LAB_MODEL.md section 5): the ranks meet before any weight is read.
    assert causes == ["load.rendezvous", "load.weights_io", "load.jit_compile", "gpu_work"]


def test_each_recorded_window_matches_exactly_one_signature_on_its_own(recorded: cs.ColdStart) -> None:
    for group in recorded.stalls:
        node = group.representative
        summary = group.verdict.readings[node].summary
        reading = sig.read_node(node, summary, after_weights=True)
        # A rendezvous is the group's verdict; alone, a waiting node is just idle.
        expected = sig.IDLE if group.cause == "load.rendezvous" else group.cause
        assert reading.kind == expected, reading.why_not


def test_a_recorded_rendezvous_without_the_late_node_is_not_guessed(recorded: cs.ColdStart) -> None:
    group = next(g for g in recorded.stalls if g.cause == "load.rendezvous")
    late = group.verdict.late_node
    # Every rank is silent while the ranks meet, the late one too (NCCL's retry lines carry
    # no stamp): the late node is told apart by its telemetry alone.
    assert late is not None and late in group.members
    windows = {n: r.summary for n, r in group.verdict.readings.items() if n != late}
    assert sig.classify(windows, sorted(group.members), after_weights=True).cause == sig.UNEXPLAINED
    windows[late] = {**group.verdict.readings[late].summary, "coverage": 0.3}
    assert sig.classify(windows, sorted(group.members), after_weights=True).cause == sig.INCOMPLETE


# -- hand-written windows ---------------------------------------------------------------------

def test_an_mmap_loader_is_weights_io() -> None:
    def mmap(t: int, rng: random.Random) -> dict[str, Any]:
        burst = t % 5 < 2
        return sample(t, user=3, system=rng.uniform(18, 26), iowait=8, cache_gib=2 + 0.5 * (t - 1000),
                      disk=(760 if burst else 45) * rng.uniform(0.85, 1.15))
    got = verdict(mmap, after_weights=False)
    assert got.cause == sig.WEIGHTS_IO
    assert 250 < got.decided_by["disk_read_mbps_mean"] < 400
    assert got.decided_by["page_cache_gib_per_min"] == pytest.approx(30, rel=0.05)


def test_slow_nfs_reads_are_not_weights_io() -> None:
    """The checkpoint on NFS: the page cache climbs and system CPU is up, but the local disk
    is idle and the bytes come in over the management network, steadily."""
    def nfs(t: int, rng: random.Random) -> dict[str, Any]:
        return sample(t, user=2, system=rng.uniform(12, 16), iowait=20, cache_gib=2 + 0.1 * (t - 1000),
                      disk=rng.uniform(0, 0.5), mgmt=rng.uniform(900, 1000))
    got = verdict(nfs, after_weights=False)
    assert got.cause == sig.UNEXPLAINED
    assert "not reading" in got.why_not["node-1"][sig.WEIGHTS_IO]


def test_steady_slow_local_reads_are_not_the_mmap_signature() -> None:
    def steady(t: int, rng: random.Random) -> dict[str, Any]:
        return sample(t, user=3, system=15, cache_gib=2 + 0.3 * (t - 1000),
                      disk=300 * rng.uniform(0.95, 1.05))
    got = verdict(steady, after_weights=False)
    assert got.cause == sig.UNEXPLAINED
    assert "steady" in got.why_not["node-1"][sig.WEIGHTS_IO]


def test_compilers_at_full_cpu_after_the_weights_are_jit() -> None:
    def jit(t: int, rng: random.Random) -> dict[str, Any]:
        return sample(t, user=rng.uniform(93, 99), system=1.5, iowait=0, compilers=rng.randint(16, 20))
    assert verdict(jit).cause == sig.JIT_COMPILE
    refused = verdict(jit, after_weights=False)
    assert refused.cause == sig.UNEXPLAINED
    assert "after the weights" in refused.why_not["node-1"][sig.JIT_COMPILE]


def test_an_io_bound_compiler_is_not_the_jit_signature() -> None:
    """Compilers waiting on a slow cache disk: present, but the CPU waits and the disk works."""
    def io_bound(t: int, rng: random.Random) -> dict[str, Any]:
        return sample(t, user=rng.uniform(20, 30), system=5, iowait=rng.uniform(35, 45),
                      compilers=rng.randint(8, 12), disk=rng.uniform(250, 350))
    got = verdict(io_bound)
    assert got.cause == sig.UNEXPLAINED
    assert "wait on something" in got.why_not["node-1"][sig.JIT_COMPILE]


def test_a_hang_with_one_busy_core_matches_nothing() -> None:
    def hang(t: int, rng: random.Random) -> dict[str, Any]:
        return sample(t, user=5.2 + rng.uniform(0, 0.3), system=1.0)
    got = verdict(hang)
    assert got.cause == sig.UNEXPLAINED
    assert set(got.why_not["node-1"]) >= {sig.WEIGHTS_IO, sig.JIT_COMPILE, sig.IDLE}


def test_a_rendezvous_needs_one_node_talking_while_all_idle() -> None:
    def waiting(t: int, rng: random.Random) -> dict[str, Any]:
        return sample(t, mgmt=rng.uniform(0.02, 0.08))

    def late(t: int, rng: random.Random) -> dict[str, Any]:
        return sample(t, mgmt=rng.uniform(0.3, 0.9) if t % 4 == 0 else rng.uniform(0.04, 0.1))

    windows = {n: window_of(waiting, seed=i) for i, n in enumerate(NODES[:3])}
    all_idle = sig.classify(windows, NODES[:3], after_weights=True)
    assert all_idle.cause == sig.UNEXPLAINED  # idle, but nobody is late: not a rendezvous
    windows["node-4"] = window_of(late, seed=9)
    got = sig.classify(windows, NODES[:3], after_weights=True)
    assert got.cause == sig.RENDEZVOUS and got.late_node == "node-4"
    busy_data = {**windows, "node-2": {**windows["node-2"], "data_nic_mbps_median": 4000.0}}
    assert sig.classify(busy_data, NODES[:3], after_weights=True).cause != sig.RENDEZVOUS
    # The ranks meet right after the process starts: the same silence after the weights
    # began to load is no rendezvous.
    later = sig.classify(windows, NODES[:3], after_weights=True, before_weights=False)
    assert later.cause == sig.UNEXPLAINED and "after the weights" in later.why_not[sig.RENDEZVOUS]


def test_a_window_the_sampler_missed_is_incomplete_not_guessed() -> None:
    def jit(t: int, rng: random.Random) -> dict[str, Any]:
        return sample(t, user=96, system=1, iowait=0, compilers=18)
    rng = random.Random(3)
    samples = [jit(t, rng) for t in range(1000, 1030)]  # the sampler died 30 s into 120
    summary = fr.summarize(fr.window(fr.node_frame(samples, ROLES), 1000, 1120))
    assert summary["coverage"] == pytest.approx(30 / 121, abs=0.01)
    got = sig.classify({"node-1": summary}, ["node-1"], after_weights=True)
    assert got.cause == sig.INCOMPLETE
    # With another node's full evidence the stall is attributed, and the gap is named.
    other = window_of(lambda t, r: jit(t, r))
    both = sig.classify({"node-1": summary, "node-2": other}, ["node-1", "node-2"], after_weights=True)
    assert both.cause == sig.JIT_COMPILE and both.incomplete_nodes == ["node-1"]


def test_frames_put_missing_seconds_on_the_grid() -> None:
    samples = [sample(t) for t in (100.0, 101.1, 103.0, 103.4)]
    frame = fr.node_frame(samples, ROLES)
    assert list(frame.index) == [100, 101, 102, 103]
    assert pd.isna(frame.loc[102, "cpu_user_pct"])
    assert frame.loc[100, "mgmt_nic_mbps"] == pytest.approx(0.075)
    assert frame.loc[100, "data_nic_mbps"] == 0.0


def test_the_csv_export_keeps_every_run_and_node(tmp_path: Path) -> None:
    frame = fr.node_frame([sample(t) for t in range(10, 20)], ROLES)
    table = fr.telemetry_table({("before", "node-1"): (frame, 10.0), ("after", "node-1"): (frame, 12.0)})
    assert len(table) == 20 and list(table.columns[:4]) == ["run", "node", "t_s", "epoch"]
    assert table[table.run == "after"].t_s.min() == -2
