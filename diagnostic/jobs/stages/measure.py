"""The measure stage: delivered throughput of the customer's configuration, per workload
(METHODOLOGY.md, "Measurement"), recorded as measurements and findings of the job."""

from __future__ import annotations

from typing import Any

from diagnostic.jobs.context import StageContext
from diagnostic.jobs.registry import register_stage
from diagnostic.jobs.stages.serving import ensure_serving
from diagnostic.pipelines.measure.protocol import measure_on_session

CUSTOMER = "customer"


def run(ctx: StageContext) -> dict[str, Any]:
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


register_stage("measure", run)
