"""How a lab day's budget of lab seconds is shared among the stages of a job.

METHODOLOGY.md wants the whole day on the reference 8-node lab in two lab hours. Measured
on the simulated reference lab at dilation 45 (`diagnose` on the out-of-box configuration,
2026-12-05, at 5289bce) it takes 6,713 lab s: preflight 30 (with the memory-bandwidth
probe), reproduce 1,456 (the customer's true cold start, 562, and the customer's
measurement where it then serves), triage 1,735 (attributed on reproduce's start; one more
customer start, so that the day's cold-start change has two a side, and one start of every
proved change, which gives each cause's phase two a side), fp4 881 (rates without
speculation; the first correct candidate was within 5 % of the default), specdec 1,678
(no speculation read from the FP4 stage's runs, the customer's setting confirmed, one
n-gram probe screened, two finalists confirmed), gap 18 (nothing differs from the lab's
baseline), measure 911 (one tuned true cold start, vLLM's cache-hit line showing it
compiled nothing, and the tuned measurement), report 3.
It was 6,419 to 6,729 with one customer start and 10,470 before reproduce measured the
customer in place. The same day on SGLang 0.5.23 takes 7,234 (at 17e0285; 7,871 with one
customer start and before specdec bounded lengths by their mean accepted length): SGLang
reports no acceptance per position, so the speculative search measures each EAGLE-3 length
it considers (specdec 2,215 lab s). The default day budget stays three lab hours so that a fault
scenario's extra starts do not cut the measurement. Each stage gets what is left of the
day once the stages after it have their reserve: the lab seconds each needs to do its work at all on an
8-node Kimi K2-class day, measured on the reference lab. A stage that runs out stops early
and says what it did not try; the measure stage does not shorten its protocol.
"""

from __future__ import annotations

from django.conf import settings

from diagnostic.jobs.models import DiagnosticJob, StageRun

RESERVE_LAB_S = {
    # Facts from every node (~22 lab s on the reference lab at dilation 45) and the memory
    # bandwidth probe on the nodes in use, all at once: 2 lab s of setup and the timed reads
    # in the simulator, 5 to 8 lab s with the agent's round trip (28 to 31 in all, measured
    # 2026-12-05); a real node also imports torch and makes a CUDA context for it. Was 30.
    "preflight": 40.0,
    # The customer's true cold start (~630 lab s with the platform's own calls) and, on a
    # day that measures, its n = 15 measurement where it serves (~850).
    "reproduce": 1500.0,
    # One more customer start, the three cumulative steps and the one start the cold-start
    # proof adds (~1,735 measured).
    "triage": 1800.0,
    # The default's checks, its restart without speculation and rate, the engine's list,
    # two candidates (~1,300 measured; ~1,000 when the first is shown to cost nothing).
    "fp4": 1300.0,
    # The customer's setting confirmed, no speculation and one probe per other method
    # screened, the acceptance model's peaks confirmed: 1,818 lab s on the reference at
    # dilation 45; 1,050 to 3,260 over bench-specdec's 40 labs at dilation 60.
    "specdec": 2200.0,
    # The gap to the lab's baseline: nothing when no field differs (the reference day);
    # with one difference, a warm restart and its n = 15 proof (~450 lab s on the reference
    # lab), the current rate read from specdec's confirmation runs.
    "gap": 600.0,
    # One tuned true cold start and the tuned configuration's n = 15 per workload (~940).
    "measure": 1000.0,
    "report": 10.0,
}


def day_budget_lab_s(job: DiagnosticJob) -> float:
    budget = job.budget_lab_s if job.budget_lab_s is not None else settings.DIAG_DAY_BUDGET_LAB_S
    return float(budget)


def stage_budget_lab_s(job: DiagnosticJob, stage: StageRun) -> float:
    """Lab seconds `stage` may spend: the day's budget less what the stages before it spent
    and what the stages after it (in this job's plan) reserve; never below zero."""
    runs = list(job.stage_runs.order_by("order").values_list("name", "order", "lab_seconds"))
    spent = sum(seconds or 0.0 for _, order, seconds in runs if order < stage.order)
    reserved = sum(RESERVE_LAB_S.get(name, 0.0) for name, order, _ in runs if order > stage.order)
    return max(0.0, day_budget_lab_s(job) - spent - reserved)
