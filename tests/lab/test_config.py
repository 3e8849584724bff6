"""The customer configuration: defaults, validation messages, YAML loading, launch_command."""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

import pytest

from lab.config import ConfigError, normalize_fields, read_config_text
from lab.engines import launch_view, load_config_text, normalize_config, parse_command

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"
REFERENCE_YAML = EXAMPLES / "kimi-k2-8spark-outofbox.yaml"
REFERENCE_COMMAND = EXAMPLES / "kimi-k2-8spark-outofbox-command.txt"

EAGLE3 = {"method": "eagle3", "draft_model": "AQ-MedAI/Kimi-K2-Instruct-eagle3",
          "num_speculative_tokens": 4}


def error_of(data: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        normalize_config(data)
    return info.value


def test_an_empty_config_gets_every_field_with_engine_defaults() -> None:
    config = normalize_config({})
    assert config == {
        "schema": "diagnostic.config/1",
        "engine": {"name": "vllm", "version": "0.34.0"},
        "model": {"id": "moonshotai/Kimi-K2-Instruct-0905", "quantization": "nvfp4",
                  "path": "/models/kimi-k2"},
        "cluster": {"nodes": 1, "node_type": "dgx-spark", "link_gbps": 100.0},
        "parallel": {"tp": 1, "pp": 1, "expert_parallel": False},
        "serving": {"max_model_len": 262144, "kv_cache_dtype": "auto",
                    "gpu_memory_utilization": 0.9, "enforce_eager": False, "load_format": "auto",
                    "safetensors_load_strategy": None, "jit_cache": "ephemeral",
                    "moe_backend": "auto", "linear_backend": "auto"},
        "speculative": None,
        "env": {},
        "extra_args": [],
        "workloads": ["code", "prose"],
    }


def test_normalizing_a_normalized_config_changes_nothing() -> None:
    config = load_config_text(REFERENCE_YAML.read_text())
    assert normalize_config(config) == config


def test_it_returns_a_new_dict_and_leaves_the_input_alone() -> None:
    data = {"env": {"NCCL_IB_TIMEOUT": 20, "NCCL_DEBUG": "INFO"}}
    config = normalize_config(data)
    assert data == {"env": {"NCCL_IB_TIMEOUT": 20, "NCCL_DEBUG": "INFO"}}
    assert config["env"] == {"NCCL_DEBUG": "INFO", "NCCL_IB_TIMEOUT": "20"}


def test_a_bad_kv_cache_dtype_is_named_with_the_accepted_values() -> None:
    err = error_of({"serving": {"kv_cache_dtype": "fp16"}})
    assert err.field == "serving.kv_cache_dtype"
    assert str(err) == "serving.kv_cache_dtype: 'fp16' is not accepted; use one of auto, fp8, bf16"


@pytest.mark.parametrize(("data", "field"), [
    ({"colour": "red"}, "colour"),
    ({"serving": {"max_model_length": 4096}}, "serving.max_model_length"),
    ({"speculative": {"method": "ngram", "k": 3}}, "speculative.k"),
    ({"reported": {"tps": 3}}, "reported.tps"),
])
def test_unknown_fields_are_errors_naming_the_field(data: dict, field: str) -> None:
    err = error_of(data)
    assert err.field == field
    assert "unknown field" in str(err)


def test_cluster_nodes_default_to_the_nodes_the_layout_uses() -> None:
    config = normalize_config({"parallel": {"tp": 4, "pp": 2}})
    assert config["cluster"]["nodes"] == 8


def test_a_layout_needing_more_nodes_than_the_cluster_has_is_refused() -> None:
    err = error_of({"cluster": {"nodes": 8}, "parallel": {"tp": 8, "pp": 2}})
    assert err.field == "parallel"
    assert "16 nodes" in str(err) and "cluster.nodes is 8" in str(err)


def test_a_layout_using_fewer_nodes_than_the_cluster_has_is_accepted() -> None:
    config = normalize_config({"cluster": {"nodes": 8}, "parallel": {"tp": 4}})
    assert (config["cluster"]["nodes"], config["parallel"]["tp"]) == (8, 4)


@pytest.mark.parametrize("tp", [0, -1, "8", 2.0, True])
def test_tp_must_be_a_positive_whole_number(tp: object) -> None:
    assert error_of({"parallel": {"tp": tp}}).field == "parallel.tp"


@pytest.mark.parametrize("value", [0, 0.0, -0.5, 1.01, "0.9", True])
def test_gpu_memory_utilization_must_be_a_fraction_in_0_1(value: object) -> None:
    err = error_of({"serving": {"gpu_memory_utilization": value}})
    assert err.field == "serving.gpu_memory_utilization"


def test_gpu_memory_utilization_of_one_is_accepted_as_a_float() -> None:
    config = normalize_config({"serving": {"gpu_memory_utilization": 1}})
    assert config["serving"]["gpu_memory_utilization"] == 1.0
    assert isinstance(config["serving"]["gpu_memory_utilization"], float)


@pytest.mark.parametrize("k", [0, 17, 2.5])
def test_num_speculative_tokens_must_be_1_to_16(k: object) -> None:
    err = error_of({"speculative": {**EAGLE3, "num_speculative_tokens": k}})
    assert err.field == "speculative.num_speculative_tokens"
    assert "1..16" in str(err)


def test_eagle3_needs_a_draft_model() -> None:
    err = error_of({"speculative": {"method": "eagle3", "num_speculative_tokens": 3}})
    assert err.field == "speculative.draft_model"


def test_ngram_refuses_a_draft_model() -> None:
    err = error_of({"speculative": {"method": "ngram", "draft_model": "x/y"}})
    assert err.field == "speculative.draft_model"
    assert "ngram uses no draft model" in str(err)


def test_ngram_keeps_its_lookup_window_and_eagle3_has_none() -> None:
    config = normalize_config({"speculative": {"method": "ngram", "num_speculative_tokens": 3,
                                               "prompt_lookup_max": 4, "prompt_lookup_min": 2}})
    assert config["speculative"] == {"method": "ngram", "draft_model": None,
                                     "num_speculative_tokens": 3, "prompt_lookup_max": 4,
                                     "prompt_lookup_min": 2}
    eagle = normalize_config({"speculative": EAGLE3})["speculative"]
    assert eagle["prompt_lookup_max"] is None and eagle["prompt_lookup_min"] is None


def test_a_lookup_window_on_eagle3_is_refused() -> None:
    assert error_of({"speculative": {**EAGLE3, "prompt_lookup_max": 4}}).field == \
        "speculative.prompt_lookup_max"


def test_a_lookup_minimum_above_the_maximum_is_refused() -> None:
    err = error_of({"speculative": {"method": "ngram", "prompt_lookup_max": 2,
                                    "prompt_lookup_min": 3}})
    assert err.field == "speculative.prompt_lookup_min"


@pytest.mark.parametrize("spec", [None, {"method": "none"}])
def test_no_speculation_normalizes_to_null(spec: object) -> None:
    assert normalize_config({"speculative": spec})["speculative"] is None


def test_a_speculative_mapping_without_method_is_refused() -> None:
    assert error_of({"speculative": {"num_speculative_tokens": 3}}).field == "speculative.method"


def test_workloads_are_a_nonempty_subset_in_canonical_order() -> None:
    assert normalize_config({"workloads": ["prose", "code"]})["workloads"] == ["code", "prose"]
    assert normalize_config({"workloads": ["prose"]})["workloads"] == ["prose"]
    assert error_of({"workloads": []}).field == "workloads"
    assert error_of({"workloads": ["code", "code"]}).field == "workloads"
    assert error_of({"workloads": ["chat"]}).field == "workloads[0]"


def test_env_values_become_strings_and_booleans_become_1_or_0() -> None:
    env = normalize_config({"env": {"OMP_NUM_THREADS": 8, "VLLM_LOG_STATS_INTERVAL": 0.5,
                                    "NCCL_IB_DISABLE": True, "NCCL_P2P_DISABLE": False,
                                    "NCCL_DEBUG": "WARN", "TOKENIZERS_PARALLELISM": False}})["env"]
    assert env == {"OMP_NUM_THREADS": "8", "VLLM_LOG_STATS_INTERVAL": "0.5", "NCCL_IB_DISABLE": "1",
                   "NCCL_P2P_DISABLE": "0", "NCCL_DEBUG": "WARN",
                   # Its choices are words: a YAML boolean becomes the word.
                   "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.parametrize(("env", "field"), [
    ({"1BAD": "x"}, "env.1BAD"),
    ({"A-B": "x"}, "env.A-B"),
    ({"NCCL_DEBUG": ["x"]}, "env.NCCL_DEBUG"),
    ({"NCCL_DEBUG": None}, "env.NCCL_DEBUG"),
    ({"NCCL_DEBUG": "two\nlines"}, "env.NCCL_DEBUG"),
])
def test_env_names_and_values_are_checked(env: dict, field: str) -> None:
    assert error_of({"env": env}).field == field


