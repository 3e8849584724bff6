"""The native context: which length a configuration must hold, the memory settings that hold
it, and the proof that they do (METHODOLOGY.md, "Context is a requirement").

The target is the model's native context (its profile in the lab's catalog) unless the
customer stated a shorter requirement (`requirements.max_context` of diagnostic.config/1): a
`max_model_len` below native that nobody asked for costs the customer the long requests the
model can serve, so it is a setting to change, not a constraint to keep.

Whether a length fits is reasoned from the engine's own figures, never from the simulator's:
the KV memory it had and what one token takes (its refusal to start, or the capacity lines it
writes after a start), the weights it loaded, and the nodes' memory as the lab's facts give it.
Two facts of the lab carry the rest: an fp8 KV cache takes the profile's fp8 bytes per token
(half of bf16 for the models the lab holds), and the KV memory grows with
gpu_memory_utilization by the memory the fraction is taken of. That memory is inferred from
the one start the engine reported on, as (KV memory + weights) / fraction: the engine's other
reserves (activations, graphs) are folded into it, so the inferred memory is a lower bound and
every gain predicted from a higher fraction is one the engine gives at least. The fraction's
ceiling is what the node leaves free with no engine running, less a share kept for the system,
as a fraction of that memory.

A prediction is not a finding: `native_request` is the proof, one request of the whole length
(prompt and output together) served by an engine started at that length. It is sent once per
proof; its prefill is most of its lab time.

No Django here; the stage (diagnostic.jobs.reproduce) does the starts and the findings.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import tiktoken
from tokenizers import Tokenizer

from diagnostic.pipelines.client import bearer_headers, normalize_endpoint
from diagnostic.pipelines.tokens import KIMI_PAT_STR, read_tiktoken_ranks
from lab.catalog import ModelProfile
from lab.engines import parse_log

GIB = 1024**3
GB = 1e9  # the catalog's sizes (checkpoint_gb) are decimal gigabytes
# gpu_memory_utilization is proposed in hundredths, rounded up: the engine takes the
# fraction as given, and a customer reads 0.92 more easily than 0.9137.
UTILIZATION_STEP = 0.01
# The field's own bound (lab.config: a fraction in (0, 1]).
MAX_UTILIZATION = 1.0
# Of the node's memory, the share a proposed fraction leaves to the system beyond what it
# already uses with no engine running (the agent, page cache the engine's loader needs,
# a shell): a unified-memory node that gives the engine all of it swaps or kills.
SYSTEM_RESERVE_SHARE = 0.05
# Predicted KV memory must exceed what the target needs by this much: the engine rounds its
# figures to hundredths of a GiB.
FIT_MARGIN_GIB = 0.05
# The proof request's output: enough tokens to show decoding at the full length, few enough
# that prefill is its whole cost. Its prompt is the rest of the length.
PROOF_OUTPUT_TOKENS = 16
# A proof request's prompt and output may fall short of the length by this much (a server
# that counts a BOS token of its own) and still count as the whole length.
PROOF_SLACK_TOKENS = 8
# Lab seconds a proof request may take: its prefill at the reference lab's rate is ~290.
PROOF_TIMEOUT_LAB_S = 3600.0
PROOF_MIN_WALL_S = 30.0
# What the proof prompt repeats: ordinary prose, so no token is a special one.
FILLER_TEXT = ("The report states every figure once, with the measurement behind it, and the "
               "customer reads why each change was made and what it bought. ")


def kv_dtype(config: Mapping[str, Any]) -> str:
    """The KV cache dtype a configuration runs: fp8, or bf16 for `auto`/`bf16` (the models
    the lab holds keep their KV cache in bf16 unless told otherwise)."""
    return "fp8" if config["serving"]["kv_cache_dtype"] == "fp8" else "bf16"


@dataclass(frozen=True)
class ContextTarget:
    """The length a configuration should hold: `native` from the catalog, `required` from the
    customer's requirements, `configured` its max_model_len; `target` the shorter of the
    first two (the configured length when neither is known)."""

    native: int | None
    required: int | None
    configured: int
    target: int

    @property
    def below(self) -> bool:
        return self.configured < self.target

    @property
    def reason(self) -> str:
        if self.required is not None and self.required == self.target:
            return "the customer's requirement, requirements.max_context"
        if self.native is not None and self.native == self.target:
            return "the model's native context, from the lab's catalog"
        return "the configured max_model_len: no native context or requirement is known"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "reason": self.reason}


def context_target(config: Mapping[str, Any], profile: ModelProfile | None) -> ContextTarget:
    """The target length of `config`: native unless the customer asked for less. A
    requirement above native is held to native (no longer context than the model has)."""
    native = profile.max_context if profile is not None else None
    required = (config.get("requirements") or {}).get("max_context")
    configured = int(config["serving"]["max_model_len"])
    known = [int(v) for v in (native, required) if v]
    return ContextTarget(native, int(required) if required else None, configured,
                         min(known) if known else configured)


@dataclass(frozen=True)
class EngineKv:
    """What the engine said about its KV cache on one start: the fraction and dtype it ran
    with, the KV memory it had (GiB), the bytes one token took, the weights it loaded (GiB a
    node), and whether it said so refusing to start (`refusal`) or after starting
    (`capacity`)."""

    utilization: float
    dtype: str
    available_gib: float
    bytes_per_token: float
    weights_gib: float
    said: str
    tokens: int | None = None

    @property
    def base_gib(self) -> float:
        """The memory gpu_memory_utilization is a fraction of, as this start implies it (a
        lower bound: the engine's other reserves are counted in the weights' stead)."""
        return (self.available_gib + self.weights_gib) / self.utilization

    def available_at(self, utilization: float) -> float:
        """KV memory (GiB) at another fraction, all else as on this start."""
        return self.available_gib + (utilization - self.utilization) * self.base_gib

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["base_gib"] = round(self.base_gib, 2)
        out["bytes_per_token"] = round(self.bytes_per_token, 1)
        return out


def profile_weights_gib(profile: ModelProfile | None, nodes: int) -> float | None:
    """The checkpoint's share of a node in GiB, from the catalog's profile."""
    share = profile.weights_per_node_gb(nodes) if profile is not None else None
    return share * GB / GIB if share is not None else None


def logged_weights_gib(log_text: str, engine: str) -> float | None:
    """The weights the engine says it loaded on a node (vLLM's "Model loading took X GiB",
    SGLang's "mem usage=X GB" at its weights' end, which it counts in GiB)."""
    found = None
    for event in parse_log(engine, log_text.splitlines()):
        if event["kind"] == "model_loaded" and event.get("memory_gib"):
            found = float(event["memory_gib"])
        elif event["kind"] == "weights_loaded" and event.get("memory_gb"):
            found = float(event["memory_gb"])
    return found


def _bytes_ratio(profile: ModelProfile | None, to: str, frm: str) -> float:
    """How many times the bytes of a `frm` token a `to` token takes: the profile's figures,
    else the lab's fact that fp8 takes half of bf16."""
    if to == frm:
        return 1.0
    if profile is not None and profile.kv_bytes_per_token is not None:
        return profile.kv_bytes_per_token[to] / profile.kv_bytes_per_token[frm]
    return 0.5 if to == "fp8" else 2.0


