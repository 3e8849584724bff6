"""Random faults in the middle of diagnostic jobs, and whether each job still ends well.

Each of the runs (20 by default) draws a fault kind, the stage it lands in and how long
after that stage started it strikes, then runs one job on real Celery workers over a
private PostgreSQL and Redis (tests/diagnostic/jobs/chaos.py) and injects the fault:

- postgres: the database server restarts (down for a second);
- redis: the broker restarts empty (down for a second), losing the message in flight;
- worker: the worker running the stage is killed with SIGKILL and a fresh one started;
- disk: the report's disk fills (a 2 MiB tmpfs) and is freed once the attempt failed
  (only in the report stage; needs root to mount);
- node: a node of the simulated lab powers off for a few seconds (only in measure, whose
  job runs preflight, reproduce and measure on a fast copy of the reference lab).

It then checks what every fault must leave standing (chaos.check_outcome: the job ended
succeeded, or failed/partial with one reason, or is held for a lab fault a node's outage
outlasted; no stage that succeeded ran again; at most
one email per report version; findings of succeeded stages kept once) and prints one row
per run: the fault, the job's end, the faulted stage's attempts, whether the checks held,
and the wall seconds. "landed" says whether the fault struck while its stage ran or after
it (a quick stage may be done by then: the fault then hits what follows). Exits 1 when
any check failed.

Run with `make bench-chaos` (about 10 minutes) or `python benchmarks/bench_chaos.py --runs 5`.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.diagnostic.jobs.chaos import Scenario, Services, check_outcome  # noqa: E402

QUICK_PLAN = ["chaos_first", "chaos_slow", "report", "chaos_deliver"]
SIM_PLAN = ["preflight", "reproduce", "measure"]
# Which stages each fault can land in.
TARGETS = {
    "postgres": ["chaos_first", "chaos_slow", "report", "chaos_deliver"],
    "redis": ["chaos_first", "chaos_slow", "report", "chaos_deliver"],
    "worker": ["chaos_slow", "report"],
    "disk": ["report"],
    "node": ["measure"],
}
TERMINAL = {"succeeded", "partial", "failed", "cancelled", "held"}
FAST_DILATION = 150


@dataclass(frozen=True)
class Fault:
    kind: str
    stage: str
    after_s: float


@dataclass
class Row:
    run: int
    fault: Fault
    status: str = "?"
    attempts: int = 0
    checks: str = "?"
    landed: str = "?"  # the stage's state when the fault struck: running, or already past it
    seconds: float = 0.0
    reason: str = ""


def draw(rng: random.Random, runs: int, kinds: list[str]) -> list[Fault]:
    faults = []
    for _ in range(runs):
        kind = rng.choice(kinds)
        faults.append(Fault(kind, rng.choice(TARGETS[kind]), round(rng.uniform(0.0, 2.0), 1)))
    return faults


def stage_status(scenario: Scenario, job_id: str, stage: str) -> str:
    with suppress(subprocess.CalledProcessError, ValueError):
        return scenario.stage_row(job_id, stage)[0]
    return "?"


@contextmanager
def mounted_tmpfs(path: Path) -> Iterator[bool]:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path)], capture_output=True)
    try:
        yield done.returncode == 0
    finally:
        if done.returncode == 0:
            subprocess.run(["umount", "-l", str(path)], check=False)


def strike(fault: Fault, scenario: Scenario, job_id: str, sim: object | None) -> str:
    """Wait for the stage to start, then `after_s`, then inject the fault; returns the
    stage's state just before it struck."""
    scenario.wait_for(
        lambda: stage_status(scenario, job_id, fault.stage) == "running"
        or scenario.job_status(job_id) in TERMINAL,
        180,
        f"{fault.stage} to start",
    )
    time.sleep(fault.after_s)
    landed = stage_status(scenario, job_id, fault.stage)
    services = scenario.services
    if fault.kind == "postgres":
        services.postgres.restart(down_s=1.0)
    elif fault.kind == "redis":
        services.redis.restart(down_s=1.0)
    elif fault.kind == "worker":
        for worker in scenario.workers:
            worker.kill()
            worker.wait()
        scenario.workers.clear()
        scenario.start_worker("replacement")
    elif fault.kind == "disk":
        filler = scenario.out_dir / "filler"
        with suppress(OSError), filler.open("wb") as sink:
            while True:
                sink.write(b"\0" * 65536)
                sink.flush()
        with suppress(AssertionError):
            scenario.wait_for(lambda: stage_status(scenario, job_id, fault.stage) != "running", 60,
                              "the attempt on the full disk to end")
        filler.unlink()
    elif fault.kind == "node":
        assert sim is not None
        sim.set_node_down("spark-01")  # type: ignore[attr-defined]
        time.sleep(3.0)
        sim.set_node_down("spark-01", down=False)  # type: ignore[attr-defined]
    return "in stage" if landed == "running" else f"stage {landed}"


