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
    assert data["model_dir"] == {"path": str(missing), "exists": False, "free_bytes": None}


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