def kv_from_refusal(kv: Mapping[str, Any], config: Mapping[str, Any], *, weights_gib: float,
                    profile: ModelProfile | None) -> EngineKv | None:
    """The engine's refusal (reproduce.kv_budget_evidence) as KV figures: the memory it
    needed for max_model_len gives the bytes a token takes. The V0 wording names only the
    tokens that fit; the profile's bytes per token then give the memory. None when neither
    is there."""
    dtype = kv_dtype(config)
    utilization = float(config["serving"]["gpu_memory_utilization"])
    needed, length = kv.get("kv_needed_gib"), kv.get("max_model_len")
    available = kv.get("kv_available_gib")
    if needed and length and available is not None:
        return EngineKv(utilization, dtype, float(available), float(needed) * GIB / int(length),
                        weights_gib, "refusal")
    estimated = kv.get("estimated_max_model_len")
    if estimated and profile is not None and profile.kv_bytes_per_token is not None:
        per_token = float(profile.kv_bytes_per_token[dtype])
        return EngineKv(utilization, dtype, int(estimated) * per_token / GIB, per_token, weights_gib,
                        "refusal", tokens=int(estimated))
    return None


def capacity_lines(log_text: str, engine: str) -> list[str]:
    """The lines in which the engine states its KV cache after starting, as it wrote them."""
    lines = log_text.splitlines()
    return [lines[int(e["line"]) - 1].strip() for e in parse_log(engine, lines)
            if e["kind"] == "kv_cache" and 0 < int(e.get("line") or 0) <= len(lines)]


