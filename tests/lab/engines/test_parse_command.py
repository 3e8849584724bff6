"""parse_command: a launch command as customers paste it -> a normalized configuration."""

from __future__ import annotations

import pytest

from lab.config import ConfigError
from lab.engines import parse_command


def command_error(text: str, *, version: str | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_command(text, version=version)
    assert info.value.field == "launch_command"
    return str(info.value)


def test_continuations_quoting_and_env_prefixes_are_understood() -> None:
    config = parse_command(
        "NCCL_SOCKET_IFNAME=enp1s0f0np0 NCCL_IB_HCA='rocep1s0f0,roceP2p1s0f0' \\\n"
        "  vllm serve /models/kimi-k2 \\\n"
        "    --tensor-parallel-size 8 --enable-expert-parallel \\\n"
        "    --speculative-config '{\"method\": \"eagle3\",\n"
        "      \"model\": \"AQ-MedAI/Kimi-K2-Instruct-eagle3\",\n"
        "                           \"num_speculative_tokens\": 3}'\n")
    assert config["env"] == {"NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0",
                             "NCCL_SOCKET_IFNAME": "enp1s0f0np0"}
    assert config["parallel"] == {"tp": 8, "pp": 1, "expert_parallel": True}
    assert config["speculative"]["draft_model"] == "AQ-MedAI/Kimi-K2-Instruct-eagle3"
    assert config["speculative"]["num_speculative_tokens"] == 3


def test_export_lines_comments_and_prompts_are_read() -> None:
    config = parse_command("# our launch\n"
                           "$ export VLLM_USE_DEEP_GEMM=1\n"
                           "export NCCL_DEBUG=WARN; vllm serve /models/kimi-k2  # head\n")
    assert config["env"] == {"NCCL_DEBUG": "WARN", "VLLM_USE_DEEP_GEMM": "1"}
    assert config["model"]["path"] == "/models/kimi-k2"


def test_output_plumbing_after_the_command_is_dropped() -> None:
    config = parse_command("nohup vllm serve /models/kimi-k2 --enforce-eager 2>&1 | tee vllm.log &")
    assert config["serving"]["enforce_eager"] is True
    assert config["extra_args"] == []


def test_quoted_shell_characters_stay_part_of_their_argument() -> None:
    config = parse_command("vllm serve '/models/kimi-k2' --served-model-name 'k2-prod' "
                           "--api-key 'a;b $(x)'")
    assert config["model"] == {"id": "k2-prod", "quantization": "nvfp4", "path": "/models/kimi-k2"}
    assert config["extra_args"] == ["--api-key", "a;b $(x)"]
    # A served name is a name: shell text there is refused with the flag's rule.
    assert "the served model name takes a name of letters" in command_error(
        "vllm serve /models/kimi-k2 --served-model-name 'k2 | prod'")


def test_per_node_flags_are_read_and_ignored() -> None:
    worker = parse_command("vllm serve /models/kimi-k2 -tp 8 --nnodes 8 --node-rank 3 --master-addr 10.0.0.1 "
                           "--master-port 29500 --headless --host 0.0.0.0 --port 9000")
    head = parse_command("vllm serve /models/kimi-k2 -tp 8")
    assert worker == head


def test_what_a_command_cannot_say_is_derived_or_defaulted() -> None:
    config = parse_command("vllm serve /models/kimi-k2 --tensor-parallel-size 4 --pipeline-parallel-size 2")
    assert config["cluster"] == {"nodes": 8, "node_type": "dgx-spark", "link_gbps": 100.0}
    assert config["engine"] == {"name": "vllm", "version": "0.34.0"}
    assert parse_command("vllm serve /models/kimi-k2", version="0.29.0")["engine"] == \
        {"name": "vllm", "version": "0.29.0"}
    assert config["workloads"] == ["code", "prose"]
    assert "reported" not in config


def test_engine_defaults_fill_what_the_command_leaves_out() -> None:
    serving = parse_command("vllm serve /models/kimi-k2")["serving"]
    assert serving["gpu_memory_utilization"] == 0.9
    assert serving["kv_cache_dtype"] == "auto"
    assert serving["load_format"] == "auto"


def test_the_older_python_entrypoint_takes_model_as_a_flag() -> None:
    config = parse_command("python3 -m vllm.entrypoints.openai.api_server --model /models/kimi-k2 "
                           "--served-model-name k2 --max-model-len 64K")
    assert config["model"]["path"] == "/models/kimi-k2"
    assert config["model"]["id"] == "k2"
    assert config["serving"]["max_model_len"] == 65536


def test_an_sglang_command_is_read() -> None:
    config = parse_command(
        "python3 -m sglang.launch_server --model-path /models/kimi-k2 --tp 8 --ep-size 8 "
        "--dist-init-addr 10.0.0.1:5000 --nnodes 8 --node-rank 0 --trust-remote-code "
        "--kv-cache-dtype fp8_e4m3 --mem-fraction-static 0.8 --moe-runner-backend cutlass "
        "--speculative-algorithm EAGLE3 --speculative-draft-model-path AQ-MedAI/Kimi-K2-Instruct-eagle3 "
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4")
    assert config["engine"]["name"] == "sglang"
    assert config["parallel"] == {"tp": 8, "pp": 1, "expert_parallel": True}
    assert config["serving"]["kv_cache_dtype"] == "fp8"
    assert config["serving"]["gpu_memory_utilization"] == 0.8
    assert config["serving"]["moe_backend"] == "cutlass"
    assert config["speculative"]["method"] == "eagle3"
    assert config["speculative"]["num_speculative_tokens"] == 3
    assert config["extra_args"] == ["--trust-remote-code"]


def test_jit_cache_variables_mean_a_persisted_cache() -> None:
    config = parse_command("VLLM_CACHE_ROOT=/cache/vllm vllm serve /models/kimi-k2")
    assert config["serving"]["jit_cache"] == "persisted"
    assert config["env"] == {}


def test_known_harmless_flags_travel_in_extra_args_verbatim() -> None:
    config = parse_command("vllm serve /models/kimi-k2 --trust-remote-code --max-num-seqs=4 "
                           "--tool-call-parser kimi_k2")
    assert config["extra_args"] == ["--trust-remote-code", "--max-num-seqs=4",
                                    "--tool-call-parser", "kimi_k2"]


def test_a_flag_the_version_does_not_have_is_refused_in_its_words() -> None:
    assert command_error("vllm serve /models/kimi-k2 --swap-space 16") == (
        "launch_command: '--swap-space' is not a flag of vllm 0.34.0 (vllm serve: error: "
        "unrecognized arguments: --swap-space 16); remove it")


def test_a_flag_one_version_has_and_another_has_not() -> None:
    text = "vllm serve /models/kimi-k2 --disable-log-requests"
    assert parse_command(text, version="0.34.0")["extra_args"] == ["--disable-log-requests"]
    assert "unrecognized arguments: --disable-log-requests" in \
        command_error(text, version="0.29.0")


def test_what_vllm_accepts_is_accepted_with_its_meaning() -> None:
    config = parse_command("vllm serve /models/kimi-k2 -tp 8 --max-model-len auto "
                           "--moe-backend FLASHINFER-CUTLASS --linear-backend Flashinfer_Cutlass "
                           "--safetensors-load-strategy prefetch -sc "
                           "'{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'")
    assert config["parallel"]["tp"] == 8
    assert config["extra_args"] == ["--max-model-len", "auto"]
    assert config["serving"]["moe_backend"] == "flashinfer_cutlass"
    assert config["serving"]["linear_backend"] == "flashinfer_cutlass"
    assert config["serving"]["safetensors_load_strategy"] == "prefetch"
    assert config["speculative"]["method"] == "ngram"


def test_a_backend_the_version_does_not_have_is_refused_with_its_list() -> None:
    message = command_error("vllm serve /models/kimi-k2 --moe-backend no_such")
    assert message.startswith("launch_command: vllm serve: error: argument --moe-backend: invalid "
                              "choice: 'no_such' (choose from aiter, ")
    assert "flashinfer_b12x" in message


def test_a_flag_that_is_not_on_the_versions_list_is_refused_naming_the_list() -> None:
    message = command_error("vllm serve /models/kimi-k2 --middleware my.module.Middleware")
    assert "'--middleware' is not a flag the lab lets a configuration pass to vLLM 0.34.0" in message
    assert "lab/engines/releases/vllm-0.34.0.flags.yaml" in message
    assert "'--tool-parser-plugin' is not a flag" in command_error(
        "vllm serve /models/kimi-k2 --tool-parser-plugin /tmp/x.py")


def test_a_stray_argument_is_named() -> None:
    assert command_error("vllm serve /a /b") == (
        "launch_command: '/b' is an extra argument vllm 0.34.0 does not take (vllm serve: error: "
        "unrecognized arguments: /b); remove it")


def test_a_bad_value_names_its_flag() -> None:
    assert command_error("vllm serve /models/kimi-k2 --gpu-memory-utilization 1.5").startswith(
        "launch_command: --gpu-memory-utilization: 1.5 is not accepted")
    assert command_error("vllm serve /models/kimi-k2 --tensor-parallel-size eight") == (
        "launch_command: vllm serve: error: argument --tensor-parallel-size/-tp: invalid int "
        "value: 'eight'")


def test_a_container_wrapper_is_refused_naming_the_token() -> None:
    message = command_error("docker run --gpus all -e NCCL_IB_HCA=x vllm/vllm-openai:latest "
                            "vllm serve /models/kimi-k2")
    assert message.startswith("launch_command: 'docker': container and scheduler wrappers")


def test_something_that_is_not_an_engine_launch_is_named() -> None:
    assert "'vllm bench'" in command_error("vllm bench serve --model /models/kimi-k2")
    assert "'python3'" in command_error("python3 train.py")


def test_two_commands_are_refused() -> None:
    assert "'vllm' starts a second command" in command_error("vllm serve /a\nvllm serve /b")


def test_an_unbalanced_quote_is_reported() -> None:
    assert "check the quotes" in command_error("vllm serve /models/kimi-k2 --served-model-name 'k2")


def test_text_without_a_command_is_refused() -> None:
    assert "holds no command" in command_error("# nothing here\nexport A=1\n")