def test_cuda_module_loading_is_named_so_the_module_word_does_not_refuse_it() -> None:
    # CUDA_MODULE_LOADING=LAZY is a common, harmless setting; its "MODULE" is not a path.
    env = {"CUDA_MODULE_LOADING": "LAZY", "CUDA_MODULE_DATA_LOADING": "EAGER"}
    assert normalize_config({"env": env})["env"] == env
    # Other names with the word are not on the list.
    assert error_of({"env": {"CUDA_MODULE_PATH": "/x"}}).field == "env.CUDA_MODULE_PATH"
    assert error_of({"env": {"UCX_MODULE_DIR": "/x"}}).field == "env.UCX_MODULE_DIR"


@pytest.mark.parametrize("name", ["VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE"])
def test_jit_cache_variables_point_to_serving_jit_cache(name: str) -> None:
    err = error_of({"env": {name: "/cache"}})
    assert err.field == f"env.{name}"
    assert "serving.jit_cache" in str(err)


def test_extra_args_keep_known_pass_through_flags_in_order() -> None:
    args = ["--max-num-seqs", "4", "--trust-remote-code", "--enable-prefix-caching"]
    assert normalize_config({"extra_args": args})["extra_args"] == args


def test_extra_args_refuse_an_unknown_flag_by_name() -> None:
    err = error_of({"extra_args": ["--frobnicate", "3"]})
    assert err.field == "extra_args"
    assert str(err) == ("extra_args: '--frobnicate' is not a flag of vllm 0.34.0 (vllm serve: "
                        "error: unrecognized arguments: --frobnicate 3); remove it")


