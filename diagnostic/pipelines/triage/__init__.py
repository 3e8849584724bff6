"""The loading triage (issue 11): why a cold start takes minutes, told apart from
evidence and proven by fixing it. `run_triage` is the entry point; the stage adapter is
`diagnostic.jobs.stages.triage`.

Modules: `timeline` (phases and stalls from engine logs), `frames` (1 Hz telemetry as
pandas frames), `signatures` (the telemetry-only classifier), `fixes` (changes from the
lab's facts), `coldstart` (one observed cold start), `section` (the findings.json section)
and `pipeline` (the proving loop).
"""

from diagnostic.pipelines.triage.pipeline import run_triage

TELEMETRY_CSV = "cold-start-telemetry.csv"

__all__ = ["TELEMETRY_CSV", "run_triage"]
