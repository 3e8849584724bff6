"""The FP4 stage on labs whose backends are not the reference lab's: other names, and
no correct backend at all."""

from __future__ import annotations

from pathlib import Path

from diagnostic.pipelines.fp4 import FINDING

from .labs import config, run_and_relaunch_tuned, scenario


def test_other_backend_names(tmp_path: Path) -> None:
    # The simulator keeps its default backends beside these; the ones not broken here are
    # FlashInfer CUTLASS, Triton and Marlin.
    scn = scenario(
        default="flashinfer_trtllm",
        broken=["flashinfer_trtllm", "cutlass", "flashinfer_cutlass"],
        speed={"flashinfer_trtllm": 1.0, "cutlass": 0.9, "triton": 2.0, "marlin": 1.2},
    )
    result = run_and_relaunch_tuned(tmp_path, scn, config())
    fp4 = result["section"]
    assert fp4["backend_before"] == "flashinfer_trtllm" and fp4["verdict"] == "garbage"
    assert fp4["table_row"] is None  # the table knows nothing of it; the checks decide
    assert set(fp4["candidates_source"]["supported"]) >= {"flashinfer_trtllm", "cutlass", "triton", "marlin"}
    assert fp4["backend_after"] == "marlin"  # triton is correct too, but far slower
    assert {c["backend"]: c["verdict"] for c in fp4["candidates"]}["triton"] == "correct"
    assert [f["code"] for f in result["findings"]] == [FINDING]


def test_no_correct_backend(tmp_path: Path) -> None:
    scn = scenario(default="flashinfer_cutlass", broken=["flashinfer_cutlass", "cutlass", "marlin"])
    result = run_and_relaunch_tuned(tmp_path, scn, config())
    fp4 = result["section"]
    assert fp4["verdict"] == "garbage" and fp4["backend_after"] is None and fp4["verdict_after"] is None
    assert result["config_changes"] == []
    assert result["findings"][0]["change"] is None
    assert "no correct backend" in result["findings"][0]["title"]
