"""The simulated engine's OpenAI-compatible endpoint: API shapes, pacing, accounting.

Engines run on 127.0.0.1 at high dilation; every test stops the ones it started.
The scenario is written out here from LAB_MODEL.md's defaults (reference lab).
"""

from __future__ import annotations

import copy
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from tokenizers import Tokenizer

from lab.clock import LabClock
from lab.engines import normalize_config
from lab.sim.http import ServingEngine
from lab.sim.physics import decode_plan
from lab.sim.tokenizer import count_tokens, default_cache_dir, ensure_tokenizer, load_tokenizer


def _truth() -> dict[str, Any]:
    return {
        "decode": {
            "ep_imbalance": 2.0,
            "collectives_per_layer": 2,
            "step_overhead_ms": 8.0,
            "eager_penalty_ms": 12.0,
            "verify_growth": 0.2,
            "run_sigma": 0.03,
            "step_sigma": 0.05,
            "prefill_tps": 900.0,
        },
        "specdec": {
            "draft_ms": {"eagle3": 2.5, "ngram": 0.3},
            "acceptance": {
                "eagle3": {
                    "code": [0.86, 0.76, 0.66, 0.45, 0.34, 0.26, 0.2],
                    "prose": [0.75, 0.55, 0.40, 0.28, 0.2, 0.15, 0.1],
                },
                "ngram": {"code": [0.5, 0.35, 0.25, 0.18], "prose": [0.2, 0.1, 0.05, 0.03]},
            },
        },
        "fp4": {
            "default_backend": "flashinfer_cutlass",
            "broken": ["flashinfer_cutlass"],
            "degraded": [],
            "error_rate": 0.25,
            "speed": {"flashinfer_cutlass": 1.0, "cutlass": 1.0, "marlin": 1.15},
        },
        "server_counts": "emitted",
        "faults": [],
    }


@dataclass(frozen=True)
class LabScenario:
    """What lab.sim.scenario.Scenario gives the serving side, with LAB_MODEL defaults."""

    seed: int = 7
    nodes: int = 8
    node: dict[str, Any] = field(
        default_factory=lambda: {"mem_gib": 121.7, "mem_bw_gbs": 273.0, "mem_bw_efficiency": 0.75}
    )
    network: dict[str, Any] = field(
        default_factory=lambda: {"link_gbps": 100.0, "collective_latency_us": 120.0, "hop_latency_us": 30.0}
    )
    model: dict[str, Any] = field(
        default_factory=lambda: {
            "layers": 61,
            "vocab": 163840,
            "kv_bytes_per_token": {"fp8": 35136, "bf16": 70272},
            "checkpoint_gb": 597.0,
            "decode_bytes_per_token_gb": 32.0,
        }
    )
    truth: dict[str, Any] = field(default_factory=_truth)
    serving: dict[str, Any] = field(
        default_factory=lambda: {"abort_on_disconnect": True, "log_interval_s": 10.0}
    )


# The out-of-box customer configuration (LAB_MODEL.md section 8): EAGLE-3, k = 4.
CONFIG: dict[str, Any] = normalize_config(yaml.safe_load(
    (Path(__file__).resolve().parents[3] / "examples/configs/kimi-k2-8spark-outofbox.yaml").read_text()))
MODEL = "/models/kimi-k2"
CODE_PROMPT = "Write a Python function that merges two sorted lists."
PROSE_PROMPT = "Describe a walk along the harbour at dusk."


@pytest.fixture(scope="module")
def tokenizer_path() -> Path:
    return ensure_tokenizer(default_cache_dir())


@pytest.fixture(scope="module")
def tokenizer(tokenizer_path: Path) -> Tokenizer:
    return load_tokenizer(tokenizer_path)


@dataclass
class Started:
    engine: ServingEngine
    client: httpx.Client
    logs: list[str]


