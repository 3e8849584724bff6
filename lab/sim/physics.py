"""Decode physics of the simulated lab: LAB_MODEL.md section 3, as code.

`decode_plan` turns a scenario's hardware, model and truth figures plus a serving
configuration into the per-step timings and expected rates the spec defines;
`sample_request` draws one request's step schedule from them (run and step lognormal
factors, accepted draft prefixes). Everything takes plain values so that tests, the
benchmark and outside checks can compute the same figures the server obeys.

Units: times in milliseconds (lab time) unless a name says `_s`; rates in tokens per
lab second; bandwidth in GB/s; latencies in the scenario's microseconds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# A layout with a single tensor-parallel rank reads its own experts only, so the
# expert-parallel imbalance (the busiest rank sets the pace) does not apply.
_SINGLE_RANK_IMBALANCE = 1.0


@dataclass(frozen=True)
class DecodePlan:
    """Per-step timings and expected rates of one serving configuration (batch 1)."""

    t_mem: float  # ms, weight streaming for one token
    t_comm: float  # ms, collectives and pipeline hops for one token
    t_step: float  # ms, one plain decode step (one token)
    t_verify: float  # ms, one verification step over k draft positions
    t_draft: float  # ms, drafting k tokens
    k: int  # draft tokens per step; 0 without speculation
    method: str | None
    workload: str
    acceptance: tuple[float, ...]  # conditional acceptance per draft position, length k
    expected_emitted: float  # E(k), tokens emitted per step

    @property
    def step_ms(self) -> float:
        """Duration of one decode step: verification plus drafting."""
        return self.t_verify + self.t_draft

    @property
    def rate(self) -> float:
        """Delivered decode rate in tokens per lab second, E(k) / step time."""
        return self.expected_emitted / self.step_ms * 1000.0

    @property
    def proposed_rate(self) -> float:
        """What a server counting every verified position (k + 1 per step) claims."""
        return (self.k + 1) / self.step_ms * 1000.0


def expected_emitted(acceptance: Sequence[float]) -> float:
    """E(k) = 1 + sum_j prod_{i<=j} a_i: the bonus token plus the accepted prefix."""
    total = 1.0
    prefix = 1.0
    for a in acceptance:
        prefix *= a
        total += prefix
    return total


def acceptance_for(specdec: Mapping[str, Any], method: str, workload: str, k: int) -> tuple[float, ...]:
    """The first k per-position acceptances; positions beyond the list accept nothing."""
    listed = list(specdec["acceptance"][method][workload])
    padded = listed[:k] + [0.0] * max(0, k - len(listed))
    return tuple(float(a) for a in padded)


def decode_plan(
    model: Mapping[str, Any],
    node: Mapping[str, Any],
    network: Mapping[str, Any],
    decode: Mapping[str, Any],
    specdec: Mapping[str, Any],
    fp4_speed: float,
    tp: int,
    pp: int,
    enforce_eager: bool,
    method: str | None,
    k: int,
    workload: str,
) -> DecodePlan:
    """LAB_MODEL section 3 for one layout, FP4 backend, speculation setting and workload.

    `fp4_speed` multiplies t_mem (section 6). `method=None` or `k=0` means no
    speculation. Raises ValueError for a layout or method the formulas cannot price.
    """
    if tp < 1 or pp < 1:
        raise ValueError(f"parallel layout: tp and pp must be at least 1, got tp={tp}, pp={pp}")
    if k < 0:
        raise ValueError(f"num_speculative_tokens: must be 0 or more, got {k}")
    bw = float(node["mem_bw_gbs"]) * float(node["mem_bw_efficiency"])
    imbalance = _SINGLE_RANK_IMBALANCE if tp == 1 else float(decode["ep_imbalance"])
    t_mem = float(model["decode_bytes_per_token_gb"]) * imbalance / (tp * bw) * 1000.0
    t_mem *= fp4_speed
    t_comm = (pp - 1) * float(network["hop_latency_us"]) / 1000.0
    if tp > 1:
        t_comm += (
            int(model["layers"])
            * float(decode["collectives_per_layer"])
            * float(network["collective_latency_us"])
            / 1000.0
        )
    t_step = t_mem + t_comm + float(decode["step_overhead_ms"])
    if enforce_eager:
        t_step += float(decode["eager_penalty_ms"])

    if method is None or k == 0:
        return DecodePlan(
            t_mem=t_mem,
            t_comm=t_comm,
            t_step=t_step,
            t_verify=t_step,
            t_draft=0.0,
            k=0,
            method=None,
            workload=workload,
            acceptance=(),
            expected_emitted=1.0,
        )
    if method not in specdec["draft_ms"] or method not in specdec["acceptance"]:
        known = sorted(set(specdec["draft_ms"]) & set(specdec["acceptance"]))
        raise ValueError(f"speculative.method: no draft model for {method!r}; known: {known}")
    acceptance = acceptance_for(specdec, method, workload, k)
    return DecodePlan(
        t_mem=t_mem,
        t_comm=t_comm,
        t_step=t_step,
        t_verify=t_step * (1.0 + float(decode["verify_growth"]) * k),
        t_draft=k * float(specdec["draft_ms"][method]),
        k=k,
        method=method,
        workload=workload,
        acceptance=acceptance,
        expected_emitted=expected_emitted(acceptance),
    )


def ttft_ms(prompt_tokens: int, prefill_tps: float, t_step: float) -> float:
    """Time to first token, lab ms: prefill of the prompt plus one plain step."""
    return prompt_tokens / prefill_tps * 1000.0 + t_step


@dataclass(frozen=True)
class Step:
    """One scheduled engine step of a request: how long it takes and what it emits."""

    lab_ms: float
    emitted: int  # tokens delivered to the client by this step
    accepted: int  # draft tokens accepted (before truncation at max_tokens)
    drafted: int  # draft tokens proposed (k, or 0 for the prefill step)


@dataclass(frozen=True)
class RequestSchedule:
    run_factor: float  # the run's rate multiplier, exp(N(0, run_sigma))
    steps: tuple[Step, ...]  # the first step is prefill and emits the first token

    @property
    def ttft_ms(self) -> float:
        return self.steps[0].lab_ms if self.steps else 0.0

def sample_accepted(acceptance: Sequence[float], rng: random.Random) -> int:
    """Length of the accepted draft prefix: stop at the first rejected position."""
    accepted = 0
    for a in acceptance:
        if rng.random() >= a:
            break
        accepted += 1
    return accepted


class StepSampler:
    """Draws one request's steps one at a time, so a server can start pacing the first
    token before the rest are drawn; `sample_request` draws them all at once.

    The prefill step (prompt prefill plus one plain step, the TTFT formula) delivers
    the first token, as an engine's first forward pass does; each later step delivers
    1 + the accepted draft prefix, cut at the token budget, so the last step may
    deliver fewer than it verified but still takes its full time. The run factor
    divides every decode step's duration (it multiplies the rate); each step's
    duration is also multiplied by its own exp(N(0, step_sigma)).
    """

    def __init__(
        self,
        plan: DecodePlan,
        *,
        tokens: int,
        prompt_tokens: int,
        prefill_tps: float,
        run_sigma: float,
        step_sigma: float,
        rng: random.Random,
    ) -> None:
        self.plan = plan
        self.tokens = tokens
        self.prefill_ms = prompt_tokens / prefill_tps * 1000.0
        self.step_sigma = step_sigma
        self.rng = rng
        self.run_factor = math.exp(rng.gauss(0.0, run_sigma))

    def __iter__(self) -> Iterator[Step]:
        plan, rng = self.plan, self.rng
        if self.tokens <= 0:
            # Prompt log-probabilities only (echo with max_tokens 0): a prefill, no token.
            yield Step(lab_ms=self.prefill_ms, emitted=0, accepted=0, drafted=0)
            return
        first = self.prefill_ms + plan.t_step * math.exp(rng.gauss(0.0, self.step_sigma)) / self.run_factor
        yield Step(lab_ms=first, emitted=1, accepted=0, drafted=0)
        remaining = self.tokens - 1
        while remaining > 0:
            accepted = sample_accepted(plan.acceptance, rng)
            emitted = min(1 + accepted, remaining)
            duration = plan.step_ms * math.exp(rng.gauss(0.0, self.step_sigma)) / self.run_factor
            yield Step(lab_ms=duration, emitted=emitted, accepted=accepted, drafted=plan.k)
            remaining -= emitted


def sample_request(
    plan: DecodePlan,
    *,
    tokens: int,
    prompt_tokens: int,
    prefill_tps: float,
    run_sigma: float,
    step_sigma: float,
    rng: random.Random,
) -> RequestSchedule:
    """Draw all the steps that deliver `tokens` tokens for one request (see StepSampler)."""
    sampler = StepSampler(
        plan,
        tokens=tokens,
        prompt_tokens=prompt_tokens,
        prefill_tps=prefill_tps,
        run_sigma=run_sigma,
        step_sigma=step_sigma,
        rng=rng,
    )
    return RequestSchedule(sampler.run_factor, tuple(sampler))


def kv_bytes_per_token(model: Mapping[str, Any], kv_cache_dtype: str) -> float:
    """KV bytes per token for the cache dtype; bf16 (and `auto`) double fp8's bytes."""
    raw = model["kv_bytes_per_token"]
    if isinstance(raw, Mapping):
        key = "fp8" if kv_cache_dtype == "fp8" else "bf16"
        return float(raw[key])
    return float(raw) if kv_cache_dtype == "fp8" else 2.0 * float(raw)


# What the engine keeps back from its memory share besides weights and KV: activations,
# CUDA graphs, the draft model. A fixed figure; the scenario does not model it.
_RUNTIME_RESERVE_GIB = 4.0


def kv_capacity_tokens(
    model: Mapping[str, Any],
    node: Mapping[str, Any],
    *,
    nodes_used: int,
    pp: int,
    gpu_memory_utilization: float,
    kv_cache_dtype: str,
) -> int:
    """Tokens the KV cache holds: the node's memory share minus weights, over KV bytes.

    MLA's latent cache is replicated across a stage's tensor-parallel ranks, so each
    node holds every token for its own stage's layers (1/pp of the KV bytes).
    """
    gib = 1024**3
    budget = float(node["mem_gib"]) * gpu_memory_utilization * gib
    weights = float(model["checkpoint_gb"]) * 1e9 / nodes_used
    free = budget - weights - _RUNTIME_RESERVE_GIB * gib
    per_token = kv_bytes_per_token(model, kv_cache_dtype) / pp
    return max(0, int(free / per_token))
