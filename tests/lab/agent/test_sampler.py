"""The telemetry sampler against this machine's real /proc: start, sample, stop."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.agent import AGENT_PATH, validate_sample
from lab.agent.agent import Snapshot, sample, whole_disks
from tests.lab.agent.conftest import agent_python, proc_alive, run_agent, wait_until
from tests.lab.agent.fake_gpu import install_fake_nvidia_smi


def _meminfo_kib(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(field)


@pytest.fixture
def out(tmp_path: Path):
    path = tmp_path / "telemetry" / "samples.jsonl"
    yield path
    run_agent("sampler", "stop", "--out", str(path))


def test_it_samples_about_once_a_second_with_plausible_values(out: Path) -> None:
    started = run_agent("sampler", "start", "--out", str(out)).data
    assert started["out"] == str(out)
    assert proc_alive(started["pid"])
    time.sleep(2.5)
    available = _meminfo_kib("MemAvailable")
    tel = run_agent("telemetry", "--out", str(out), "--since", "0").data
    assert tel["running"] is True
    samples = tel["samples"]
    assert 2 <= len(samples) <= 3
    nics = sorted(n for n in os.listdir("/sys/class/net") if n != "lo")
    for s in samples:
        validate_sample(s)
        assert time.time() - 4 < s["t"] <= time.time()
        # Steal time (a virtual machine's) is in none of the four: they sum to 100 or less.
        assert 0 < sum(s["cpu"].values()) <= 100.5
        assert abs(s["mem"]["available_kib"] - available) <= 0.1 * available
        assert s["mem"]["swap_used_kib"] >= 0
        assert 0 <= s["disk_read_mbps"] < 100_000
        assert sorted(s["net"]) == nics
        assert s["compilers"] >= 0
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(samples)]
    assert all(0.7 < g < 1.5 for g in gaps), gaps


def test_telemetry_returns_only_samples_after_since(out: Path) -> None:
    run_agent("sampler", "start", "--out", str(out), "--interval", "0.2")
    assert wait_until(lambda: out.exists() and out.read_text().count("\n") >= 4, 10)
    every = run_agent("telemetry", "--out", str(out), "--since", "0").data["samples"]
    cut = every[1]["t"]
    later = run_agent("telemetry", "--out", str(out), "--since", repr(cut)).data["samples"]
    assert later and all(s["t"] > cut for s in later)
    assert [s["t"] for s in later[: len(every) - 2]] == [s["t"] for s in every[2:]]


def test_sampler_stop_ends_the_process_and_the_samples(out: Path) -> None:
    pid = run_agent("sampler", "start", "--out", str(out), "--interval", "0.2").data["pid"]
    assert wait_until(lambda: out.exists() and out.stat().st_size > 0, 5)
    assert run_agent("sampler", "stop", "--out", str(out)).data == {"stopped": True}
    assert not proc_alive(pid)
    assert not Path(f"{out}.pid").exists()
    size = out.stat().st_size
    time.sleep(0.6)
    assert out.stat().st_size == size
    assert run_agent("telemetry", "--out", str(out)).data["running"] is False


def test_sampler_stop_without_a_sampler_says_nothing_was_stopped(tmp_path: Path) -> None:
    ans = run_agent("sampler", "stop", "--out", str(tmp_path / "none.jsonl"))
    assert ans.data == {"stopped": False}


def test_a_second_start_keeps_the_running_sampler(out: Path) -> None:
    first = run_agent("sampler", "start", "--out", str(out), "--interval", "0.5").data
    second = run_agent("sampler", "start", "--out", str(out), "--interval", "0.5").data
    assert second == first


def test_telemetry_without_a_sampler_file_is_empty(tmp_path: Path) -> None:
    data = run_agent("telemetry", "--out", str(tmp_path / "never.jsonl"), "--since", "0").data
    assert data == {"samples": [], "running": False}


def test_telemetry_skips_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    whole = ('{"t":5.0,"cpu":{"user":1,"system":1,"iowait":0,"idle":98},'
             '"mem":{"available_kib":1,"cached_kib":1,"swap_used_kib":0},'
             '"disk_read_mbps":0,"net":{},"compilers":0,"gpu_util":null}\n')
    path.write_text(whole + whole.replace("5.0", "6.0")[:40])
    samples = run_agent("telemetry", "--out", str(path), "--since", "0").data["samples"]
    assert [s["t"] for s in samples] == [5.0]


def test_user_cpu_compilers_and_gpu_rise_while_work_runs(out: Path, tmp_path: Path) -> None:
    env = install_fake_nvidia_smi(tmp_path / "bin", util="37")
    fake_ptxas = tmp_path / "bin" / "ptxas"  # comm is the name the program was run as
    fake_ptxas.symlink_to("/bin/sleep")
    interval = 0.5
    subprocess.run([agent_python(), str(AGENT_PATH),
                    "sampler", "start", "--out", str(out), "--interval", str(interval), "--json"],
                   env=env, check=True, capture_output=True)
    time.sleep(1.6)
    t0 = time.time()
    compiler = subprocess.Popen([str(fake_ptxas), "3"])
    burner = subprocess.Popen([sys.executable, "-c",
                               "import time\nend = time.monotonic() + 2.0\n"
                               "while time.monotonic() < end: pass"])
    _, burn_status, usage = os.wait4(burner.pid, 0)
    burner.returncode = os.waitstatus_to_exitcode(burn_status)
    t1 = time.time()
    compiler.kill()
    compiler.wait()
    assert burner.returncode == 0
    time.sleep(interval + 0.2)
    samples = run_agent("telemetry", "--out", str(out), "--since", "0").data["samples"]
    idle = [s for s in samples if s["t"] < t0]
    busy = [s for s in samples if t0 + interval <= s["t"] <= t1]  # whole window in the burn
    assert len(idle) >= 2 and len(busy) >= 2, (len(idle), len(busy))

    def mean_user(xs: list[dict]) -> float:
        return sum(s["cpu"]["user"] for s in xs) / len(xs)

    # The burner's own user time is part of the machine's, whatever else runs on this
    # shared machine: that share of all cores is a floor for the sampled user CPU.
    burner_share = 100 * usage.ru_utime / (t1 - t0) / (os.cpu_count() or 1)
    assert burner_share > 5, burner_share
    assert mean_user(busy) >= 0.7 * burner_share, (burner_share, busy)
    if mean_user(idle) < 100 - burner_share - 10:  # room to rise above the idle level
        assert mean_user(busy) > mean_user(idle), (idle, busy)
    assert all(s["compilers"] >= 1 for s in busy)
    assert all(s["gpu_util"] == 37.0 for s in samples)


def _snapshot(mono: float, cpu: list[int], sectors: int,
              net: dict[str, tuple[int, int]]) -> Snapshot:
    snap = Snapshot.__new__(Snapshot)  # counters set by hand instead of read from /proc
    snap.t, snap.mono, snap.cpu, snap.sectors, snap.net = 1000.0 + mono, mono, cpu, sectors, net
    snap.mem = {"MemAvailable": 10, "Cached": 20, "SwapTotal": 100, "SwapFree": 60}
    snap.compilers, snap.gpu_util = 2, None
    return snap


def test_a_sample_turns_counter_deltas_into_rates() -> None:
    # user nice system idle iowait irq softirq steal, in jiffies
    prev = _snapshot(10.0, [100, 0, 50, 800, 10, 0, 0, 0], 1_000, {"eth0": (0, 0), "gone": (5, 5)})
    cur = _snapshot(12.0, [160, 15, 70, 880, 25, 5, 5, 0], 5_000,
                    {"eth0": (250_000, 500_000), "new0": (9, 9)})
    s = sample(prev, cur)
    assert s["cpu"] == {"user": 37.5, "system": 15.0, "iowait": 7.5, "idle": 40.0}
    assert s["disk_read_mbps"] == pytest.approx(4_000 * 512 / 1e6 / 2)
    assert s["net"] == {"eth0": {"rx_mbps": 1.0, "tx_mbps": 2.0}}  # only NICs seen twice
    assert s["mem"] == {"available_kib": 10, "cached_kib": 20, "swap_used_kib": 40}
    assert (s["t"], s["compilers"], s["gpu_util"]) == (1012.0, 2, None)
    validate_sample(s)


def test_a_counter_that_steps_back_reads_as_no_activity() -> None:
    prev = _snapshot(0.0, [100, 0, 50, 800, 30, 0, 0, 0], 9_000, {"eth0": (900, 900)})
    cur = _snapshot(1.0, [110, 0, 50, 890, 20, 0, 0, 0], 1_000, {"eth0": (100, 100)})
    s = sample(prev, cur)
    assert s["cpu"]["iowait"] == 0 and s["cpu"]["user"] == 10.0
    assert s["disk_read_mbps"] == 0
    assert s["net"]["eth0"] == {"rx_mbps": 0.0, "tx_mbps": 0.0}


def test_disk_reads_count_whole_physical_disks_only() -> None:
    disks = whole_disks()
    for name in disks:
        assert not Path(f"/sys/class/block/{name}/partition").exists(), name
        assert not name.startswith(("loop", "ram", "zram", "dm-")), name
    physical = {n for n in os.listdir("/sys/block") if Path(f"/sys/block/{n}/device").exists()}
    assert disks == physical
