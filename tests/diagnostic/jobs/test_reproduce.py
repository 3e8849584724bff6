"""What the reproduce stage reads from an engine that would not start."""

from __future__ import annotations

import pytest

from diagnostic.jobs.reproduce import kv_budget_evidence

pytestmark = pytest.mark.unit

# vLLM V1's wording, as quoted in vllm-project/vllm#34076 (with the estimate) and #16118
# (before the estimate was added); V0's wording as quoted in vllm-project/vllm#2418.
V1 = (
    "(EngineCore_DP0 pid=1094) ValueError: To serve at least one request with the models's max seq len "
    "(262144), (24.0 GiB KV cache is needed, which is larger than the available KV cache memory (3.18 GiB). "
    "Based on the available memory, the estimated maximum model length is 34736. Try increasing "
    "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
)
V1_NO_ESTIMATE = (
    "ERROR 04-05 01:12:55 [core.py:390] ValueError: To serve at least one request with the models's max "
    "seq len (1048576), (24.00 GiB KV cache is needed, which is larger than the available KV cache memory "
    "(9.97 GiB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing "
    "the engine."
)
V0 = (
    "ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be "
    "stored in KV cache (3664). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
    "initializing the engine."
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (V1, {"max_model_len": 262144, "kv_needed_gib": 24.0, "kv_available_gib": 3.18,
              "estimated_max_model_len": 34736}),
        (V1_NO_ESTIMATE, {"max_model_len": 1048576, "kv_needed_gib": 24.0, "kv_available_gib": 9.97}),
        (V0, {"max_model_len": 4096, "estimated_max_model_len": 3664}),
    ],
)
def test_the_kv_budget_refusal_is_read_in_every_wording(text: str, expected: dict[str, object]) -> None:
    assert kv_budget_evidence("INFO earlier line\n" + text + "\nTraceback follows\n") == expected


def test_any_other_start_failure_is_not_a_kv_budget() -> None:
    assert kv_budget_evidence("RuntimeError: NCCL error: unhandled system error\n") is None
