"""How faithfully, and how cheaply, the simulated engine paces its tokens.

Serves the reference scenario (lab/scenarios/reference-kimi-k2-8spark.yaml) with the
out-of-box customer configuration (examples/configs/kimi-k2-8spark-outofbox.yaml:
EAGLE-3, k = 4) and streams n runs per workload (code, prose) at several dilations,
one request at a time, from a client in a separate process, measuring as the
methodology does: per-run decode rate (N - 1) / (last byte - first byte), N counted by
re-tokenizing the delivered text, converted to lab time. It prints, per workload and
dilation:

- the formula's rate (LAB_MODEL.md section 3) and the measured mean with its Student-t
  95 % interval and % error: the end-to-end check, which carries the model's own
  randomness (run factor, accepted drafts per step, the last step cut at max_tokens);
- the scheduled rate (what the server's seeded draw asked for, same N - 1 tokens over
  the same steps) and the mean % error of measured against scheduled: the pacing check,
  which isolates the simulator's wall-clock precision from that randomness;
- TTFT measured against scheduled, and the server's CPU time per streamed token.

Runs ask for the protocol's 512 tokens (2048 at dilation 100): shorter runs read low,
because the last speculative step is cut at max_tokens yet takes its full time.

Run with `make bench-sim` (about 15 minutes: dilation 1 is real time) or
`python benchmarks/bench_sim.py --quick`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from scipy import stats

from lab.clock import LabClock
from lab.engines import normalize_config
from lab.scenarios import REFERENCE, scenario_path
from lab.sim.http import ServingEngine
from lab.sim.physics import decode_plan
from lab.sim.scenario import Scenario, load_scenario
from lab.sim.tokenizer import count_tokens, default_cache_dir, ensure_tokenizer, load_tokenizer

REPO = Path(__file__).resolve().parents[1]
CONFIG_PATH = REPO / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"
WARMUP_RUNS = 2
WARMUP_TOKENS = 16

CODE_PROMPTS = [
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Implement a least-recently-used cache class with get and put.",
    "Write a function that parses ISO 8601 dates without external libraries.",
    "Refactor this loop into a list comprehension and explain the code.",
    "Write a Python script that counts word frequencies in a text file.",
    "Implement binary search over a sorted list as a function.",
    "Write a class for a thread-safe bounded queue in Python.",
    "Implement a function that flattens arbitrarily nested lists.",
    "Write a Python function to validate an IPv4 address string.",
    "Fix the bug in a function that computes a running average.",
    "Implement a trie class with insert and prefix search.",
    "Write a function that renders a table of rows as aligned text.",
    "Write a Python program that walks a directory tree and sums file sizes.",
    "Implement a token bucket rate limiter class.",
    "Write a function that converts Roman numerals to integers.",
]
PROSE_PROMPTS = [
    "Describe a walk along the harbour at dusk.",
    "Summarise the history of the printing press.",
    "Explain why the sky is blue to a curious child.",
    "Narrate the first day of a new lighthouse keeper.",
    "Explain how exceptions propagate through nested calls.",
    "Describe the changing of the seasons in a mountain valley.",
    "Summarise the arguments for and against daylight saving time.",
    "Tell the story of a letter that took fifty years to arrive.",
    "Explain how a bicycle stays upright while moving.",
    "Describe a busy market on a winter morning.",
    "Explain the difference between weather and climate.",
    "Narrate a storm seen from a small fishing boat.",
    "Summarise how bees communicate where flowers are.",
    "Describe the sounds of a city waking up.",
    "Explain how tides follow the moon.",
]


@dataclass
class Run:
    tokens: int  # N, by re-tokenizing the delivered text
    usage_tokens: int
    sent: float  # perf_counter when the request left
    first: float  # first content byte
    last: float  # last content byte


def _client(url: str, model: str, prompts: list[str], max_tokens: int, tokenizer_path: str) -> list[Run]:
    """Stream each prompt once, in order, the way the measurement protocol does."""
    tokenizer = load_tokenizer(tokenizer_path)
    runs = []
    with httpx.Client(base_url=url, timeout=600, verify=False) as client:
        for prompt in prompts:
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            pieces: list[str] = []
            first = last = 0.0
            usage = 0
            sent = time.perf_counter()
            with client.stream("POST", "/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if event.get("usage"):
                        usage = event["usage"]["completion_tokens"]
                    text = event["choices"][0]["text"] if event["choices"] else ""
                    if text:
                        now = time.perf_counter()
                        first = first or now
                        last = now
                        pieces.append(text)
            runs.append(Run(count_tokens(tokenizer, "".join(pieces)), usage, sent, first, last))
    return runs


def _client_process(args: tuple[str, str, list[str], int, str], out: Any) -> None:
    out.put(_client(*args))


def stream_in_child(
    url: str, model: str, prompts: list[str], max_tokens: int, tokenizer_path: Path
) -> list[Run]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    proc = context.Process(
        target=_client_process, args=((url, model, prompts, max_tokens, str(tokenizer_path)), queue)
    )
    proc.start()
    runs: list[Run] = queue.get()
    proc.join()
    return runs


def mean_ci(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan")
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return mean, float(half)


def bench_one(
    scenario: Scenario,
    config: dict[str, Any],
    backend: str,
    tokenizer_path: Path,
    dilation: float,
    max_tokens: int,
    n: int,
) -> list[dict[str, Any]]:
    """Both workloads at one dilation: one engine, warm-ups, then n measured runs each."""
    state = "broken" if backend in scenario.truth["fp4"]["broken"] else "ok"
    engine = ServingEngine(
        scenario=scenario,
        config=config,
        backend=backend,
        backend_state=state,
        error_rate=0.0,
        clock=LabClock(dilation, time.time()),
        log=lambda _message: None,
        tokenizer_path=tokenizer_path,
        host="127.0.0.1",
        port=0,
        seed=scenario.seed,
    )
    engine.start()
    model = engine.core.model_name
    rows = []
    try:
        for workload, prompts in (("code", CODE_PROMPTS), ("prose", PROSE_PROMPTS)):
            stream_in_child(engine.url, model, prompts[:WARMUP_RUNS], WARMUP_TOKENS, tokenizer_path)
            before = len(engine.core.history())
            cpu = time.process_time()
            runs = stream_in_child(engine.url, model, (prompts * 2)[:n], max_tokens, tokenizer_path)
            cpu = time.process_time() - cpu
            records = engine.core.history()[before:]
            plan = engine.core.plans[workload]
            measured, scheduled, pacing, ttft, ttft_scheduled = [], [], [], [], []
            for run, record in zip(runs, records, strict=True):
                steps = record.schedule.steps
                lab_rate = (run.tokens - 1) / ((run.last - run.first) * dilation)
                planned = (len(record.reply.token_ids) - 1) / (sum(s.lab_ms for s in steps[1:]) / 1000)
                measured.append(lab_rate)
                scheduled.append(planned)
                pacing.append(lab_rate / planned - 1)
                ttft.append((run.first - run.sent) * dilation)
                ttft_scheduled.append(steps[0].lab_ms / 1000)
            mean, half = mean_ci(measured)
            delivered = sum(run.tokens for run in runs)
            rows.append(
                {
                    "workload": workload,
                    "dilation": dilation,
                    "n": len(runs),
                    "max_tokens": max_tokens,
                    "formula_tps": plan.rate,
                    "measured_tps": mean,
                    "ci95_half": half,
                    "error_pct": (mean / plan.rate - 1) * 100,
                    "scheduled_tps": statistics.fmean(scheduled),
                    # How far the mean of n runs may stray from the formula by the model's
                    # own randomness alone (95 %), from the spread of the scheduled rates.
                    "sampling_pct": 1.96 * statistics.stdev(scheduled) / len(scheduled) ** 0.5
                    / plan.rate * 100,
                    "pacing_error_pct": statistics.fmean(pacing) * 100,
                    "pacing_worst_pct": max(pacing, key=abs) * 100,
                    "ttft_s": statistics.fmean(ttft),
                    "ttft_scheduled_s": statistics.fmean(ttft_scheduled),
                    "tokens_match_usage": all(run.tokens == run.usage_tokens for run in runs),
                    "cpu_us_per_token": cpu / delivered * 1e6,
                }
            )
    finally:
        engine.stop()
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'workload':8} {'dil':>4} {'n':>3} {'N':>5} {'formula':>8} {'measured':>16} {'err%':>6} "
        f"{'sched':>7} {'±samp%':>6} {'pace%':>6} {'worst%':>7} {'ttft s':>7} {'sched':>6} "
        f"{'cpu us/tok':>10} usage=N"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['workload']:8} {r['dilation']:>4g} {r['n']:>3} {r['max_tokens']:>5} "
            f"{r['formula_tps']:>8.2f} "
            f"{r['measured_tps']:>8.2f} ±{r['ci95_half']:>5.2f}  {r['error_pct']:>+6.2f} "
            f"{r['scheduled_tps']:>7.2f} {r['sampling_pct']:>6.2f} {r['pacing_error_pct']:>+6.2f} "
            f"{r['pacing_worst_pct']:>+7.2f} "
            f"{r['ttft_s']:>7.3f} {r['ttft_scheduled_s']:>6.3f} {r['cpu_us_per_token']:>10.1f} "
            f"{r['tokens_match_usage']}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=15, help="measured runs per workload (default 15)")
    parser.add_argument("--dilations", default="1,30,100", help="comma-separated (default 1,30,100)")
    parser.add_argument(
        "--tokens", default="512,512,2048", help="max_tokens per dilation, same order (default 512,512,2048)"
    )
    parser.add_argument("--quick", action="store_true", help="n=5 at dilations 30,100 only")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args(argv)
    dilations = [float(d) for d in args.dilations.split(",")]
    tokens = [int(t) for t in args.tokens.split(",")]
    if args.quick:
        args.n, dilations, tokens = 5, [30.0, 100.0], [512, 2048]
    if len(tokens) != len(dilations):
        parser.error("--tokens needs one value per dilation")

    scenario = load_scenario(scenario_path(REFERENCE))
    config = normalize_config(yaml.safe_load(CONFIG_PATH.read_text()))
    # The out-of-box configuration leaves FP4 dispatch to the engine's default rule.
    backend = str(scenario.truth["fp4"]["default_backend"])
    tokenizer_path = ensure_tokenizer(default_cache_dir())
    spec = config["speculative"]
    print(
        f"scenario {scenario.name} (seed {scenario.seed}), config {CONFIG_PATH.name}: "
        f"{spec['method']} k={spec['num_speculative_tokens']}, tp={config['parallel']['tp']}, "
        f"backend {backend}"
    )
    base = decode_plan(
        scenario.model,
        scenario.node,
        scenario.network,
        scenario.truth["decode"],
        scenario.truth["specdec"],
        1.0,
        config["parallel"]["tp"],
        config["parallel"]["pp"],
        False,
        None,
        0,
        "code",
    )
    print(f"formula without speculation: {base.rate:.2f} tok/s")
    rows: list[dict[str, Any]] = []
    for dilation, max_tokens in zip(dilations, tokens, strict=True):
        started = time.monotonic()
        rows += bench_one(scenario, config, backend, tokenizer_path, dilation, max_tokens, args.n)
        print(f"  dilation {dilation:g}: {time.monotonic() - started:.0f} s wall", file=sys.stderr)
    print()
    print_rows(rows)
    print(
        "\nerr% = measured mean vs formula; ±samp% = the 95 % band that the seeded draw alone "
        "(run factor, accepted drafts per step) puts around the formula for n runs, so an err% "
        "inside it is the model's randomness, not the simulator's timing; pace% = mean of "
        "per-run measured/scheduled - 1 (wall-clock pacing); worst% = the run furthest from "
        "its schedule."
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
