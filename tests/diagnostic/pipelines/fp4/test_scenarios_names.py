"""The FP4 stage on labs whose backends are not the reference lab's: other names, and
no correct backend at all."""

from __future__ import annotations

from pathlib import Path

from diagnostic.pipelines.fp4 import FINDING

from .labs import config, run_and_relaunch_tuned, scenario


def test_other_backend_names(tmp_path: Path) -> None:
    """The native backends broken: the GB10 kernels (flashinfer_b12x, b12x) are tried and
    Triton, which has no NVFP4 kernel for sm_121, never is."""
    scn = scenario(
        default="flashinfer_cutlass",
        broken=["flashinfer_cutlass", "cutlass"],
        speed={"flashinfer_cutlass": 1.0, "cutlass": 1.0, "flashinfer_b12x": 1.0, "b12x": 1.0, "marlin": 1.2},
        # The choice rests on marlin's 20 % against the GB10 kernels: at the labs' 300 a short
        # screen is ~20 ms of wall time, which a busy CI machine's stall reversed twice in a run.
        dilation=100,
    )
    result = run_and_relaunch_tuned(tmp_path, scn, config())
    fp4 = result["section"]
    assert fp4["backend_before"] == "flashinfer_cutlass" and fp4["verdict"] == "garbage"
    assert {"flashinfer_b12x", "b12x", "triton", "marlin"} <= set(fp4["candidates_source"]["supported"])
    # Both GB10 kernels are correct and equally fast: the one vLLM's own rule considers first.
    assert fp4["backend_after"] == "flashinfer_b12x"
    statuses = {c["backend"]: c["status"] for c in fp4["candidates"]}
    assert statuses["triton"] == "skipped" and statuses["cutlass"] == "measured"
    assert [f["code"] for f in result["findings"]] == [FINDING]


def test_no_correct_backend(tmp_path: Path) -> None:
    scn = scenario(default="flashinfer_cutlass",
                   broken=["flashinfer_cutlass", "cutlass", "flashinfer_b12x", "b12x", "marlin"])
    result = run_and_relaunch_tuned(tmp_path, scn, config())
    fp4 = result["section"]
    assert fp4["verdict"] == "garbage" and fp4["backend_after"] is None and fp4["verdict_after"] is None
    assert result["config_changes"] == []
    assert result["findings"][0]["change"] is None
    assert "no correct backend" in result["findings"][0]["title"]


def test_sglang_which_names_only_its_moe_runner(tmp_path: Path) -> None:
    """SGLang 0.5.23 on GB10 names its MoE runner while it reads its arguments (an auto
    runner for modelopt_fp4 on SM110/SM120 is flashinfer_cutlass) and logs no linear
    backend: that is known from the flags and its rule. Its --fp4-gemm-backend has no
    `cutlass`: the MoE runner is switched and the GEMM keeps its backend, rather than both
    going to the one name both flags take (Marlin)."""
    engine = {"name": "sglang", "version": "0.5.23"}
    scn = scenario(default="flashinfer_cutlass", broken=["flashinfer_cutlass"], engine=engine)
    result = run_and_relaunch_tuned(tmp_path, scn, config(engine=engine))
    fp4 = result["section"]
    assert fp4["verdict"] == "garbage" and fp4["backend_before"] == "flashinfer_cutlass"
    assert any("log names the moe backend; the rest is known from the flags and the version's default "
               "rule (linear" in n for n in fp4["notes"]), fp4["notes"]
    assert fp4["layers"] == ["moe", "linear"]
    source = fp4["candidates_source"]
    assert set(source["how"]) == {"--moe-runner-backend", "--fp4-gemm-backend"}
    assert "cutlass" not in source["flags"]["--fp4-gemm-backend"]
    assert fp4["backend_after"] == "cutlass" and fp4["verdict_after"] == "correct"
    assert [(c["path"], c["to"]) for c in result["config_changes"]] == [("serving.moe_backend", "cutlass")]
    assert any(n.startswith("cutlass: set on moe only; linear keeps") for n in fp4["notes"])
    assert result["findings"][0]["change"]["flags"] == ["--moe-runner-backend", "cutlass"]
    assert result["tuned_config"]["serving"]["linear_backend"] == "auto"
