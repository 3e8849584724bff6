"""How well the gap stage finds the differences that cost speed, and what lab time it spends.

Over `--seeds` seeds (20 by default) a simulated reference lab (scenario seed = the seed)
is calibrated the way a baseline is made (the lab's best configuration: two true cold
starts, n = 15 per workload), then the gap stage (diagnostic.pipelines.gap.run_gap) runs
on a configuration that differs from it in fields the four pipelines do not look at. Seed i
takes family i mod 8:

- eager: serving.enforce_eager true (costs the eager penalty per step);
- layout: tp 4 x pp 2 instead of tp 8 (half the ranks read the weights, one more hop);
- eager + memory: eager mode and gpu_memory_utilization 0.8 (the latter costs nothing);
- layout + flag: tp 4 x pp 2 and `--max-num-seqs 4` (the flag costs nothing at batch 1);
- layout + eager: two costly differences;
- memory: gpu_memory_utilization 0.8 alone (nothing to find);
- KV precision: kv_cache_dtype auto at a 128k context, whose change to fp8 lowers quality
  (excluded, as the context is: a requirement);
- at the baseline: nothing differs.

Which differences cost comes from LAB_MODEL.md section 3 (the layout and eager mode are
the only fields of these that enter the decode step), not from the stage. The benchmark
prints the confusion matrix over candidates (costly found / missed, false findings,
costless correctly left) and the stage's lab time and restarts against an exhaustive test
that restarts once per candidate and measures it alone with the proof's protocol (its lab
time priced from the stage's own proof steps).

The current configuration's rate is measured before the stage with the proof's protocol
and handed to it, as the speculative stage's confirmation runs are on a lab day; the
stage's lab time excludes it. Cold starts are not part of this benchmark (the cold-start
search has its own test, tests/diagnostic/pipelines/gap/test_sim_gap.py). Dilation 60,
two labs at a time: about 10 minutes. Results go to out/bench/gap.json.

Run: `make bench-gap`, or `python benchmarks/bench_gap.py --seeds 8` for a look.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diagnostic.pipelines.gap import run_gap  # noqa: E402
from diagnostic.pipelines.gap.candidates import diff, finding_code  # noqa: E402
from diagnostic.pipelines.gap.pipeline import PROVE  # noqa: E402
from diagnostic.pipelines.measure.protocol import measure_on_session  # noqa: E402
from lab.session import LabSession  # noqa: E402
from lab.sim.lab import SimLab  # noqa: E402
from tests.diagnostic.pipelines.gap.simgap import (  # noqa: E402
    best_config,
    measure_baseline,
    scenario_file,
    variant,
)

# The fields of these families that enter LAB_MODEL section 3's decode step.
COSTLY = {"parallel", "serving.enforce_eager"}
FAMILIES: list[tuple[str, dict[str, Any]]] = [
    ("eager", {"serving__enforce_eager": True}),
    ("layout", {"parallel__tp": 4, "parallel__pp": 2}),
    ("eager+memory", {"serving__enforce_eager": True, "serving__gpu_memory_utilization": 0.8}),
    ("layout+flag", {"parallel__tp": 4, "parallel__pp": 2,
                     "extra_args": ["--trust-remote-code", "--max-num-seqs", "4"]}),
    ("layout+eager", {"parallel__tp": 4, "parallel__pp": 2, "serving__enforce_eager": True}),
    ("memory", {"serving__gpu_memory_utilization": 0.8}),
    # A bf16 KV cache of 256k does not fit eight Sparks at 0.85: the customer's shorter
    # context (a requirement) goes with it.
    ("kv-precision", {"serving__kv_cache_dtype": "auto", "serving__max_model_len": 131072}),
    ("at-baseline", {}),
]


def one(seed: int, dilation: float) -> dict[str, Any]:
    try:
        return _one(seed, dilation)
    except Exception as exc:  # one lab's failure is a row, not the end of the benchmark
        family = FAMILIES[seed % len(FAMILIES)][0]
        return {"seed": seed, "family": family, "error": f"{type(exc).__name__}: {exc}"}


def _one(seed: int, dilation: float) -> dict[str, Any]:
    family, fields = FAMILIES[seed % len(FAMILIES)]
    config = variant(**fields)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp, SimLab(scenario_file(Path(tmp), seed=100 + seed,
                                                                     dilation=dilation),
                                                       Path(tmp) / "lab") as sim, \
            LabSession.open(sim.inventory_path) as session:
        baseline = measure_baseline(session, best_config())
        current: dict[str, list[float]] | None = None
        if diff(config, baseline.config)[0]:
            # The current configuration's rate, as the speculative stage's confirmation gives it.
            session.launch(config, cold=False)
            measured = measure_on_session(session, engine="vllm", version=config["engine"]["version"],
                                          workloads=tuple(config["workloads"]), n=PROVE.n,
                                          warmup=PROVE.warmup, max_tokens=PROVE.max_tokens)
            current = {w: list(measured[w]["decode"]["samples"]) for w in config["workloads"]}
        result = run_gap(session, config, baseline, log=lambda _l: None, progress=lambda _p, _m: None,
                         check_cancelled=lambda: None, current_runs=current,
                         current_source="measured before the stage")
    section = result["section"]
    candidates = {c["path"] for c in section["candidates"]}
    costly = candidates & COSTLY
    found = {p["path"] for p in section["proved"]}
    proofs = [s["lab_s"] for s in section["steps"] if len(s["applied"]) == 1]
    exhaustive_s = len(candidates) * statistics.fmean(proofs) if proofs else None
    return {
        "seed": seed,
        "family": family,
        "candidates": sorted(candidates),
        "excluded": [e["path"] for e in section["excluded"]],
        "costly": sorted(costly),
        "found": sorted(found),
        "tp": len(found & costly),
        "fn": len(costly - found),
        "fp": len(found - costly),
        "tn": len(candidates - costly - found),
        "in_config_changes": sorted({c["finding"] for c in result["config_changes"]}),
        "restarts": section["restarts"],
        "exhaustive_restarts": section["exhaustive_restarts"],
        "lab_time_s": result["lab_time_s"],
        "exhaustive_lab_s_estimate": round(exhaustive_s, 1) if exhaustive_s is not None else 0.0,
        "wall_s": round(time.time() - t0, 1),
        # Every measurement's samples (outliers flagged), so that a miss can be read afterwards
        # without running the seed again: its stalls are the wall clock's and do not repeat.
        "current": section.get("current"),
        "gap": section.get("gap"),
        "steps": section["steps"],
        "checked": section["checked"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--dilation", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        rows = list(pool.map(one, range(args.seeds), [args.dilation] * args.seeds))
    failed = [r for r in rows if "error" in r]
    for r in failed:
        print(f"seed {r['seed']} ({r['family']}): {r['error'][:300]}")
    rows = [r for r in rows if "error" not in r]
    print(f"{'seed':>4} {'family':<13} {'cand':>4} {'costly':>6} {'found':>5} {'fp':>3} "
          f"{'restarts':>8} {'exh.':>4} {'lab s':>7} {'exh. lab s':>10}")
    for r in rows:
        print(f"{r['seed']:>4} {r['family']:<13} {len(r['candidates']):>4} {len(r['costly']):>6} "
              f"{r['tp']:>5} {r['fp']:>3} {r['restarts']:>8} {r['exhaustive_restarts']:>4} "
              f"{r['lab_time_s']:>7.0f} {r['exhaustive_lab_s_estimate']:>10.0f}")
    tp, fn = sum(r["tp"] for r in rows), sum(r["fn"] for r in rows)
    fp, tn = sum(r["fp"] for r in rows), sum(r["tn"] for r in rows)
    changed = all(set(r["in_config_changes"]) == {finding_code(p) for p in r["found"]} for r in rows)
    restarts, exhaustive = sum(r["restarts"] for r in rows), sum(r["exhaustive_restarts"] for r in rows)
    lab, exh_lab = sum(r["lab_time_s"] for r in rows), sum(r["exhaustive_lab_s_estimate"] for r in rows)
    print()
    print("confusion matrix over candidates (truth: LAB_MODEL section 3)")
    print("                 proved   not proved")
    print(f"  costly         {tp:>6}   {fn:>10}")
    print(f"  costs nothing  {fp:>6}   {tn:>10}")
    print(f"costly found: {tp}/{tp + fn} ({100.0 * tp / max(1, tp + fn):.0f} %); false findings: {fp}; "
          f"every proved change in config_changes: {changed}")
    print(f"restarts: {restarts} (exhaustive one field at a time: {exhaustive}); lab time {lab:.0f} s "
          f"(exhaustive, priced from the stage's own proof steps: {exh_lab:.0f} s); "
          f"max per day {max(r['lab_time_s'] for r in rows):.0f} s")
    print(f"wall {time.time() - t0:.0f} s")
    out = ROOT / "out" / "bench" / "gap.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "tp": tp, "fn": fn, "fp": fp, "tn": tn,
                               "restarts": restarts, "exhaustive_restarts": exhaustive,
                               "lab_time_s": lab, "exhaustive_lab_s_estimate": exh_lab}, indent=1))
    if fn or fp or not changed or failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
