"""A stand-in for nvidia-smi on a GB10 node, put first on PATH by the tests: it answers
the two queries the agent makes the way GB10's driver does (no memory figure)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

SCRIPT = """#!{python}
import sys
args = " ".join(sys.argv[1:])
if "--query-gpu=name,compute_cap,driver_version,memory.total" in args:
    print("NVIDIA GB10, 12.1, 580.95.05, [N/A]")
elif "--query-gpu=utilization.gpu" in args:
    print("{util}")
else:
    sys.exit(6)
"""


def install_fake_nvidia_smi(bin_dir: Path, util: str = "37") -> dict[str, str]:
    """Write the fake into `bin_dir` and return an environment that finds it first."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    exe.write_text(SCRIPT.format(python=sys.executable, util=util))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
