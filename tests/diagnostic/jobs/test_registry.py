"""The stage registry: a declared order, stages registered by name, adapters imported by
the registry itself rather than as a side effect of which apps are installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from diagnostic.jobs import registry, stages
from diagnostic.jobs.registry import STAGE_ORDER, StageRegistry, UnknownStage
from diagnostic.jobs.stage_context import StageContext
from tests.diagnostic.conftest import REPO

CORE = ("preflight", "reproduce", "report")


def probe(ctx: StageContext) -> dict[str, Any]:
    return {}


def other_probe(ctx: StageContext) -> dict[str, Any]:
    return {}


def test_it_lists_stages_in_the_declared_order_whatever_order_they_registered_in() -> None:
    reg = StageRegistry(STAGE_ORDER)
    for name in ("report", "measure", "preflight", "fp4", "reproduce"):
        reg.register(name, probe)
    assert [s.name for s in reg.stages()] == ["preflight", "reproduce", "fp4", "measure", "report"]
    assert [s.name for s in reg.select(["report", "fp4"])] == ["fp4", "report"]


def test_it_refuses_a_name_outside_the_declared_order_and_names_the_accepted_ones() -> None:
    reg = StageRegistry(STAGE_ORDER)
    with pytest.raises(ValueError, match="'tuning' is not in the declared stage order; accepted: "
                                         "preflight, reproduce, triage, fp4, specdec, gap, measure, report"):
        reg.register("tuning", probe)
    assert reg.stages() == []


def test_it_refuses_a_second_stage_under_a_taken_name_but_not_the_same_one_again() -> None:
    reg = StageRegistry(STAGE_ORDER)
    reg.register("fp4", probe)
    reg.register("fp4", probe)  # the module imported twice registers the same callable
    with pytest.raises(ValueError, match=f"'fp4' is already registered by {__name__}"):
        reg.register("fp4", other_probe)


def test_a_declared_stage_without_an_adapter_is_absent_and_selecting_it_says_so() -> None:
    reg = StageRegistry(STAGE_ORDER)
    for name in CORE:
        reg.register(name, probe)
    assert [s.name for s in reg.stages()] == list(CORE)
    assert reg.lookup("triage") is None
    with pytest.raises(UnknownStage, match="stage 'triage' is not available in this build; "
                                           "accepted: preflight, reproduce, report"):
        reg.select(["preflight", "triage"])
    with pytest.raises(UnknownStage, match="unknown stage 'fp5'; accepted: preflight, reproduce, report"):
        reg.select(["fp5"])
    with pytest.raises(UnknownStage, match="no stage selected"):
        reg.select([" ", ""])


def test_the_job_registry_holds_the_core_stages_and_every_built_adapter() -> None:
    names = [s.name for s in registry.all_stages()]
    assert names == [n for n in STAGE_ORDER if n in CORE or n in stages.ADAPTERS]
    assert "measure" in names
    flags = {s.name: (s.required, s.after_stop) for s in registry.all_stages()}
    assert flags["preflight"] == flags["reproduce"] == (True, False)
    assert flags["report"] == (True, True)  # runs after a stop, and its failure fails the job
    assert all(flags[n] == (False, False) for n in stages.ADAPTERS)


def test_every_declared_stage_with_a_module_in_the_adapter_package_is_imported() -> None:
    package = Path(stages.__file__).parent
    modules = {p.stem for p in package.glob("*.py")}
    assert set(stages.ADAPTERS) == modules & set(STAGE_ORDER)
    # ensure_serving is a shared step, not a stage.
    assert "ensure_serving" in modules and "ensure_serving" not in stages.ADAPTERS
    for name in stages.ADAPTERS:
        assert registry.REGISTRY.lookup(name) is not None


def test_the_adapters_are_loaded_when_django_starts_not_when_a_job_asks() -> None:
    # A fresh process: only django.setup() has run when the registry is read directly.
    probe_code = (
        "import django; django.setup(); "
        "from diagnostic.jobs.registry import REGISTRY; "
        "print(','.join(s.name for s in REGISTRY.stages()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe_code], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "diagnostic.settings"}, check=True,
    )
    assert out.stdout.strip().split(",") == [s.name for s in registry.all_stages()]
