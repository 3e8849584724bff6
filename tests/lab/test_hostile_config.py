"""Every way a configuration could put code or content on a lab node, refused with a field
error before anything reaches a node: as a structured configuration, as YAML, as a pasted
command, at render time, and through a LabSession whose node cannot even be reached."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

import lab.engines
from lab.catalog import parse_catalog
from lab.config import ConfigError
from lab.engines import load_config_text, normalize_config, parse_command, render
from lab.inventory import parse_inventory
from lab.session import LabSession

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"
# The reference lab's catalog (the one lab.catalog.load_catalog() reads by default).
LAB_CATALOG = Path(__file__).resolve().parents[2] / "lab" / "catalog.yaml"
EAGLE3 = {"method": "eagle3", "draft_model": "AQ-MedAI/Kimi-K2-Instruct-eagle3",
          "num_speculative_tokens": 4}

# (what the configuration tries, the structured fields that try it, the field named)
HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    ("preload a library", {"env": {"LD_PRELOAD": "/tmp/evil.so"}}, "env.LD_PRELOAD"),
    ("widen the library path", {"env": {"LD_LIBRARY_PATH": "/tmp"}}, "env.LD_LIBRARY_PATH"),
    ("replace PATH", {"env": {"PATH": "/tmp:/usr/bin"}}, "env.PATH"),
    ("inject Python modules", {"env": {"PYTHONPATH": "/tmp"}}, "env.PYTHONPATH"),
    ("run a Python start-up file", {"env": {"PYTHONSTARTUP": "/tmp/x.py"}}, "env.PYTHONSTARTUP"),
    ("point the hub elsewhere", {"env": {"HF_ENDPOINT": "https://evil.example"}}, "env.HF_ENDPOINT"),
    ("go online for the hub", {"env": {"HF_HUB_OFFLINE": "0"}}, "env.HF_HUB_OFFLINE"),
    ("use a proxy", {"env": {"HTTPS_PROXY": "http://evil.example:3128"}}, "env.HTTPS_PROXY"),
    ("use a proxy, lower case", {"env": {"http_proxy": "http://evil.example"}}, "env.http_proxy"),
    ("load an NCCL network plugin", {"env": {"NCCL_NET_PLUGIN": "/tmp/x.so"}}, "env.NCCL_NET_PLUGIN"),
    ("load UCX modules", {"env": {"UCX_MODULE_DIR": "/tmp"}}, "env.UCX_MODULE_DIR"),
    ("run another ptxas", {"env": {"TRITON_PTXAS_PATH": "/tmp/ptxas"}}, "env.TRITON_PTXAS_PATH"),
    ("download from ModelScope", {"env": {"VLLM_USE_MODELSCOPE": "1"}}, "env.VLLM_USE_MODELSCOPE"),
    ("load vLLM plugins", {"env": {"VLLM_PLUGINS": "evil"}}, "env.VLLM_PLUGINS"),
    ("inject a CUDA library", {"env": {"CUDA_INJECTION64_PATH": "/tmp/x.so"}},
     "env.CUDA_INJECTION64_PATH"),
    ("talk to another MPS daemon", {"env": {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps"}},
     "env.CUDA_MPS_PIPE_DIRECTORY"),
    ("write NCCL debug output anywhere", {"env": {"NCCL_DEBUG_FILE": "/etc/x"}},
     "env.NCCL_DEBUG_FILE"),
    ("serve a model the lab does not hold", {"model": {"path": "evil/Model-With-Code"}}, "model.path"),
    ("serve weights from elsewhere", {"model": {"path": "/tmp/weights"}}, "model.path"),
    ("climb out of the models directory", {"model": {"path": "/models/kimi-k2/../../etc"}},
     "model.path"),
    ("speculate with any repository", {"speculative": {**EAGLE3, "draft_model": "evil/draft"}},
     "speculative.draft_model"),
    ("speculate with a local path", {"speculative": {**EAGLE3, "draft_model": "/tmp/draft"}},
     "speculative.draft_model"),
    ("load any tokenizer", {"extra_args": ["--tokenizer", "evil/tokenizer"]}, "extra_args"),
    ("load a tokenizer from /tmp", {"extra_args": ["--tokenizer=/tmp/tok"]}, "extra_args"),
    ("choose where weights download", {"extra_args": ["--download-dir", "/models/x"]}, "extra_args"),
    ("pass an inline chat template", {"extra_args": ["--chat-template", "{{ 7 * 7 }}"]},
     "extra_args"),
    ("read a chat template from /tmp", {"extra_args": ["--chat-template", "/tmp/t.jinja"]},
     "extra_args"),
    ("read a generation config from /etc", {"extra_args": ["--generation-config", "/etc"]},
     "extra_args"),
    ("name a compilation backend", {"extra_args": ["--compilation-config",
                                                   '{"backend": "evil.module.fn"}']}, "extra_args"),
    # Pass-through flags the engine has that import code, read files or reach the network.
    ("import a middleware", {"extra_args": ["--middleware", "evil.module.App"]}, "extra_args"),
    ("load a tool parser plugin", {"extra_args": ["--tool-parser-plugin", "/tmp/p.py"]},
     "extra_args"),
    ("read arguments from a file", {"extra_args": ["--config", "/etc/args.yaml"]}, "extra_args"),
    ("override the model's config", {"extra_args": ["--hf-overrides", '{"auto_map": {}}']},
     "extra_args"),
    ("name a KV connector module", {"extra_args": [
        "--kv-transfer-config", '{"kv_connector_module_path": "evil"}']}, "extra_args"),
    ("import logits processors", {"extra_args": ["--logits-processors", "evil.P"]}, "extra_args"),
    ("extend the worker class", {"extra_args": ["--worker-extension-cls", "evil.W"]},
     "extra_args"),
    ("load LoRA adapters", {"extra_args": ["--lora-modules", "a=/tmp/a"]}, "extra_args"),
    ("read local media anywhere", {"extra_args": ["--allowed-local-media-path", "/"]},
     "extra_args"),
    ("reach a tool server", {"extra_args": ["--tool-server", "evil.example:80"]}, "extra_args"),
    ("a draft by vLLM's shorthand", {"extra_args": ["--spec-model", "evil/d"]}, "extra_args"),
    ("sglang: read an n-gram corpus", {"engine": {"name": "sglang"}, "extra_args": [
        "--speculative-ngram-external-corpus-path", "/etc/shadow"]}, "extra_args"),
    ("sglang: load any tokenizer", {"engine": {"name": "sglang"},
                                    "extra_args": ["--tokenizer-path", "evil/tok"]}, "extra_args"),
    ("sglang: choose a download dir", {"engine": {"name": "sglang"},
                                       "extra_args": ["--download-dir", "/tmp"]}, "extra_args"),
    ("sglang: an inline chat template", {"engine": {"name": "sglang"},
                                         "extra_args": ["--chat-template", "{{ x }}"]}, "extra_args"),
    ("sglang: draft from any repository", {"engine": {"name": "sglang"},
                                           "speculative": {**EAGLE3, "draft_model": "evil/d"}},
     "speculative.draft_model"),
]
IDS = [row[0] for row in HOSTILE]


def reference() -> dict[str, Any]:
    return dict(yaml.safe_load((EXAMPLES / "kimi-k2-8spark-outofbox.yaml").read_text()))


def hostile(fields: dict[str, Any]) -> dict[str, Any]:
    data = reference()
    for key, value in fields.items():
        if key == "engine":
            data[key] = value  # another engine: its own default version
        else:
            data[key] = {**data[key], **value} if isinstance(value, dict) and data.get(key) \
                else value
    return data


@pytest.mark.parametrize(("what", "fields", "field"), HOSTILE, ids=IDS)
def test_a_structured_configuration_is_refused_at_the_field(what: str, fields: dict[str, Any],
                                                            field: str) -> None:
    with pytest.raises(ConfigError) as info:
        normalize_config(hostile(fields))
    assert info.value.field == field, what
    assert info.value.problem


@pytest.mark.parametrize(("what", "fields", "field"), HOSTILE, ids=IDS)
def test_the_same_as_yaml_is_refused_at_the_field(what: str, fields: dict[str, Any],
                                                  field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text(yaml.safe_dump(hostile(fields)))
    assert info.value.field == field, what


@pytest.mark.parametrize(("what", "fields", "field"), HOSTILE, ids=IDS)
def test_the_same_slipped_into_a_normalized_configuration_is_refused_by_render(
        what: str, fields: dict[str, Any], field: str) -> None:
    # A configuration normalized once and changed afterwards (by hand, by a pipeline) is
    # checked again on its way to a node.
    config = copy.deepcopy(normalize_config(reference()))
    for key, value in fields.items():
        if key == "engine":
            config = normalize_config({**reference(), "engine": value})
        elif isinstance(value, dict):
            config[key] = {**(config[key] or {}), **value}
        else:
            config[key] = value
    with pytest.raises(ConfigError) as info:
        render(config, unreachable_inventory().nodes)
    assert info.value.field == field, what


COMMANDS = [
    ("preload a library", "LD_PRELOAD=/tmp/evil.so vllm serve /models/kimi-k2", "LD_PRELOAD"),
    ("export a Python path", "export PYTHONPATH=/tmp\nvllm serve /models/kimi-k2", "PYTHONPATH"),
    ("point the hub elsewhere", "HF_ENDPOINT=https://evil.example vllm serve /models/kimi-k2",
     "HF_ENDPOINT"),
    ("serve any repository", "vllm serve evil/Model-With-Code --trust-remote-code", "--model"),
    ("any tokenizer", "vllm serve /models/kimi-k2 --tokenizer evil/tok", "--tokenizer"),
    ("a download dir", "vllm serve /models/kimi-k2 --download-dir /tmp", "--download-dir"),
    ("a chat template from /tmp", "vllm serve /models/kimi-k2 --chat-template /tmp/t.jinja",
     "--chat-template"),
    ("a generation config from /tmp", "vllm serve /models/kimi-k2 --generation-config /tmp",
     "--generation-config"),
    ("a draft from any repository", "vllm serve /models/kimi-k2 --speculative-config "
     "'{\"method\": \"eagle3\", \"model\": \"evil/d\", \"num_speculative_tokens\": 3}'",
     "evil/d"),
    ("a draft by vLLM's shorthand", "vllm serve /models/kimi-k2 --spec-method eagle3 "
     "--spec-model evil/d --spec-tokens 3", "evil/d"),
    ("a middleware", "vllm serve /models/kimi-k2 --middleware evil.App", "--middleware"),
    ("sglang: any tokenizer", "python3 -m sglang.launch_server --model-path /models/kimi-k2 "
     "--tokenizer-path /tmp/tok", "--tokenizer-path"),
    ("sglang: a draft from any repository", "python3 -m sglang.launch_server --model-path "
     "/models/kimi-k2 --speculative-algorithm EAGLE3 --speculative-draft-model-path evil/d "
     "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
     "evil/d"),
]


@pytest.mark.parametrize(("what", "command", "named"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_pasted_command_is_refused_naming_the_culprit(what: str, command: str, named: str) -> None:
    for attempt in (lambda: parse_command(command),
                    lambda: normalize_config({"launch_command": command})):
        with pytest.raises(ConfigError) as info:
            attempt()
        assert info.value.field == "launch_command", what
        assert named in info.value.problem, info.value.problem


def test_remote_code_is_refused_for_a_model_the_catalog_does_not_mark(
        monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = parse_catalog({"schema": "lab.catalog/1", "version": "test", "models_dir": "/models",
                             "models": [{"id": "moonshotai/Kimi-K2-Instruct-0905",
                                         "path": "/models/kimi-k2", "remote_code": False,
                                         "drafts": [{"id": EAGLE3["draft_model"], "method": "eagle3",
                                                     "path": "/models/kimi-k2-eagle3"}]}]})
    monkeypatch.setattr(lab.engines, "load_catalog", lambda: catalog)
    with pytest.raises(ConfigError) as info:
        normalize_config({**reference(), "extra_args": ["--trust-remote-code"]})
    assert info.value.field == "extra_args"
    assert "marks as reviewed" in info.value.problem
    with pytest.raises(ConfigError):
        parse_command("python3 -m sglang.launch_server --model-path /models/kimi-k2 "
                      "--trust-remote-code")


# A lab holding a second model whose code it has not reviewed, and a draft it has not
# reviewed under the reviewed Kimi K2.
TWO_MODELS = {"schema": "lab.catalog/1", "version": "test", "models_dir": "/models",
              "models": [{"id": "moonshotai/Kimi-K2-Instruct-0905", "path": "/models/kimi-k2",
                          "remote_code": True,
                          "drafts": [{"id": EAGLE3["draft_model"], "method": "eagle3",
                                      "path": "/models/kimi-k2-eagle3", "remote_code": True}]},
                         {"id": "other/Unreviewed", "path": "/models/other-model",
                          "remote_code": False}]}


@pytest.mark.parametrize("extra", [
    ["--trust-remote-code", "--tokenizer", "/models/other-model"],
    ["--tokenizer", "/models/other-model"],
    ["--tokenizer", "/models/other-model/tokenizer"],
    ["--trust-remote-code", "--generation-config", "/models/other-model"],
    ["--generation-config", "/models/other-model"],
])
def test_remote_code_is_judged_on_the_command_as_launched(
        extra: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # A tokenizer or generation config from an unreviewed model's files would run that
    # model's code: the lab launches Kimi K2 with --trust-remote-code (its catalog marks it
    # reviewed) whether the customer wrote the flag or not.
    monkeypatch.setattr(lab.engines, "load_catalog", lambda: parse_catalog(TWO_MODELS))
    with pytest.raises(ConfigError) as info:
        normalize_config({**reference(), "extra_args": extra})
    assert info.value.field == "extra_args"
    assert "--trust-remote-code would run the code of other/Unreviewed" in info.value.problem
    # With remote code off, the same file is only read, and the lab holds it.
    read_only = [a for a in extra if a != "--trust-remote-code"]
    assert normalize_config({**reference(), "extra_args": ["--no-trust-remote-code", *read_only]})


@pytest.mark.parametrize("extra", [
    ["--tokenizer", "/models/not-an-entry"],
    ["--generation-config", "/models/unreviewed"],
    ["--chat-template", "/models/loose/template.jinja"],
])
def test_a_file_from_a_folder_that_is_no_entry_of_the_catalog_is_refused(extra: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        normalize_config({**reference(), "extra_args": extra})
    assert info.value.field == "extra_args"
    assert "must come from a folder of the lab's catalog" in info.value.problem


def test_an_unreviewed_draft_is_refused_when_the_launch_runs_remote_code(
        monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = copy.deepcopy(TWO_MODELS)
    catalog["models"][0]["drafts"][0]["remote_code"] = False
    monkeypatch.setattr(lab.engines, "load_catalog", lambda: parse_catalog(catalog))
    with pytest.raises(ConfigError) as info:
        normalize_config({**reference(), "speculative": EAGLE3})
    assert info.value.field == "speculative.draft_model"
    assert "has not reviewed the draft's code" in info.value.problem
    # Remote code off: the draft's folder is only read.
    assert normalize_config({**reference(), "speculative": EAGLE3,
                             "extra_args": ["--no-trust-remote-code"]})


def test_what_the_lab_holds_is_accepted() -> None:
    config = normalize_config({
        **reference(),
        "env": {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5_0:1,mlx5_1",
                "VLLM_USE_DEEP_GEMM": "1", "OMP_NUM_THREADS": 8},
        "extra_args": ["--trust-remote-code", "--tokenizer", "/models/kimi-k2",
                       "--chat-template", "/models/kimi-k2/chat_template.jinja",
                       "--generation-config", "auto", "--compilation-config", '{"mode": 3}'],
    })
    assert config["env"]["OMP_NUM_THREADS"] == "8"
    assert normalize_config({**reference(), "model": {"path": "moonshotai/Kimi-K2-Instruct-0905"},
                             "speculative": {**EAGLE3, "draft_model": "/models/kimi-k2-eagle3"}})


def unreachable_inventory() -> Any:
    # Port 1 on loopback refuses at once: any attempt to reach the node fails as LabError.
    return parse_inventory({
        "schema": "lab.inventory/1", "name": "nowhere", "known_hosts": "/dev/null",
        "catalog": str(LAB_CATALOG),
        "nodes": [{"name": f"n{i}", "host": "127.0.0.1", "port": 1,
                   "role": "head" if i == 0 else "worker"} for i in range(8)],
    }, base=Path("/tmp"))


@pytest.mark.parametrize(("what", "fields", "field"),
                         [row for row in HOSTILE if "engine" not in row[1]],
                         ids=[row[0] for row in HOSTILE if "engine" not in row[1]])
def test_a_session_refuses_before_it_reaches_any_node(what: str, fields: dict[str, Any],
                                                      field: str) -> None:
    config = copy.deepcopy(normalize_config(reference()))
    for key, value in fields.items():
        config[key] = {**(config[key] or {}), **value} if isinstance(value, dict) else value
    session = LabSession(unreachable_inventory())
    try:
        # Reaching a node first would fail as NodeUnreachable, not as a configuration error.
        with pytest.raises(ConfigError) as info:
            session.launch(config, cold=True, timeout_s=5)
        assert info.value.field == field, what
    finally:
        session.close()
