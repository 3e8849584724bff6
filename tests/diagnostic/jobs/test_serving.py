"""The pipeline stages' shared step: making sure the customer's configuration is what the
lab serves before anything is measured, against the simulated lab over SSH."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from diagnostic.bookings.models import Lab
from diagnostic.jobs.labaccess import LabAccess
from diagnostic.jobs.models import DiagnosticJob
from diagnostic.jobs.stage_context import StageContext
from diagnostic.jobs.stages.ensure_serving import ensure_serving
from lab.session import LabSession
from lab.sim.lab import SimLab
from tests.diagnostic.conftest import REFERENCE_SCENARIO
from tests.diagnostic.doubles import fast_scenario

pytestmark = pytest.mark.django_db


def verbs(sim: SimLab, since: int = 0) -> list[str]:
    """The agent verbs the nodes answered, from the `since`-th on."""
    return [json.loads(line)["verb"] for line in sim.calls_log_path.read_text().splitlines()[since:]]


def test_ensure_serving_relaunches_when_another_configuration_is_serving(
    make_job: Callable[..., DiagnosticJob], lab: Lab, tmp_path: Path
) -> None:
    job = make_job(["measure"])
    ours: dict[str, Any] = job.config.normalized
    other = copy.deepcopy(ours)
    other["speculative"]["num_speculative_tokens"] = 3  # what another job left running
    with SimLab(fast_scenario(tmp_path, REFERENCE_SCENARIO), tmp_path / "labsim") as sim, \
            LabSession.open(sim.inventory_path) as session:

        @contextmanager
        def this_session(_: Lab) -> Iterator[LabSession]:
            yield session

        ctx = StageContext(job=job, stage=job.stage_runs.get(name="measure"), owner="test",
                           max_attempts=3, access=LabAccess(this_session, lab))
        session.launch(other, cold=False, timeout_s=3600)
        assert not session.serves(ours)  # though /health answers 200

        before = len(verbs(sim))
        ensure_serving(ctx)
        assert "a different configuration is serving" in ctx.log_text
        assert "a different configuration is running on spark-01" in ctx.log_text
        assert ctx.stage.progress_message == "a different configuration is serving; starting it again (warm)"
        assert session.serves(ours)
        relaunch = verbs(sim, before)
        assert relaunch[:8] == ["status"] * 8  # the check: one status per node
        assert relaunch.count("stop") == 8 and relaunch.count("launch") == 8
        assert "drop-caches" not in relaunch  # warm: the cold start was reproduce's

        # Serving what we asked for: one status per node, and nothing else.
        before = len(verbs(sim))
        ensure_serving(ctx)
        assert verbs(sim, before) == ["status"] * 8

        # An engine that died is "not serving", not another configuration.
        session.stop()
        ensure_serving(ctx)
        assert "the configuration is not serving (no engine runs on spark-01" in ctx.log_text
        assert session.serves(ours)
