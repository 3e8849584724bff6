"""The tuned configuration's diff shows the proved changes and nothing else."""

from __future__ import annotations

import json

from diagnostic.jobs.tuning import config_diff
from diagnostic.pipelines.changes import apply_changes, change
from lab.engines import load_config_text
from tests.diagnostic.conftest import REFERENCE_CONFIG


def jsonb_order(value: object) -> object:
    """Keys as PostgreSQL's jsonb returns them: shorter keys first, then by bytes."""
    if isinstance(value, dict):
        return {k: jsonb_order(value[k]) for k in sorted(value, key=lambda k: (len(k), k))}
    if isinstance(value, list):
        return [jsonb_order(v) for v in value]
    return value


def test_a_configuration_read_back_from_the_database_diffs_only_where_it_changed() -> None:
    submitted = load_config_text(REFERENCE_CONFIG.read_text())
    stored = jsonb_order(json.loads(json.dumps(submitted)))
    assert list(stored) != list(submitted)  # type: ignore[arg-type]
    fits = change("serving.max_model_len", 262144, 104857, finding="load.kv_budget", why="fits")
    tuned = apply_changes(submitted, [fits])
    diff = config_diff(stored, tuned)  # type: ignore[arg-type]
    changed = [line for line in diff.splitlines()
               if line[:1] in "+-" and not line.startswith(("---", "+++"))]
    assert changed == ["-  max_model_len: 262144", "+  max_model_len: 104857"]