@pytest.fixture
def start(tokenizer_path: Path) -> Iterator[Callable[..., Started]]:
    """start(dilation=..., server_counts=..., state=..., config changes...) -> a serving engine."""
    started: list[Started] = []

    def make(
        *,
        dilation: float = 500.0,
        server_counts: str = "emitted",
        state: str = "ok",
        error_rate: float = 0.0,
        seed: int = 7,
        serving: dict[str, Any] | None = None,
        speculative: dict[str, Any] | str | None = "default",
        engine: str = "vllm",
        max_model_len: int | None = None,
        kv_capacity_tokens: int | None = None,
        argv: Sequence[str] = (),
    ) -> Started:
        truth = _truth()
        truth["server_counts"] = server_counts
        scenario = LabScenario(
            truth=truth, serving={"abort_on_disconnect": True, "log_interval_s": 10.0, **(serving or {})}
        )
        config = copy.deepcopy(CONFIG)
        if speculative != "default":
            config["speculative"] = speculative
        config["engine"]["name"] = engine
        if max_model_len is not None:
            config["serving"]["max_model_len"] = max_model_len
        logs: list[str] = []
        server = ServingEngine(
            scenario=scenario,
            config=config,
            backend="flashinfer_cutlass" if state == "broken" else "cutlass",
            backend_state=state,
            error_rate=error_rate,
            clock=LabClock(dilation, time.time()),
            log=logs.append,
            tokenizer_path=tokenizer_path,
            host="127.0.0.1",
            port=0,
            seed=seed,
            kv_capacity_tokens=kv_capacity_tokens,
            argv=argv,
        )
        server.start()
        result = Started(server, httpx.Client(base_url=server.url, timeout=30, verify=False), logs)
        started.append(result)
        return result

    yield make
    for s in started:
        s.client.close()
        s.engine.stop()


@dataclass
class Streamed:
    events: list[dict[str, Any]]
    arrivals: list[float]  # perf_counter of each event with content
    text: str
    sent: float
    raw: str


def stream(client: httpx.Client, path: str, body: dict[str, Any]) -> Streamed:
    events: list[dict[str, Any]] = []
    arrivals: list[float] = []
    text = []
    raw: list[str] = []
    sent = time.perf_counter()
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            raw.append(line)
            if not line:
                continue
            assert line.startswith("data: ")
            data = line[len("data: ") :]
            if data == "[DONE]":
                break
            event = json.loads(data)
            events.append(event)
            piece = _piece(event)
            if piece:
                arrivals.append(time.perf_counter())
                text.append(piece)
    return Streamed(events, arrivals, "".join(text), sent, "\n".join(raw))


def _piece(event: dict[str, Any]) -> str:
    if not event["choices"]:
        return ""
    choice = event["choices"][0]
    return str(choice.get("text") or (choice.get("delta") or {}).get("content") or "")


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in /metrics")


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


# -- API surface ------------------------------------------------------------------------


def test_health_models_and_version_answer(start: Callable[..., Started]) -> None:
    s = start()
    assert s.client.get("/health").status_code == 200
    models = s.client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == 262144
    assert s.client.get("/version").json() == {"version": s.engine.version}
    assert s.engine.core.release.version == "0.34.0"
    assert s.engine.url.startswith("http://127.0.0.1:")


def test_served_model_name_flag_renames_the_model(
    start: Callable[..., Started], tokenizer_path: Path
) -> None:
    config = copy.deepcopy(CONFIG)
    config["extra_args"] = ["--served-model-name", "kimi"]
    engine = ServingEngine(
        scenario=LabScenario(),
        config=config,
        backend="cutlass",
        backend_state="ok",
        error_rate=0.0,
        clock=LabClock(500.0, time.time()),
        log=lambda _: None,
        tokenizer_path=tokenizer_path,
        host="127.0.0.1",
        port=0,
        seed=1,
    )
    with engine, httpx.Client(base_url=engine.url, verify=False) as client:
        assert client.get("/v1/models").json()["data"][0]["id"] == "kimi"


