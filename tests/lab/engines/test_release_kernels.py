"""The NVFP4 kernels as the releases name them (issue 37 items 9 and 14): the linear kernel
class a vLLM line names is read as the --linear-backend choice the release maps it to, and
the MoE oracle's "potential backends" list is the release's fixed one."""

from __future__ import annotations

import ast

import pytest

from enginetables.extract import nvfp4_linear_kernels
from lab.engines import parse_log
from lab.engines.tables import release
from lab.engines.vllm import linear_kernel_choice
from lab.sim.engine import VLLM_MOE_POTENTIAL
from tests.lab.engines.release_source import source

KERNEL_MAP = "vllm/model_executor/kernels/linear/__init__.py"
MOE_ORACLE = "vllm/model_executor/layers/fused_moe/oracle/nvfp4.py"


@pytest.mark.parametrize("version", ["0.29.0", "0.34.0"])
def test_the_table_holds_the_releases_kernel_map(version: str) -> None:
    tree = ast.parse(source("vllm", version, KERNEL_MAP))
    assert release("vllm", version)["nvfp4_linear_kernels"] == nvfp4_linear_kernels({KERNEL_MAP: tree})


@pytest.mark.parametrize(("version", "kernel", "choice"), [
    ("0.34.0", "FlashInferCuteDslNvFp4LinearKernel", "flashinfer_cutedsl"),  # not flashinfer_cute_dsl
    ("0.34.0", "FlashInferCuteDslNvFp4W4A16LinearKernel", "flashinfer_cutedsl"),
    ("0.34.0", "B12xNvFp4W4A16LinearKernel", "b12x"),
    ("0.34.0", "FlashInferCutlassNvFp4LinearKernel", "flashinfer_cutlass"),
    ("0.34.0", "TorchNvFp4LinearKernel", "torch"),
    ("0.29.0", "CutlassNvFp4LinearKernel", "cutlass"),
    ("0.29.0", "FlashInferCuteDslNvFp4LinearKernel", "flashinfer_cutedsl"),
])
def test_a_linear_kernel_reads_as_the_choice_that_covers_it(version: str, kernel: str, choice: str) -> None:
    assert linear_kernel_choice(kernel, version) == choice
    [event] = [e for e in parse_log("vllm", [f"INFO 12-06 10:00:00 [x.py:1] Using {kernel} for NVFP4 GEMM"],
                                    version=version) if e["kind"] == "fp4_backend"]
    assert (event["backend"], event["layer"]) == (choice, "linear")
    assert "selectable" not in event


def test_a_kernel_no_choice_covers_is_said_to_be_automatic_only() -> None:
    # 0.34.0's Hadamard variant is picked only by the automatic rule.
    line = "INFO 12-06 10:00:00 [x.py:1] Using HummingHadamardNvFp4LinearKernel for NVFP4 GEMM"
    [event] = [e for e in parse_log("vllm", [line], version="0.34.0") if e["kind"] == "fp4_backend"]
    assert event["selectable"] is False
    assert event["backend"] == "humming_hadamard"
    assert linear_kernel_choice("HummingHadamardNvFp4LinearKernel", "0.34.0") is None


@pytest.mark.parametrize("version", ["0.29.0", "0.34.0"])
def test_the_potential_backends_are_the_releases_fixed_list(version: str) -> None:
    # AVAILABLE_BACKENDS in select_nvfp4_moe_backend: the list the line prints, forced or not
    # (B12X is excluded from automatic choice on SM121).
    text = source("vllm", version, MOE_ORACLE)
    tree = ast.parse(text)
    select = next(n for n in tree.body
                  if isinstance(n, ast.FunctionDef) and n.name == "select_nvfp4_moe_backend")
    assigned = next(n for n in ast.walk(select) if isinstance(n, ast.Assign)
                    and getattr(n.targets[0], "id", "") == "AVAILABLE_BACKENDS"
                    and isinstance(n.value, ast.List))
    assert tuple(e.attr for e in assigned.value.elts) == VLLM_MOE_POTENTIAL  # type: ignore[attr-defined]
