"""A simulated lab for the gap stage's tests and benchmark: the reference scenario at a
high dilation, the reference configuration with every earlier stage's fix (the lab's own
best, as a calibration would leave it), and that configuration's measured rates and cold
starts as a `lab.baseline/1` file would hold them. Tests change one or two fields of the
baseline configuration the four pipelines do not look at and check what the stage finds."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from diagnostic.pipelines.gap import GapBaseline
from diagnostic.pipelines.specdec.pipeline import CONFIRM
from lab.engines import normalize_config
from lab.session import LabSession

REPO = Path(__file__).resolve().parents[4]
SCENARIO = REPO / "lab" / "scenarios" / "reference-kimi-k2-8spark.yaml"
CONFIG = REPO / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"
# Lab seconds per wall second: 80, not 120, since a busy CI machine's stall during a
# 192-token run once left eager mode's 2x cost unproved at 120.
DILATION = 80


def scenario_file(tmp: Path, *, seed: int = 7, dilation: float = DILATION) -> Path:
    data: dict[str, Any] = yaml.safe_load(SCENARIO.read_text())
    data["dilation"] = dilation
    data["seed"] = seed
    path = tmp / f"gap-{seed}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def best_config() -> dict[str, Any]:
    """The reference lab's best: the reference configuration with the loading, FP4 and
    interface fixes and EAGLE-3 k = 3."""
    raw = copy.deepcopy(yaml.safe_load(CONFIG.read_text()))
    raw["serving"].update(safetensors_load_strategy="eager", jit_cache="persisted", moe_backend="cutlass")
    raw["env"] = {"NCCL_SOCKET_IFNAME": "enP7s7", "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0"}
    raw["speculative"]["num_speculative_tokens"] = 3
    return normalize_config(raw)


def variant(**changes: Any) -> dict[str, Any]:
    """The best configuration with dotted fields changed (`serving__enforce_eager=True`;
    `extra_args=[...]` replaces the list)."""
    raw = best_config()
    for key, value in changes.items():
        parts = key.split("__")
        node = raw
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return normalize_config(raw)


def measure_baseline(session: LabSession, config: dict[str, Any], *, cold: int = 2) -> GapBaseline:
    """What calibration keeps: the configuration's true cold starts and its n = 15 rates."""
    from diagnostic.pipelines.measure.protocol import measure_on_session
    from diagnostic.pipelines.stats import summarize

    # The first start with a kept JIT cache still compiles (LAB_MODEL section 5): calibration's
    # starts are the ones after it.
    session.launch(config, cold=False)
    starts = [float(session.launch(config, cold=True).cold_start_s) for _ in range(cold)]
    result = measure_on_session(session, engine="vllm", version=config["engine"]["version"],
                                workloads=tuple(config["workloads"]), n=CONFIRM.n, warmup=CONFIRM.warmup,
                                max_tokens=CONFIRM.max_tokens)
    rates = {}
    for w in config["workloads"]:
        s = summarize(result[w]["decode"]["samples"])
        rates[w] = {"n": s["n"], "mean_tps": s["mean"], "ci95": s["ci95"], "samples": s["samples"]}
    return GapBaseline(source="calibrate", config=config, version=1, made_at="2026-12-05T10:00:00Z",
                       rates=rates, cold_start={"n": len(starts), "mean_s": sum(starts) / len(starts),
                                                "samples": starts})