def test_completion_answers_a_checkable_question_and_stops(start: Callable[..., Started]) -> None:
    s = start()
    body = {
        "model": MODEL,
        "prompt": "What is 123 + 456? Answer with the number only.",
        "max_tokens": 16,
        "temperature": 0,
    }
    out = s.client.post("/v1/completions", json=body).json()
    assert out["object"] == "text_completion" and out["model"] == MODEL
    assert out["choices"][0]["text"] == "579"
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == 2  # "579" is two tokens of this vocabulary
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 2


def test_chat_completion_writes_the_catalogue_function(start: Callable[..., Started]) -> None:
    s = start()
    body = {
        "model": MODEL,
        "temperature": 0,
        "max_tokens": 100,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Write a Python function gcd(a, b)."},
        ],
    }
    out = s.client.post("/v1/chat/completions", json=body).json()
    message = out["choices"][0]["message"]
    assert out["object"] == "chat.completion" and message["role"] == "assistant"
    assert message["content"].startswith("```python\ndef gcd(a, b):")
    assert out["choices"][0]["finish_reason"] == "stop"


def test_broken_backend_answers_fluently_and_wrongly_with_no_error(start: Callable[..., Started]) -> None:
    s = start(state="broken")
    body = {
        "model": MODEL,
        "prompt": "What is 123 + 456? Answer with the number only.",
        "max_tokens": 16,
        "temperature": 0,
    }
    response = s.client.post("/v1/completions", json=body)
    assert response.status_code == 200
    text = response.json()["choices"][0]["text"]
    assert text.lstrip("-").isdigit() and text != "579"


def test_streamed_completion_is_sse_with_usage_and_done(
    start: Callable[..., Started], tokenizer: Tokenizer
) -> None:
    s = start()
    body = {
        "model": MODEL,
        "prompt": CODE_PROMPT,
        "max_tokens": 120,
        "ignore_eos": True,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    out = stream(s.client, "/v1/completions", body)
    assert out.raw.rstrip().endswith("data: [DONE]")
    *chunks, usage = out.events
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 120
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert count_tokens(tokenizer, out.text) == 120


def test_speculative_steps_arrive_as_one_chunk_each(
    start: Callable[..., Started], tokenizer: Tokenizer
) -> None:
    s = start()
    body = {"model": MODEL, "prompt": CODE_PROMPT, "max_tokens": 200, "ignore_eos": True, "temperature": 0}
    out = stream(s.client, "/v1/completions", body)
    per_chunk = [count_tokens(tokenizer, _piece(e)) for e in out.events]
    record = s.engine.core.history()[-1]
    assert len(out.events) == len(record.schedule.steps)
    assert per_chunk[0] == 1  # the first token comes from the prefill step
    assert max(per_chunk) > 1 and len(out.events) < 200
    assert [step.emitted for step in record.schedule.steps] == pytest.approx(per_chunk, abs=1)


def test_without_speculation_every_chunk_is_one_token(
    start: Callable[..., Started], tokenizer: Tokenizer
) -> None:
    s = start(speculative=None)
    body = {"model": MODEL, "prompt": PROSE_PROMPT, "max_tokens": 60, "ignore_eos": True}
    out = stream(s.client, "/v1/completions", body)
    assert len(out.events) == 60
    assert count_tokens(tokenizer, out.text) == 60


def test_streamed_chat_sends_role_first_then_content(start: Callable[..., Started]) -> None:
    s = start()
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROSE_PROMPT}],
        "max_tokens": 30,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    out = stream(s.client, "/v1/chat/completions", body)
    first = out.events[0]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": ""}
    assert out.events[-1]["usage"]["completion_tokens"] == 30
    assert all(e["object"] == "chat.completion.chunk" for e in out.events)


def test_chat_without_a_limit_ends_on_its_own(start: Callable[..., Started]) -> None:
    s = start(dilation=5000.0)
    out = s.client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": PROSE_PROMPT}]}
    )
    assert out.json()["choices"][0]["finish_reason"] == "stop"
    assert out.json()["usage"]["completion_tokens"] == 512


