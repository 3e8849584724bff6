"""The memory roofline comes from the model's profile in the lab's catalog and the nodes'
own accelerator names."""

import pytest

from diagnostic.pipelines.catalogs import CatalogError, accelerator
from diagnostic.pipelines.roofline import fraction_of_bound, roofline
from lab.catalog import parse_catalog
from lab.scenarios import scenario_path
from lab.sim.lab import scenario_catalog
from lab.sim.scenario import load_scenario

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


def test_the_hardware_catalog_names_what_it_knows():
    assert accelerator("GB10")["mem_bw_gbs"] == 273
    with pytest.raises(CatalogError, match="NVIDIA GB10"):
        accelerator("TPU")


DEEPSEEK_CONFIG = {"parallel": {"tp": 4, "pp": 1},
                   "model": {"id": "nvidia/DeepSeek-V3-0324-FP4", "path": "/models/deepseek-v3-fp4"}}


def test_the_profile_is_the_labs_own_catalog_entrys():
    lab = scenario_catalog(load_scenario(scenario_path("deepseek-v3-4spark")))
    bound = roofline(DEEPSEEK_CONFIG, facts(nodes=4), catalog=lab)
    assert bound["bound_tps"] == pytest.approx(4 * 273 / 21.9, rel=1e-4)
    assert bound["inputs"]["decode_bytes_per_token_gb"] == 21.9
    assert bound["inputs"]["catalog_version"] == lab.version
    assert "deepseek-v3-4spark" in bound["inputs"]["model_source"]
    # The same model on a lab that does not hold it has no bound there, and says what it holds.
    kimi_lab = scenario_catalog(load_scenario(scenario_path("reference-kimi-k2-8spark")))
    elsewhere = roofline(DEEPSEEK_CONFIG, facts(nodes=4), catalog=kimi_lab)
    assert elsewhere["bound_tps"] is None
    assert "not a model this lab's catalog" in elsewhere["unavailable"]
    assert "moonshotai/Kimi-K2-Instruct-0905" in elsewhere["unavailable"]


def test_a_model_without_a_profile_leaves_the_bound_out_and_says_why():
    catalog = parse_catalog({"schema": "lab.catalog/1", "version": "7", "models_dir": "/models", "models": [
        {"id": "org/bare", "path": "/models/bare"},
        {"id": "org/partial", "path": "/models/partial", "profile": {"layers": 40}}]})
    for name in ("org/bare", "org/partial"):
        bound = roofline({"parallel": {"tp": 2, "pp": 1}, "model": {"id": name, "path": name}}, facts(),
                         catalog=catalog)
        assert bound["bound_tps"] is None
        assert bound["unavailable"] == (
            f"the lab's catalog (version 7) gives no decode_bytes_per_token_gb in the profile of {name}, "
            "so the weights a token reads are not known")
        assert fraction_of_bound(10.0, bound) is None


def test_fraction_of_bound():
    assert fraction_of_bound(27.3, {"bound_tps": 68.25}) == pytest.approx(0.4)
