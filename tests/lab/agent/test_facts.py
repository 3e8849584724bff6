"""facts against this machine's own /proc and /sys, read independently here."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import time
from importlib import metadata
from pathlib import Path

import pytest

from lab.agent import agent
from tests.lab.agent.conftest import agent_python_version, run_agent
from tests.lab.agent.fake_gpu import install_fake_nvidia_smi


def _meminfo_kib(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/meminfo")


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> dict:
    model_dir = tmp_path_factory.mktemp("models")
    before = time.time()
    data = run_agent("facts", "--model-dir", str(model_dir)).data
    data["_window"] = (before, time.time())
    data["_model_dir"] = str(model_dir)
    return data


def test_it_reports_memory_from_proc_meminfo(facts: dict) -> None:
    assert facts["mem_total_kib"] == _meminfo_kib("MemTotal")
    available = _meminfo_kib("MemAvailable")
    assert abs(facts["mem_available_kib"] - available) <= 0.1 * available


def test_it_reports_the_cpu_count_kernel_arch_host_and_python(facts: dict) -> None:
    assert facts["cpu_count"] == os.cpu_count()
    assert facts["kernel"] == os.uname().release
    assert facts["arch"] == os.uname().machine == platform.machine()
    assert facts["host"] == socket.gethostname()
    assert facts["python"] == agent_python_version()


def test_it_reports_the_node_clock(facts: dict) -> None:
    start, end = facts["_window"]
    assert start <= facts["time"] <= end


def test_it_lists_every_interface_but_loopback_with_its_sysfs_values(facts: dict) -> None:
    expected = sorted(n for n in os.listdir("/sys/class/net") if n != "lo")
    assert [n["name"] for n in facts["nics"]] == expected
    for nic in facts["nics"]:
        base = Path("/sys/class/net") / nic["name"]
        assert nic["mtu"] == int((base / "mtu").read_text())
        assert nic["operstate"] == (base / "operstate").read_text().strip()
        try:
            speed: int | None = int((base / "speed").read_text())
        except (OSError, ValueError):
            speed = None
        assert nic["speed_mbps"] == (speed if speed is not None and speed > 0 else None)


def test_it_reports_free_space_in_the_model_dir(facts: dict) -> None:
    st = os.statvfs(facts["_model_dir"])
    free = st.f_bavail * st.f_frsize
    assert facts["model_dir"]["path"] == facts["_model_dir"]
    assert facts["model_dir"]["exists"] is True
    # Other processes write to the same disk meanwhile: allow 1 GiB of drift.
    assert abs(facts["model_dir"]["free_bytes"] - free) < 1 << 30


def test_it_says_a_missing_model_dir_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    data = run_agent("facts", "--model-dir", str(missing)).data
    assert data["model_dir"] == {"path": str(missing), "exists": False, "free_bytes": None,
                                 "fs_type": None}


def test_it_reports_the_filesystem_serving_the_model_dir_as_proc_mounts_says(facts: dict) -> None:
    # The kernel's own answer for the same folder: findmnt reads the mount table too, so
    # the agent is checked against the longest mount point above the resolved path.
    resolved = os.path.realpath(facts["_model_dir"])
    best, expected = "", None
    for line in Path("/proc/mounts").read_text().splitlines():
        _dev, point, kind, *_ = line.split()
        if (resolved == point or resolved.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
            best, expected = point, kind
    assert facts["model_dir"]["fs_type"] == expected is not None


def test_the_longest_mount_point_above_a_path_decides_its_filesystem(tmp_path: Path) -> None:
    # /data on NFS with a local disk mounted inside it, and a mount point with a space
    # (written \\040 by the kernel), as vLLM's _get_fs_type reads them.
    mounts = "\n".join([
        "/dev/nvme0n1p2 / ext4 rw 0 0",
        "server:/export /data nfs4 rw 0 0",
        "/dev/nvme1n1 /data/local ext4 rw 0 0",
        "mds@tcp:/lfs /mnt/my\\040models lustre rw 0 0",
        "short line",
    ])
    assert agent.fs_type("/data/models/kimi", mounts) == "nfs4"
    assert agent.fs_type("/data/local/kimi", mounts) == "ext4"
    assert agent.fs_type("/data", mounts) == "nfs4"
    assert agent.fs_type("/datastore", mounts) == "ext4"
    assert agent.fs_type("/mnt/my models/k2", mounts) == "lustre"


def test_it_reports_the_loader_packages_as_the_interpreter_sees_them(facts: dict) -> None:
    try:
        expected: str | None = metadata.version("fastsafetensors")
    except metadata.PackageNotFoundError:
        expected = None
    assert facts["loaders"] == {"fastsafetensors": expected}


def test_it_reports_engine_versions_as_the_interpreter_sees_them(facts: dict) -> None:
    for name in ("vllm", "sglang"):
        try:
            expected: str | None = metadata.version(name)
        except metadata.PackageNotFoundError:
            expected = None
        assert facts["engines"][name] == expected


def test_it_reports_no_gpus_where_there_is_no_nvidia_smi(facts: dict) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    assert facts["gpus"] == []


def test_it_reads_gb10s_missing_memory_figure_as_null(tmp_path: Path) -> None:
    env = install_fake_nvidia_smi(tmp_path / "bin")
    data = run_agent("facts", "--model-dir", str(tmp_path), env=env).data
    assert data["gpus"] == [{"name": "NVIDIA GB10", "compute_capability": "12.1",
                             "driver": "580.95.05", "memory_total_mib": None}]
