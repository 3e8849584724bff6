"""How often the FP4 stage reaches the right verdict, and what lab time it spends.

Over `--seeds` seeds (20 by default) of the reference scenario and four FP4 truths --
the default backend broken, degraded with error rate 0.15 and 0.3, and sound -- runs the
FP4 stage (diagnostic.pipelines.fp4.run_fp4) on a simulated lab over SSH with the
reference customer configuration after triage (kept JIT cache, fast loader, NCCL
variables), and prints:

- the verdict confusion matrix (truth: garbage | degraded | correct; target 100 % on the
  diagonal);
- how often the backend chosen is the one that is correct and fastest (cutlass here:
  speed 1.0 against Marlin's 1.15), or, for a sound default, that nothing changed;
- the canaries run (the base 40 and the extensions the Wilson rule asked for) and the
  lab seconds the stage spent, per truth.

Results go to out/bench/fp4.json. Run with `make bench-fp4` (about 15 minutes on two
cores) or `python benchmarks/bench_fp4.py --seeds 2` for a quick look.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diagnostic.pipelines.fp4 import run_fp4  # noqa: E402
from lab.engines import normalize_config  # noqa: E402
from lab.session import LabSession  # noqa: E402
from lab.sim.lab import SimLab  # noqa: E402
from lab.sim.scenario import parse_scenario  # noqa: E402
from lab.sim.tokenizer import default_cache_dir  # noqa: E402

SCENARIO = ROOT / "lab" / "scenarios" / "reference-kimi-k2-8spark.yaml"
CONFIG = ROOT / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"
# Lab seconds per wall second. Lab time includes the platform's own work (SSH calls,
# sandboxed code checks) scaled by the dilation, so a faster dilation overstates it.
DILATION = 100.0
SPEED = {"flashinfer_cutlass": 1.0, "cutlass": 1.0, "marlin": 1.15}
# truth name -> (scenario fp4 truth, expected verdict)
TRUTHS: dict[str, tuple[dict[str, Any], str]] = {
    "broken": ({"broken": ["flashinfer_cutlass"], "degraded": []}, "garbage"),
    "degraded 0.15": ({"broken": [], "degraded": ["flashinfer_cutlass"], "error_rate": 0.15}, "degraded"),
    "degraded 0.3": ({"broken": [], "degraded": ["flashinfer_cutlass"], "error_rate": 0.3}, "degraded"),
    "sound": ({"broken": [], "degraded": []}, "correct"),
}
VERDICTS = ("garbage", "degraded", "correct")


def scenario(truth: dict[str, Any], seed: int, dilation: float) -> Any:
    data = yaml.safe_load(SCENARIO.read_text())
    data["seed"] = seed
    data["dilation"] = dilation
    data["truth"]["fp4"] = {"default_backend": "flashinfer_cutlass", "speed": dict(SPEED), **truth}
    return parse_scenario(data)


def config() -> dict[str, Any]:
    raw = copy.deepcopy(yaml.safe_load(CONFIG.read_text()))
    needs = yaml.safe_load(SCENARIO.read_text())["truth"]["load"]["rendezvous"]["needs"]
    raw["serving"].update({"jit_cache": "persisted", "load_format": "fastsafetensors"})
    raw["env"] = dict(needs)
    return normalize_config(raw)


def one(truth: dict[str, Any], seed: int, state: Path, dilation: float) -> dict[str, Any]:
    cfg = config()
    wall = time.monotonic()
    with SimLab(scenario(truth, seed, dilation), state, tokenizer_cache=default_cache_dir()) as sim, \
            LabSession.open(sim.inventory_path) as session:
        session.launch(cfg, cold=False)
        result = run_fp4(session, cfg)
    fp4 = result["section"]
    before = next(c for c in fp4["candidates"] if c["status"] == "customer")
    return {
        "seed": seed,
        "verdict": fp4["verdict"],
        "verdict_after": fp4["verdict_after"],
        "backend_after": fp4["backend_after"],
        "changes": [c["path"] for c in result["config_changes"]],
        "canaries_before": before["checks"]["canaries"]["n"],
        "pass_rate_before": fp4["canary_pass_rate"]["before"],
        "failed_checks_before": before.get("failed_checks"),
        "lab_time_s": fp4["lab_time_s"],
        "wall_s": round(time.monotonic() - wall, 2),
    }


def right_fix(truth_name: str, row: dict[str, Any]) -> bool:
    if truth_name == "sound":
        return row["backend_after"] == "flashinfer_cutlass" and not row["changes"]
    return row["backend_after"] == "cutlass" and row["verdict_after"] == "correct"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--dilation", type=float, default=DILATION)
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench" / "fp4.json")
    args = parser.parse_args()
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in TRUTHS}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-fp4-") as tmp:
        for seed in range(1, args.seeds + 1):
            for name, (truth, _) in TRUTHS.items():
                row = one(truth, seed, Path(tmp) / f"{seed}-{name.replace(' ', '_')}", args.dilation)
                rows[name].append(row)
                print(f"seed {seed:2d} {name:<14} verdict {row['verdict']:<8} "
                      f"after {row['backend_after']!s:<18} "
                      f"canaries {row['canaries_before']:3d} ({row['pass_rate_before']:.2f})  "
                      f"lab {row['lab_time_s']:7.1f} s  wall {row['wall_s']:5.1f} s", flush=True)

    print("\nverdict confusion matrix (rows: truth; columns: verdict)")
    print(f"{'truth':<14} {'expected':<9} " + " ".join(f"{v:>9}" for v in VERDICTS) + f" {'correct':>8}")
    total = hits = 0
    matrix: dict[str, dict[str, int]] = {}
    for name, (_, expected) in TRUTHS.items():
        counts = {v: sum(r["verdict"] == v for r in rows[name]) for v in VERDICTS}
        matrix[name] = counts
        total += len(rows[name])
        hits += counts[expected]
        print(f"{name:<14} {expected:<9} " + " ".join(f"{counts[v]:>9}" for v in VERDICTS)
              + f" {100.0 * counts[expected] / max(1, len(rows[name])):>7.1f}%")
    print(f"overall: {hits}/{total} = {100.0 * hits / max(1, total):.1f} % (target 100 %)")

    print("\nfix and cost per truth")
    print(f"{'truth':<14} {'right fix':>9} {'canaries':>9} {'lab s mean':>11} {'min':>8} {'max':>8}")
    summary: dict[str, Any] = {}
    for name in TRUTHS:
        lab = [r["lab_time_s"] for r in rows[name]]
        fixes = sum(right_fix(name, r) for r in rows[name])
        canaries = statistics.fmean(r["canaries_before"] for r in rows[name])
        summary[name] = {"right_fix": fixes, "n": len(rows[name]), "canaries_before_mean": canaries,
                         "lab_time_s": {"mean": statistics.fmean(lab), "min": min(lab), "max": max(lab)}}
        print(f"{name:<14} {fixes:>4}/{len(rows[name]):<4} {canaries:>9.1f} {statistics.fmean(lab):>11.1f} "
              f"{min(lab):>8.1f} {max(lab):>8.1f}")
    print(f"\nwall time {time.monotonic() - started:.0f} s at dilation {args.dilation:g}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"seeds": args.seeds, "dilation": args.dilation, "speed": SPEED,
                                    "confusion": matrix, "accuracy": hits / max(1, total),
                                    "summary": summary, "runs": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