def test_prompt_given_as_token_ids_counts_those_tokens(
    start: Callable[..., Started], tokenizer: Tokenizer
) -> None:
    ids = tokenizer.encode(PROSE_PROMPT, add_special_tokens=False).ids
    out = start().client.post("/v1/completions", json={"prompt": ids, "max_tokens": 4}).json()
    assert out["usage"]["prompt_tokens"] == len(ids)


def test_completion_default_limit_is_16_tokens(start: Callable[..., Started]) -> None:
    out = start().client.post("/v1/completions", json={"prompt": PROSE_PROMPT}).json()
    assert out["usage"]["completion_tokens"] == 16 and out["choices"][0]["finish_reason"] == "length"


# -- log-probabilities ------------------------------------------------------------------

REFERENCE = (
    "Exceptions are a means of breaking out of the normal flow of control of a code block in "
    "order to handle errors or other exceptional conditions."
)


def prompt_logprobs(client: httpx.Client) -> tuple[dict[str, Any], list[float]]:
    body = {
        "model": MODEL,
        "prompt": REFERENCE,
        "max_tokens": 0,
        "echo": True,
        "logprobs": 1,
        "temperature": 0,
    }
    out = client.post("/v1/completions", json=body).json()
    lp = out["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    return out, [v for v in lp["token_logprobs"][1:]]


def test_echo_returns_prompt_logprobs_with_low_surprise_when_healthy(start: Callable[..., Started]) -> None:
    out, values = prompt_logprobs(start().client)
    assert out["choices"][0]["text"] == REFERENCE
    assert out["usage"]["completion_tokens"] == 0
    assert len(values) + 1 == out["usage"]["prompt_tokens"]
    lp = out["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == REFERENCE
    assert lp["text_offset"][0] == 0 and lp["text_offset"][-1] == len(REFERENCE) - len(lp["tokens"][-1])
    assert -2.0 < sum(values) / len(values) < -0.8


def test_echo_logprobs_of_a_broken_backend_are_near_uniform(start: Callable[..., Started]) -> None:
    _, values = prompt_logprobs(start(state="broken").client)
    assert sum(values) / len(values) == pytest.approx(-math.log(163840), abs=0.3)


def test_generated_token_logprobs_come_per_token(start: Callable[..., Started]) -> None:
    s = start()
    body = {"model": MODEL, "prompt": PROSE_PROMPT, "max_tokens": 12, "logprobs": 3, "ignore_eos": True}
    lp = s.client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 12
    assert all(len(top) == 3 for top in lp["top_logprobs"])
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROSE_PROMPT}],
        "max_tokens": 5,
        "logprobs": True,
        "top_logprobs": 2,
    }
    content = s.client.post("/v1/chat/completions", json=chat).json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 5 and all(len(c["top_logprobs"]) == 2 and c["logprob"] < 0 for c in content)


# -- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", {"model": "other", "prompt": "hi"}, 404, "model"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "n": 2}, 400, "n"),
        ("/v1/completions", {"prompt": 5}, 400, "prompt"),
        ("/v1/completions", {"prompt": [10**9]}, 400, "prompt"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ],
)
def test_bad_requests_get_openai_style_errors(
    start: Callable[..., Started], path: str, body: dict[str, Any], status: int, param: str
) -> None:
    response = start().client.post(path, json=body)
    assert response.status_code == status
    assert response.json()["error"]["param"] == param and response.json()["error"]["code"] == status


def test_requests_beyond_the_context_length_are_refused(start: Callable[..., Started]) -> None:
    response = start(max_model_len=64).client.post(
        "/v1/completions", json={"prompt": "hi", "max_tokens": 100}
    )
    assert response.status_code == 400
    assert "maximum context length is 64 tokens" in response.json()["error"]["message"]