def kv_from_log(log_text: str, config: Mapping[str, Any], *, engine: str, weights_gib: float,
                profile: ModelProfile | None) -> EngineKv | None:
    """The KV cache a started engine reports: vLLM's "Available KV cache memory: X GiB" and
    "... KV cache size: N tokens", SGLang's "KV cache allocated ... #tokens: N, KV size: X GB"
    (SGLang's GB are GiB). Without the memory figure, the profile's bytes per token give it;
    None when the log holds no token count."""
    lines = log_text.splitlines()
    tokens: int | None = None
    available: float | None = None
    for event in parse_log(engine, lines):
        if event["kind"] != "kv_cache":
            continue
        if event.get("tokens") is not None:
            tokens = int(event["tokens"])
            raw = lines[int(event["line"]) - 1] if 0 < int(event.get("line") or 0) <= len(lines) else ""
            if engine == "sglang" and (m := re.search(r"KV size: ([\d.]+) GB", raw)):
                available = float(m[1])
            elif engine == "sglang" and (parts := re.findall(r"[KV] size: ([\d.]+) GB", raw)):
                available = sum(float(p) for p in parts)
        if event.get("available_gib") is not None:
            available = float(event["available_gib"])
    if not tokens:
        return None
    dtype = kv_dtype(config)
    if available is None:
        if profile is None or profile.kv_bytes_per_token is None:
            return None
        available = tokens * float(profile.kv_bytes_per_token[dtype]) / GIB
    return EngineKv(float(config["serving"]["gpu_memory_utilization"]), dtype, available,
                    available * GIB / tokens, weights_gib, "capacity", tokens=tokens)


@dataclass(frozen=True)
class NodeMemory:
    """The smallest of the used nodes' memory (GiB) as their facts gave it with no engine
    running: MemTotal and MemAvailable (GB10's memory is unified: /proc/meminfo decides)."""

    total_gib: float
    available_gib: float

    def as_dict(self) -> dict[str, float]:
        return {"total_gib": round(self.total_gib, 2), "available_gib": round(self.available_gib, 2)}


def node_memory(facts: Iterable[Mapping[str, Any]]) -> NodeMemory | None:
    """The smallest node's memory from agent facts (mem_total_kib, mem_available_kib)."""
    totals, available = [], []
    for f in facts:
        total, free = int(f.get("mem_total_kib") or 0), int(f.get("mem_available_kib") or 0)
        if total > 0 and free > 0:
            totals.append(total)
            available.append(free)
    if not totals:
        return None
    return NodeMemory(min(totals) / 1024**2, min(available) / 1024**2)


