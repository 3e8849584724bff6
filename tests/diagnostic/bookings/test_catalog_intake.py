"""Intake admits a configuration by the catalog of the lab it is for: a lab holding
DeepSeek V3 admits a configuration serving it, the Kimi K2 lab refuses that one with what
it holds, and the other way round; a lab whose catalog cannot be known admits nothing."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.exceptions import ValidationError

from diagnostic.bookings.configs import booking_catalog, lab_catalog, submit_configuration
from diagnostic.bookings.models import Lab, LabDay, book_lab_day
from diagnostic.jobs.preflight import model_memory_check
from diagnostic.portal.submission import (
    SubmissionError,
    booked_catalog,
    from_command,
    from_yaml,
    launch_preview,
)
from lab.catalog import parse_catalog
from lab.scenarios import scenario_path
from tests.diagnostic.conftest import REFERENCE_CONFIG, Cast

DEEPSEEK_SCENARIO = scenario_path("deepseek-v3-4spark")
DEEPSEEK_CONFIG = """schema: diagnostic.config/1
engine: {name: vllm, version: "0.34.0"}
model: {id: nvidia/DeepSeek-V3-0324-FP4, quantization: nvfp4, path: /models/deepseek-v3-fp4}
cluster: {nodes: 4, node_type: dgx-spark, link_gbps: 100}
parallel: {tp: 4, pp: 1, expert_parallel: true}
serving: {max_model_len: 65536, kv_cache_dtype: fp8, gpu_memory_utilization: 0.95}
workloads: [code, prose]
"""
DEEPSEEK_COMMAND = ("vllm serve /models/deepseek-v3-fp4 --tensor-parallel-size 4 --enable-expert-parallel "
                    "--max-model-len 65536 --kv-cache-dtype fp8 --gpu-memory-utilization 0.95")
KIMI_HOLDS = "/models/kimi-k2 (moonshotai/Kimi-K2-Instruct-0905)"
DEEPSEEK_HOLDS = "/models/deepseek-v3-fp4 (nvidia/DeepSeek-V3-0324-FP4)"


@pytest.fixture
def deepseek_lab(db: None) -> Lab:
    return Lab.objects.create(name="sim:deepseek", inventory=f"sim:{DEEPSEEK_SCENARIO}")


def messages(exc: pytest.ExceptionInfo[ValidationError]) -> str:
    return " ".join(exc.value.messages)


def test_a_configuration_is_admitted_on_the_lab_that_holds_its_model(deepseek_lab: Lab, cast: Cast) -> None:
    day = LabDay.objects.create(lab=deepseek_lab, date=dt.date.today() + dt.timedelta(days=5))
    booking = book_lab_day(lab_day=day, customer=cast.alice)
    assert booking_catalog(booking) == lab_catalog(deepseek_lab)
    config = submit_configuration(raw_text=DEEPSEEK_CONFIG, source="yaml", booking=booking)
    assert config.normalized["model"]["path"] == "/models/deepseek-v3-fp4"
    # DeepSeek V3 ships no code of its own: no --trust-remote-code in what the lab launches.
    command = launch_preview(config.normalized, deepseek_lab)
    assert "/models/deepseek-v3-fp4" in command and "--trust-remote-code" not in command
    pasted = from_command(DEEPSEEK_COMMAND, catalog=booked_catalog(deepseek_lab))
    assert pasted.normalized["parallel"]["tp"] == 4


def test_the_kimi_lab_refuses_it_and_says_what_it_holds(lab: Lab, deepseek_lab: Lab) -> None:
    with pytest.raises(ValidationError) as caught:
        submit_configuration(raw_text=DEEPSEEK_CONFIG, source="yaml", lab=lab)
    assert "model.path: '/models/deepseek-v3-fp4' is not a model this lab holds" in messages(caught)
    assert KIMI_HOLDS in messages(caught) and "DeepSeek" not in messages(caught).split("holds;")[1]
    with pytest.raises(SubmissionError) as refused:
        from_command(DEEPSEEK_COMMAND, catalog=booked_catalog(lab))
    assert KIMI_HOLDS in str(refused.value)
    # And the DeepSeek lab refuses the reference Kimi K2 configuration, naming its own model.
    with pytest.raises(SubmissionError) as other:
        from_yaml(REFERENCE_CONFIG.read_text(), catalog=booked_catalog(deepseek_lab))
    assert "is not a model this lab holds" in str(other.value) and DEEPSEEK_HOLDS in str(other.value)
    assert submit_configuration(raw_text=REFERENCE_CONFIG.read_text(), source="yaml", lab=lab)


def test_a_real_labs_catalog_is_the_one_its_inventory_names(tmp_path: Path, db: None) -> None:
    inventory: dict[str, Any] = {
        "schema": "lab.inventory/1", "name": "two-models", "catalog": "catalog.yaml",
        "nodes": [{"name": f"spark-0{i}", "host": f"10.0.0.{i}", "role": "head" if i == 1 else "worker"}
                  for i in range(1, 9)]}
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "catalog.yaml").write_text(yaml.safe_dump({
        "schema": "lab.catalog/1", "version": "3", "models_dir": "/models", "models": [
            {"id": "moonshotai/Kimi-K2-Instruct-0905", "path": "/models/kimi-k2", "remote_code": True},
            {"id": "nvidia/DeepSeek-V3-0324-FP4", "path": "/models/deepseek-v3-fp4"}]}))
    real = Lab.objects.create(name="two-models", inventory=str(tmp_path / "inventory.yaml"))
    # One lab, several models: each is admitted there.
    assert submit_configuration(raw_text=DEEPSEEK_CONFIG, source="yaml", lab=real)
    kimi = yaml.safe_load(REFERENCE_CONFIG.read_text())
    kimi.pop("speculative")  # this lab holds no draft for it
    stored = submit_configuration(raw_text=yaml.safe_dump(kimi), source="yaml", lab=real)
    assert stored.normalized["model"]["id"] == "moonshotai/Kimi-K2-Instruct-0905"
    with pytest.raises(ValidationError) as no_draft:
        submit_configuration(raw_text=REFERENCE_CONFIG.read_text(), source="yaml", lab=real)
    assert "speculative.draft_model" in messages(no_draft)
    # A layout the lab's nodes cannot hold is refused at intake, before a day is spent on it.
    for field, value, says in (("parallel", {"tp": 8, "pp": 2, "expert_parallel": True},
                                "needs 16 nodes (one rank on each), and this lab has 8"),
                               ("cluster", {"nodes": 12}, "12 nodes: this lab has 8")):
        with pytest.raises(ValidationError) as too_big:
            bigger = {**kimi, field: value, "cluster": {"nodes": 16} if field == "parallel" else value}
            submit_configuration(raw_text=yaml.safe_dump(bigger), source="yaml", lab=real)
        assert says in messages(too_big)
    # An inventory that names no catalog admits nothing: no lab stands in for another.
    del inventory["catalog"]
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(inventory))
    with pytest.raises(ValidationError) as caught:
        submit_configuration(raw_text=DEEPSEEK_CONFIG, source="yaml", lab=real)
    assert "names no catalog" in messages(caught)


def test_a_served_simulated_lab_is_read_from_the_catalog_it_wrote(deepseek_lab: Lab,
                                                                  sim_state_dir: Path) -> None:
    state = deepseek_lab.sim_state_dir
    state.mkdir(parents=True)
    written = lab_catalog(deepseek_lab).as_data()
    written["version"] = "as-served"
    (state / "catalog.yaml").write_text(yaml.safe_dump(written))
    (state / "inventory.yaml").write_text(yaml.safe_dump({
        "schema": "lab.inventory/1", "name": "deepseek", "catalog": "catalog.yaml",
        "nodes": [{"name": "spark-01", "host": "127.0.0.1", "role": "head"}]}))
    assert lab_catalog(deepseek_lab).version == "as-served"


def test_the_memory_check_uses_the_labs_profile(deepseek_lab: Lab) -> None:
    catalog = lab_catalog(deepseek_lab)
    facts = [{"mem_total_kib": int(121.7 * 1024 * 1024)}] * 4
    model = {"id": "nvidia/DeepSeek-V3-0324-FP4", "path": "/models/deepseek-v3-fp4"}
    config: dict[str, Any] = {"model": model,
                              "parallel": {"tp": 4, "pp": 1},
                              "serving": {"max_model_len": 65536, "kv_cache_dtype": "fp8",
                                          "gpu_memory_utilization": 0.95}}
    fits = model_memory_check(config, catalog, facts)
    assert fits["ok"] is True and fits["weights_per_node_gb"] == pytest.approx(387 / 4, abs=0.01)
    assert fits["kv_gb"] == pytest.approx(35136 * 65536 / 1e9, abs=0.01)
    config["serving"]["gpu_memory_utilization"] = 0.7
    assert model_memory_check(config, catalog, facts)["ok"] is False
    bare = parse_catalog({"schema": "lab.catalog/1", "version": "1", "models_dir": "/models",
                          "models": [model]})
    unknown = model_memory_check(config, bare, facts)
    assert unknown["ok"] is None and "gives no profile" in unknown["summary"]
