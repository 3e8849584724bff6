"""Rendering a configuration into one lab.launch/1 spec per node."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lab import env_policy
from lab.catalog import Catalog, CatalogModel
from lab.config import JIT_CACHE_ENV, PER_LAUNCH_CACHE, ConfigError
from lab.engines import normalize_config, parse_launch, render
from lab.engines.tables import release
from lab.inventory import Node
from tests.lab.engines.conftest import spark_nodes

REFERENCE = {
    "engine": {"name": "vllm", "version": "0.34.0"},
    "parallel": {"tp": 8, "pp": 1, "expert_parallel": True},
    "serving": {"kv_cache_dtype": "fp8", "gpu_memory_utilization": 0.85},
    "speculative": {"method": "eagle3", "draft_model": "AQ-MedAI/Kimi-K2-Instruct-eagle3",
                    "num_speculative_tokens": 4},
}


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_one_spec_per_node_used_with_the_head_as_rank_0(sparks: list[Node]) -> None:
    specs = render(normalize_config({**REFERENCE, "parallel": {"tp": 4, "pp": 1}}), sparks)
    assert [(s["node"], s["rank"], s["role"]) for s in specs] == [
        ("spark-01", 0, "head"), ("spark-02", 1, "worker"), ("spark-03", 2, "worker"),
        ("spark-04", 3, "worker")]


def test_the_head_goes_first_wherever_the_inventory_lists_it() -> None:
    nodes = spark_nodes(4, head=2)
    specs = render(normalize_config({"parallel": {"tp": 2}}), nodes)
    assert [s["node"] for s in specs] == ["spark-03", "spark-01"]
    assert flag_value(specs[1]["argv"], "--master-addr") == "10.10.0.3"


def test_specs_follow_the_launch_contract(sparks: list[Node]) -> None:
    spec = render(REFERENCE, sparks)[1]
    assert spec["schema"] == "lab.launch/1"
    assert spec["engine"] == "vllm"
    assert spec["log_file"] == "/var/lib/diag-2/logs/engine.log"
    assert spec["cwd"] == "/var/lib/diag-2"
    json.dumps(spec)  # written to the node as JSON


def test_vllm_multinode_flags_name_the_head_and_workers_run_headless(sparks: list[Node]) -> None:
    head, worker = render(REFERENCE, sparks)[:2]
    for spec, rank in ((head, "0"), (worker, "1")):
        argv = spec["argv"]
        assert argv[:3] == ["vllm", "serve", "/models/kimi-k2"]
        assert flag_value(argv, "--nnodes") == "8"
        assert flag_value(argv, "--node-rank") == rank
        assert flag_value(argv, "--master-addr") == "10.10.0.1"
        assert flag_value(argv, "--master-port") == "29500"
        assert flag_value(argv, "--port") == "8000"
    assert "--headless" not in head["argv"]
    assert "--headless" in worker["argv"]


def test_a_single_node_launch_has_no_multinode_flags(sparks: list[Node]) -> None:
    (spec,) = render(normalize_config({}), sparks)
    assert not {"--nnodes", "--node-rank", "--master-addr", "--headless"} & set(spec["argv"])


def test_vllm_argv_carries_the_serving_fields(sparks: list[Node]) -> None:
    config = normalize_config({
        **REFERENCE,
        "serving": {"max_model_len": 131072, "kv_cache_dtype": "bf16",
                    "gpu_memory_utilization": 0.8, "enforce_eager": True,
                    "load_format": "fastsafetensors", "safetensors_load_strategy": "eager",
                    "moe_backend": "cutlass", "linear_backend": "marlin"},
        "extra_args": ["--max-num-seqs", "2"],
    })
    argv = render(config, sparks)[0]["argv"]
    assert flag_value(argv, "--served-model-name") == "moonshotai/Kimi-K2-Instruct-0905"
    assert flag_value(argv, "--tensor-parallel-size") == "8"
    assert flag_value(argv, "--pipeline-parallel-size") == "1"
    assert "--enable-expert-parallel" in argv
    assert flag_value(argv, "--max-model-len") == "131072"
    assert flag_value(argv, "--kv-cache-dtype") == "bfloat16"
    assert flag_value(argv, "--gpu-memory-utilization") == "0.8"
    assert "--enforce-eager" in argv
    assert flag_value(argv, "--load-format") == "fastsafetensors"
    assert flag_value(argv, "--safetensors-load-strategy") == "eager"
    assert flag_value(argv, "--moe-backend") == "cutlass"
    assert flag_value(argv, "--linear-backend") == "marlin"
    # the customer's extra arguments, then what the lab adds for the catalog's model
    assert argv[-3:] == ["--max-num-seqs", "2", "--trust-remote-code"]


def test_vllm_defaults_are_left_to_the_engine(sparks: list[Node]) -> None:
    argv = render(REFERENCE, sparks)[0]["argv"]
    for flag in ("--enforce-eager", "--load-format", "--safetensors-load-strategy",
                 "--moe-backend", "--linear-backend"):
        assert flag not in argv


def test_vllm_reads_an_unset_and_an_explicit_lazy_strategy_apart(sparks: list[Node]) -> None:
    # Unset, vLLM prefetches a checkpoint on NFS or Lustre that fits in memory; lazy never
    # does (LoadConfig.safetensors_load_strategy, vllm/config/load.py): lazy is passed.
    unset = normalize_config({**REFERENCE, "serving": {}})
    assert unset["serving"]["safetensors_load_strategy"] is None
    assert "--safetensors-load-strategy" not in render(unset, sparks)[0]["argv"]
    lazy = normalize_config({**REFERENCE, "serving": {"safetensors_load_strategy": "lazy"}})
    argv = render(lazy, sparks)[0]["argv"]
    assert argv[argv.index("--safetensors-load-strategy") + 1] == "lazy"


def test_sglang_reads_lazy_as_its_only_way_and_refuses_the_others() -> None:
    config = normalize_config({"engine": {"name": "sglang", "version": "0.5.23"},
                               "serving": {"safetensors_load_strategy": "lazy"}})
    assert config["serving"]["safetensors_load_strategy"] is None
    for strategy in ("eager", "prefetch"):
        with pytest.raises(ConfigError, match="leave it unset") as err:
            normalize_config({"engine": {"name": "sglang", "version": "0.5.23"},
                              "serving": {"safetensors_load_strategy": strategy}})
        assert err.value.field == "serving.safetensors_load_strategy"


def test_vllm_speculative_config_is_vllms_json(sparks: list[Node]) -> None:
    argv = render(REFERENCE, sparks)[0]["argv"]
    # the draft by the lab's path: nodes run offline, where a hub id does not load
    assert json.loads(flag_value(argv, "--speculative-config")) == {
        "method": "eagle3", "model": "/models/kimi-k2-eagle3", "num_speculative_tokens": 4}
    ngram = normalize_config({"speculative": {"method": "ngram", "num_speculative_tokens": 3,
                                              "prompt_lookup_max": 4, "prompt_lookup_min": 2}})
    argv = render(ngram, sparks)[0]["argv"]
    assert json.loads(flag_value(argv, "--speculative-config")) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
        "prompt_lookup_min": 2}


def test_sglang_argv_uses_sglangs_flags(sparks: list[Node]) -> None:
    config = normalize_config({**REFERENCE, "engine": {"name": "sglang"},
                               "serving": {"kv_cache_dtype": "fp8", "enforce_eager": True,
                                           "moe_backend": "flashinfer_cutlass"}})
    argv = render(config, sparks)[1]["argv"]
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert flag_value(argv, "--model-path") == "/models/kimi-k2"
    assert flag_value(argv, "--tp-size") == "8"
    assert flag_value(argv, "--pp-size") == "1"
    assert flag_value(argv, "--ep-size") == "8"
    assert flag_value(argv, "--nnodes") == "8"
    assert flag_value(argv, "--node-rank") == "1"
    assert flag_value(argv, "--dist-init-addr") == "10.10.0.1:5000"
    assert flag_value(argv, "--context-length") == "262144"
    assert flag_value(argv, "--kv-cache-dtype") == "fp8_e4m3"
    assert flag_value(argv, "--mem-fraction-static") == "0.9"
    assert "--disable-cuda-graph" in argv
    assert flag_value(argv, "--moe-runner-backend") == "flashinfer_cutlass"
    assert flag_value(argv, "--speculative-algorithm") == "EAGLE3"
    assert flag_value(argv, "--speculative-draft-model-path") == "/models/kimi-k2-eagle3"
    assert flag_value(argv, "--speculative-num-steps") == "4"
    assert flag_value(argv, "--speculative-eagle-topk") == "1"
    assert flag_value(argv, "--speculative-num-draft-tokens") == "5"
    assert "--headless" not in argv
    assert argv[-2:] == ["--trust-remote-code", "--enable-metrics"]


def test_sglang_always_renders_enable_metrics_once(sparks: list[Node]) -> None:
    for version in ("0.5.12", "0.5.23"):
        config = normalize_config({"engine": {"name": "sglang", "version": version},
                                   "extra_args": ["--enable-metrics"]})
        (spec,) = render(config, sparks[:1])
        assert spec["argv"].count("--enable-metrics") == 1


def test_remote_code_is_rendered_only_where_the_catalog_says_so(sparks: list[Node]) -> None:
    plain = Catalog(version="t", models_dir="/models", models=(
        CatalogModel(id="org/plain", path="/models/plain", remote_code=False, drafts=()),))
    config = normalize_config({"model": {"id": "org/plain", "path": "/models/plain"}},
                              catalog=plain)
    (spec,) = render(config, sparks[:1], catalog=plain)
    assert "--trust-remote-code" not in spec["argv"]
    (spec,) = render(normalize_config({}), sparks[:1])
    assert spec["argv"].count("--trust-remote-code") == 1


@pytest.mark.parametrize(("engine", "version", "absent", "words"), [
    # 0.5.23 has no --cuda-graph-max-bs: argparse reads it as an abbreviation of two others
    ("sglang", "0.5.23", "--cuda-graph-max-bs",
     "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
     "--cuda-graph-max-bs-prefill"),
    ("sglang", "0.5.12", "--speculative-ngram-max-match-window-size",
     "unrecognized arguments: --speculative-ngram-max-match-window-size 8"),
    ("vllm", "0.34.0", "--swap-space", "unrecognized arguments: --swap-space 8"),
])
def test_render_refuses_what_the_version_does_not_have(sparks: list[Node], engine: str,
                                                       version: str, absent: str,
                                                       words: str) -> None:
    with pytest.raises(ConfigError, match="extra_args") as info:
        render({"engine": {"name": engine, "version": version}, "extra_args": [absent, "8"]},
               sparks[:1])
    assert words in str(info.value)
    # 0.5.12 still has --cuda-graph-max-bs
    if absent == "--cuda-graph-max-bs":
        config = normalize_config({"engine": {"name": engine, "version": "0.5.12"},
                                   "extra_args": [absent, "8"]})
        assert render(config, sparks[:1])[0]["argv"][-4:-2] == [absent, "8"]


def test_sglang_brackets_an_ipv6_rendezvous_address() -> None:
    nodes = [replace(n, data_addr=f"fd00::{i + 1}") for i, n in enumerate(spark_nodes(2))]
    argv = render(normalize_config({"engine": {"name": "sglang"}, "parallel": {"tp": 2}}),
                  nodes)[0]["argv"]
    assert flag_value(argv, "--dist-init-addr") == "[fd00::1]:5000"


def test_env_is_the_config_env_without_jit_caches_when_ephemeral(sparks: list[Node]) -> None:
    config = normalize_config({**REFERENCE, "env": {"NCCL_SOCKET_IFNAME": "enp1s0f0np0"}})
    assert render(config, sparks)[0]["env"] == {"NCCL_SOCKET_IFNAME": "enp1s0f0np0",
                                                "VLLM_HOST_IP": "10.10.0.1"}


def test_a_persisted_jit_cache_lives_under_each_nodes_cache_dir(sparks: list[Node]) -> None:
    config = normalize_config({**REFERENCE, "serving": {"jit_cache": "persisted"}})
    env = render(config, sparks)[3]["env"]
    assert env == {"VLLM_CACHE_ROOT": "/var/cache/diag-4/vllm",
                   "FLASHINFER_WORKSPACE_BASE": "/var/cache/diag-4/flashinfer",
                   "TRITON_CACHE_DIR": "/var/cache/diag-4/triton",
                   "VLLM_HOST_IP": "10.10.0.4"}


@pytest.mark.parametrize("version", ["0.5.12", "0.5.23"])
def test_sglang_caches_move_with_sglangs_own_variables(sparks: list[Node], version: str) -> None:
    # SGLang reads no VLLM_CACHE_ROOT: its compile cache follows SGLANG_CACHE_DIR
    # (srt/environ.py), and 0.5.23's kernel JIT builds SGLANG_JIT_CACHE_DIR, which does not
    # follow SGLANG_CACHE_DIR (kernels/jit/utils/compile/cache.py).
    config = {**REFERENCE, "engine": {"name": "sglang", "version": version}, "speculative": None,
              "serving": {"jit_cache": "persisted"}}
    env = render(config, sparks)[1]["env"]
    expected = {"SGLANG_CACHE_DIR": "/var/cache/diag-2/sglang",
                "FLASHINFER_WORKSPACE_BASE": "/var/cache/diag-2/flashinfer",
                "TRITON_CACHE_DIR": "/var/cache/diag-2/triton"}
    if version == "0.5.23":
        expected["SGLANG_JIT_CACHE_DIR"] = "/var/cache/diag-2/sglang-jit"
    assert env == expected
    for name in env:
        engine_own = name.startswith("SGLANG_")
        assert not engine_own or name in env_policy.version_reads("sglang", version)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_ephemeral_cache_on_the_lab_is_a_folder_emptied_per_launch(sparks: list[Node],
                                                                       engine: str) -> None:
    # Without a variable, every cache lands under the engine user's home and survives the
    # restart on bare metal: the lab's own launches place an ephemeral cache in the cache
    # volume's per-launch folder, which the node agent empties before each launch.
    config = {**REFERENCE, "engine": {"name": engine}, "speculative": None}
    assert all(name not in render(config, sparks)[0]["env"] for name in JIT_CACHE_ENV)
    specs = render(config, sparks, per_launch_cache=True)
    caches = {k: v for k, v in specs[1]["env"].items() if k in JIT_CACHE_ENV}
    assert caches and all(v.startswith(f"/var/cache/diag-2/{PER_LAUNCH_CACHE}/") for v in caches.values())
    # Read back, the launch is the ephemeral configuration it was rendered from.
    parsed = parse_launch(specs[1]["argv"], specs[1]["env"])
    assert parsed.config["serving"]["jit_cache"] == "ephemeral"
    assert parsed.config["env"] == {}
    persisted = render({**config, "serving": {"jit_cache": "persisted"}}, sparks, per_launch_cache=True)
    kept = parse_launch(persisted[1]["argv"], persisted[1]["env"]).config
    assert kept["serving"]["jit_cache"] == "persisted"


def test_each_vllm_rank_gets_its_own_data_address_as_vllm_host_ip(sparks: list[Node]) -> None:
    # vLLM's head binds its broadcast queue to get_ip() (VLLM_HOST_IP, else the default-route
    # interface: vllm/utils/network_utils.py): each rank names its own data address.
    specs = render(REFERENCE, sparks)
    assert [s["env"]["VLLM_HOST_IP"] for s in specs] == [n.data_addr for n in sparks]
    # One node meets no one; SGLang meets at --dist-init-addr and reads no VLLM_HOST_IP.
    one = normalize_config({**REFERENCE, "parallel": {"tp": 1, "pp": 1}, "cluster": {"nodes": 1}})
    assert "VLLM_HOST_IP" not in render(one, sparks)[0]["env"]
    sglang = {**REFERENCE, "engine": {"name": "sglang"}, "speculative": None}
    assert all("VLLM_HOST_IP" not in s["env"] for s in render(sglang, sparks))
    # Read back, the launch is the same configuration: the lab's variable is not the customer's.
    parsed = parse_launch(specs[2]["argv"], specs[2]["env"], version="0.34.0")
    assert parsed.config["env"] == {}
    # Both modelled vLLM releases read it (envs.py) and log where the queue binds.
    for version in ("0.29.0", "0.34.0"):
        table = release("vllm", version)
        assert "VLLM_HOST_IP" in table["env"]["registry"]
        [found] = table["lines"]["mq_leader"]["found"]
        assert found["file"] == "vllm/v1/executor/multiproc_executor.py"
        assert "mq_connect_ip=%s (local)" in found["text"]


def test_too_few_nodes_is_an_error_naming_the_layout() -> None:
    with pytest.raises(ConfigError) as info:
        render(REFERENCE, spark_nodes(4))
    assert info.value.field == "parallel"
    assert "8 nodes are needed" in str(info.value)


def test_render_validates_what_it_is_given(sparks: list[Node]) -> None:
    with pytest.raises(ConfigError, match=r"serving\.kv_cache_dtype"):
        render({"serving": {"kv_cache_dtype": "fp16"}}, sparks)