def utilization_ceiling(kv: EngineKv, memory: NodeMemory | None) -> tuple[float, str]:
    """The highest gpu_memory_utilization the node allows, and why: the fraction of the
    engine's memory base that fits in what the node leaves free less the system's share,
    in hundredths, never below the customer's own fraction (which the node ran) nor above
    the field's bound. Without node facts, the customer's fraction."""
    if memory is None:
        return kv.utilization, "no node memory facts: the configured fraction is the ceiling"
    usable = memory.available_gib - SYSTEM_RESERVE_SHARE * memory.total_gib
    raw = usable / kv.base_gib
    ceiling = min(MAX_UTILIZATION, math.floor(raw / UTILIZATION_STEP + 1e-9) * UTILIZATION_STEP)
    ceiling = round(max(kv.utilization, ceiling), 2)
    why = (f"{memory.available_gib:.1f} GiB free on the node with no engine running, less "
           f"{SYSTEM_RESERVE_SHARE:.0%} of its {memory.total_gib:.1f} GiB for the system, is {raw:.2f} of "
           f"the {kv.base_gib:.1f} GiB the engine's fraction is taken of")
    if raw > MAX_UTILIZATION:
        why += f" (the fraction's own bound is {MAX_UTILIZATION:g})"
    return ceiling, why


def _fraction_for(kv: EngineKv, needed_gib: float) -> float:
    """The smallest fraction (in hundredths, at least the configured one) whose KV memory
    holds `needed_gib` with the margin."""
    if kv.available_gib >= needed_gib + FIT_MARGIN_GIB:
        return kv.utilization
    raw = kv.utilization + (needed_gib + FIT_MARGIN_GIB - kv.available_gib) / kv.base_gib
    return round(math.ceil(raw / UTILIZATION_STEP - 1e-9) * UTILIZATION_STEP, 2)


def plan_fit(kv: EngineKv, *, target: int, memory: NodeMemory | None, profile: ModelProfile | None,
             nodes: int, lab_nodes: int | None = None) -> dict[str, Any]:
    """How `target` tokens fit, from what the engine said (`kv`) and the node's memory.

    Options in order of the least change: as configured; an fp8 KV cache at the configured
    fraction; an fp8 KV cache with the lowest fraction that holds it; the configured dtype
    with the lowest fraction. The first within the ceiling is `settings` (the fields to
    change, {} when it fits as configured); the others that fit are `alternatives`. When none
    fits, `settings` is None and `would_fit` says what would (`what_would_fit`)."""
    ceiling, ceiling_why = utilization_ceiling(kv, memory)

    def needed(dtype: str) -> float:
        return target * kv.bytes_per_token * _bytes_ratio(profile, dtype, kv.dtype) / GIB

    candidates: list[tuple[str, float]] = [(kv.dtype, kv.utilization)]
    if kv.dtype != "fp8":
        candidates.append(("fp8", kv.utilization))
    candidates.append(("fp8", _fraction_for(kv, needed("fp8"))))
    if kv.dtype != "fp8":
        candidates.append((kv.dtype, _fraction_for(kv, needed(kv.dtype))))
    options: list[dict[str, Any]] = []
    for dtype, fraction in dict.fromkeys(candidates):
        predicted = kv.available_at(fraction)
        options.append({
            "kv_cache_dtype": dtype, "gpu_memory_utilization": fraction,
            "needed_gib": round(needed(dtype), 2), "predicted_kv_gib": round(predicted, 2),
            "fits": predicted >= needed(dtype) + FIT_MARGIN_GIB - 1e-9 and fraction <= ceiling + 1e-9,
        })
    fitting = [o for o in options if o["fits"]]
    plan: dict[str, Any] = {
        "target": target,
        "engine": kv.as_dict(),
        "ceiling": {"gpu_memory_utilization": ceiling, "why": ceiling_why,
                    **({"node_memory": memory.as_dict()} if memory is not None else {})},
        "options": options,
        "settings": None,
        "alternatives": [],
        "would_fit": None,
    }
    if fitting:
        chosen = fitting[0]
        settings: dict[str, Any] = {}
        if chosen["kv_cache_dtype"] != kv.dtype:
            settings["kv_cache_dtype"] = chosen["kv_cache_dtype"]
        if chosen["gpu_memory_utilization"] != kv.utilization:
            settings["gpu_memory_utilization"] = chosen["gpu_memory_utilization"]
        plan["settings"] = settings
        plan["chosen"] = chosen
        plan["alternatives"] = fitting[1:]
        return plan
    plan["would_fit"] = what_would_fit(kv, target=target, ceiling=ceiling, profile=profile, nodes=nodes,
                                       lab_nodes=lab_nodes)
    return plan


