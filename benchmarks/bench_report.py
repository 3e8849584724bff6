"""Render time of the full written report: findings.json to report.pdf, measured.

Renders the reference day's findings (the report tests' fixture,
tests/reports/reference_day.json: a real findings.json with every section, 22 pages)
and, when `make demo` has run, the demo's own out/demo/findings.json, several times
each (or only `--findings FILE`), and prints wall time per phase and the CPU time of
this process plus the rendering child. CPU time is printed because this machine is
shared: wall time grows with other people's load, CPU time much less.
The target is a full report in under 5 s of wall time on an idle two-core machine.

    .venv/bin/python benchmarks/bench_report.py [--findings FILE] [--repeat 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "diagnostic.settings")


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


DEMO_FINDINGS = ROOT / "out" / "demo" / "findings.json"


def _documents(path: Path | None) -> list[tuple[str, dict[str, Any]]]:
    if path is not None:
        return [(str(path), dict(json.loads(path.read_text())))]
    from tests.reports.reference_story import reference_findings

    documents = [("reference day", reference_findings())]
    if DEMO_FINDINGS.exists():
        documents.append((str(DEMO_FINDINGS.relative_to(ROOT)), dict(json.loads(DEMO_FINDINGS.read_text()))))
    return documents


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--findings", type=Path, default=None, help="a findings.json (default: the test fixture)"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=None, help="keep the PDFs here (default: a temporary folder)"
    )
    args = parser.parse_args(argv)

    import django

    django.setup()
    from reports.render import render

    issued = dt.datetime(2025, 12, 1, 16, 0, tzinfo=dt.UTC)
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        out = args.out or Path(tmp)
        for d, (name, findings) in enumerate(_documents(args.findings)):
            walls, cpus = [], []
            for i in range(args.repeat):
                cpu0, wall0 = _cpu_seconds(), time.perf_counter()
                folder = out / f"doc-{d}-run-{i}"
                result = render(findings, folder, customer="Benchmark Customer", as_of=issued)
                wall, cpu = time.perf_counter() - wall0, _cpu_seconds() - cpu0
                walls.append(wall)
                cpus.append(cpu)
                phases = "  ".join(f"{k}={v:.2f}s" for k, v in result.seconds.items())
                print(
                    f"{name} run {i + 1}: wall {wall:.2f} s  cpu {cpu:.2f} s  pages {result.pages}  "
                    f"size {result.pdf_path.stat().st_size / 1024:.0f} KiB  {phases}"
                )
            load = os.getloadavg()[0]
            print(
                f"{name}: median wall {statistics.median(walls):.2f} s, median cpu "
                f"{statistics.median(cpus):.2f} s over {args.repeat} runs (target < 5 s; the first run "
                f"includes imports; 1-min load average {load:.1f} on {os.cpu_count()} cores)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
