"""Conformance with the released engines, from the committed tables only (nothing is
downloaded): every launch the platform can render parses back under its version's table to
the same configuration, and a pasted command is accepted by the platform exactly when the
version accepts it, with the same meaning, or refused in the version's own words."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any

import pytest

from lab.config import ConfigError
from lab.engines import (
    EngineArgError,
    as_launched,
    backend_choices,
    launch_view,
    load_config_text,
    modelled_versions,
    normalize_config,
    parse_command,
    parse_launch,
    refused_choice,
    render,
)
from lab.engines.argv import release_parser
from tests.lab.engines.conftest import spark_nodes
from tests.lab.engines.test_parse_launch import EXTRA_ARGS

REFERENCE = Path(__file__).resolve().parents[3] / "examples" / "configs" / \
    "kimi-k2-8spark-outofbox.yaml"
VERSIONS = [(e, v) for e in ("vllm", "sglang") for v in modelled_versions(e)]
EAGLE3 = {"method": "eagle3", "draft_model": "AQ-MedAI/Kimi-K2-Instruct-eagle3"}


def test_the_modelled_versions_are_the_real_releases() -> None:
    assert modelled_versions("vllm") == ("0.29.0", "0.34.0")
    assert modelled_versions("sglang") == ("0.5.12", "0.5.23")


def reference(engine: str, version: str) -> dict[str, Any]:
    data = load_config_text(REFERENCE.read_text())
    return {**data, "engine": {"name": engine, "version": version}}


def variants(engine: str, version: str) -> list[tuple[str, dict[str, Any]]]:
    """Every configuration the platform renders for a version: the reference day's, each
    stage's trial settings (each FP4 backend the version offers, EAGLE-3 k = 1..7, n-gram,
    no speculation, the loaders, a kept JIT cache, eager mode) and a tuned one."""
    base = reference(engine, version)
    out: list[tuple[str, dict[str, Any]]] = [("reference", base)]

    def serving(**fields: Any) -> dict[str, Any]:
        return {**base, "serving": {**base["serving"], **fields}}

    for layer, field in (("moe", "moe_backend"), ("linear", "linear_backend")):
        for name in backend_choices(engine, version, layer):
            out.append((f"{layer} backend {name}", serving(**{field: name})))
    for k in range(1, 8):
        out.append((f"eagle3 k={k}", {**base, "speculative": {**EAGLE3,
                                                               "num_speculative_tokens": k}}))
    ngram: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": 3}
    if engine == "vllm":
        ngram |= {"prompt_lookup_min": 2, "prompt_lookup_max": 4}
    out.append(("ngram", {**base, "speculative": ngram}))
    out.append(("no speculation", {**base, "speculative": None}))
    out.append(("fastsafetensors", serving(load_format="fastsafetensors")))
    if engine == "vllm":
        out.append(("eager loader", serving(safetensors_load_strategy="eager")))
    out.append(("jit cache persisted", serving(jit_cache="persisted")))
    out.append(("enforce eager", serving(enforce_eager=True)))
    out.append(("tuned", {**serving(load_format="fastsafetensors", jit_cache="persisted",
                                    moe_backend="flashinfer_cutlass"),
                          "env": {"NCCL_SOCKET_IFNAME": "enp1s0f0np0",
                                  "NCCL_IB_HCA": "rocep1s0f0",
                                  "GLOO_SOCKET_IFNAME": "enp1s0f0np0"},
                          "speculative": {**EAGLE3, "num_speculative_tokens": 3}}))
    return out


CASES = [(engine, version, name, config) for engine, version in VERSIONS
         for name, config in variants(engine, version)]


@pytest.mark.parametrize(("engine", "version", "name", "config"), CASES,
                         ids=[f"{e}-{v}-{n}" for e, v, n, _ in CASES])
def test_every_renderable_launch_parses_back_under_its_version(
        engine: str, version: str, name: str, config: dict[str, Any]) -> None:
    normalized = normalize_config(config)
    launched = as_launched(normalized)
    specs = render(normalized, spark_nodes(8))
    assert [s["role"] for s in specs[:2]] == ["head", "worker"]
    for spec in specs[:2]:  # the head and a worker
        parsed = parse_launch(spec["argv"], spec["env"], version=version)
        assert parsed.config["engine"] == {"name": engine, "version": version}
        assert launch_view(parsed.config) == launch_view(launched), name
        assert parsed.node_rank == spec["rank"]
    argv = specs[0]["argv"]
    if engine == "sglang":
        assert "--enable-metrics" in argv
    assert "--trust-remote-code" in argv  # Kimi K2's tokenizer is its own code, reviewed
    spec = launched["speculative"]
    if spec is not None and spec["method"] == "eagle3":
        assert spec["draft_model"] == "/models/kimi-k2-eagle3"
        assert "AQ-MedAI/Kimi-K2-Instruct-eagle3" not in " ".join(argv)


@pytest.mark.parametrize(("engine", "version"), VERSIONS)
def test_every_rendered_flag_is_one_the_version_has(engine: str, version: str) -> None:
    parser = release_parser(engine, version)
    for _, config in variants(engine, version):
        for spec in render(normalize_config(config), spark_nodes(8))[:2]:
            for token in spec["argv"]:
                if token.startswith("--"):
                    assert parser.option(token.partition("=")[0]) is not None, token


@pytest.mark.parametrize(("engine", "version"), VERSIONS)
def test_the_round_trip_tests_pass_through_flags_every_version_has(engine: str,
                                                                   version: str) -> None:
    parser = release_parser(engine, version)
    for group in EXTRA_ARGS[engine]:
        assert parser.option(group[0].partition("=")[0]) is not None, group


# -- pasted commands: accepted with the version's meaning, or refused in its words ------------
VLLM = "vllm serve /models/kimi-k2 "
SGLANG = "python3 -m sglang.launch_server --model-path /models/kimi-k2 "
# (engine, version, the command's tail, what the version does: a check of the configuration
# read, or the words of its refusal)
PASTED: list[tuple[str, str, str, Any]] = [
    *[("vllm", v, "--swap-space 16", "unrecognized arguments: --swap-space 16")
      for v in ("0.29.0", "0.34.0")],
    ("vllm", "0.29.0", "--disable-log-requests", "unrecognized arguments: --disable-log-requests"),
    ("vllm", "0.34.0", "--disable-log-requests",
     lambda c: c["extra_args"] == ["--disable-log-requests"]),
    *[("vllm", v, "--max-model-len auto", lambda c: c["extra_args"] == ["--max-model-len", "auto"])
      for v in ("0.29.0", "0.34.0")],
    *[("vllm", v, "--moe-backend FLASHINFER-CUTLASS",
       lambda c: c["serving"]["moe_backend"] == "flashinfer_cutlass") for v in ("0.29.0", "0.34.0")],
    *[("vllm", v, "--moe-backend flashinfer_b12x --linear-backend FLASHINFER_B12X",
       lambda c: (c["serving"]["moe_backend"], c["serving"]["linear_backend"])
       == ("flashinfer_b12x", "flashinfer_b12x")) for v in ("0.29.0", "0.34.0")],
    *[("vllm", v, "--safetensors-load-strategy prefetch",
       lambda c: c["serving"]["safetensors_load_strategy"] == "prefetch")
      for v in ("0.29.0", "0.34.0")],
    *[("vllm", v, "-sc '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'",
       lambda c: (c["speculative"]["method"], c["speculative"]["num_speculative_tokens"])
       == ("ngram", 4)) for v in ("0.29.0", "0.34.0")],
    *[("vllm", v, "--spec-method eagle3 --spec-model /models/kimi-k2-eagle3 --spec-tokens 2",
       lambda c: (c["speculative"]["method"], c["speculative"]["num_speculative_tokens"])
       == ("eagle3", 2)) for v in ("0.29.0", "0.34.0")],
    *[("vllm", v, "--tensor_parallel_size=4 -pp 2", lambda c: (c["parallel"]["tp"], c["parallel"][
        "pp"]) == (4, 2)) for v in ("0.29.0", "0.34.0")],
    *[("vllm", v, "--tensor-parallel-size", "argument --tensor-parallel-size/-tp: expected one "
       "argument") for v in ("0.29.0", "0.34.0")],
    ("sglang", "0.5.12", "--cuda-graph-max-bs 8",
     lambda c: c["extra_args"] == ["--cuda-graph-max-bs", "8"]),
    ("sglang", "0.5.23", "--cuda-graph-max-bs 8",
     "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
     "--cuda-graph-max-bs-prefill"),
    *[("sglang", v, "--speculative-algorithm NGRAM --speculative-num-draft-tokens 4 "
       "--speculative-ngram-max-match-window-size 8",
       "unrecognized arguments: --speculative-ngram-max-match-window-size 8")
      for v in ("0.5.12", "0.5.23")],
    ("sglang", "0.5.23", "--fp4-gemm-backend marlin",
     lambda c: c["serving"]["linear_backend"] == "marlin"),
    ("sglang", "0.5.12", "--fp4-gemm-backend marlin",
     "argument --fp4-gemm-backend: invalid choice: 'marlin' (choose from auto, cutlass, "
     "flashinfer_cudnn, flashinfer_cutedsl, flashinfer_cutlass, flashinfer_trtllm)"),
    *[("sglang", v, "--moe-runner-backend FLASHINFER_CUTLASS",
       "argument --moe-runner-backend: invalid choice: 'FLASHINFER_CUTLASS'")
      for v in ("0.5.12", "0.5.23")],
    *[("sglang", v, "--enable-metrics --decode-log-interval 40",
       lambda c: c["extra_args"] == ["--enable-metrics", "--decode-log-interval", "40"])
      for v in ("0.5.12", "0.5.23")],
    *[("sglang", v, "--tp 8 --ep 8", lambda c: c["parallel"]["expert_parallel"] is True)
      for v in ("0.5.12", "0.5.23")],
]


@pytest.mark.parametrize(("engine", "version", "tail", "expected"), PASTED,
                         ids=[f"{e}-{v}-{t[:40]}" for e, v, t, _ in PASTED])
def test_a_pasted_command_is_read_as_the_version_reads_it(engine: str, version: str, tail: str,
                                                          expected: Any) -> None:
    command = (VLLM if engine == "vllm" else SGLANG) + tail
    if isinstance(expected, str):
        with pytest.raises(ConfigError) as info:
            parse_command(command, version=version)
        assert info.value.field == "launch_command"
        assert expected in info.value.problem
        # ... as the version itself refuses it, exit 2 and all
        with pytest.raises(EngineArgError) as refused:
            parse_launch(shlex.split(command), {}, version=version)
        assert expected in refused.value.message
        assert str(refused.value).startswith("usage: ")
    else:
        config = parse_command(command, version=version)
        assert config["engine"] == {"name": engine, "version": version}
        assert expected(config)


@pytest.mark.parametrize(("engine", "version"), VERSIONS)
def test_a_refused_backend_lists_the_versions_own_choices(engine: str, version: str) -> None:
    flag = "--moe-backend" if engine == "vllm" else "--moe-runner-backend"
    command = (VLLM if engine == "vllm" else SGLANG) + f"{flag} no_such"
    with pytest.raises(ConfigError) as info:
        parse_command(command, version=version)
    found = refused_choice(info.value.problem)
    assert found is not None
    value, names = found
    assert value == "no_such"
    assert tuple(names) == backend_choices(engine, version, "moe")


def test_an_invalid_choice_reads_in_both_pythons_wordings() -> None:
    assert refused_choice("argument --x: invalid choice: 'a' (choose from b, c)") == ("a", ["b", "c"])
    assert refused_choice("argument --x: invalid choice: 'a' (choose from 'b', 'c')") == \
        ("a", ["b", "c"])
    assert refused_choice("unrecognized arguments: --x") is None


@pytest.mark.parametrize(("engine", "older", "newer"),
                         [("vllm", "0.29.0", "0.34.0"), ("sglang", "0.5.12", "0.5.23")])
def test_a_flag_only_one_version_has_is_refused_by_the_other_as_argparse_would(
        engine: str, older: str, newer: str) -> None:
    for have, lack in ((older, newer), (newer, older)):
        has, lacks = release_parser(engine, have), release_parser(engine, lack)
        missing = [o for o in has.options
                   if not any(lacks.has(s) for s in o.option_strings)]
        assert missing, (have, lack)
        for option in missing:
            name = next(s for s in option.option_strings if s.startswith("--"))
            abbreviates = [s for s in dict.fromkeys(
                s for o in lacks.options for s in o.option_strings) if s.startswith(name)]
            tokens = [name, "1"] if option.takes_value else [name]
            try:
                lacks.parse(tokens, partial=True)
            except EngineArgError as exc:
                if len(abbreviates) > 1:
                    assert exc.message.startswith(f"ambiguous option: {name} could match ")
                elif not abbreviates:
                    assert exc.message.startswith("unrecognized arguments: " + name), exc.message
            else:
                # argparse takes it as the abbreviation of the one option it begins
                assert len(abbreviates) == 1, name


def test_a_structured_configuration_is_held_to_its_version_too() -> None:
    config = copy.deepcopy(reference("sglang", "0.5.12"))
    config["speculative"] = {"method": "ngram", "num_speculative_tokens": 3,
                             "prompt_lookup_max": 4}
    with pytest.raises(ConfigError) as info:
        normalize_config(config)
    assert info.value.field == "speculative.prompt_lookup_max"
    assert "no n-gram match-window flags" in info.value.problem