def test_sglang_refuses_in_its_own_words_and_by_its_kv_pool(start: Callable[..., Started]) -> None:
    """SGLang's tokenizer manager checks the context length, its scheduler the KV pool:
    max_req_input_len = min(context - 1, pool - 1) - 5 (tp_worker.py, managers/utils.py in
    0.5.12 and 0.5.23), so a pool shorter than the context refuses long inputs it admits."""
    s = start(engine="sglang", max_model_len=64)
    response = s.client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 100})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(
        "Requested token count exceeds the model's maximum context length of 64 tokens.")
    pooled = start(engine="sglang", max_model_len=4096, kv_capacity_tokens=40)
    response = pooled.client.post("/v1/completions", json={"prompt": list(range(100, 140)), "max_tokens": 4})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "Input length (40 tokens) exceeds the maximum allowed length (34 tokens). Use a shorter input or "
        "enable --allow-auto-truncate.")
    assert pooled.client.post("/v1/completions", json={"prompt": list(range(100, 120)),
                                                       "max_tokens": 4}).status_code == 200


def test_unknown_paths_are_404_and_bad_json_is_400(start: Callable[..., Started]) -> None:
    s = start()
    assert s.client.get("/v2/nothing").status_code == 404
    assert s.client.post("/health").status_code == 405
    bad = s.client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400


# -- pacing -----------------------------------------------------------------------------


def decode_rates(s: Started, out: Streamed, tokenizer: Tokenizer, dilation: float) -> tuple[float, float]:
    """The last request's decode rate as the client received it and as it was scheduled (lab tok/s)."""
    steps = s.engine.core.history()[-1].schedule.steps
    n = count_tokens(tokenizer, out.text)
    measured = (n - 1) / ((out.arrivals[-1] - out.arrivals[0]) * dilation)
    return measured, (n - 1) / (sum(step.lab_ms for step in steps[1:]) / 1000)


def test_single_stream_keeps_the_scheduled_pace(start: Callable[..., Started], tokenizer: Tokenizer) -> None:
    dilation = 20.0
    s = start(dilation=dilation)
    body = {"model": MODEL, "prompt": CODE_PROMPT, "max_tokens": 500, "ignore_eos": True, "temperature": 0}
    out = stream(s.client, "/v1/completions", body)
    measured, scheduled = decode_rates(s, out, tokenizer, dilation)
    assert measured == pytest.approx(scheduled, rel=0.03)
    # And the schedule itself follows the formula, up to the run's lognormal spread.
    plan = decode_plan(
        LabScenario().model,
        LabScenario().node,
        LabScenario().network,
        _truth()["decode"],
        _truth()["specdec"],
        1.0,
        8,
        1,
        False,
        "eagle3",
        4,
        "code",
    )
    assert scheduled == pytest.approx(plan.rate, rel=0.15)


class _StallsOnce(threading.Event):
    """The engine's stop event whose first wait overruns by `stall` wall seconds: the
    simulating host descheduled the request's thread just before its first token."""

    def __init__(self, stall: float) -> None:
        super().__init__()
        self.stall = stall

    def wait(self, timeout: float | None = None) -> bool:
        stall, self.stall = self.stall, 0.0
        stopped = super().wait(timeout)
        time.sleep(stall)
        return stopped


def test_a_host_stall_before_the_first_token_delays_it_and_not_the_decode_pace(
    start: Callable[..., Started], tokenizer: Tokenizer,
) -> None:
    dilation = 10.0
    s = start(dilation=dilation, speculative=None)
    body = {"model": MODEL, "prompt": CODE_PROMPT, "max_tokens": 120, "ignore_eos": True, "temperature": 0}
    stream(s.client, "/v1/completions", body)  # a first request, paced as usual
    s.engine.core._stop = _StallsOnce(0.5)  # 5 lab s at this dilation, most of the decode's ~7 s
    out = stream(s.client, "/v1/completions", body)
    measured, scheduled = decode_rates(s, out, tokenizer, dilation)
    first_step_s = s.engine.core.history()[-1].schedule.steps[0].lab_ms / 1000
    # Caught up on the first schedule instead, the tokens would have come in a burst and read
    # as a rate several times the schedule's; the stall is the first token's lateness only.
    assert measured == pytest.approx(scheduled, rel=0.1)
    assert (out.arrivals[0] - out.sent) * dilation > first_step_s + 0.5 * dilation * 0.9