def test_extra_args_refuse_a_flag_that_a_config_field_sets() -> None:
    err = error_of({"extra_args": ["--tensor-parallel-size", "4"]})
    assert str(err) == ("extra_args: '--tensor-parallel-size' is set by parallel.tp; "
                        "set it there instead")


def test_extra_args_refuse_per_node_flags() -> None:
    assert "set by the lab for each node" in str(error_of({"extra_args": ["--node-rank", "1"]}))


def test_extra_args_check_values_like_the_engine() -> None:
    err = error_of({"extra_args": ["--max-num-seqs", "many"]})
    assert "invalid int value: 'many'" in str(err)


def test_extra_args_are_checked_against_the_configured_engine() -> None:
    err = error_of({"engine": {"name": "sglang"}, "extra_args": ["--max-num-seqs", "4"]})
    assert "is not a flag of sglang 0.5.23" in str(err)
    sglang = normalize_config({"engine": {"name": "sglang"},
                               "extra_args": ["--max-running-requests", "4"]})
    assert sglang["extra_args"] == ["--max-running-requests", "4"]


def test_extra_args_must_be_a_list_of_strings() -> None:
    assert error_of({"extra_args": "--trust-remote-code"}).field == "extra_args"
    assert error_of({"extra_args": ["--max-num-seqs", 4]}).field == "extra_args"


