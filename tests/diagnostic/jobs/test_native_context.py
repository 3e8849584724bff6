"""The native context on the simulated lab: reproduce keeps the model's native context where
memory settings hold it, and proves it (METHODOLOGY.md, "Context is a requirement").

Figures from LAB_MODEL.md sections 1-2 for the reference lab (eight nodes, Kimi K2): 69.5 GiB
of weights a node; at gpu_memory_utilization 0.85 about 14.4 GiB of KV memory, which holds
262,144 tokens of fp8 KV (8.6 GiB) but not of bf16 (17.2 GiB). A native-length request costs
its prefill, 262,144 / 900 ≈ 290 lab s.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from diagnostic.jobs.findings_document import validate_findings
from diagnostic.jobs.models import DiagnosticJob
from tests.diagnostic.conftest import REFERENCE_CONFIG, REFERENCE_SCENARIO
from tests.diagnostic.doubles import fast_scenario

pytestmark = pytest.mark.django_db(transaction=True)

NATIVE = 262144
PREFILL_LAB_S = NATIVE / 900


def reproduce(tmp_path: Path, config_text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    config = tmp_path / "customer.yaml"
    config.write_text(config_text)
    out = tmp_path / "out"
    lab = f"sim:{fast_scenario(tmp_path, REFERENCE_SCENARIO)}"
    call_command("diagnose", "--config", str(config), "--lab", lab, "--out", str(out),
                 "--stages", "preflight,reproduce", stdout=io.StringIO())
    document = json.loads((out / "findings.json").read_text())
    validate_findings(document)
    job = DiagnosticJob.objects.get(pk=document["job"]["id"])
    result = job.stage_runs.get(name="reproduce").result
    assert isinstance(result, dict)
    return document, result


def argv_of(result: dict[str, Any]) -> str:
    return " ".join(result["launch"][0]["argv"])


def test_a_context_that_does_not_fit_in_bf16_is_kept_native_with_an_fp8_kv_cache(
    tmp_path: Path, sim_state_dir: Path
) -> None:
    text = REFERENCE_CONFIG.read_text().replace("kv_cache_dtype: fp8", "kv_cache_dtype: auto")
    document, result = reproduce(tmp_path, text)
    assert document["job"]["status"] == "succeeded"
    (finding,) = [f for f in document["findings"] if f["code"] == "context.native"]
    assert not [f for f in document["findings"] if f["code"] == "load.kv_budget"]
    # The change: the KV cache's dtype only; the native length kept.
    assert result["config_changes"] == [{
        "path": "serving.kv_cache_dtype", "from": "auto", "to": "fp8", "finding": "context.native",
        "why": result["config_changes"][0]["why"]}]
    assert finding["change"]["config"] == {"serving.kv_cache_dtype": {"from": "auto", "to": "fp8"}}
    # The kept start is the fitted configuration's, at the native length.
    assert f"--max-model-len {NATIVE}" in argv_of(result) and "--kv-cache-dtype fp8" in argv_of(result)
    evidence = finding["evidence"]
    assert evidence["refusal"]["max_model_len"] == NATIVE
    assert evidence["refusal"]["kv_available_gib"] < evidence["refusal"]["kv_needed_gib"]
    # The proof: the engine's own capacity lines, and one request of the whole length.
    assert any("KV cache size:" in line for line in evidence["engine_lines"])
    request = evidence["request"]
    assert request["total_tokens"] == NATIVE and request["completion_tokens"] >= 1
    assert PREFILL_LAB_S * 0.9 < request["lab_s"] < PREFILL_LAB_S * 1.5
    context = result["context"]
    assert context["settings"] == {"kv_cache_dtype": "fp8"}
    assert context["target"]["target"] == NATIVE and context["target"]["native"] == NATIVE


def test_a_configuration_below_native_that_could_hold_it_gets_native_proved(
    tmp_path: Path, sim_state_dir: Path
) -> None:
    text = REFERENCE_CONFIG.read_text().replace(f"max_model_len: {NATIVE}", "max_model_len: 131072")
    document, result = reproduce(tmp_path, text)
    assert document["job"]["status"] == "succeeded"
    (finding,) = [f for f in document["findings"] if f["code"] == "context.native"]
    # The customer's own start is the kept one, at its own length.
    assert "--max-model-len 131072" in argv_of(result)
    assert [(c["path"], c["from"], c["to"]) for c in result["config_changes"]] == [
        ("serving.max_model_len", 131072, NATIVE)]
    assert finding["change"]["config"] == {"serving.max_model_len": {"from": 131072, "to": NATIVE}}
    evidence = finding["evidence"]
    assert evidence["engine"]["said"] == "capacity" and evidence["engine"]["tokens"] >= NATIVE
    assert evidence["request"]["total_tokens"] == NATIVE
    assert evidence["lab_s"] >= evidence["request"]["lab_s"] > PREFILL_LAB_S * 0.9
    assert result["context"]["proof"]["served"]


def test_a_stated_requirement_below_native_is_kept_and_costs_nothing(
    tmp_path: Path, sim_state_dir: Path
) -> None:
    text = (REFERENCE_CONFIG.read_text().replace(f"max_model_len: {NATIVE}", "max_model_len: 131072")
            + "requirements: {max_context: 131072}\n")
    document, result = reproduce(tmp_path, text)
    assert not [f for f in document["findings"] if f["code"].startswith("context.")]
    assert result["config_changes"] == [] and result["context"]["lab_s"] == 0.0
    assert result["context"]["target"]["target"] == 131072


def test_the_reference_configuration_spends_nothing_on_its_context(
    tmp_path: Path, sim_state_dir: Path
) -> None:
    document, result = reproduce(tmp_path, REFERENCE_CONFIG.read_text())
    assert not [f for f in document["findings"] if f["code"] in ("context.native", "load.kv_budget")]
    assert result["config_changes"] == []
    context = result["context"]
    assert context["lab_s"] == 0.0 and "proof" not in context and "plan" not in context
    # What the engine said of its KV cache is kept all the same (no lab time: the log is read anyway).
    assert context["engine"]["tokens"] >= NATIVE


def test_when_nothing_fits_the_context_is_shortened_and_the_finding_says_what_would(
    tmp_path: Path, sim_state_dir: Path
) -> None:
    # Six nodes: 92.7 GiB of weights a node leaves too little for 262,144 tokens of fp8 KV at
    # any fraction the node allows; seven would do (the lab has eight).
    text = (REFERENCE_CONFIG.read_text().replace("nodes: 8", "nodes: 6").replace("tp: 8", "tp: 6")
            .replace("gpu_memory_utilization: 0.85", "gpu_memory_utilization: 0.95"))
    document, result = reproduce(tmp_path, text)
    assert document["job"]["status"] == "succeeded"
    assert not [f for f in document["findings"] if f["code"] == "context.native"]
    (finding,) = [f for f in document["findings"] if f["code"] == "load.kv_budget"]
    fits = finding["evidence"]["estimated_max_model_len"]
    assert finding["change"]["config"] == {"serving.max_model_len": {"from": NATIVE, "to": fits}}
    would = finding["evidence"]["context"]["plan"]["would_fit"]
    assert would["nodes_needed"] == 7 and would["lab_nodes"] == 8
    assert "262,144 tokens fit on 7 nodes (this lab has them)" in finding["change"]["note"]
    # Nothing was started to prove what the figures already rule out.
    assert "tried" not in finding["evidence"]["context"] and result["context"]["lab_s"] == 0.0
    assert f"--max-model-len {fits}" in argv_of(result)


def test_sglang_below_native_is_read_from_its_own_kv_line_and_proved(
    tmp_path: Path, sim_state_dir: Path
) -> None:
    sglang = REFERENCE_CONFIG.parent / "kimi-k2-8spark-sglang.yaml"
    config = tmp_path / "customer.yaml"
    config.write_text(sglang.read_text().replace(f"max_model_len: {NATIVE}", "max_model_len: 131072"))
    scenario = fast_scenario(tmp_path, REFERENCE_SCENARIO.parent / "reference-kimi-k2-8spark-sglang.yaml")
    out = tmp_path / "out"
    call_command("diagnose", "--config", str(config), "--lab", f"sim:{scenario}", "--out", str(out),
                 "--stages", "preflight,reproduce", stdout=io.StringIO())
    document = json.loads((out / "findings.json").read_text())
    (finding,) = [f for f in document["findings"] if f["code"] == "context.native"]
    assert finding["change"]["config"] == {"serving.max_model_len": {"from": 131072, "to": NATIVE}}
    assert any("KV Cache is allocated" in line for line in finding["evidence"]["engine_lines"])
    assert finding["evidence"]["request"]["total_tokens"] == NATIVE


def test_sglang_whose_kv_pool_is_shorter_than_its_context_gets_native_proved(
    tmp_path: Path, sim_state_dir: Path
) -> None:
    """SGLang starts with a bf16 KV pool of about 220k tokens (14.4 GiB / 70,272 bytes) at a
    context of 262,144 and refuses longer requests when they come: the length configured is
    not the length served. Its own capacity line says so; fp8 holds the native context, and
    a start and one request of it prove it."""
    sglang = REFERENCE_CONFIG.parent / "kimi-k2-8spark-sglang.yaml"
    config = tmp_path / "customer.yaml"
    config.write_text(sglang.read_text().replace("kv_cache_dtype: fp8", "kv_cache_dtype: auto"))
    scenario = fast_scenario(tmp_path, REFERENCE_SCENARIO.parent / "reference-kimi-k2-8spark-sglang.yaml")
    out = tmp_path / "out"
    call_command("diagnose", "--config", str(config), "--lab", f"sim:{scenario}", "--out", str(out),
                 "--stages", "preflight,reproduce", stdout=io.StringIO())
    document = json.loads((out / "findings.json").read_text())
    validate_findings(document)
    assert document["job"]["status"] == "succeeded"
    assert not [f for f in document["findings"] if f["code"] in ("load.kv_budget", "lab.engine_crash")]
    (finding,) = [f for f in document["findings"] if f["code"] == "context.native"]
    assert finding["change"]["config"] == {"serving.kv_cache_dtype": {"from": "auto", "to": "fp8"}}
    pool = finding["evidence"]["pool_tokens"]
    assert 200_000 < pool < NATIVE and f"holds {pool:,} tokens" in finding["title"]
    assert finding["evidence"]["request"]["total_tokens"] == NATIVE
