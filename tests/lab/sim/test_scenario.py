"""Scenario files: the labsim.scenario/1 format, its defaults and its errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.scenarios import available, scenario_path
from lab.sim.scenario import ScenarioError, load_scenario, parse_scenario


def minimal(**extra: Any) -> dict[str, Any]:
    return {"schema": "labsim.scenario/1", "name": "t", **extra}


def error_of(data: dict[str, Any]) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data)
    return info.value


def test_the_reference_scenario_reads_as_lab_model_section_8_says() -> None:
    s = load_scenario(scenario_path("reference-kimi-k2-8spark"))
    assert (s.name, s.seed, s.dilation, s.nodes) == ("reference-kimi-k2-8spark", 7, 30.0, 8)
    assert s.engine == {"name": "vllm", "version": "0.34.0"}
    assert s.truth["load"]["rendezvous"] == {
        "needs": {"NCCL_SOCKET_IFNAME": "enP7s7", "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0"},
        "stall_s": 60.0,
    }
    assert s.truth["fp4"]["broken"] == ["flashinfer_cutlass"]
    assert s.truth["server_counts"] == "emitted"
    assert s.truth["specdec"]["acceptance"]["eagle3"]["code"][:2] == [0.86, 0.76]
    assert s.node_names == [f"spark-0{i}" for i in range(1, 9)]


def test_every_unstated_field_takes_the_lab_model_default() -> None:
    s = parse_scenario(minimal())
    load = s.truth["load"]
    assert load == {
        "proc_start_s": 20.0, "mmap_read_gbs": 0.33, "nvme_read_gbs": 6.0, "page_cache_gbs": 20.0,
        "rendezvous_s": 8.0, "jit_cold_s": 150.0, "jit_warm_s": 10.0, "kv_alloc_s": 15.0,
        "graph_capture_s": 75.0, "api_ready_s": 5.0, "rendezvous": load["rendezvous"],
    }
    assert s.node["mem_gib"] == 121.7 and s.node["cuda_free_gib"] == 102.0
    assert s.node["nics"]["data"] == ["enp1s0f0np0", "enP2p1s0f0np0"]
    assert s.network == {"link_gbps": 100.0, "collective_latency_us": 120.0, "hop_latency_us": 30.0}
    assert s.truth["decode"]["step_overhead_ms"] == 8.0 and s.truth["decode"]["prefill_tps"] == 900.0
    assert s.truth["server_counts"] == "emitted" and s.truth["faults"] == []
    assert s.serving == {"abort_on_disconnect": True, "log_interval_s": 10.0}
    assert s.model["checkpoint_gb"] == 597.0
    assert s.model["kv_bytes_per_token"] == {"fp8": 35136, "bf16": 70272}


def test_the_nvme_rate_of_the_load_defaults_to_the_nodes_own() -> None:
    s = parse_scenario(minimal(cluster={"node": {"nvme_read_gbs": 3.5}}))
    assert s.truth["load"]["nvme_read_gbs"] == 3.5


def test_a_model_mapping_overrides_the_kimi_k2_profile_field_by_field() -> None:
    s = parse_scenario(minimal(model={"checkpoint_gb": 300, "kv_bytes_per_token": 1000}))
    assert s.model["checkpoint_gb"] == 300.0
    assert s.model["layers"] == 61
    assert s.model["kv_bytes_per_token"] == {"fp8": 1000, "bf16": 2000}


def test_an_unknown_top_level_field_is_named() -> None:
    err = error_of(minimal(colour="blue"))
    assert err.field == "colour"
    assert "unknown field" in str(err) and "truth" in str(err)


def test_an_unknown_nested_field_is_named_by_its_dotted_path() -> None:
    err = error_of(minimal(truth={"load": {"mmap_gbs": 1}}))
    assert err.field == "truth.load.mmap_gbs"
    assert "mmap_read_gbs" in str(err)  # the accepted names are listed


def test_an_ill_typed_value_names_the_field_the_value_and_what_is_accepted() -> None:
    err = error_of(minimal(truth={"load": {"mmap_read_gbs": "fast"}}))
    assert str(err).startswith("truth.load.mmap_read_gbs: got 'fast'; accepted: a number")


def test_an_integer_field_refuses_a_fraction() -> None:
    err = error_of(minimal(cluster={"nodes": 7.5}))
    assert err.field == "cluster.nodes"


def test_a_rate_of_zero_is_refused() -> None:
    assert error_of(minimal(truth={"load": {"page_cache_gbs": 0}})).field == "truth.load.page_cache_gbs"


def test_an_acceptance_rate_above_one_is_refused_by_position() -> None:
    err = error_of(minimal(truth={"specdec": {"acceptance": {"eagle3": {"code": [0.5, 1.5]}}}}))
    assert err.field == "truth.specdec.acceptance.eagle3.code[1]"


def test_an_unknown_model_profile_lists_the_built_in_ones() -> None:
    err = error_of(minimal(model="llama"))
    assert err.field == "model" and "kimi-k2" in str(err)


def test_a_broken_backend_must_be_one_the_speed_table_knows() -> None:
    err = error_of(minimal(truth={"fp4": {"broken": ["warp_drive"]}}))
    assert err.field == "truth.fp4.broken[0]" and "flashinfer_cutlass" in str(err)


def test_faults_are_read_in_their_four_shapes() -> None:
    s = parse_scenario(minimal(truth={"faults": [
        {"node_down": "spark-05"}, {"engine_crash_after_s": 900},
        {"nic_degraded_gbps": 25, "node": "spark-03"}, {"kv_budget": True}]}))
    assert s.truth["faults"] == [{"node_down": "spark-05"}, {"engine_crash_after_s": 900.0},
                                 {"nic_degraded_gbps": 25.0, "node": "spark-03"}, {"kv_budget": True}]
    assert s.faults("node_down") == [{"node_down": "spark-05"}]


def test_a_kv_budget_is_the_native_share_or_gib_per_rank_and_nothing_else() -> None:
    s = parse_scenario(minimal(truth={"faults": [{"kv_budget": 12}]}))
    assert s.truth["faults"] == [{"kv_budget": 12.0}]
    for bad in (0, -3, "lots", False):
        err = error_of(minimal(truth={"faults": [{"kv_budget": bad}]}))
        assert err.field == "truth.faults[0].kv_budget" and "GiB" in str(err)


def test_a_clock_offset_reads_as_lab_seconds_either_way_for_one_node_or_all() -> None:
    s = parse_scenario(minimal(truth={"faults": [{"clock_offset_s": -90, "node": "spark-02"},
                                                 {"clock_offset_s": 1.5}]}))
    assert s.faults("clock_offset_s") == [{"clock_offset_s": -90.0, "node": "spark-02"},
                                          {"clock_offset_s": 1.5}]
    err = error_of(minimal(truth={"faults": [{"clock_offset_s": "ahead"}]}))
    assert err.field == "truth.faults[0].clock_offset_s" and "lab seconds" in str(err)
    err = error_of(minimal(cluster={"nodes": 2},
                           truth={"faults": [{"clock_offset_s": 5, "node": "spark-03"}]}))
    assert err.field == "truth.faults[0].node"


def test_a_fault_naming_a_node_the_lab_lacks_is_refused() -> None:
    err = error_of(minimal(cluster={"nodes": 4}, truth={"faults": [{"node_down": "spark-05"}]}))
    assert err.field == "truth.faults[0].node_down" and "spark-04" in str(err)


def test_an_unknown_fault_kind_is_refused_with_the_kinds_listed() -> None:
    err = error_of(minimal(truth={"faults": [{"gremlins": True}]}))
    assert err.field == "truth.faults[0]" and "kv_budget" in str(err)


def test_an_unknown_server_count_rule_is_refused() -> None:
    assert error_of(minimal(truth={"server_counts": "tokens"})).field == "truth.server_counts"


@pytest.mark.parametrize("rule", ["proposed", "emitted_busy"])
def test_a_count_no_modelled_release_makes_is_refused(rule: str) -> None:
    # vLLM counts len(new_token_ids) per step (v1/metrics/stats.py) over the interval's
    # wall time, SGLang accepted drafts plus one (managers/utils.py): a scenario runs a
    # modelled release, so it counts honestly (LAB_MODEL.md section 4).
    for engine in ({"name": "vllm", "version": "0.29.0"}, {"name": "sglang", "version": "0.5.23"}):
        err = error_of(minimal(engine=engine, truth={"server_counts": rule}))
        assert err.field == "truth.server_counts"
        assert "the modelled releases count the tokens each step emits" in str(err)


def test_the_wrong_schema_is_refused() -> None:
    assert error_of({"schema": "labsim.scenario/2"}).field == "schema"


def test_a_file_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(minimal(dilation=-1)))
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert info.value.field == "dilation" and str(path) in str(info.value)


@pytest.mark.parametrize("name", available())
def test_every_shipped_scenario_loads(name: str) -> None:
    assert load_scenario(scenario_path(name)).name == name


def test_an_unknown_shipped_scenario_lists_the_available_ones() -> None:
    with pytest.raises(FileNotFoundError, match="reference-kimi-k2-8spark"):
        scenario_path("nope")