def test_first_token_arrives_after_prefill_and_one_step(start: Callable[..., Started]) -> None:
    dilation = 10.0
    s = start(dilation=dilation, speculative=None)
    prompt = " ".join(["harbour"] * 900)
    out = stream(s.client, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 2})
    record = s.engine.core.history()[-1]
    expected_s = record.schedule.steps[0].lab_ms / 1000
    assert expected_s == pytest.approx(record.prompt_tokens / 900 + 0.0617, rel=0.06)
    assert (out.arrivals[0] - out.sent) * dilation == pytest.approx(expected_s, rel=0.15)


def test_same_seed_and_requests_give_same_tokens_and_durations(start: Callable[..., Started]) -> None:
    def session(seed: int) -> list[tuple[str, list[float]]]:
        s = start(seed=seed, dilation=2000.0)
        texts = []
        for prompt in (CODE_PROMPT, PROSE_PROMPT, CODE_PROMPT):
            body = {
                "model": MODEL,
                "prompt": prompt,
                "max_tokens": 40,
                "ignore_eos": True,
                "temperature": 0.7,
            }
            texts.append(s.client.post("/v1/completions", json=body).json()["choices"][0]["text"])
        return [(t, r.step_lab_ms) for t, r in zip(texts, s.engine.core.history(), strict=True)]

    first = session(3)
    assert session(3) == first
    other = session(4)
    assert [d for _, d in other] != [d for _, d in first]
    # The same prompt asked twice is a different request: its own timing draw.
    assert first[0][1] != first[2][1]


def test_concurrent_streams_each_get_their_tokens(
    start: Callable[..., Started], tokenizer: Tokenizer
) -> None:
    s = start(dilation=100.0)
    results: dict[int, str] = {}

    def one(i: int) -> None:
        with httpx.Client(base_url=s.engine.url, timeout=30, verify=False) as client:
            body = {"model": MODEL, "prompt": f"{PROSE_PROMPT} ({i})", "max_tokens": 80, "ignore_eos": True}
            results[i] = stream(client, "/v1/completions", body).text

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: s.engine.core.running() >= 2 or len(results) == 3)
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1, 2]
    assert all(count_tokens(tokenizer, text) == 80 for text in results.values())


# -- server accounting ------------------------------------------------------------------


def run_one(s: Started, tokens: int = 150) -> None:
    body = {"model": MODEL, "prompt": CODE_PROMPT, "max_tokens": tokens, "ignore_eos": True}
    assert s.client.post("/v1/completions", json=body).status_code == 200


