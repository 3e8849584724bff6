"""Where the rest goes: the weights' read at the bandwidth preflight measured (catalog bytes,
measured bandwidth), or at the specified peak without a measurement, and the parts still
summing to the measured step either way."""

from __future__ import annotations

from typing import Any

import pytest

from diagnostic.jobs.stages.measure import explain_rest
from diagnostic.pipelines.explain import ESTIMATE, MEASURED, explain_step, measured_bandwidth
from lab.catalog import reference_catalog

FACTS = {f"spark-0{i}": {"gpus": [{"name": "NVIDIA GB10"}]} for i in range(1, 9)}
CONFIG: dict[str, Any] = {"parallel": {"tp": 8, "pp": 1},
                          "model": {"id": "moonshotai/Kimi-K2-Instruct-0905"}, "speculative": None}
PROBED: dict[str, Any] = {
    "method": "torch.sum over a float32 buffer", "size_mib": 2048, "repeats": 5,
    "nodes": {f"spark-0{i}": {"median_gbs": 204.0 + i * 0.2, "gbs": [204.0 + i * 0.2] * 5}
              for i in range(1, 9)},
    "median_gbs": 204.9, "min_gbs": 204.2, "min_node": "spark-01", "failed": {}, "lab_s": 2.1,
}


def _profile() -> Any:
    model = reference_catalog().served(CONFIG)
    assert model is not None
    return model.profile


def _weights(entry: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in entry["parts"] if p["part"] == "weights_read")


def test_with_a_measured_bandwidth_the_weights_are_read_at_it() -> None:
    entry = explain_step(16.2, acceptance_len=None, k=None, profile=_profile(), nodes_facts=FACTS,
                         config=CONFIG, measured_bw=PROBED)
    weights = _weights(entry)
    gb = _profile().decode_bytes_per_token_gb
    assert weights["ms"] == pytest.approx(gb / (8 * 204.9) * 1000, abs=1e-3)
    assert weights["kind"] == MEASURED
    assert weights["basis"] == "catalog bytes at the measured bandwidth"
    assert "reached 205 GB/s of the 273 specified" in weights["how"]
    assert "the median of 8 nodes' medians of 5 repeats each" in weights["how"]
    assert "the slowest node 204 GB/s" in weights["how"]
    inputs = weights["inputs"]
    assert (inputs["mem_bw_gbs"], inputs["peak_gbs"], inputs["bandwidth_kind"]) == (204.9, 273.0, MEASURED)
    assert (inputs["probe_nodes"], inputs["probe_repeats"]) == (8, 5)
    # Honest about what is not measured: the catalog's bytes, the experts' uneven read.
    assert any("not read evenly across the ranks" in n and "remainder" in n for n in entry["notes"])
    assert entry["sum_ms"] == pytest.approx(entry["step_ms"], abs=0.01)
    rest = next(p for p in entry["parts"] if p["part"] == "communication_and_overhead")
    assert rest["ms"] == pytest.approx(1000 / 16.2 - weights["ms"], abs=2e-3)


@pytest.mark.parametrize("bw", [None, {"unavailable": "mem-bw-probe unsupported: no torch"},
                                {"median_gbs": None}, {"median_gbs": 0}])
def test_without_a_measured_bandwidth_it_is_the_peak_estimate(bw: dict[str, Any] | None) -> None:
    entry = explain_step(16.2, acceptance_len=None, k=None, profile=_profile(), nodes_facts=FACTS,
                         config=CONFIG, measured_bw=bw)
    weights = _weights(entry)
    assert weights["kind"] == ESTIMATE
    assert weights["basis"] == "catalog bytes at the specified peak"
    assert weights["ms"] == pytest.approx(_profile().decode_bytes_per_token_gb / (8 * 273.0) * 1000, abs=1e-3)
    assert "specified peak" in weights["how"]
    [note] = [n for n in entry["notes"] if n.startswith("The weights' read is at the specified peak")]
    if bw and bw.get("unavailable"):
        assert "mem-bw-probe unsupported: no torch" in note
    assert entry["sum_ms"] == pytest.approx(entry["step_ms"], abs=0.01)


