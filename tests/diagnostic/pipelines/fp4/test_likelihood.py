"""Prompt perplexity from echo + logprobs, and its judgement against the best backend."""

from __future__ import annotations

import math
from typing import Any

from diagnostic.pipelines.client import EndpointError
from diagnostic.pipelines.fp4 import likelihood


def _answer(prompt: str, lps: list[float | None], generated: float = -0.1) -> dict[str, Any]:
    step = len(prompt) // len(lps)
    offsets = [i * step for i in range(len(lps))] + [len(prompt)]
    return {"choices": [{"logprobs": {"token_logprobs": [*lps, generated], "text_offset": offsets}}]}


class FakeEndpoint:
    def __init__(self, answer: dict[str, Any] | Exception) -> None:
        self.answer = answer

    def prompt_logprobs(self, text: str) -> dict[str, Any]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_perplexity_of_the_prompt_tokens_only() -> None:
    lps: list[float | None] = [None] + [-1.0] * 20 + [-3.0] * 20
    got = likelihood.measure(FakeEndpoint(_answer(likelihood.REFERENCE_PASSAGE, lps)))  # type: ignore[arg-type]
    assert got["available"] and got["tokens"] == 40
    assert got["perplexity"] == round(math.exp(2.0), 4)  # the generated token is not counted


def test_no_prompt_logprobs_is_said_and_not_fatal() -> None:
    got = likelihood.measure(FakeEndpoint(EndpointError("HTTP 400: echo is not supported")))  # type: ignore[arg-type]
    assert not got["available"] and "echo is not supported" in got["reason"]
    got = likelihood.measure(FakeEndpoint({"choices": [{"logprobs": None}]}))  # type: ignore[arg-type]
    assert not got["available"]


def test_judged_against_the_best_backend_and_the_uniform_bound() -> None:
    good = {"available": True, "perplexity": 4.0, "mean_nll": math.log(4.0)}
    close = {"available": True, "perplexity": 4.4, "mean_nll": math.log(4.4)}
    broken = {"available": True, "perplexity": 90000.0, "mean_nll": math.log(90000.0)}
    missing = {"available": False, "reason": "no"}
    likelihood.judge([good, close, broken, missing], vocab_size=163840)
    assert good["passed"] and close["passed"] and not broken["passed"]
    assert broken["near_uniform"] and broken["ratio_to_best"] > 1000
    assert "passed" not in missing
    # Alone, a broken backend is its own best: the uniform bound still catches it.
    alone = {"available": True, "perplexity": 90000.0, "mean_nll": math.log(90000.0)}
    likelihood.judge([alone], vocab_size=163840)
    assert alone["ratio_to_best"] == 1.0 and not alone["passed"]