def test_metrics_count_emitted_tokens_honestly(start: Callable[..., Started]) -> None:
    # vLLM counts len(new_token_ids) per step (v1/metrics/stats.py): the accepted drafts and
    # the bonus token, never the k + 1 positions a speculative step proposed.
    s = start()
    run_one(s)
    record = s.engine.core.history()[-1]
    text = s.client.get("/metrics").text
    assert metric(text, "vllm:generation_tokens_total", model_name=MODEL) == 150
    assert metric(text, "vllm:prompt_tokens_total", model_name=MODEL) == record.prompt_tokens
    drafts = len(record.schedule.steps) - 1
    assert metric(text, "vllm:spec_decode_num_drafts_total") == drafts
    assert metric(text, "vllm:spec_decode_num_draft_tokens_total") == 4 * drafts
    accepted = sum(step.accepted for step in record.schedule.steps)
    assert metric(text, "vllm:spec_decode_num_accepted_tokens_total") == accepted
    assert metric(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0") <= drafts
    assert metric(text, "vllm:num_requests_running") == 0
    assert metric(text, "vllm:request_success_total", finished_reason="length") == 1


def stats_lines(logs: list[str]) -> list[re.Match[str]]:
    return [m for line in logs if (m := STATS.fullmatch(line))]


STATS = re.compile(
    r"Engine 000: Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, Avg generation throughput: "
    r"(?P<gen>[\d.]+) tokens/s, Running: (?P<running>\d+) reqs, Waiting: 0 reqs, "
    r"GPU KV cache usage: [\d.]+%, Prefix cache hit rate: 0.0%"
)
SPEC = re.compile(
    r"SpecDecoding metrics: Mean acceptance length: [\d.]+, Accepted throughput: [\d.]+ tokens/s, "
    r"Drafted throughput: [\d.]+ tokens/s, Accepted: \d+ tokens, Drafted: (?P<drafted>\d+) tokens, "
    r"Per-position acceptance rate: (?:[\d.]+, ){3}[\d.]+, Avg Draft acceptance rate: [\d.]+%"
)


def test_stats_log_claims_what_the_steps_emitted_over_the_windows_wall_time(
        start: Callable[..., Started]) -> None:
    s = start(dilation=200.0, serving={"log_interval_s": 5.0})
    run_one(s, tokens=2500)
    wait_until(lambda: any(m["running"] == "0" for m in stats_lines(s.logs[-3:])))
    record = s.engine.core.history()[-1]
    steps = record.schedule.steps[1:]
    realized = sum(step.emitted for step in steps) / (sum(step.lab_ms for step in steps) / 1000)
    busy = [float(m["gen"]) for m in stats_lines(s.logs) if m["running"] == "1"]
    inner = busy[1:-1]  # the first and last windows are partly idle
    assert len(inner) >= 8
    assert sum(inner) / len(inner) == pytest.approx(realized, rel=0.05)
    assert any(SPEC.fullmatch(line) for line in s.logs)


def test_an_idle_part_of_a_window_lowers_its_rate(start: Callable[..., Started]) -> None:
    # The releases divide by the interval's wall time, busy or not.
    s = start(dilation=100.0, serving={"log_interval_s": 50.0})
    first = len(s.logs)
    run_one(s, tokens=60)  # about 2.5 lab s of work in a 50 s window
    wait_until(lambda: any(float(m["gen"]) > 0 for m in stats_lines(s.logs[first:])), timeout=5)
    assert max(float(m["gen"]) for m in stats_lines(s.logs[first:])) < 2.0  # 60 tokens over 50 s


def test_sglang_engine_logs_in_sglang_wording(start: Callable[..., Started]) -> None:
    s = start(engine="sglang", dilation=200.0, serving={"log_interval_s": 2.0})
    run_one(s, tokens=400)
    wait_until(lambda: any(line.startswith("Decode batch,") for line in s.logs))
    assert any(line.startswith("Prefill batch, #new-seq: 1, #new-token: ") for line in s.logs)
    decode = next(line for line in s.logs if line.startswith("Decode batch,"))
    # SGLang 0.5.23's format strings (scheduler_components/metrics_reporter.py).
    assert re.fullmatch(
        r"Decode batch, #running-req: \d+, #token: \d+, token usage: [\d.]+, accept len: [\d.]+, "
        r"accept rate: [\d.]+, cuda graph: True, gen throughput \(token/s\): [\d.]+, #queue-req: 0",
        decode,
    )
    # One line per 40 decode steps, not on a clock.
    steps = len(s.engine.core.history()[-1].steps) - 1
    assert sum(line.startswith("Decode batch,") for line in s.logs) == steps // 40
    assert not any(line.startswith("Engine 000") for line in s.logs)


# -- disconnects ------------------------------------------------------------------------


def abandon(s: Started, tokens: int) -> None:
    """Read the first chunks of a long stream, then hang up."""
    body = {"model": MODEL, "prompt": PROSE_PROMPT, "max_tokens": tokens, "ignore_eos": True, "stream": True}
    with s.client.stream("POST", "/v1/completions", json=body) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i > 4:
                break


def test_disconnect_aborts_the_request_by_default(start: Callable[..., Started]) -> None:
    s = start(dilation=50.0)
    abandon(s, tokens=3000)
    wait_until(lambda: s.engine.core.running() == 0)
    record = s.engine.core.history()[-1]
    assert record.outcome == "aborted" and record.generated < 3000
    text = s.client.get("/metrics").text
    assert metric(text, "vllm:request_success_total", finished_reason="abort") == 1
    assert metric(text, "vllm:generation_tokens_total") == record.generated


def test_without_abort_an_abandoned_request_runs_on_as_an_orphan(start: Callable[..., Started]) -> None:
    s = start(dilation=200.0, serving={"abort_on_disconnect": False})
    abandon(s, tokens=800)
    time.sleep(0.05)
    assert s.engine.core.running() == 1
    assert metric(s.client.get("/metrics").text, "vllm:num_requests_running") == 1
    wait_until(lambda: s.engine.core.running() == 0, timeout=20)
    record = s.engine.core.history()[-1]
    assert record.outcome == "orphaned" and record.generated == 800
    assert metric(s.client.get("/metrics").text, "vllm:generation_tokens_total") == 800
    assert not any(line.startswith("Aborted request") for line in s.logs)


def test_stop_ends_in_flight_streams_and_closes_the_port(start: Callable[..., Started]) -> None:
    s = start(dilation=20.0)
    url = s.engine.url
    done = threading.Event()

    def long_stream() -> None:
        try:
            abandon_body = {"prompt": PROSE_PROMPT, "max_tokens": 5000, "ignore_eos": True, "stream": True}
            with (
                httpx.Client(base_url=url, timeout=30, verify=False) as client,
                client.stream("POST", "/v1/completions", json=abandon_body) as response,
            ):
                for _ in response.iter_lines():
                    pass
        except httpx.HTTPError:
            pass
        done.set()

    worker = threading.Thread(target=long_stream)
    worker.start()
    wait_until(lambda: s.engine.core.running() == 1)
    began = time.monotonic()
    s.engine.stop()
    assert time.monotonic() - began < 3
    assert done.wait(5)
    worker.join()
    assert s.engine.core.history()[-1].outcome == "stopped"
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=2)