def what_would_fit(kv: EngineKv, *, target: int, ceiling: float, profile: ModelProfile | None,
                   nodes: int, lab_nodes: int | None) -> dict[str, Any]:
    """When nothing fits: the longest context these nodes hold (fp8 KV at the ceiling), the
    node count whose weights share leaves room for the target (tensor parallel: MLA's KV
    cache is whole on every node), and the most weights a node may hold for it."""
    fp8_bytes = kv.bytes_per_token * _bytes_ratio(profile, "fp8", kv.dtype)
    needed = target * fp8_bytes / GIB
    budget = ceiling * kv.base_gib  # weights + KV at the ceiling
    longest = max(0, int(kv.available_at(ceiling) * GIB / fp8_bytes))
    room = budget - needed  # what a node's weights may take
    total_weights = kv.weights_gib * nodes
    out: dict[str, Any] = {
        "kv_cache_dtype": "fp8", "gpu_memory_utilization": ceiling,
        "longest_context": longest, "needed_gib": round(needed, 2),
        "weights_per_node_gib": round(kv.weights_gib, 2),
        "max_weights_per_node_gib": round(room, 2) if room > 0 else 0.0,
        "max_weights_per_node_gb": round(room * GIB / GB, 1) if room > 0 else 0.0,
        "nodes": nodes, "nodes_needed": None, "lab_nodes": lab_nodes,
    }
    if room > 0:
        out["nodes_needed"] = max(nodes + 1, math.ceil(total_weights / room - 1e-9))
    return out


def would_fit_words(would: Mapping[str, Any], target: int) -> str:
    """`what_would_fit` as a sentence a customer reads."""
    parts = [f"These nodes hold at most {would['longest_context']:,} tokens (an fp8 KV cache at "
             f"gpu_memory_utilization {would['gpu_memory_utilization']:g})."]
    if would.get("nodes_needed"):
        lab = would.get("lab_nodes")
        has = "" if lab is None else (" (this lab has them)" if lab >= would["nodes_needed"]
                                      else f" (this lab has {lab})")
        parts.append(f"{target:,} tokens fit on {would['nodes_needed']} nodes{has}, or with at most "
                     f"{would['max_weights_per_node_gb']:g} GB of weights a node (now "
                     f"{would['weights_per_node_gib'] * GIB / GB:.1f} GB): a smaller quantization or "
                     "more nodes.")
    else:
        parts.append(f"{target:,} tokens need {would['needed_gib']:g} GiB of fp8 KV cache a node, more "
                     "than a node's memory leaves at any weight share.")
    return " ".join(parts)


def settings_words(settings: Mapping[str, Any]) -> str:
    words = []
    if "kv_cache_dtype" in settings:
        words.append(f"an {settings['kv_cache_dtype']} KV cache")
    if "gpu_memory_utilization" in settings:
        words.append(f"gpu_memory_utilization {settings['gpu_memory_utilization']:g}")
    return " and ".join(words) or "the configured memory settings"


# -- the proof --------------------------------------------------------------------------------