def test_a_measured_read_takes_longer_than_the_peak_one_and_the_remainder_shrinks() -> None:
    args: dict[str, Any] = {"acceptance_len": None, "k": None, "profile": _profile(), "nodes_facts": FACTS,
                            "config": CONFIG}
    peak = explain_step(16.2, **args)
    measured = explain_step(16.2, **args, measured_bw=PROBED)
    assert _weights(measured)["ms"] > _weights(peak)["ms"]
    assert measured["parts"][1]["ms"] < peak["parts"][1]["ms"]
    assert measured["step_ms"] == peak["step_ms"]


def test_a_measured_bandwidth_needs_no_accelerator_in_the_catalog() -> None:
    facts = {"spark-01": {"gpus": [{"name": "Some Future GPU"}]}}
    entry = explain_step(16.2, acceptance_len=None, k=None, profile=_profile(), nodes_facts=facts,
                         config=CONFIG, measured_bw=PROBED)
    weights = _weights(entry)
    assert weights["kind"] == MEASURED and "specified" not in weights["how"]
    assert weights["inputs"]["peak_gbs"] is None


def test_speculation_keeps_its_part_with_a_measured_bandwidth() -> None:
    config = {**CONFIG, "speculative": {"method": "eagle3", "num_speculative_tokens": 2}}
    entry = explain_step(27.9, acceptance_len=2.52, k=2, profile=_profile(), nodes_facts=FACTS, config=config,
                         no_spec_tps=16.2, measured_bw=PROBED)
    assert [p["part"] for p in entry["parts"]] == [
        "weights_read", "communication_and_overhead", "speculation"]
    assert entry["sum_ms"] == pytest.approx(entry["step_ms"], abs=0.01)


def test_measured_bandwidth_reads_preflight_s_entry() -> None:
    assert measured_bandwidth(PROBED) == (204.9, "")
    assert measured_bandwidth(None)[0] is None
    assert measured_bandwidth({"unavailable": "busy"}) == (
        None, "preflight could not measure the memory bandwidth: busy")
    assert measured_bandwidth({"median_gbs": True})[0] is None


class _Ctx:
    """What explain_rest asks of the stage context: the lab's catalog, earlier results, a log."""

    def __init__(self, results: dict[str, Any]) -> None:
        self.catalog = reference_catalog()
        self.results = results
        self.lines: list[str] = []

    def earlier_result(self, name: str) -> dict[str, Any] | None:
        return self.results.get(name)

    def log(self, line: str) -> None:
        self.lines.append(line)


@pytest.mark.parametrize("preflight", [{"memory_bandwidth": PROBED},
                                       {"memory_bandwidth": {"unavailable": "x"}}, {}, None])
def test_the_measure_stage_passes_preflight_s_bandwidth_to_the_split(
        preflight: dict[str, Any] | None) -> None:
    ctx = _Ctx({"preflight": preflight} if preflight is not None else {})
    out = explain_rest(ctx, dict(CONFIG), "customer", {"code": {"mean_tps": 16.2}},  # type: ignore[arg-type]
                       {"code": {"bound_tps": 136.5}}, FACTS, ("code",))
    weights = _weights(out["code"])
    if preflight and "median_gbs" in preflight.get("memory_bandwidth", {}):
        assert out["memory_bandwidth"] == PROBED
        assert weights["kind"] == MEASURED and weights["inputs"]["mem_bw_gbs"] == 204.9
    else:
        assert "unavailable" in out["memory_bandwidth"]
        assert weights["kind"] == ESTIMATE and weights["inputs"]["mem_bw_gbs"] == 273.0
    assert "weights_read" in ctx.lines[0]
