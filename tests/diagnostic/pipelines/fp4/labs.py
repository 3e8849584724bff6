"""Simulated labs for the FP4 scenario tests and the benchmark: the reference scenario
with its FP4 truth replaced, at a fast dilation, and the customer's configuration with the
load-path fixes already applied (as the FP4 stage receives it after triage)."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from diagnostic.pipelines.changes import apply_changes
from diagnostic.pipelines.fp4 import run_fp4
from diagnostic.pipelines.fp4.backends import backend_events
from lab.engines import normalize_config
from lab.session import LabSession
from lab.sim.lab import SimLab
from lab.sim.scenario import Scenario, parse_scenario
from lab.sim.tokenizer import default_cache_dir

ROOT = Path(__file__).resolve().parents[4]
REFERENCE_SCENARIO = ROOT / "lab" / "scenarios" / "reference-kimi-k2-8spark.yaml"
REFERENCE_CONFIG = ROOT / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"
DILATION = 300.0  # the stage's ~30 lab minutes in a few wall seconds; rates only need ordering


def scenario(
    *,
    default: str,
    broken: Sequence[str] = (),
    degraded: Sequence[str] = (),
    error_rate: float = 0.25,
    speed: Mapping[str, float] | None = None,
    seed: int = 7,
    dilation: float = DILATION,
    engine: Mapping[str, str] | None = None,
) -> Scenario:
    data = yaml.safe_load(REFERENCE_SCENARIO.read_text())
    if engine is not None:
        data["engine"] = dict(engine)
    data["name"] = f"fp4-{default}-{'-'.join(broken) or 'sound'}"
    data["seed"] = seed
    data["dilation"] = dilation
    data["truth"]["fp4"] = {
        "default_backend": default,
        "broken": list(broken),
        "degraded": list(degraded),
        "error_rate": error_rate,
        "speed": dict(speed or {"flashinfer_cutlass": 1.0, "cutlass": 1.0, "marlin": 1.15}),
    }
    return parse_scenario(data)


def config(*, env: Mapping[str, str] | None = None, engine: Mapping[str, str] | None = None,
           **serving: Any) -> dict[str, Any]:
    """The reference customer configuration after triage: kept JIT cache, a fast loader
    and the data-path NCCL variables, so that each restart is a short warm one (another
    engine with its own default loader)."""
    raw = yaml.safe_load(REFERENCE_CONFIG.read_text())
    needs = yaml.safe_load(REFERENCE_SCENARIO.read_text())["truth"]["load"]["rendezvous"]["needs"]
    raw = copy.deepcopy(raw)
    fast = {"jit_cache": "persisted", "load_format": "fastsafetensors"}
    if engine is not None:
        raw["engine"] = dict(engine)
        fast = {"jit_cache": "persisted"}
    raw["serving"].update({**fast, **serving})
    raw["env"] = {**needs, **(env or {})}
    return normalize_config(raw)


@contextmanager
def lab_session(scn: Scenario, state_dir: Path) -> Iterator[tuple[SimLab, LabSession]]:
    with (
        SimLab(scn, state_dir, tokenizer_cache=default_cache_dir()) as sim,
        LabSession.open(sim.inventory_path) as session,
    ):
        yield sim, session


def run_and_relaunch_tuned(tmp_path: Path, scn: Scenario, cfg: dict[str, Any]) -> dict[str, Any]:
    """run_fp4 on a fresh lab of `scn`; when it changes the configuration, start the tuned one
    and record the backends its log shows (`tuned_backends`)."""
    with lab_session(scn, tmp_path / "lab") as (_, session):
        session.launch(cfg, cold=False)
        result = run_fp4(session, cfg)
        if result["config_changes"]:
            session.launch(apply_changes(cfg, result["config_changes"]), cold=False)
            run = session.logs(since=0).text.splitlines()  # this launch's own log
            result["tuned_backends"] = [e["backend"] for e in backend_events(cfg["engine"]["name"], run)]
            result["tuned_config"] = apply_changes(cfg, result["config_changes"])
        return result
