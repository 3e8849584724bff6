"""Reading the engine's choice and its list of backends, and expressing a change."""

from __future__ import annotations

from diagnostic.pipelines.fp4 import backends as bk


def test_supported_backends_from_each_wording() -> None:
    sim = (
        "ERROR 12-03 10:00:00 [core.py:708] ValueError: Unknown NVFP4 backend "
        "'diag_probe_no_such_backend'; supported: cutlass, flashinfer_cutlass, marlin"
    )
    assert bk.supported_from_error(sim) == ["cutlass", "flashinfer_cutlass", "marlin"]
    env = (
        "ValueError: Invalid value 'diag_probe_no_such_backend' for VLLM_NVFP4_GEMM_BACKEND. "
        "Valid options: ['flashinfer-cudnn', 'flashinfer-trtllm', 'flashinfer-cutlass', 'cutlass', 'marlin']"
    )
    assert bk.supported_from_error(env) == [
        "flashinfer-cudnn",
        "flashinfer-trtllm",
        "flashinfer-cutlass",
        "cutlass",
        "marlin",
    ]
    argparse = (
        "launch_server.py: error: argument --moe-runner-backend: invalid choice: 'x' "
        "(choose from 'auto', 'triton', 'flashinfer_cutlass')"
    )
    assert bk.supported_from_error(argparse) == ["auto", "triton", "flashinfer_cutlass"]
    assert bk.supported_from_error("RuntimeError: CUDA out of memory") is None


def test_the_current_run_is_the_last_start_in_an_appended_log() -> None:
    lines = [
        "INFO 12-03 10:00:00 [api_server.py:1885] vLLM API server version 0.29.1",
        "INFO 12-03 10:00:20 [modelopt.py:1009] Using FlashInferCutlass backend for NVFP4 MoE",
        "INFO 12-03 10:10:00 [api_server.py:1885] vLLM API server version 0.29.1",
        "INFO 12-03 10:10:20 [modelopt.py:1009] Using Marlin backend for NVFP4 MoE",
    ]
    assert [e["backend"] for e in bk.backend_events("vllm", lines)] == ["marlin"]
    assert [e["backend"] for e in bk.backend_events("vllm", bk.current_run(lines[:2]))] == [
        "flashinfer_cutlass"
    ]
    assert bk.current_run(lines)[0] == lines[2]


def test_a_change_sets_the_flag_and_removes_environment_pins() -> None:
    config = {
        "serving": {"moe_backend": "auto", "linear_backend": "auto"},
        "env": {"VLLM_USE_FLASHINFER_MOE_FP4": "1", "NCCL_SOCKET_IFNAME": "eth9"},
    }
    changes = bk.backend_changes(config, "cutlass", ["moe"])
    assert changes == [
        {"path": "serving.moe_backend", "from": "auto", "to": "cutlass"},
        {"path": "env.VLLM_USE_FLASHINFER_MOE_FP4", "from": "1", "to": None},
    ]
    assert bk.flags_for("vllm", changes) == ["--moe-backend", "cutlass"]
    assert bk.flags_for("sglang", changes) == ["--moe-runner-backend", "cutlass"]
    probe = bk.discovery_config(
        {"serving": {"moe_backend": "marlin"}, "env": {"VLLM_NVFP4_GEMM_BACKEND": "x"}}
    )
    assert probe["serving"]["moe_backend"] == "auto"
    assert probe["env"] == {bk.DISCOVERY_ENV: bk.UNKNOWN_BACKEND}
    assert bk.expressible("vllm", "moe", "cutlass") and not bk.expressible("vllm", "moe", "no_such")