def fast_reference_lab(directory: Path) -> Path:
    """A copy of the reference scenario at 150 lab seconds per wall second."""
    data = yaml.safe_load((REPO / "lab" / "scenarios" / "reference-kimi-k2-8spark.yaml").read_text())
    data["dilation"] = FAST_DILATION
    path = directory / "reference-fast.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def one_run(number: int, fault: Fault, services: Services, root: Path) -> Row:
    row = Row(number, fault)
    started = time.monotonic()
    scenario = Scenario(services, root / f"run-{number:02d}", slow_s=3.0)
    with ExitStack() as stack:
        sim = None
        inventory = None
        plan = QUICK_PLAN
        if fault.kind == "disk" and not stack.enter_context(mounted_tmpfs(scenario.out_dir)):
            row.checks, row.reason = "skipped", "cannot mount a tmpfs (not root?)"
            return row
        if fault.kind == "node":
            from lab.sim.lab import SimLab

            lab_dir = root / f"run-{number:02d}" / "lab"
            lab_dir.mkdir(parents=True)
            sim = stack.enter_context(SimLab(fast_reference_lab(lab_dir), lab_dir / "state"))
            inventory, plan = sim.inventory_path, SIM_PLAN
        stack.callback(scenario.stop_workers)
        scenario.start_worker()
        try:
            job_id = scenario.submit(plan, inventory=inventory)
            row.landed = strike(fault, scenario, job_id, sim)
            row.status = scenario.wait_until_ended(job_id, timeout=240)
            job = check_outcome(scenario, job_id, expect_stages=plan)
            stage = next(s for s in job["stages"] if s["name"] == fault.stage)
            row.attempts = stage["attempts"]
            row.checks = "ok"
            row.reason = job["status_message"] or (stage["last_error"] or "")
            if stage["status"] != "succeeded":
                row.reason += f" ({stage['message'] or stage['last_error']})"
        except (AssertionError, RuntimeError) as failed:
            row.checks = "FAILED"
            row.reason = " ".join(str(failed).split())[:300]
        finally:
            if services.redis.process is None:
                services.redis.start()
    row.seconds = time.monotonic() - started
    return row


def print_table(rows: list[Row]) -> None:
    print(f"{'run':>3}  {'fault':<8} {'stage':<13} {'at s':>4}  {'landed':<17} {'job':<9} {'att':>3}  "
          f"{'checks':<7} {'wall s':>6}  reason / last retried error")
    for r in rows:
        print(f"{r.run:>3}  {r.fault.kind:<8} {r.fault.stage:<13} {r.fault.after_s:>4.1f}  {r.landed:<17} "
              f"{r.status:<9} {r.attempts:>3}  {r.checks:<7} {r.seconds:>6.1f}  {r.reason[:160]}")
    held = sum(r.checks == "ok" for r in rows)
    ran = sum(r.checks != "skipped" for r in rows)
    print(f"\nchecks held in {held} of {ran} runs; jobs succeeded: "
          f"{sum(r.status == 'succeeded' for r in rows)}, ended otherwise with a reason: "
          f"{sum(r.status in ('partial', 'failed') for r in rows)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--kinds", default=",".join(TARGETS), help="comma-separated fault kinds to draw from")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(TARGETS))
    if unknown:
        parser.error(f"unknown fault kinds {unknown}; known: {', '.join(TARGETS)}")
    faults = draw(random.Random(args.seed), args.runs, kinds)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-chaos-") as tmp, Services.running() as services:
        for number, fault in enumerate(faults, 1):
            row = one_run(number, fault, services, Path(tmp))
            rows.append(row)
            print(f"run {number:>2}/{len(faults)}: {fault.kind} in {fault.stage} at +{fault.after_s:.1f} s"
                  f" -> {row.status}, checks {row.checks} ({row.seconds:.0f} s)", flush=True)
    print()
    print_table(rows)
    return 0 if all(r.checks in ("ok", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