def test_an_unquoted_version_number_is_refused_with_a_hint() -> None:
    err = error_of({"engine": {"name": "vllm", "version": 0.1}})
    assert err.field == "engine.version"
    assert "quote it" in str(err)


def test_the_engine_version_defaults_per_engine() -> None:
    assert normalize_config({"engine": {"name": "sglang"}})["engine"]["version"] == "0.5.23"
    assert normalize_config({})["engine"]["version"] == "0.34.0"


@pytest.mark.parametrize(("engine", "version", "modelled"), [
    ("vllm", "0.29.1", "0.29.0, 0.34.0"), ("sglang", "0.5.6", "0.5.12, 0.5.23"),
    ("vllm", "latest", "0.29.0, 0.34.0")])
def test_a_version_the_platform_does_not_model_is_refused_with_the_list(
        engine: str, version: str, modelled: str) -> None:
    err = error_of({"engine": {"name": engine, "version": version}})
    assert err.field == "engine.version"
    assert str(err) == (f"engine.version: {version!r} is not a {engine} version the platform "
                        f"models; use one of {modelled}")


def test_a_pasted_command_is_read_with_the_version_beside_it() -> None:
    text = "vllm serve /models/kimi-k2 --disable-log-requests"
    assert normalize_config({"launch_command": text})["extra_args"] == ["--disable-log-requests"]
    err = error_of({"launch_command": text, "engine": {"version": "0.29.0"}})
    assert err.field == "launch_command"
    assert "unrecognized arguments: --disable-log-requests" in str(err)


def test_an_unknown_engine_is_refused() -> None:
    assert str(error_of({"engine": {"name": "tgi"}})) == \
        "engine.name: 'tgi' is not accepted; use one of vllm, sglang"


def test_fp4_backends_are_checked_per_engine_version() -> None:
    vllm = normalize_config({"serving": {"moe_backend": "marlin", "linear_backend": "cutlass"}})
    assert vllm["serving"]["moe_backend"] == "marlin"
    # vLLM lower-cases and turns - into _ before checking, as its flag does
    b12x = normalize_config({"serving": {"moe_backend": "FLASHINFER-B12X"}})
    assert b12x["serving"]["moe_backend"] == "flashinfer_b12x"
    err = error_of({"engine": {"name": "sglang"}, "serving": {"linear_backend": "triton"}})
    assert err.field == "serving.linear_backend"
    assert "flashinfer_cutlass" in str(err) and "sglang 0.5.23" in str(err)
    # marlin is a --fp4-gemm-backend choice of 0.5.23, not of 0.5.12
    assert normalize_config({"engine": {"name": "sglang", "version": "0.5.23"},
                             "serving": {"linear_backend": "marlin"}})
    err = error_of({"engine": {"name": "sglang", "version": "0.5.12"},
                    "serving": {"linear_backend": "marlin"}})
    assert err.field == "serving.linear_backend"


def test_sglang_has_no_eager_safetensors_strategy() -> None:
    err = error_of({"engine": {"name": "sglang"},
                    "serving": {"safetensors_load_strategy": "eager"}})
    assert err.field == "serving.safetensors_load_strategy"
    assert "fastsafetensors" in str(err)


def test_reported_figures_are_optional_and_positive() -> None:
    assert "reported" not in normalize_config({})
    assert normalize_config({"reported": {"decode_tps": 15}})["reported"] == {"decode_tps": 15.0}
    assert error_of({"reported": {"cold_start_s": 0}}).field == "reported.cold_start_s"


@pytest.mark.parametrize("field", ["id", "path"])
def test_model_strings_must_not_read_as_flags(field: str) -> None:
    err = error_of({"model": {field: "--enforce-eager"}})
    assert err.field == f"model.{field}"
    assert "read as a flag" in str(err)


def test_a_wrong_schema_is_refused() -> None:
    assert error_of({"schema": "diagnostic.config/2"}).field == "schema"