def filler_token_ids(tokenizer_path: str | Path) -> list[int]:
    """Token ids of FILLER_TEXT in the model's own tokenizer (a HuggingFace tokenizer.json,
    or Kimi's tiktoken.model), so that the proof prompt holds only ordinary tokens."""
    path = Path(tokenizer_path)
    if path.suffix == ".json":
        return list(Tokenizer.from_file(str(path)).encode(FILLER_TEXT, add_special_tokens=False).ids)
    encoding = tiktoken.Encoding(name=path.name, pat_str=KIMI_PAT_STR,
                                 mergeable_ranks=read_tiktoken_ranks(path), special_tokens={})
    return list(encoding.encode_ordinary(FILLER_TEXT))


def native_request(endpoint: str, *, length: int, tokenizer_path: str | Path, api_key: str | None,
                   lab_now: Callable[[], float], wall_timeout_s: float,
                   output_tokens: int = PROOF_OUTPUT_TOKENS) -> dict[str, Any]:
    """Send one completion whose prompt and output fill `length` tokens (the prompt as token
    ids, the output held to `output_tokens` with ignore_eos) and say what the engine did:
    `served` when it answered with usage that reaches the length within PROOF_SLACK_TOKENS.
    Lab seconds are read on the lab's clock around the request."""
    ids = filler_token_ids(tokenizer_path)
    prompt_len = length - output_tokens
    prompt = (ids * (prompt_len // len(ids) + 1))[:prompt_len]
    base = normalize_endpoint(endpoint)
    out: dict[str, Any] = {"max_model_len": length, "prompt_tokens_sent": prompt_len,
                           "max_tokens": output_tokens, "served": False}
    began_lab, began_wall = lab_now(), time.monotonic()
    try:
        with httpx.Client(base_url=base, headers=bearer_headers(api_key), trust_env=False,
                          timeout=httpx.Timeout(wall_timeout_s, connect=10.0)) as http:
            listed = http.get("/v1/models").json().get("data") or []
            model = str(listed[0]["id"]) if listed else ""
            response = http.post("/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": output_tokens, "ignore_eos": True,
                "temperature": 0, "stream": False})
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        out.update(error=f"{type(exc).__name__}: {exc}"[:300], lab_s=round(lab_now() - began_lab, 1))
        return out
    out["lab_s"] = round(lab_now() - began_lab, 1)
    out["wall_s"] = round(time.monotonic() - began_wall, 2)
    out["status"] = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code != 200 or not isinstance(body, dict):
        out["error"] = response.text[:300]
        return out
    usage = body.get("usage") or {}
    prompt_tokens = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    choices = body.get("choices") or [{}]
    out.update(prompt_tokens=prompt_tokens, completion_tokens=completion,
               total_tokens=prompt_tokens + completion,
               finish_reason=(choices[0] or {}).get("finish_reason"))
    out["served"] = completion >= 1 and prompt_tokens + completion >= length - PROOF_SLACK_TOKENS
    if not out["served"]:
        out["error"] = (f"the engine served {prompt_tokens:,} + {completion:,} tokens, short of "
                        f"{length:,}")
    return out


def section_view(record: Mapping[str, Any]) -> dict[str, Any]:
    """Reproduce's context record (its result's `context`) in the shape the gap section
    carries (`diagnostic.gap/1` "context"): native, target and the customer's length, whether
    the target fits (None when nothing was needed or known), the proved settings and the
    proof's request and lab seconds."""
    target = record.get("target") or {}
    proof = record.get("proof")
    if proof is not None:
        fits: bool | None = bool(proof.get("served"))
    elif (record.get("plan") or {}).get("would_fit") or record.get("tried") or record.get("shortened_to"):
        fits = False
    else:
        fits = None if target.get("configured", 0) < target.get("target", 0) else True
    return {
        "native": target.get("native"), "target": target.get("target"), "customer": target.get("configured"),
        "required": target.get("required"), "fits": fits, "settings": record.get("settings"),
        "proof": None if proof is None else {k: proof.get(k) for k in (
            "max_model_len", "prompt_tokens", "completion_tokens", "total_tokens", "lab_s", "engine_lines")},
        "shortened_to": record.get("shortened_to"), "lab_s": record.get("lab_s", 0.0),
    }
