"""The whole diagnostic day on the simulated lab: lab seconds per stage and in total, and
the wall time, for the reference scenario and each fault scenario.

    python benchmarks/bench_day.py [--dilation 45] [--scenario NAME ...] [--out out/bench/day]

Each day is a real `manage.py diagnose` run (its own SQLite database under --out), so the
figures are what a consultant's run spends. Lab time on a simulated lab includes the
platform's own calls stretched by the dilation (0.1 wall s is 4.5 lab s at 45x), so it
reads a little above a real lab's; the wall time is what the demo costs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"
SCENARIOS = ROOT / "lab" / "scenarios"
DEFAULT = ("reference-kimi-k2-8spark", "renamed-nics", "fault-node-down", "fault-kv-budget",
           "fault-engine-crash", "fault-nic-degraded")
STAGES = ("preflight", "reproduce", "triage", "fp4", "specdec", "measure", "report")
TARGET_LAB_S = 7200.0


def run_day(scenario: str, out: Path, dilation: float) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DIAG_DB": str(out / "db.sqlite3"), "DIAG_OUT_DIR": str(out / "platform")}
    env.pop("DATABASE_URL", None)
    env.pop("CELERY_BROKER_URL", None)
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, check=True, cwd=ROOT)
    began = time.monotonic()
    done = subprocess.run(
        [*manage, "diagnose", "--config", str(CONFIG), "--lab", f"sim:{SCENARIOS / (scenario + '.yaml')}",
         "--dilation", str(dilation), "--out", str(out / "day")],
        env=env, cwd=ROOT, capture_output=True, text=True, check=False,
    )
    wall = time.monotonic() - began
    findings_path = out / "day" / "findings.json"
    if not findings_path.is_file():
        return {"scenario": scenario, "error": done.stderr.strip().splitlines()[-1:] or ["no findings"],
                "wall_s": wall}
    document = json.loads(findings_path.read_text())
    stages = {s["name"]: s for s in document["job"]["stages"]}
    return {
        "scenario": scenario,
        "status": document["job"]["status"],
        "exit": done.returncode,
        "lab_s": {name: (stages[name].get("lab_seconds") if name in stages else None) for name in STAGES},
        "total_lab_s": document["job"]["lab_time_s"],
        "wall_s": round(wall, 1),
        "money_back": (document.get("money_back") or {}).get("eligible"),
        "findings": sorted({f["code"] for f in document["findings"]}),
    }


def reserves() -> dict[str, float]:
    """The lab seconds the job budget keeps for each stage (diagnostic.jobs.budget)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "diagnostic.settings")
    import django

    django.setup()
    from diagnostic.jobs.budget import RESERVE_LAB_S

    return dict(RESERVE_LAB_S)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dilation", type=float, default=45.0)
    parser.add_argument("--scenario", action="append", help="scenario name under lab/scenarios (repeatable)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench" / "day")
    args = parser.parse_args()
    rows = [run_day(name, args.out / name, args.dilation) for name in (args.scenario or DEFAULT)]
    (args.out / "day.json").write_text(json.dumps(rows, indent=2) + "\n")
    head = (f"{'scenario':<26}" + "".join(f"{s[:9]:>10}" for s in STAGES)
            + f"{'total':>9}{'wall s':>8}  money back")
    print(f"bench-day: lab seconds per stage at dilation {args.dilation:g} (target: whole day "
          f"≤ {TARGET_LAB_S:.0f} lab s on the reference)")
    print(head)
    reserve = reserves()
    print(f"{'reserve (jobs/budget.py)':<26}" + "".join(f"{reserve.get(s, 0):>10.0f}" for s in STAGES))
    for row in rows:
        if "error" in row:
            print(f"{row['scenario']:<26} failed: {row['error']}")
            continue
        cells = "".join(f"{'-' if v is None else f'{v:.0f}':>10}" for v in row["lab_s"].values())
        print(f"{row['scenario']:<26}{cells}{row['total_lab_s']:>9.0f}{row['wall_s']:>8.0f}  "
              f"{'free' if row['money_back'] else 'not free'} ({row['status']})")
        print(f"{'':<26}findings: {', '.join(row['findings']) or 'none'}")
        over = [f"{name} {v:.0f} > {reserve[name]:.0f}" for name, v in row["lab_s"].items()
                if v is not None and name in reserve and v > reserve[name]]
        if over:
            print(f"{'':<26}over its reserve: {', '.join(over)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