def test_a_non_mapping_is_refused() -> None:
    with pytest.raises(ConfigError):
        normalize_config(["vllm"])  # type: ignore[arg-type]


# -- YAML ---------------------------------------------------------------------------------
def test_yaml_aliases_are_refused() -> None:
    text = "env: &e {A: '1'}\nreported: *e\n"
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    assert info.value.field == "file"
    assert "anchors and aliases" in str(info.value) and "line 1" in str(info.value)


def test_a_billion_laughs_document_is_refused_before_expansion() -> None:
    lines = ["a: &a ['x', 'x']"]
    lines += [f"{c}: &{c} [*{p}, *{p}]" for p, c in pairwise("abcdefghi")]
    with pytest.raises(ConfigError, match="anchors and aliases"):
        load_config_text("\n".join(lines))


def test_oversized_text_is_refused_with_the_limit() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text("# " + "x" * 100 + "\n", max_bytes=64)
    assert str(info.value) == "file: is 103 bytes; the limit is 64"


def test_yaml_syntax_errors_give_the_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text("engine: {name: vllm\nparallel: [\n")
    assert info.value.field == "file"
    assert "line" in str(info.value)


def test_duplicate_keys_are_refused() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text("parallel: {tp: 8}\nparallel: {tp: 4}\n")
    assert info.value.field == "parallel"
    assert "appears twice" in str(info.value)


def test_python_object_tags_are_refused() -> None:
    with pytest.raises(ConfigError):
        load_config_text("env: !!python/object/apply:os.system ['true']\n")


def test_a_yaml_scalar_is_not_a_configuration() -> None:
    with pytest.raises(ConfigError, match="must hold a YAML mapping"):
        load_config_text("vllm serve /models/kimi-k2\n")


# -- launch_command -----------------------------------------------------------------------
def test_a_launch_command_stands_for_the_structured_fields() -> None:
    config = load_config_text(
        "schema: diagnostic.config/1\n"
        "engine: {version: '0.29.0'}\n"
        "cluster: {nodes: 8}\n"
        "workloads: [code]\n"
        "launch_command: >-\n"
        "  NCCL_SOCKET_IFNAME=enp1s0f0np0 vllm serve /models/kimi-k2\n"
        "  --tensor-parallel-size 4 --enable-expert-parallel --kv-cache-dtype fp8\n"
    )
    assert config["engine"] == {"name": "vllm", "version": "0.29.0"}
    assert config["cluster"]["nodes"] == 8
    assert config["parallel"] == {"tp": 4, "pp": 1, "expert_parallel": True}
    assert config["serving"]["kv_cache_dtype"] == "fp8"
    assert config["env"] == {"NCCL_SOCKET_IFNAME": "enp1s0f0np0"}
    assert config["workloads"] == ["code"]


def test_a_launch_command_with_a_field_it_sets_is_ambiguous() -> None:
    err = error_of({"launch_command": "vllm serve /models/kimi-k2", "parallel": {"tp": 2}})
    assert err.field == "parallel"
    assert "launch_command" in str(err)


def test_an_engine_name_that_disagrees_with_the_command_is_refused() -> None:
    err = error_of({"launch_command": "vllm serve /models/kimi-k2", "engine": {"name": "sglang"}})
    assert err.field == "engine.name"


def test_a_launch_command_error_names_the_token() -> None:
    err = error_of({"launch_command": "vllm serve /models/kimi-k2 --tensor-parallel-size x"})
    assert err.field == "launch_command"
    assert "--tensor-parallel-size" in str(err) and "'x'" in str(err)


def test_the_reference_yaml_and_its_pasted_command_are_the_same_configuration() -> None:
    structured = load_config_text(REFERENCE_YAML.read_text())
    pasted = parse_command(REFERENCE_COMMAND.read_text())
    assert launch_view(pasted) == launch_view(structured)
    assert pasted["cluster"]["nodes"] == structured["cluster"]["nodes"] == 8


