"""The findings document (`diagnostic.findings/1`, findings.json) of a job.

Built from what the job's stages stored: each succeeded stage's result may carry
`sections` (cold_start, fp4, speculative, measurement); a section no stage produced is
null, never invented. Every document is validated against
schemas/findings.schema.json before it leaves the platform.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from django.utils import timezone

from diagnostic.jobs.models import DiagnosticJob, JobEvent, StageRun
from diagnostic.jobs.tuning import tuned_section
from reports.moneyback import held_decision

SCHEMA = "diagnostic.findings/1"
SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "findings.schema.json"
SECTIONS = ("cold_start", "fp4", "speculative", "gap", "measurement")


class FindingsInvalid(ValueError):
    """A findings document that does not match the schema; names the failing path."""


@cache
def findings_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return schema


def validate_findings(document: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(findings_schema())
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(document)"
        raise FindingsInvalid(f"findings.json {where}: {first.message}")


def build_findings(job: DiagnosticJob) -> dict[str, Any]:
    """The findings document of `job` as it stands now."""
    stages = list(job.stage_runs.order_by("order"))
    sections: dict[str, Any] = dict.fromkeys(SECTIONS)
    for stage in stages:
        if stage.status not in StageRun.WITH_RESULT or not isinstance(stage.result, dict):
            continue
        produced = stage.result.get("sections") or {}
        for name in SECTIONS:
            if name not in produced:
                continue
            earlier, later = sections[name], produced[name]
            # A later stage may add to a section an earlier one wrote (the measure stage
            # gives cold_start its after_s from the tuned configuration's true cold start).
            if isinstance(earlier, dict) and isinstance(later, dict) and later.get("_merge"):
                sections[name] = {**earlier, **{k: v for k, v in later.items() if k != "_merge"}}
            else:
                sections[name] = {k: v for k, v in later.items() if k != "_merge"} \
                    if isinstance(later, dict) else later
    # Preflight notes the lab's time dilation; the report stage decides the money-back flag.
    done = {s.name: s.result for s in stages
            if s.status in StageRun.WITH_RESULT and isinstance(s.result, dict)}
    report = done.get("report", {})
    dilation = done.get("preflight", {}).get("lab_dilation")
    if job.started_at is None:
        wall = 0.0
    else:
        wall = ((job.finished_at or timezone.now()) - job.started_at).total_seconds()
    held = job.status == DiagnosticJob.Status.HELD
    money_back = report.get("money_back")
    if held and job.first_fault_at is not None:
        # No report, no verdict on the findings: a re-run is due at no cost (or, five
        # business days on without one, the day is free).
        money_back = held_decision(timezone.localdate(job.first_fault_at), timezone.localdate())
    return {
        "schema": SCHEMA,
        "job": {
            "id": str(job.pk),
            "lab": job.lab.name,
            "simulated": job.lab.is_simulated,
            "status": job.status,
            "status_message": job.status_message,
            **({"stop_side": job.stop_side} if job.stop_side else {}),
            "seed": job.seed,
            **({"lab_dilation": dilation} if dilation else {}),
            "lab_time_s": round(sum(s.lab_seconds or 0.0 for s in stages), 3),
            "wall_time_s": round(wall, 3),
            "stages": [
                {
                    "name": s.name,
                    "status": s.status,
                    "attempts": s.attempts,
                    "message": s.status_message,
                    "lab_seconds": None if s.lab_seconds is None else round(s.lab_seconds, 3),
                }
                for s in stages
            ],
        },
        "config": job.config.normalized,
        **sections,
        # The customer's configuration with every proved change, its command and diff.
        "tuned": tuned_section(job),
        "findings": [f.as_document() for f in job.finding_set.order_by("id")],
        # Decided by the report stage from measured improvements; never guessed here (a held
        # day's is the re-run rule's).
        "money_back": money_back,
        # The fault the day is held for now (staff facts: nodes, evidence), and every lab
        # fault that stopped this diagnostic with when it was re-run.
        "lab_fault": job.fault if held else None,
        "lab_faults": lab_fault_history(job),
    }


def lab_fault_history(job: DiagnosticJob) -> list[dict[str, Any]]:
    """Each lab fault that held the job, oldest first: when, where, what, and the day of the
    re-run that followed it (None while none is set)."""
    history: list[dict[str, Any]] = []
    for event in job.events.filter(kind__in=[JobEvent.Kind.LAB_FAULT, JobEvent.Kind.RETRIED,
                                             JobEvent.Kind.MOVED]).order_by("at", "id"):
        data = event.data if isinstance(event.data, dict) else {}
        if event.kind == JobEvent.Kind.LAB_FAULT:
            history.append({
                "at": timezone.localtime(event.at).isoformat(),
                "stage": data.get("stage"),
                "what": data.get("what"),
                "nodes": data.get("nodes") or [],
                "summary": data.get("summary") or event.message,
                "rerun_on": None,
            })
        elif history and history[-1]["rerun_on"] is None:
            history[-1]["rerun_on"] = data.get("rerun_on")
    return history
