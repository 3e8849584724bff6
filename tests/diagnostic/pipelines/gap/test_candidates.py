"""The gap stage's candidates: every differing field the customer did not require and no
earlier stage decided, one per field, flag and variable, the layout as one; and the changes
that apply them."""

from __future__ import annotations

from diagnostic.pipelines.changes import apply_changes
from diagnostic.pipelines.gap.candidates import (
    diff,
    finding_code,
    search_order,
    split_flags,
    with_candidates,
)
from tests.diagnostic.pipelines.gap.simgap import best_config, variant


def test_a_configuration_at_the_baseline_has_no_candidate() -> None:
    assert diff(best_config(), best_config()) == ([], [])


def test_each_setting_is_its_own_candidate_and_requirements_are_excluded_with_why() -> None:
    mine = variant(serving__enforce_eager=True, serving__gpu_memory_utilization=0.8,
                   serving__max_model_len=131072, speculative__num_speculative_tokens=2,
                   serving__moe_backend="marlin", parallel__tp=4, parallel__pp=2,
                   env={"NCCL_SOCKET_IFNAME": "eth9", "NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1"},
                   extra_args=["--trust-remote-code", "--max-num-seqs", "4"])
    candidates, excluded = diff(mine, best_config())
    assert [c.path for c in candidates] == [
        "parallel", "serving.gpu_memory_utilization", "serving.enforce_eager", "env.NCCL_P2P_DISABLE",
        "extra_args.--max-num-seqs",
    ]
    layout = candidates[0]
    assert layout.customer == {"tp": 4, "pp": 2} and layout.baseline == {"tp": 8, "pp": 1}
    why = {e["path"]: e["why"] for e in excluded}
    assert set(why) == {"serving.max_model_len", "speculative", "serving.moe_backend",
                        "env.NCCL_SOCKET_IFNAME", "env.NCCL_IB_HCA", "env.NCCL_DEBUG"}
    assert "requirement" in why["serving.max_model_len"]
    assert "speculative" in why["speculative"]
    assert "FP4" in why["serving.moe_backend"]
    assert "interfaces" in why["env.NCCL_SOCKET_IFNAME"]
    # The layout and eager mode are searched first.
    assert [c.path for c in search_order(candidates)][:2] == ["parallel", "serving.enforce_eager"]


def test_a_kv_cache_of_lower_precision_is_a_quality_change_not_a_candidate() -> None:
    candidates, excluded = diff(variant(serving__kv_cache_dtype="auto"), best_config())
    assert candidates == []
    assert excluded[0]["path"] == "serving.kv_cache_dtype" and "quality" in excluded[0]["why"]
    # The other way round (the baseline's precision is higher) it is a candidate.
    candidates, _ = diff(best_config(), variant(serving__kv_cache_dtype="auto"))
    assert [c.path for c in candidates] == ["serving.kv_cache_dtype"]


def test_finding_codes_fit_the_findings_schema() -> None:
    assert finding_code("serving.enforce_eager") == "gap.serving.enforce_eager"
    assert finding_code("parallel") == "gap.parallel"
    assert finding_code("env.NCCL_P2P_DISABLE") == "gap.env.nccl_p2p_disable"
    assert finding_code("extra_args.--max-num-seqs") == "gap.extra_args.max_num_seqs"


def test_flags_are_split_with_their_values_and_applied_one_at_a_time() -> None:
    assert split_flags(["--trust-remote-code", "--max-num-seqs", "4", "--seed=3"]) == {
        "--trust-remote-code": ["--trust-remote-code"], "--max-num-seqs": ["--max-num-seqs", "4"],
        "--seed": ["--seed=3"]}
    mine = variant(extra_args=["--trust-remote-code", "--max-num-seqs", "4", "--seed", "3"],
                   serving__enforce_eager=True, parallel__tp=4, parallel__pp=2)
    candidates, _ = diff(mine, best_config())
    by = {c.path: c for c in candidates}
    changes = with_candidates(mine, [by["extra_args.--max-num-seqs"], by["extra_args.--seed"]])
    assert changes[-1]["to"] == ["--trust-remote-code"]
    changes = with_candidates(mine, [by["parallel"], by["serving.enforce_eager"]])
    assert [c["path"] for c in changes] == ["parallel.tp", "parallel.pp", "serving.enforce_eager"]
    assert {c["finding"] for c in changes} == {"gap.parallel", "gap.serving.enforce_eager"}
    tuned = apply_changes(mine, changes)
    assert tuned["parallel"]["tp"] == 8 and tuned["parallel"]["pp"] == 1
    assert tuned["serving"]["enforce_eager"] is False