def test_the_reference_configuration_is_the_out_of_box_story() -> None:
    config = load_config_text(REFERENCE_YAML.read_text())
    assert config["engine"] == {"name": "vllm", "version": "0.34.0"}
    assert config["parallel"] == {"tp": 8, "pp": 1, "expert_parallel": True}
    # the model's tokenizer is its own code; the draft by the lab's path
    assert config["extra_args"] == ["--trust-remote-code"]
    assert config["speculative"]["draft_model"] == "/models/kimi-k2-eagle3"
    serving = config["serving"]
    assert (serving["load_format"], serving["safetensors_load_strategy"]) == ("auto", None)
    assert serving["jit_cache"] == "ephemeral"
    assert (serving["moe_backend"], serving["linear_backend"]) == ("auto", "auto")
    assert not any(k.startswith("NCCL_") or "FP4" in k or "GEMM" in k for k in config["env"])
    assert config["speculative"]["method"] == "eagle3"
    assert config["speculative"]["num_speculative_tokens"] == 4
    assert config["workloads"] == ["code", "prose"]


def _imports(path: str) -> set[str]:
    tree = ast.parse(Path(path).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {f"{node.module}.{alias.name}" if node.module == "lab" else node.module or ""
                 for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 for alias in node.names}
    return {name for name in imported if name == "lab" or name.startswith("lab.")}


def test_lab_config_is_a_leaf_that_never_imports_the_engines() -> None:
    # Not even inside a function: the engines build on the configuration, not the reverse.
    # The environment policy is data (lab/env_policy.yaml, the release tables read as
    # JSON) and the agent's stdlib-only value rules (the served name's flag rule too): no
    # engine code.
    import lab.env_policy

    assert _imports(lab.config.__file__) == {"lab.env_policy", "lab.agent.agent"}
    assert _imports(lab.env_policy.__file__) == {"lab.agent.agent"}


def test_the_field_checks_alone_leave_flags_and_commands_to_the_engines() -> None:
    # lab.config checks extra_args' shape; which flags an engine takes, lab.engines checks.
    assert normalize_fields({"extra_args": ["--no-such-flag"]})["extra_args"] == ["--no-such-flag"]
    assert error_of({"extra_args": ["--no-such-flag"]}).field == "extra_args"
    with pytest.raises(ConfigError) as info:
        normalize_fields({"launch_command": "vllm serve /models/kimi-k2"})
    assert info.value.field == "launch_command"
    structured = read_config_text(REFERENCE_YAML.read_text())
    assert normalize_fields(structured) == load_config_text(REFERENCE_YAML.read_text())


@pytest.mark.parametrize(("text", "field"), [
    ("model: " + "[" * 500 + "]" * 500, "file"),  # once a RecursionError
    ("a: " + "{b: " * 500 + "1" + "}" * 500, "file"),
    ("? [tp, pp]\n: 8", "file"),  # a list as a key: once a TypeError
    ("? {tp: 8}\n: 8", "file"),
    ("parallel: {tp: " + "9" * 5000 + "}", "file"),  # once a ValueError from int()
    ("cluster: {link_gbps: .inf}", "cluster.link_gbps"),  # once accepted, then IntegrityError
    ("cluster: {link_gbps: .nan}", "cluster.link_gbps"),
    ("reported: {decode_tps: .inf}", "reported.decode_tps"),
    ("reported: {cold_start_s: 1.0e+999}", "reported.cold_start_s"),
    ("serving: {gpu_memory_utilization: .nan}", "serving.gpu_memory_utilization"),
    ("env: {NCCL_DEBUG: .inf}", "env.NCCL_DEBUG"),
    ("model: {id: " + "k" * 2000 + "}", "model.id"),
])
def test_input_that_once_ended_in_a_traceback_is_a_field_error(text: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    assert info.value.field == field
    assert len(str(info.value)) < 1100


def test_a_launch_command_has_a_size_limit() -> None:
    err = error_of({"launch_command": "vllm serve /models/kimi-k2 " + "--enforce-eager " * 2000})
    assert err.field == "launch_command"
    assert "the limit is 16384" in err.problem
