"""parse_launch: what the simulated engine reads from its argv, by the version's table, and the
render round trip over every modelled version."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.config import (
    KV_CACHE_DTYPES,
    LOAD_FORMATS,
    MAX_MODEL_LEN,
)
from lab.engines import (
    UNCARRIED,
    EngineArgError,
    as_launched,
    backend_choices,
    launch_view,
    modelled_versions,
    normalize_config,
    parse_command,
    parse_launch,
    render,
)
from lab.engines.argv import NotReproduced
from tests.lab.engines.conftest import spark_nodes
from tests.lab.env_values import environments

VLLM = ["vllm", "serve", "/models/kimi-k2"]
SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/kimi-k2"]
VERSIONS = [(e, v) for e in ("vllm", "sglang") for v in modelled_versions(e)]


def arg_error(argv: list[str], env: dict[str, str] | None = None, *,
              version: str | None = None) -> EngineArgError:
    with pytest.raises(EngineArgError) as info:
        parse_launch(argv, env or {}, version=version)
    return info.value


def test_an_unknown_flag_fails_like_argparse_with_the_usage_line() -> None:
    err = arg_error([*VLLM, "--tensor-parallel-size", "8", "--foo"])
    assert str(err) == ("usage: vllm serve [model_tag] [options]\n"
                        "vllm serve: error: unrecognized arguments: --foo")
    assert (err.flag, err.message) == ("--foo", "unrecognized arguments: --foo")


def test_an_unknown_flag_is_reported_with_its_value() -> None:
    err = arg_error([*VLLM, "--foo", "bar", "--baz"])
    assert err.message == "unrecognized arguments: --foo bar --baz"
    assert err.flag == "--foo"


def test_a_bad_int_names_the_flag_by_all_its_spellings_and_the_value() -> None:
    err = arg_error([*VLLM, "--tensor-parallel-size", "x"])
    assert err.message == "argument --tensor-parallel-size/-tp: invalid int value: 'x'"
    assert err.flag == "--tensor-parallel-size"


def test_a_bad_float_names_the_converter_as_argparse_does() -> None:
    err = arg_error([*VLLM, "--gpu-memory-utilization", "most"], version="0.29.0")
    assert err.message == "argument --gpu-memory-utilization: invalid float value: 'most'"
    # 0.34.0 reads it with vLLM's optional_type(float)
    err = arg_error([*VLLM, "--gpu-memory-utilization", "most"], version="0.34.0")
    assert err.message == ("argument --gpu-memory-utilization/--device-memory-utilization: "
                           "invalid _optional_type value: 'most'")


def test_a_bad_choice_lists_the_versions_choices() -> None:
    err = arg_error([*VLLM, "--moe-backend", "no_such"], version="0.34.0")
    choices = ", ".join(backend_choices("vllm", "0.34.0", "moe"))
    assert err.message == f"argument --moe-backend: invalid choice: 'no_such' (choose from {choices})"
    assert "flashinfer_b12x" in choices and "'" not in choices


def test_a_flag_without_its_value_expects_one_argument() -> None:
    assert arg_error([*VLLM, "--port"]).message == "argument --port: expected one argument"
    assert arg_error([*VLLM, "--port", "--enforce-eager"]).message == \
        "argument --port: expected one argument"


def test_a_switch_given_a_value_is_refused() -> None:
    err = arg_error([*VLLM, "--enforce-eager=yes"])
    assert err.message == ("argument --enforce-eager/--no-enforce-eager: ignored explicit "
                           "argument 'yes'")


def test_a_value_out_of_range_is_an_argument_error_naming_the_flag() -> None:
    err = arg_error([*VLLM, "--gpu-memory-utilization", "1.5"])
    assert err.flag == "--gpu-memory-utilization"
    assert err.message.startswith("argument --gpu-memory-utilization: 1.5 is not accepted")


def test_a_missing_model_is_reported() -> None:
    assert "model_tag" in arg_error(["vllm", "serve", "--port", "8000"]).message
    assert arg_error(["python3", "-m", "sglang.launch_server"]).message == \
        "the following arguments are required: --model-path/--model"


def test_an_argv_that_launches_neither_engine_is_refused() -> None:
    err = arg_error(["python3", "server.py"])
    assert err.flag == "python3"
    assert "does not launch vllm or sglang" in str(err)


def test_a_version_the_platform_does_not_model_is_refused() -> None:
    with pytest.raises(LookupError, match=r"0\.29\.0, 0\.34\.0"):
        parse_launch(VLLM, {}, version="0.29.1")


def test_vllm_accepts_short_names_equals_underscores_and_abbreviations() -> None:
    parsed = parse_launch([*VLLM, "-tp", "4", "--pipeline_parallel_size=2", "-ep",
                           "--max-model-len=128k", "--enforce_eager", "--gpu-memory-util", "0.8"],
                          {})
    assert parsed.config["parallel"] == {"tp": 4, "pp": 2, "expert_parallel": True}
    assert parsed.config["serving"]["max_model_len"] == 128000
    assert parsed.config["serving"]["enforce_eager"] is True
    assert parsed.config["serving"]["gpu_memory_utilization"] == 0.8


def test_an_ambiguous_abbreviation_is_refused_listing_the_matches() -> None:
    err = arg_error([*VLLM, "--enable-log", "x"])
    assert err.message.startswith("ambiguous option: --enable-log could match ")
    assert "--enable-log-requests" in err.message and "--enable-log-outputs" in err.message


@pytest.mark.parametrize(("text", "tokens"), [("262144", 262144), ("256K", 262144),
                                              ("32k", 32000), ("1.5k", 1500)])
def test_vllm_max_model_len_reads_human_numbers(text: str, tokens: int) -> None:
    parsed = parse_launch([*VLLM, "--max-model-len", text], {})
    assert parsed.config["serving"]["max_model_len"] == tokens


def test_vllm_max_model_len_auto_travels_as_written() -> None:
    parsed = parse_launch([*VLLM, "--max-model-len", "auto"], {})
    assert parsed.config["extra_args"] == ["--max-model-len", "auto"]
    assert "Decimals are not allowed" in arg_error([*VLLM, "--max-model-len", "1.5K"]).message


@pytest.mark.parametrize("version", ["0.29.0", "0.34.0"])
def test_vllm_backend_names_are_read_as_vllm_reads_them(version: str) -> None:
    parsed = parse_launch([*VLLM, "--moe-backend", "FLASHINFER-CUTLASS", "--linear-backend",
                           "Flashinfer-Cutlass"], {}, version=version)
    assert parsed.config["serving"]["moe_backend"] == "flashinfer_cutlass"
    assert parsed.config["serving"]["linear_backend"] == "flashinfer_cutlass"


def test_vllm_no_flags_turn_switches_off() -> None:
    parsed = parse_launch([*VLLM, "--enforce-eager", "--no-enforce-eager",
                           "--no-enable-expert-parallel"], {})
    assert parsed.config["serving"]["enforce_eager"] is False
    assert parsed.config["parallel"]["expert_parallel"] is False
    # 0.34.0's EnableDisableAction also reads --disable-X as false
    parsed = parse_launch([*VLLM, "-ep", "--disable-expert-parallel"], {}, version="0.34.0")
    assert parsed.config["parallel"]["expert_parallel"] is False


def test_vllm_the_positional_model_wins_over_model_flag() -> None:
    parsed = parse_launch([*VLLM, "--model", "/elsewhere"], {})
    assert parsed.config["model"]["path"] == "/models/kimi-k2"
    assert parsed.config["model"]["id"] == "/models/kimi-k2"  # no --served-model-name


def test_vllm_launch_facts_are_read() -> None:
    parsed = parse_launch([*VLLM, "--nnodes", "8", "--node-rank", "3", "--master-addr",
                           "10.0.0.1", "--master-port", "29500", "--headless", "--port", "8001"],
                          {})
    assert (parsed.engine, parsed.node_rank, parsed.nnodes, parsed.headless) == \
        ("vllm", 3, 8, True)
    assert (parsed.master_addr, parsed.master_port, parsed.host, parsed.port) == \
        ("10.0.0.1", 29500, "0.0.0.0", 8001)


def test_vllm_speculative_config_json_is_checked() -> None:
    err = arg_error([*VLLM, "--speculative-config", "{bad"])
    assert err.message == ("argument --speculative-config/-sc: invalid _optional_type value: "
                           "'{bad'")
    err = arg_error([*VLLM, "-sc",
                     '{"method": "eagle3", "model": "d", "num_speculative_tokens": 3, '
                     '"draft_tensor_parallel_size": 1}'])
    # a key the release's SpeculativeConfig has, which the lab does not reproduce: the lab's
    # words, not an engine error (issue 37; test_release_spec_keys.py has the release's side)
    assert isinstance(err, NotReproduced)
    assert "'draft_tensor_parallel_size' is a key of vLLM 0.34.0's SpeculativeConfig that " \
        "the lab does not reproduce" in err.message
    assert not err.error_line.startswith("vllm serve: error:")
    err = arg_error([*VLLM, "--speculative-config", '{"method": "medusa"}'])
    assert "method 'medusa' is not modelled" in err.message


def test_vllm_older_ngram_spelling_is_understood() -> None:
    parsed = parse_launch([*VLLM, "--speculative-config",
                           '{"model": "[ngram]", "num_speculative_tokens": 5, '
                           '"prompt_lookup_max": 4}'], {})
    assert parsed.config["speculative"]["method"] == "ngram"
    assert parsed.config["speculative"]["prompt_lookup_max"] == 4


def test_jit_cache_variables_in_the_env_mean_persisted() -> None:
    env = {"VLLM_CACHE_ROOT": "/var/cache/diag/vllm", "NCCL_IB_HCA": "rocep1s0f0"}
    parsed = parse_launch(VLLM, env)
    assert parsed.config["serving"]["jit_cache"] == "persisted"
    assert parsed.config["env"] == {"NCCL_IB_HCA": "rocep1s0f0"}
    assert parse_launch(VLLM, {}).config["serving"]["jit_cache"] == "ephemeral"


def test_the_version_read_with_is_the_configurations() -> None:
    for engine, version in VERSIONS:
        argv = VLLM if engine == "vllm" else SGLANG
        assert parse_launch(argv, {}, version=version).config["engine"] == \
            {"name": engine, "version": version}
    assert parse_launch(VLLM, {}).config["engine"]["version"] == "0.34.0"
    assert parse_launch(SGLANG, {}).config["engine"]["version"] == "0.5.23"


@pytest.mark.parametrize("version", ["0.5.12", "0.5.23"])
def test_sglang_launch_facts_come_from_dist_init_addr_and_rank(version: str) -> None:
    # --tp is argparse's abbreviation of --tp-size
    parsed = parse_launch([*SGLANG, "--tp", "8", "--nnodes", "8", "--node-rank", "2",
                           "--dist-init-addr", "10.0.0.1:5000"], {}, version=version)
    assert (parsed.engine, parsed.node_rank, parsed.headless) == ("sglang", 2, True)
    assert (parsed.master_addr, parsed.master_port) == ("10.0.0.1", 5000)
    assert (parsed.host, parsed.port) == ("127.0.0.1", 30000)
    assert parsed.config["parallel"]["tp"] == 8


def test_sglang_expert_parallel_must_span_the_tp_group() -> None:
    assert parse_launch([*SGLANG, "--tp-size", "8", "--ep", "8"], {}).config["parallel"][
        "expert_parallel"] is True
    assert arg_error([*SGLANG, "--tp-size", "8", "--enable-ep-moe"]).message == \
        "unrecognized arguments: --enable-ep-moe"
    err = arg_error([*SGLANG, "--tp-size", "8", "--ep-size", "4"])
    assert err.flag == "--ep-size"
    assert "use 8" in err.message


def test_sglang_eagle_topk_above_one_is_not_modelled() -> None:
    err = arg_error([*SGLANG, "--speculative-algorithm", "EAGLE3",
                     "--speculative-draft-model-path", "d", "--speculative-num-steps", "3",
                     "--speculative-eagle-topk", "4"])
    assert err.flag == "--speculative-eagle-topk"


def test_sglang_draft_tokens_must_match_the_steps() -> None:
    err = arg_error([*SGLANG, "--speculative-algorithm", "EAGLE3",
                     "--speculative-draft-model-path", "d", "--speculative-num-steps", "3",
                     "--speculative-num-draft-tokens", "8"])
    assert "use 4" in err.message


def test_sglang_speculative_flags_need_an_algorithm() -> None:
    err = arg_error([*SGLANG, "--speculative-num-steps", "3"])
    assert err.message == "argument --speculative-num-steps: needs --speculative-algorithm"


def test_sglang_reads_nextn_as_mtp_and_ngram_draft_tokens_as_k_plus_one() -> None:
    mtp = parse_launch([*SGLANG, "--speculative-algorithm", "nextn",
                        "--speculative-num-steps", "2"], {}).config["speculative"]
    assert (mtp["method"], mtp["num_speculative_tokens"]) == ("mtp", 2)
    ngram = parse_launch([*SGLANG, "--speculative-algorithm", "NGRAM",
                          "--speculative-num-draft-tokens", "4"], {}).config["speculative"]
    assert (ngram["method"], ngram["num_speculative_tokens"]) == ("ngram", 3)


def test_sglang_has_no_ngram_match_window_flags() -> None:
    for version in ("0.5.12", "0.5.23"):
        err = arg_error([*SGLANG, "--speculative-algorithm", "NGRAM",
                         "--speculative-num-draft-tokens", "4",
                         "--speculative-ngram-max-match-window-size", "8"], version=version)
        assert err.message == ("unrecognized arguments: "
                               "--speculative-ngram-max-match-window-size 8")


def test_sglang_ngram_needs_at_least_one_draft_token() -> None:
    err = arg_error([*SGLANG, "--speculative-algorithm", "NGRAM",
                     "--speculative-num-draft-tokens", "1"])
    assert err.flag == "--speculative-num-draft-tokens"


def test_a_bad_speculative_field_is_named_under_its_flag() -> None:
    err = arg_error([*VLLM, "--speculative-config", '{"method": "eagle3", '
                                                    '"num_speculative_tokens": 3}'])
    assert err.message.startswith("argument --speculative-config: draft_model is required")


def test_sglang_errors_use_its_prog_and_generated_usage() -> None:
    err = arg_error([*SGLANG, "--foo"])
    assert err.error_line == "sglang serve: error: unrecognized arguments: --foo"
    usage, _, last = str(err).rpartition("\n")
    assert usage.startswith("usage: sglang serve [-h] ")
    assert "--model-path MODEL_PATH" in usage and last == err.error_line


# -- the round trip -----------------------------------------------------------------------
# Pass-through flags every modelled release of the engine has (the tables say so: a test in
# test_conformance.py checks each against them).
EXTRA_ARGS = {
    "vllm": [["--trust-remote-code"], ["--max-num-seqs", "4"], ["--enable-prefix-caching"],
             ["--no-enable-chunked-prefill"], ["--seed=7"], ["--tool-call-parser", "kimi_k2"]],
    "sglang": [["--trust-remote-code"], ["--max-running-requests", "4"],
               ["--chunked-prefill-size", "8192"], ["--disable-radix-cache"],
               ["--random-seed=7"], ["--enable-metrics"]],
}
# "None" is left out: vLLM's parser reads --served-model-name None as no name at all, so a
# model id "None" does not round-trip (a finding of its own: intake could refuse it).
# A served model name as the lab's flag lists take it (lab/agent/agent.py _NAME).
ARGUMENT_TEXT = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,23}", fullmatch=True).filter(
    lambda s: s != "None")
# What the lab's catalog holds (lab/catalog.yaml): a model by its path or id, its draft.
MODEL_PATHS = st.sampled_from(["/models/kimi-k2", "moonshotai/Kimi-K2-Instruct-0905"])
DRAFTS = st.sampled_from(["AQ-MedAI/Kimi-K2-Instruct-eagle3", "/models/kimi-k2-eagle3"])


def _names(engine: str, version: str, layer: str) -> list[str]:
    return list(backend_choices(engine, version, layer)) or ["auto"]


@st.composite
def configs(draw: st.DrawFn, engine: str, version: str | None = None) -> dict[str, Any]:
    version = version or draw(st.sampled_from(modelled_versions(engine)))
    tp = draw(st.integers(1, 8))
    pp = draw(st.integers(1, 16 // tp))
    method = draw(st.sampled_from([None, "eagle3", "ngram", "mtp"]))
    speculative: dict[str, Any] | None = None
    if method is not None:
        speculative = {"method": method, "num_speculative_tokens": draw(st.integers(1, 16))}
        if method == "eagle3":
            speculative["draft_model"] = draw(DRAFTS)
        if method == "ngram" and engine == "vllm":
            low = draw(st.none() | st.integers(1, 8))
            high = draw(st.none() | st.integers(low or 1, 16))
            speculative.update(prompt_lookup_min=low, prompt_lookup_max=high)
    extra = draw(st.lists(st.sampled_from(EXTRA_ARGS[engine]), max_size=3))
    strategies = ["lazy", "eager", "prefetch"] if engine == "vllm" else ["lazy"]
    return normalize_config({
        "engine": {"name": engine, "version": version},
        "model": {"id": draw(ARGUMENT_TEXT), "path": draw(MODEL_PATHS)},
        "parallel": {"tp": tp, "pp": pp, "expert_parallel": draw(st.booleans())},
        "serving": {
            "max_model_len": draw(st.integers(1, MAX_MODEL_LEN)),
            "kv_cache_dtype": draw(st.sampled_from(KV_CACHE_DTYPES)),
            "gpu_memory_utilization": draw(st.floats(0, 1, exclude_min=True)),
            "enforce_eager": draw(st.booleans()),
            "load_format": draw(st.sampled_from(LOAD_FORMATS)),
            "safetensors_load_strategy": draw(st.sampled_from(strategies)),
            "jit_cache": draw(st.sampled_from(["ephemeral", "persisted"])),
            "moe_backend": draw(st.sampled_from(_names(engine, version, "moe"))),
            "linear_backend": draw(st.sampled_from(_names(engine, version, "linear"))),
        },
        "speculative": speculative,
        "env": draw(environments(engine, version)),
        "extra_args": [token for group in extra for token in group],
    })


def check_round_trip(config: dict[str, Any]) -> None:
    nodes = spark_nodes(16)
    specs = render(config, nodes)
    used = config["parallel"]["tp"] * config["parallel"]["pp"]
    assert len(specs) == used
    launched = as_launched(config)
    for spec in specs:
        parsed = parse_launch(spec["argv"], spec["env"], version=config["engine"]["version"])
        assert launch_view(parsed.config) == launch_view(launched)
        assert parsed.config["engine"] == config["engine"]
        assert parsed.engine == config["engine"]["name"]
        assert parsed.node_rank == spec["rank"]
        assert parsed.nnodes == used
        assert parsed.headless == (spec["rank"] > 0)
        assert parsed.port == nodes[0].api_port
        if used > 1:
            assert parsed.master_addr == nodes[0].data_addr


@settings(max_examples=150, deadline=None)
@given(configs("vllm"))
def test_vllm_launches_parse_back_to_their_configuration(config: dict[str, Any]) -> None:
    check_round_trip(config)


@settings(max_examples=150, deadline=None)
@given(configs("sglang"))
def test_sglang_launches_parse_back_to_their_configuration(config: dict[str, Any]) -> None:
    check_round_trip(config)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["vllm", "sglang"]).flatmap(configs))
def test_a_rendered_command_pasted_back_is_the_same_configuration(config: dict[str, Any]) -> None:
    head = render(config, spark_nodes(16))[0]
    text = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in head["env"].items()),
                     shlex.join(head["argv"])])
    pasted = parse_command(text, version=config["engine"]["version"])
    assert launch_view(pasted) == launch_view(as_launched(config))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["vllm", "sglang"]).flatmap(configs))
def test_normalizing_is_idempotent(config: dict[str, Any]) -> None:
    assert normalize_config(config) == config
    launched = as_launched(config)
    assert normalize_config(launched) == launched
    assert as_launched(launched) == launched


def test_fields_a_command_cannot_carry_take_defaults_and_nothing_else_differs() -> None:
    config = normalize_config({"engine": {"name": "vllm", "version": "0.29.0"},
                               "model": {"quantization": "fp8"}, "cluster": {"nodes": 4},
                               "workloads": ["prose"], "reported": {"decode_tps": 15},
                               "requirements": {"max_context": 131072}})
    parsed = parse_launch(render(config, spark_nodes(1))[0]["argv"], {}).config
    assert parsed["engine"]["version"] == "0.34.0"
    assert parsed["model"]["quantization"] == "nvfp4"
    assert parsed["cluster"]["nodes"] == 1
    assert parsed["workloads"] == ["code", "prose"]
    assert "reported" not in parsed and "requirements" not in parsed
    assert launch_view(parsed) == launch_view(as_launched(config))
    assert set(UNCARRIED) == {"engine.version", "model.quantization", "cluster", "workloads",
                              "reported", "requirements"}
