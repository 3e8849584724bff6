"""The memory roofline comes from published sizes and the nodes' own accelerator names."""

import pytest

from diagnostic.pipelines.catalogs import CatalogError, accelerator, model_profile
from diagnostic.pipelines.roofline import fraction_of_bound, roofline

CONFIG = {"parallel": {"tp": 8, "pp": 1}, "model": {"id": "moonshotai/Kimi-K2-Instruct-0905"}}


def facts(name: str = "NVIDIA GB10", nodes: int = 8) -> dict:
    return {f"n{i}": {"gpus": [{"name": name, "compute_capability": "12.1"}]} for i in range(nodes)}


def test_it_bounds_eight_gb10_ranks_by_their_bandwidth_over_the_active_bytes():
    bound = roofline(CONFIG, facts())
    assert bound["bound_tps"] == pytest.approx(8 * 273 / 32.0)
    assert bound["inputs"]["mem_bw_gbs"] == 273
    assert bound["inputs"]["decode_bytes_per_token_gb"] == 32.0


def test_speculation_multiplies_the_bound_by_the_measured_acceptance_length():
    plain = roofline(CONFIG, facts())["bound_tps"]
    spec = roofline(CONFIG, facts(), mean_acceptance_length=3.05)["bound_tps"]
    assert spec == pytest.approx(plain * 3.05, rel=1e-4)


def test_pipeline_stages_add_no_bandwidth_for_one_stream():
    four_by_two = {"parallel": {"tp": 4, "pp": 2}, "model": CONFIG["model"]}
    assert roofline(four_by_two, facts())["bound_tps"] == pytest.approx(4 * 273 / 32.0)


def test_an_unknown_accelerator_leaves_the_bound_out_and_says_why():
    bound = roofline(CONFIG, facts("NVIDIA H100 80GB HBM3"))
    assert bound["bound_tps"] is None
    assert "H100" in bound["unavailable"] and "NVIDIA GB10" in bound["unavailable"]
    assert fraction_of_bound(25.0, bound) is None


def test_mixed_accelerators_are_not_averaged():
    mixed = {**facts(nodes=2), "odd": {"gpus": [{"name": "GB10"}]}}
    assert "different accelerators" in roofline(CONFIG, mixed)["unavailable"]


def test_catalog_lookups_name_what_they_know():
    assert model_profile("moonshotai/Kimi-K2-Instruct")["layers"] == 61
    with pytest.raises(CatalogError, match="Kimi-K2-Instruct-0905"):
        model_profile("someone/else")
    with pytest.raises(CatalogError, match="NVIDIA GB10"):
        accelerator("TPU")


def test_fraction_of_bound():
    assert fraction_of_bound(27.3, {"bound_tps": 68.25}) == pytest.approx(0.4)
