"""The simulated lab's serving endpoint, started in-process, for measurement tests and the bench.

`sim_endpoint` brings up lab.sim.http.ServingEngine for the reference scenario and the
reference customer configuration, with the knobs the measurement cares about
(dilation, speculation, whether it sees disconnects, noise),
and hands back what a lab session would: the URL, the lab clock, the log and the
tokenizer. `expected_rate` is LAB_MODEL's formula for the same settings.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab.clock import LabClock
from lab.engines import normalize_config
from lab.sim import logfmt
from lab.sim.http import ServingEngine
from lab.sim.physics import decode_plan
from lab.sim.scenario import Scenario, parse_scenario
from lab.sim.tokenizer import ensure_tokenizer

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "lab" / "scenarios" / "reference-kimi-k2-8spark.yaml"
CONFIG = ROOT / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"
BACKEND = "cutlass"  # a correct native FP4 backend: the physics at speed factor 1.0


def tokenizer_cache() -> Path:
    return ROOT / "out" / "cache" / "sim-tokenizer"


def scenario(
    *,
    dilation: float,
    abort_on_disconnect: bool = True,
    run_sigma: float | None = None,
    step_sigma: float | None = None,
    seed: int = 7,
    log_interval_s: float = 10.0,
) -> Scenario:
    data = yaml.safe_load(SCENARIO.read_text())
    data["dilation"] = dilation
    data["seed"] = seed
    if run_sigma is not None:
        data["truth"]["decode"]["run_sigma"] = run_sigma
    if step_sigma is not None:
        data["truth"]["decode"]["step_sigma"] = step_sigma
    data["serving"] = {"abort_on_disconnect": abort_on_disconnect, "log_interval_s": log_interval_s}
    return parse_scenario(data)


def config(k: int) -> dict[str, Any]:
    raw = yaml.safe_load(CONFIG.read_text())
    raw = copy.deepcopy(raw)
    if k == 0:
        raw["speculative"] = None
    else:
        raw["speculative"]["num_speculative_tokens"] = k
    raw["serving"]["moe_backend"] = BACKEND
    return normalize_config(raw)


def expected_rate(scn: Scenario, cfg: dict[str, Any], workload: str) -> float:
    """LAB_MODEL section 3's delivered rate (tokens per lab second) for these settings."""
    spec = cfg.get("speculative")
    plan = decode_plan(
        scn.model,
        scn.node,
        scn.network,
        scn.truth["decode"],
        scn.truth["specdec"],
        float(scn.truth["fp4"]["speed"].get(BACKEND, 1.0)),
        int(cfg["parallel"]["tp"]),
        int(cfg["parallel"]["pp"]),
        bool(cfg["serving"]["enforce_eager"]),
        spec["method"] if spec else None,
        int(spec["num_speculative_tokens"]) if spec else 0,
        workload,
    )
    return plan.rate


@dataclass
class SimEndpoint:
    url: str
    clock: LabClock
    tokenizer: Path
    scenario: Scenario
    config: dict[str, Any]
    engine: ServingEngine
    log: list[str] = field(default_factory=list)
    _read: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, line: str) -> None:
        with self._lock:
            self.log.append(line)

    def log_source(self) -> list[str]:
        with self._lock:
            new = self.log[self._read :]
            self._read = len(self.log)
        return new

    def expected(self, workload: str) -> float:
        return expected_rate(self.scenario, self.config, workload)


@contextmanager
def sim_endpoint(*, dilation: float, k: int = 4, **knobs: Any) -> Iterator[SimEndpoint]:
    scn = scenario(dilation=dilation, **knobs)
    cfg = config(k)
    clock = LabClock(dilation, time.time())
    tokenizer = ensure_tokenizer(tokenizer_cache())
    holder: list[SimEndpoint] = []

    def log(message: str) -> None:
        # Stamped as the simulated engine process stamps its serving lines.
        holder[0].write(logfmt.vllm("INFO", clock.now(), "loggers.py:123", message))

    engine = ServingEngine(
        scenario=scn,
        config=cfg,
        backend=BACKEND,
        backend_state="ok",
        error_rate=0.0,
        clock=clock,
        log=log,
        tokenizer_path=tokenizer,
        host="127.0.0.1",
        port=0,
        seed=scn.seed,
    )
    endpoint = SimEndpoint(url="", clock=clock, tokenizer=tokenizer, scenario=scn, config=cfg, engine=engine)
    holder.append(endpoint)
    engine.start()
    endpoint.url = engine.url
    try:
        yield endpoint
    finally:
        engine.stop()


def main() -> None:
    """Serve the simulated endpoint in its own process (the benchmark's server); prints one JSON line."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--dilation", type=float, required=True)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quiet", action="store_true", help="run_sigma and step_sigma 0")
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    knobs: dict[str, Any] = {"seed": args.seed}
    if args.quiet:
        knobs.update(run_sigma=0.0, step_sigma=0.0)
    with sim_endpoint(dilation=args.dilation, k=args.k, **knobs) as sim:
        print(
            json.dumps(
                {
                    "url": sim.url,
                    "tokenizer": str(sim.tokenizer),
                    "dilation": sim.clock.dilation,
                    "origin": sim.clock.origin,
                    "expected": {w: sim.expected(w) for w in ("code", "prose")},
                }
            ),
            flush=True,
        )
        time.sleep(args.seconds)


if __name__ == "__main__":
    main()
