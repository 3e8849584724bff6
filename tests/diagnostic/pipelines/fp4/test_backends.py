"""Reading the engine's choice and its list of backends, and expressing a change: the
refusal in argparse's own words (Python 3.12 bare names, older quoted), the released
versions' backend lines built from the tables' format strings, and the dispatch table's
capabilities for sm_121."""

from __future__ import annotations

import pytest

from diagnostic.pipelines.fp4 import backends as bk
from diagnostic.pipelines.fp4 import dispatch
from diagnostic.pipelines.fp4.pipeline import ran_by_rule
from lab.engines.tables import flag, release


def refusal(engine: str, version: str, option: str, *, quoted: bool) -> str:
    """argparse's refusal of an unknown name for `option`, its list from the version's table."""
    choices = (flag(release(engine, version), option) or {})["choices"]
    listed = ", ".join(f"'{c}'" if quoted else str(c) for c in choices)
    prog = release(engine, version)["prog"]
    return (f"usage: {prog} [options]\n{prog}: error: argument {option}: invalid choice: "
            f"'{bk.UNKNOWN_BACKEND}' (choose from {listed})")


@pytest.mark.parametrize("quoted", [False, True])
@pytest.mark.parametrize(("engine", "version", "option"), [
    ("vllm", "0.29.0", "--moe-backend"), ("vllm", "0.34.0", "--linear-backend"),
    ("sglang", "0.5.12", "--moe-runner-backend"), ("sglang", "0.5.23", "--fp4-gemm-backend")])
def test_the_choices_come_from_argparse_in_either_python_form(engine: str, version: str, option: str,
                                                              quoted: bool) -> None:
    text = refusal(engine, version, option, quoted=quoted)
    names = bk.supported_from_error(text, option)
    assert names == list((flag(release(engine, version), option) or {})["choices"])
    assert bk.supported_from_error(text, "--some-other-flag") is None
    assert bk.supported_from_error("RuntimeError: CUDA out of memory") is None


def test_the_gb10_kernels_are_among_vllms_choices() -> None:
    for version in ("0.29.0", "0.34.0"):
        for layer in ("moe", "linear"):
            choices = bk.declared_choices("vllm", version, layer)
            assert {"flashinfer_b12x", "b12x"} <= set(choices) and "auto" not in choices
    assert bk.backend_flag("sglang", "0.5.23", "linear") == "--fp4-gemm-backend"
    assert bk.expressible("vllm", "0.34.0", "moe", "flashinfer_b12x")
    assert not bk.expressible("sglang", "0.5.23", "moe", "flashinfer_b12x")


def test_the_refusal_argv_replaces_the_customers_value() -> None:
    argv = ["vllm", "serve", "/models/m", "--moe-backend", "marlin", "--port", "8000"]
    assert bk.refusal_argv(argv, "--moe-backend") == [
        "vllm", "serve", "/models/m", "--port", "8000", "--moe-backend", bk.UNKNOWN_BACKEND]


def vllm_line(message: str) -> str:
    return f"INFO 12-03 10:00:20 [x.py:1] {message}"


def test_each_vllm_versions_moe_line_and_the_linear_kernel_class() -> None:
    """0.29 quotes the backend, 0.34 does not (the tables' format strings)."""
    old = release("vllm", "0.29.0")["lines"]["moe_backend"]["found"][0]["text"]
    new = release("vllm", "0.34.0")["lines"]["moe_backend"]["found"][0]["text"]
    assert "'{backend.value}'" in old and "'" not in new.split("{backend.value}")[0]
    line_029 = old.replace("{backend.value}", "CUTLASS").replace(
        "{available_backend_strs}", "[FLASHINFER_CUTLASS, CUTLASS, MARLIN]")
    line_034 = new.replace("{backend.value}", "MARLIN").replace("{self.name}", "NvFp4").replace(
        "{lora}", "").replace("{available}", " out of potential backends: [FLASHINFER_CUTLASS, MARLIN]")
    linear = release("vllm", "0.34.0")["lines"]["nvfp4_linear_kernel"]["found"][0]["text"] % (
        "FlashInferCutlassNvFp4LinearKernel",)
    got_029 = bk.backend_events("vllm", [vllm_line(line_029)])
    got_034 = bk.backend_events("vllm", [vllm_line(line_034), vllm_line(linear)])
    assert [e["backend"] for e in got_029] == ["cutlass"]
    assert {e["layer"]: e["backend"] for e in got_034} == {"moe": "marlin", "linear": "flashinfer_cutlass"}


