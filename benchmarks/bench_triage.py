"""How often the loading triage names the right causes, and what lab time it spends.

For each seed, one simulated lab (the reference scenario with that seed) runs the triage
on five customer configurations: each loading fault alone (weights I/O, JIT compile,
rendezvous), all three (the out-of-box configuration), and none. It prints the
attribution confusion matrix -- per case, in how many seeds each finding was made (the
diagonal should be every seed, everything else zero) -- the false and missed findings,
whether every proved change removed its signature, and per case the cold start before and
after, the cold starts it measured, and the lab time it spent (mean and max over seeds),
with the part of it the engine starts themselves took: the rest is the platform's own
calls and analysis, which the simulated lab's dilation stretches (0.1 s of wall time is
40 lab s at dilation 400) far beyond what they cost on a real lab.

The lab is reached in-process by default (the nodes' agent answers without SSH, so the
lab time is the triage's own, not round trips stretched by the dilation); `--ssh` goes
over loopback SSH as `diagnose --lab sim:` does.

Run with `make bench-triage` (20 seeds, a few minutes) or
`python benchmarks/bench_triage.py --seeds 3`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from diagnostic.pipelines.triage import run_triage  # noqa: E402
from tests.diagnostic.pipelines.triage.labs import FAULTS, customer, lab, scenario  # noqa: E402

CASES: dict[str, tuple[str, ...]] = {
    "weights_io": ("load.weights_io",),
    "jit_compile": ("load.jit_compile",),
    "rendezvous": ("load.rendezvous",),
    "all": FAULTS,
    "none": (),
}
COLUMNS = (*FAULTS, "load.unexplained_stall")


def run_seed(seed: int, *, ssh: bool, dilation: float) -> dict[str, dict[str, Any]]:
    scn = scenario(seed=seed, dilation=dilation)
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-triage-") as state, \
            lab(scn, Path(state), ssh=ssh) as (_, session):
        for case, faults in CASES.items():
            wall = time.monotonic()
            result = run_triage(session, customer(scn, faults))
            section = result["section"]
            codes = [f["code"] for f in result["findings"]]
            # Every step after the customer's adds one fix, and says whether its signature went.
            alone = [w for w in section["waterfall"] if w.get("mode") != "baseline"]
            out[case] = {
                "codes": codes,
                "right": sorted(c for c in codes if c in FAULTS) == sorted(faults)
                and "load.unexplained_stall" not in codes,
                "false": [c for c in codes if c not in faults],
                "missed": [c for c in faults if c not in codes],
                "signatures_gone": all(w["signature_gone"] for w in alone),
                "before_s": section["before_s"],
                "after_s": section["after_s"],
                "lab_s": result["lab_time_s"],
                # Cold starts the triage measured (a JIT-cache warm-up is inside its step).
                "starts": sum(1 for step in section["steps"] if step.get("lab_s")),
                # Of that lab time, what the engine starts themselves took (the rest is the
                # platform's own calls and analysis, stretched by the dilation).
                "start_s": sum(float(step.get("cold_start_s") or 0) + float(step.get("warm_up_lab_s") or 0)
                               for step in section["steps"] if step.get("lab_s")),
                "wall_s": time.monotonic() - wall,
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--ssh", action="store_true", help="reach the lab over loopback SSH")
    parser.add_argument("--dilation", type=float, default=400.0)
    args = parser.parse_args()

    results: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    began = time.monotonic()
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for case, row in run_seed(seed, ssh=args.ssh, dilation=args.dilation).items():
            results[case].append(row)
            if not row["right"]:
                print(f"seed {seed} {case}: found {row['codes']}", flush=True)
        print(f"seed {seed} done ({time.monotonic() - began:.0f} s wall)", file=sys.stderr, flush=True)

    n = args.seeds
    transport = "loopback SSH" if args.ssh else "in-process"
    print(f"\nLoading triage: {n} seeds x {len(CASES)} cases, reference scenario at dilation "
          f"{args.dilation:g}, {transport}\n")
    print("Attribution (seeds in which each finding was made):")
    print(f"{'case':<12}" + "".join(f"{c.removeprefix('load.'):>18}" for c in COLUMNS) + f"{'exact':>8}")
    for case, rows in results.items():
        counts = [sum(c in r["codes"] for r in rows) for c in COLUMNS]
        print(f"{case:<12}" + "".join(f"{k:>18}" for k in counts) + f"{sum(r['right'] for r in rows):>8}")
    cases_right = sum(r["right"] for rows in results.values() for r in rows)
    false = sum(len(r["false"]) for rows in results.values() for r in rows)
    missed = sum(len(r["missed"]) for rows in results.values() for r in rows)
    gone = all(r["signatures_gone"] for rows in results.values() for r in rows)
    print(f"\nright: {cases_right}/{n * len(CASES)} cases ({100 * cases_right / (n * len(CASES)):.0f} %); "
          f"false findings: {false}; missed: {missed}; every proved change removed its signature: {gone}\n")
    print(f"{'case':<12}{'before s':>10}{'after s':>10}{'starts':>8}{'in starts s':>13}{'lab s mean':>12}"
          f"{'lab s max':>11}{'wall s':>8}")
    for case, rows in results.items():
        print(f"{case:<12}{statistics.mean(r['before_s'] for r in rows):>10.1f}"
              f"{statistics.mean(r['after_s'] for r in rows):>10.1f}"
              f"{statistics.mean(r['starts'] for r in rows):>8.1f}"
              f"{statistics.mean(r['start_s'] for r in rows):>13.0f}"
              f"{statistics.mean(r['lab_s'] for r in rows):>12.0f}{max(r['lab_s'] for r in rows):>11.0f}"
              f"{statistics.mean(r['wall_s'] for r in rows):>8.1f}")
    return 0 if cases_right == n * len(CASES) and false == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
