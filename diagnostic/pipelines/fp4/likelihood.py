"""Prompt perplexity of a fixed reference passage: the likelihood check.

A kernel that computes the wrong product still writes fluent text (the model is confident
in whatever it says), but it can no longer predict ordinary text: the log-probabilities it
gives the tokens of a plain English passage collapse towards uniform over the vocabulary.
The check reads those log-probabilities with `echo` + `logprobs` on the completions API,
computes the passage's perplexity, and judges it against the best backend measured on the
same lab (kernels that compute the same product agree to within rounding, far closer than
the bound here) and against the vocabulary's uniform perplexity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from diagnostic.pipelines.client import EndpointError
from diagnostic.pipelines.fp4.api import ModelEndpoint

REFERENCE_PASSAGE = (
    "The harbour town wakes early. Before the first ferry leaves, the bakers have opened their "
    "doors and the fishing boats are already back at the quay, unloading crates of ice and silver "
    "fish. By eight o'clock the market square is full: farmers sell cheese, apples and bread from "
    "long wooden tables, and children run between the stalls on their way to school. In the "
    "afternoon the wind turns, the sea grows rough, and most people stay indoors. The old "
    "lighthouse on the northern rocks still works, although a machine now does the job that a "
    "keeper once did by hand every evening."
)
# A backend is flagged when the passage is this many times more perplexing than with the
# best backend measured: rounding differences between correct kernels move perplexity by a
# few per cent, a misread scale by orders of magnitude.
MAX_RATIO = 1.25
# ... or when its mean surprise per token is this share of a uniform guess, ln(vocabulary).
UNIFORM_SHARE = 0.75


def passage_nll(answer: dict[str, Any], prompt: str) -> list[float]:
    """Negative log-probabilities of the prompt's tokens (the first has none) from a
    completions answer made with echo and logprobs."""
    choices = answer.get("choices") or []
    block = (choices[0] if choices else {}).get("logprobs") or {}
    lps = block.get("token_logprobs")
    offsets = block.get("text_offset")
    if not isinstance(lps, list) or not lps:
        raise EndpointError("the answer carries no token_logprobs")
    if isinstance(offsets, list) and len(offsets) == len(lps):
        in_prompt = [
            lp for lp, off in zip(lps, offsets, strict=True) if isinstance(off, int) and off < len(prompt)
        ]
    else:
        # Without offsets, the last entry is the generated token.
        in_prompt = lps[:-1]
    values = [-float(lp) for lp in in_prompt if lp is not None]
    if len(values) < 10:
        raise EndpointError(f"only {len(values)} prompt tokens carry a log-probability; echo is not honoured")
    return values


def measure(endpoint: ModelEndpoint, *, passage: str = REFERENCE_PASSAGE) -> dict[str, Any]:
    """Perplexity of the reference passage, or why it could not be had."""
    try:
        nll = passage_nll(endpoint.prompt_logprobs(passage), passage)
    except EndpointError as exc:
        return {"available": False, "reason": f"no prompt log-probabilities: {exc}"}
    mean = sum(nll) / len(nll)
    return {
        "available": True,
        "tokens": len(nll),
        "mean_nll": round(mean, 4),
        "perplexity": round(math.exp(mean), 4),
    }


def judge(results: Iterable[dict[str, Any]], *, vocab_size: int | None) -> None:
    """Add `ratio` (to the best perplexity measured), `best` and `passed` to each available
    result, in place."""
    results = list(results)
    available = [r for r in results if r.get("available")]
    if not available:
        return
    best = min(float(r["perplexity"]) for r in available)
    uniform = math.log(vocab_size) if vocab_size and vocab_size > 1 else None
    for r in available:
        ratio = float(r["perplexity"]) / best
        r["ratio_to_best"] = round(ratio, 4)
        r["best_perplexity"] = best
        near_uniform = uniform is not None and float(r["mean_nll"]) >= UNIFORM_SHARE * uniform
        r["uniform_nll"] = round(uniform, 4) if uniform is not None else None
        r["near_uniform"] = near_uniform
        r["passed"] = ratio <= MAX_RATIO and not near_uniform