def test_sglang_on_gb10_ran_what_its_flags_and_rule_say() -> None:
    auto = {"serving": {"moe_backend": "auto", "linear_backend": "auto"}}
    got = ran_by_rule("sglang", "0.5.23", auto, "12.1")
    assert [(e["layer"], e["backend"], e["source"]) for e in got] == [
        ("moe", "flashinfer_cutlass", "flags"), ("linear", "flashinfer_cutlass", "flags")]
    pinned = {"serving": {"moe_backend": "cutlass", "linear_backend": "auto"}}
    assert ran_by_rule("sglang", "0.5.23", pinned, "12.1")[0]["backend"] == "cutlass"
    assert ran_by_rule("sglang", "0.5.23", auto, "9.0") == []  # no rule recorded for Hopper


def test_the_dispatch_table_tries_only_what_runs_nvfp4_on_sm121() -> None:
    block = dispatch.capability(engine="vllm", version="0.34.0", compute_capability="12.1", layer="moe")
    assert block is not None
    for name in ("flashinfer_b12x", "b12x", "cutlass", "flashinfer_cutlass", "marlin"):
        assert dispatch.can_run(name, block)[0], name
    for name in ("triton", "deep_gemm", "flashinfer_trtllm", "flashinfer_cutedsl"):
        ok, why = dispatch.can_run(name, block)
        assert not ok and "cannot run NVFP4" in why
    assert not dispatch.can_run("aiter", block)[0]  # a ROCm path: not an NVFP4 path here
    assert dispatch.capability(engine="vllm", version="0.34.0", compute_capability="9.0", layer="moe") is None
    assert dispatch.can_run("triton", None) == (True, "")  # no entry: the engine's word decides


def test_a_change_sets_the_flag_and_removes_variables_no_version_reads() -> None:
    config = {
        "serving": {"moe_backend": "auto", "linear_backend": "auto"},
        "env": {"VLLM_USE_FLASHINFER_MOE_FP4": "1", "VLLM_FLASHINFER_MOE_BACKEND": "latency",
                "NCCL_SOCKET_IFNAME": "eth9"},
    }
    assert bk.pinned_env(config) == {"VLLM_USE_FLASHINFER_MOE_FP4": "1",
                                     "VLLM_FLASHINFER_MOE_BACKEND": "latency"}
    changes = bk.backend_changes(config, "flashinfer_b12x", ["moe"])
    assert changes == [
        {"path": "serving.moe_backend", "from": "auto", "to": "flashinfer_b12x"},
        {"path": "env.VLLM_USE_FLASHINFER_MOE_FP4", "from": "1", "to": None},
        {"path": "env.VLLM_FLASHINFER_MOE_BACKEND", "from": "latency", "to": None},
    ]
    assert bk.flags_for("vllm", changes) == ["--moe-backend", "flashinfer_b12x"]
    assert bk.flags_for("sglang", changes) == ["--moe-runner-backend", "flashinfer_b12x"]
    for name in bk.PIN_ENV:  # no modelled version reads them
        for version in ("0.29.0", "0.34.0"):
            assert name not in str(release("vllm", version)["env"])


def test_the_versions_order_of_preference_and_its_warnings_come_from_its_log() -> None:
    lines = [
        "WARNING 12-05 07:10:02 [interface.py:1501] Unknown vLLM environment variable detected: "
        "VLLM_NVFP4_GEMM_BACKEND",
        vllm_line("Using FLASHINFER_CUTLASS NvFp4 MoE backend out of potential backends: "
                  "['FLASHINFER_CUTLASS', 'VLLM_CUTLASS', 'FLASHINFER_B12X', 'B12X', 'MARLIN']."),
    ]
    assert bk.preference_order(lines) == [
        "flashinfer_cutlass", "cutlass", "flashinfer_b12x", "b12x", "marlin"]
    assert bk.unknown_env_warned("vllm", lines) == ["VLLM_NVFP4_GEMM_BACKEND"]
    pinned = vllm_line("Using MARLIN NvFp4 MoE backend out of potential backends: ['MARLIN'].")
    assert bk.preference_order([pinned]) == ["marlin"]
    assert bk.preference_order([vllm_line("Using FlashInferCutlassNvFp4LinearKernel for NVFP4 GEMM")]) == []


def test_only_pins_the_version_does_not_read_are_removed() -> None:
    config = {"engine": {"name": "vllm", "version": "0.34.0"},
              "env": {"VLLM_USE_FLASHINFER_MOE_FP4": "1", "VLLM_LOGGING_LEVEL": "DEBUG"}}
    assert bk.reads_env("vllm", "0.34.0", "VLLM_LOGGING_LEVEL")
    assert not bk.reads_env("vllm", "0.34.0", "VLLM_USE_FLASHINFER_MOE_FP4")
    assert bk.pinned_env(config) == {"VLLM_USE_FLASHINFER_MOE_FP4": "1"}