# -- the truth stays hidden -------------------------------------------------------------


def test_responses_look_the_same_whatever_the_backend_state(start: Callable[..., Started]) -> None:
    shapes = []
    for state in ("ok", "broken", "degraded"):
        s = start(state=state, error_rate=0.5)
        body = {"model": MODEL, "prompt": "What is 2 + 2? Answer with the number only.", "max_tokens": 8}
        response = s.client.post("/v1/completions", json=body)
        shapes.append(
            (sorted(response.headers.keys()), sorted(response.json()), sorted(response.json()["choices"][0]))
        )
        everything = json.dumps(dict(response.headers)) + response.text + s.client.get("/metrics").text
        for secret in (
            "broken",
            "degraded",
            "error_rate",
            "acceptance",
            "run_factor",
            "server_counts",
            "truth",
        ):
            assert secret not in everything
    assert shapes[0] == shapes[1] == shapes[2]


def test_sglangs_token_counters_rise_when_a_request_ends_with_its_verify_calls(
        start: Callable[..., Started]) -> None:
    # sglang/srt/observability/metrics_collector.py observe_one_finished_request: prompt and
    # generation tokens, and 0.5.23's spec_verify_calls_total, are added when a request ends.
    import threading

    s = start(engine="sglang", dilation=50.0, argv=["--enable-metrics"])
    body = {"model": MODEL, "prompt": CODE_PROMPT, "max_tokens": 400, "ignore_eos": True}
    done = threading.Event()
    threading.Thread(target=lambda: (s.client.post("/v1/completions", json=body), done.set()),
                     daemon=True).start()
    wait_until(lambda: s.engine.core.running() == 1 and len(s.engine.core.history()[-1].steps) > 5)
    during = s.client.get("/metrics").text
    assert metric(during, "sglang:generation_tokens_total") == 0
    assert metric(during, "sglang:spec_verify_calls_total") == 0
    assert done.wait(30)
    after = s.client.get("/metrics").text
    record = s.engine.core.history()[-1]
    generated = metric(after, "sglang:generation_tokens_total")
    calls = metric(after, "sglang:spec_verify_calls_total")
    assert generated == 400 and calls == sum(1 for step in record.steps[1:] if step.drafted) > 0
