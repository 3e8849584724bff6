"""TEST FIXTURE: the findings.json of a real reference day, so the report tests read what
the producers write.

`reference_day.json` beside this module is the findings document `manage.py diagnose`
wrote for the out-of-box Kimi-K2 configuration on the simulated reference lab
(examples/configs/kimi-k2-8spark-outofbox.yaml on lab/scenarios/reference-kimi-k2-8spark.yaml,
seed 0), unedited: every section in the shape its pipeline gives it (`cold_start` from
the triage and the measure stage, `fp4`, `speculative`, `measurement` with `tuned`,
`difference` and `roofline`, `tuned`, the findings and `job.stages`).

One field is added on loading: `job.lab_day`. A real job's lab day is its booking's,
handed to the report beside the findings (diagnostic/jobs/report_versions.py); the report also
reads it from `job.lab_day`, and the money-back tests need a fixed one. Refresh the file
from a new run when a producer changes its shape: the tests take their expectations
from it, not from constants.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

REFERENCE_DAY = Path(__file__).with_name("reference_day.json")
# The reference day as `manage.py diagnose` wrote it after issue 28 (vLLM 0.34, dilation 45,
# with the gap stage, the cold-start proof on each change's phase and the split of the
# step), unedited and without a lab day, as `make demo` has it.
REFERENCE_DAY_28 = Path(__file__).with_name("reference_day_28.json")
LAB_DAY = "2025-12-01"  # a Monday: a report issued that afternoon is on time
WORKLOADS = ("code", "prose")


@cache
def _stored() -> dict[str, Any]:
    return dict(json.loads(REFERENCE_DAY.read_text()))


def reference_findings() -> dict[str, Any]:
    """The reference day's findings document (a fresh deep copy on each call)."""
    document = copy.deepcopy(_stored())
    document["job"]["lab_day"] = LAB_DAY
    return document


@cache
def _stored_28() -> dict[str, Any]:
    return dict(json.loads(REFERENCE_DAY_28.read_text()))


def reference_findings_28() -> dict[str, Any]:
    """The issue-28 reference day's findings document (a fresh deep copy on each call)."""
    return copy.deepcopy(_stored_28())
