"""The FP4 stage when the obvious fix is not available: a backend the customer pinned
through an environment variable, a usual replacement that is itself broken
(test_scenarios_names.py has labs with other backend names)."""

from __future__ import annotations

from pathlib import Path

from .labs import config, run_and_relaunch_tuned, scenario


def test_a_broken_backend_pinned_through_the_environment(tmp_path: Path) -> None:
    # The engine's own default would be sound; the customer's variable forces FlashInfer.
    scn = scenario(default="cutlass", broken=["flashinfer_cutlass"])
    cfg = config(env={"VLLM_USE_FLASHINFER_MOE_FP4": "1"})
    result = run_and_relaunch_tuned(tmp_path, scn, cfg)
    fp4 = result["section"]
    assert fp4["verdict"] == "garbage"
    assert fp4["backend_before"] == "flashinfer_cutlass"  # from the log, not the configuration
    assert fp4["backend_after"] == "cutlass"
    paths = {c["path"]: c["to"] for c in result["config_changes"]}
    assert paths == {"serving.moe_backend": "cutlass", "env.VLLM_USE_FLASHINFER_MOE_FP4": None}
    finding = result["findings"][0]
    assert finding["change"]["env"] == {"VLLM_USE_FLASHINFER_MOE_FP4": None}
    assert result["tuned_backends"] == ["cutlass"]


def test_the_usual_replacement_is_itself_broken(tmp_path: Path) -> None:
    scn = scenario(
        default="flashinfer_cutlass",
        broken=["flashinfer_cutlass", "cutlass"],
        speed={"flashinfer_cutlass": 1.0, "cutlass": 1.0, "marlin": 1.6},
    )
    result = run_and_relaunch_tuned(tmp_path, scn, config())
    fp4 = result["section"]
    by_backend = {c["backend"]: c for c in fp4["candidates"]}
    assert by_backend["cutlass"]["verdict"] == "garbage"
    assert fp4["backend_after"] == "marlin" and fp4["verdict_after"] == "correct"
    # Correctness costs speed here (marlin is 1.6x slower), and the cost is stated with its
    # interval. At n = 5 a client stall can widen that interval past zero (CI once saw
    # -16 % with [.., +0.9] tok/s), so the test asks for the cost and its interval, not power.
    for cost in fp4["speed_cost"].values():
        low, high = cost["diff_ci95"]
        assert cost["diff_tps"] < 0 and cost["diff_pct"] < -10 and low < cost["diff_tps"] < high
        assert low < 0
    assert result["tuned_backends"] == ["marlin"]
