"""The lifecycle of a diagnostic job and of each of its stages: every state, and every change
of state the platform makes, by name, in one place.

A job is queued (possibly for days, until its booking's lab day), runs, and ends succeeded,
partial (a stage that is not required failed), failed or cancelled; a lab fault holds it
instead, and staff re-run a held or ended job by queueing it again.

    queued ──start──▶ running ──end──▶ succeeded | partial | failed | cancelled
      │                  │ ▲                              │
      │ cancel_waiting   │ └──────────── requeue ◀────────┘
      ▼                hold          ▲
    cancelled            ▼           │
                       held ─────────┘ (requeue; or end: cancelled)

A stage is pending until a worker claims it under a lease. It ends succeeded, stopped (it
ended the day on purpose: the lab cannot run the configuration, and its result says why),
failed, quarantined (out of attempts) or cancelled; a transient fault or a lapsed lease
releases it to pending, and so does a hold. Staff reset ended stages to pending to run them
again.

Every change is one conditional UPDATE that names the states it leaves (`Transition.apply`):
two workers racing for one row cannot both move it, and a row in a state the transition does
not leave is not touched. Nothing else in the platform writes a job's or a stage's status
(tests/test_layout.py holds to that).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import models


class JobState(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    # Finished, but a pipeline stage failed or was quarantined; its section is null.
    PARTIAL = "partial", "partial"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"
    # Stopped by a fault of the lab or of the platform, not of the customer's
    # configuration: waits for staff to re-run it (same day or another), at no cost.
    HELD = "held", "held for a lab fault"


class StageState(models.TextChoices):
    PENDING = "pending", "pending"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    # Ended the day on purpose (orchestration's StopJob): its result carries the reason.
    STOPPED = "stopped", "stopped the job"
    FAILED = "failed", "failed"
    QUARANTINED = "quarantined", "quarantined"
    CANCELLED = "cancelled", "cancelled"


JOB_ENDED = frozenset({JobState.SUCCEEDED, JobState.PARTIAL, JobState.FAILED, JobState.CANCELLED})
JOB_OPEN = frozenset({JobState.QUEUED, JobState.RUNNING, JobState.HELD})
STAGE_ENDED = frozenset({StageState.SUCCEEDED, StageState.STOPPED, StageState.FAILED,
                         StageState.QUARANTINED, StageState.CANCELLED})
# The stages whose result later stages, the findings and the report read: those that did
# their work, including the one that stopped the day (its result says why).
STAGE_WITH_RESULT = frozenset({StageState.SUCCEEDED, StageState.STOPPED})


@dataclass(frozen=True)
class Transition:
    """A named change of state: from any of `sources` to `target`."""

    name: str
    sources: frozenset[str]
    target: str

    def apply(self, rows: models.QuerySet[Any], **fields: Any) -> int:
        """Move those of `rows` that are in a source state, setting `fields` with the status;
        returns how many moved."""
        return rows.filter(status__in=self.sources).update(status=self.target, **fields)


# -- a job ------------------------------------------------------------------------------------
START = Transition("start", frozenset({JobState.QUEUED}), JobState.RUNNING)
HOLD = Transition("hold", JOB_OPEN, JobState.HELD)
# A booking cancelled or moved before its day: the jobs still waiting for it go with it.
CANCEL_WAITING = Transition("cancel waiting", frozenset({JobState.QUEUED}), JobState.CANCELLED)
# Staff run a held day again, or retry a stage of an ended one.
REQUEUE = Transition("requeue", JOB_ENDED | {JobState.HELD}, JobState.QUEUED)
END: dict[str, Transition] = {state: Transition(f"end {state}", JOB_OPEN, state) for state in JOB_ENDED}

# -- a stage ----------------------------------------------------------------------------------
# A claim also takes over a running stage whose lease lapsed (its worker died); the caller
# narrows the rows to those.
CLAIM = Transition("claim", frozenset({StageState.PENDING, StageState.RUNNING}), StageState.RUNNING)
QUARANTINE = Transition("quarantine", frozenset({StageState.PENDING, StageState.RUNNING}),
                        StageState.QUARANTINED)
SUCCEED = Transition("succeed", frozenset({StageState.RUNNING}), StageState.SUCCEEDED)
STOP_JOB = Transition("stop the job", frozenset({StageState.RUNNING}), StageState.STOPPED)
FAIL = Transition("fail", frozenset({StageState.RUNNING}), StageState.FAILED)
# Given back after a transient fault, a lapsed lease or a hold: pending, to run again.
RELEASE = Transition("release", frozenset({StageState.RUNNING}), StageState.PENDING)
# Not run: the job stopped, was cancelled, or its booking went; or cancelled while running.
CANCEL = Transition("cancel", frozenset({StageState.PENDING, StageState.RUNNING}), StageState.CANCELLED)
# Staff run ended stages again from their beginnings.
RESET = Transition("reset", STAGE_ENDED | {StageState.PENDING}, StageState.PENDING)
