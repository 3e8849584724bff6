"""The pipeline stages a diagnostic job runs after `reproduce`, registered with the job
registry at start-up (diagnostic.jobs discovers every installed app's `stages.py`).

Each stage is a thin adapter: it makes sure the customer's configuration is serving,
calls the plain pipeline code with the lab session, and records what it found.
"""

from __future__ import annotations

from typing import Any

from diagnostic.jobs.context import StageContext
from diagnostic.jobs.registry import register_pipeline_stage
from diagnostic.pipelines.measure import measure_on_session

# A configuration that is not serving (the stage is a retry on a fresh worker, the engine
# died since reproduce, or another job used the lab meanwhile) is started again warm: the
# cold start was reproduce's job.
RELAUNCH_TIMEOUT_LAB_S = 3600.0
CUSTOMER = "customer"


def ensure_serving(ctx: StageContext) -> None:
    """Make sure the engine we measure runs the customer's configuration.

    A healthy /health is not enough: after another job used the lab, the engine answering
    may run a different configuration. The nodes say which launch spec their engine was
    started from; anything but this configuration's specs is stopped and ours relaunched.
    """
    session = ctx.session
    state = session.serving_state(ctx.config)
    if state.serving:
        return
    why = ("a different configuration is serving" if state.other_configuration
           else "the configuration is not serving")
    ctx.log(f"{why} ({state.reason}); stopping whatever runs and starting ours again (warm)")
    ctx.progress(2, f"{why}; starting it again (warm)")
    session.launch(ctx.config, cold=False, timeout_s=RELAUNCH_TIMEOUT_LAB_S)


def measure(ctx: StageContext) -> dict[str, Any]:
    """Delivered throughput of the customer's configuration, per workload (METHODOLOGY.md)."""
    config = ctx.config
    ensure_serving(ctx)
    ctx.progress(5, "measuring delivered tokens, single stream")
    section = measure_on_session(
        ctx.session,
        engine=config["engine"]["name"],
        workloads=tuple(config["workloads"]),
        progress=lambda msg: ctx.log(msg),
    )
    ctx.check_cancelled()
    for workload in config["workloads"]:
        summary = section[workload]
        if summary.get("ci95") is None:
            # Fewer than two runs gave a decode rate (failed or abandoned requests): there is
            # no interval to report, and a figure without one is not a measurement.
            ctx.add_finding(
                "measure.too_few_runs",
                f"Only {summary.get('n', 0)} {workload} run(s) gave a decode rate; no interval",
                evidence={"workload": workload, "n": summary.get("n", 0),
                          "warnings": section.get("warnings", [])},
            )
            continue
        ctx.add_measurement(
            workload=workload,
            configuration=CUSTOMER,
            n=int(summary["n"]),
            mean_tps=float(summary["mean_tps"]),
            ci95=(float(summary["ci95"][0]), float(summary["ci95"][1])),
            ttft_s=summary.get("ttft_s"),
            samples=list(summary["runs"]),
        )
    for finding in section.pop("findings", []):
        ctx.add_finding(
            finding["code"],
            finding["title"],
            evidence=finding.get("evidence", {}),
            change=finding.get("change"),
            impact=finding.get("impact"),
        )
    ctx.progress(100, "measured")
    return {"sections": {"measurement": section}}


register_pipeline_stage("measure", measure)
