"""Issue 37, item 6: vLLM's FlexibleArgumentParser rewrites argv before argparse reads it, and
the platform reads a command the same way.

vllm/utils/argparse_utils.py FlexibleArgumentParser.parse_args, the same code in 0.29.0
(lines 259-448) and 0.34.0 (lines 313-502):

- `--config FILE` (0.29.0 line 317, 0.34.0 line 371): more than one is an AssertionError
  "More than one config file specified!" (496 / 551), one last with no file a ValueError "No
  config file specified! Please check your command-line arguments." (501 / 556), a file not
  named .yaml/.yml a ValueError "Config file must be of a yaml/yml type. <ext> supplied"
  (574 / 636); a YAML file is read on the node (the lab does not take --config);
- underscores to dashes between `--` and the first `.` (pattern at 325 / 379);
- `-O<anything>` and `-O=<x>` are `--optimization-level <anything>` (341-345 / 395-399);
  `-O N` with N in 0-3 is `--optimization-level N` (346-352 / 400-406). -O stands for
  --optimization-level in both releases (registered at vllm/engine/arg_utils.py:1736 /
  :1942, a string flag; VllmConfig.optimization_level, vllm/config/vllm.py:419 / :465, an
  OptimizationLevel 0-3, :110 / :161);
- a token starting with `-` and holding a `.` takes the next token (or what follows `=`)
  as its value (408-415 / 462-469), `+` makes a list of the comma-separated values
  (418-420 / 472-474), the value is JSON, else human_readable_int, else the string
  (423-431 / 477-485), and all values of one argument merge (recursive_dict_update, 367 /
  421) into one JSON object appended at the end (443-446 / 497-500): `--speculative-config
  .method eagle3` is `--speculative-config '{"method": "eagle3"}'`.
"""

from __future__ import annotations

import json

import pytest

from lab.config import ConfigError
from lab.engines import normalize_config, parse_command, parse_launch, render
from lab.engines.argv import EngineArgError, EngineException, release_parser, vllm_flexible_args
from tests.lab.engines.conftest import spark_nodes
from tests.lab.engines.release_source import line

VERSIONS = ("0.29.0", "0.34.0")
ARGPARSE_UTILS = "vllm/utils/argparse_utils.py"
SERVE = "vllm serve /models/kimi-k2 "
DRAFT = "/models/kimi-k2-eagle3"


@pytest.mark.parametrize(("tokens", "read"), [
    (["--speculative-config.method", "eagle3", "--speculative-config.num_speculative_tokens", "3"],
     ["--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 3}']),
    (["-sc.method=ngram", "-sc.prompt_lookup_max", "4", "--port", "8001"],
     ["--port", "8001", "-sc", '{"method": "ngram", "prompt_lookup_max": 4}']),
    (["--compilation-config.pass_config.fuse_allreduce_rms", "true",
      "--compilation-config.mode", "3"],
     ["--compilation-config", '{"pass_config": {"fuse_allreduce_rms": true}, "mode": 3}']),
    (["--compilation-config.cudagraph_capture_sizes+", "1,2", "--compilation-config"
      ".cudagraph_capture_sizes+=4"],
     ["--compilation-config", '{"cudagraph_capture_sizes": ["1", "2", "4"]}']),
    (["--kv-transfer-config.cpu_bytes_to_use", "80g", "--kv-transfer-config.x", "1K",
      "--kv-transfer-config.y", "eager"],
     ["--kv-transfer-config", '{"cpu_bytes_to_use": 80000000000, "x": 1024, "y": "eager"}']),
    (["--speculative_config.num_speculative_tokens", "3"],
     ["--speculative-config", '{"num_speculative_tokens": 3}']),
    (["--served-model-name=kimi.k2", "--max_model_len=128k", "--help=cache"],
     ["--served-model-name=kimi.k2", "--max-model-len=128k", "--help"]),
    (["-O3"], ["--optimization-level", "3"]),
    (["-O", "3"], ["--optimization-level", "3"]),
    (["-O=0"], ["--optimization-level", "0"]),
    (["-Odecode"], ["--optimization-level", "decode"]),
    (["-O.mode", "3"], ["--optimization-level", ".mode", "3"]),
    (["-O", "5"], ["-O", "5"]),
])
def test_argv_is_rewritten_as_flexible_argument_parser_does(tokens: list[str],
                                                            read: list[str]) -> None:
    assert vllm_flexible_args(tokens) == read


@pytest.mark.parametrize("version", VERSIONS)
def test_dotted_arguments_read_as_the_json_argument(version: str) -> None:
    parser = release_parser("vllm", version)
    parsed = parser.parse(["/m", "--speculative-config.method", "eagle3",
                           "--speculative-config.num_speculative_tokens", "3"])
    assert parsed.values()["speculative_config"] == {"method": "eagle3",
                                                     "num_speculative_tokens": 3}
    given = parsed.last("speculative_config")
    assert given is not None
    assert given.tokens == ("--speculative-config",
                            '{"method": "eagle3", "num_speculative_tokens": 3}')
    # one of the JSON arguments given whole and dotted: the dotted object, appended last, wins
    parsed = parser.parse(["/m", "-sc.num_speculative_tokens", "2", "--speculative-config",
                           '{"method": "ngram"}'])
    assert parsed.values()["speculative_config"] == {"num_speculative_tokens": 2}


@pytest.mark.parametrize("version", VERSIONS)
def test_dotted_speculative_config_flows_like_the_long_form(version: str) -> None:
    dotted = parse_command(SERVE + "--speculative-config.method eagle3 --speculative-config.model "
                           f"{DRAFT} --speculative-config.num_speculative_tokens 3",
                           version=version)
    whole = parse_command(SERVE + "--speculative-config " + json.dumps(json.dumps(
        {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3})), version=version)
    assert dotted == whole
    assert dotted["speculative"]["method"] == "eagle3"
    assert dotted["speculative"]["num_speculative_tokens"] == 3
    short = parse_command(SERVE + "-sc.method=ngram -sc.num_speculative_tokens=4 "
                                  "-sc.prompt_lookup_max=5", version=version)
    assert short["speculative"] == {"method": "ngram", "draft_model": None,
                                    "num_speculative_tokens": 4, "prompt_lookup_max": 5,
                                    "prompt_lookup_min": None}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("written", ["-O3", "-O 3", "-O=3", "--optimization_level 3",
                                     "--optimization-level=3"])
def test_o3_is_the_optimization_level_and_passes_the_list(version: str, written: str) -> None:
    config = parse_command(SERVE + written, version=version)
    listed = ["--optimization-level=3"] if written.endswith("level=3") else \
        ["--optimization-level", "3"]
    assert config["extra_args"] == listed
    assert normalize_config(config) == config
    argv = render(config, spark_nodes(8))[0]["argv"]
    at = argv.index(listed[0])
    assert argv[at:at + len(listed)] == listed


@pytest.mark.parametrize("version", VERSIONS)
def test_o_levels_vllm_does_not_take_are_refused(version: str) -> None:
    # -Odecode: --optimization-level decode, which VllmConfig refuses; the list holds 0-3
    with pytest.raises(ConfigError) as info:
        parse_command(SERVE + "-Odecode", version=version)
    assert info.value.problem == (f"'decode' is not accepted: --optimization-level takes one of "
                                  f"0, 1, 2, 3 in vLLM {version}")
    # -O.mode 3: --optimization-level .mode, and 3 an argument vLLM does not take
    with pytest.raises(ConfigError) as info:
        parse_command(SERVE + "-O.mode 3", version=version)
    assert "unrecognized arguments: 3" in info.value.problem
    # -O 5: not a level, left alone; argparse has no -O
    with pytest.raises(ConfigError) as info:
        parse_command(SERVE + "-O 5", version=version)
    assert "unrecognized arguments: -O 5" in info.value.problem


@pytest.mark.parametrize("version", VERSIONS)
def test_dotted_compilation_config_is_held_to_the_list_rule(version: str) -> None:
    config = parse_command(SERVE + "--compilation-config.mode 3 "
                                   "--compilation-config.cudagraph_mode FULL", version=version)
    assert config["extra_args"] == ["--compilation-config",
                                    '{"mode": 3, "cudagraph_mode": "FULL"}']
    with pytest.raises(ConfigError) as info:
        parse_command(SERVE + "--compilation-config.backend evil.module.fn", version=version)
    assert "--compilation-config" in info.value.problem


@pytest.mark.parametrize("version", VERSIONS)
def test_the_config_file_is_checked_in_vllm_s_words(version: str) -> None:
    cases = {
        "--config a.yaml --config b.yaml": "AssertionError: More than one config file specified!",
        "--config": "ValueError: No config file specified! Please check your command-line "
                    "arguments.",
        "--config args.json": "ValueError: Config file must be of a yaml/yml type. json supplied",
    }
    for written, words in cases.items():
        with pytest.raises(EngineException) as raised:
            parse_launch(["vllm", "serve", "/models/kimi-k2", *written.split()], {},
                         version=version)
        assert raised.value.error_line == words
        with pytest.raises(ConfigError) as info:
            parse_command(SERVE + written, version=version)
        assert info.value.problem == words
    # A YAML file is read on the node; the lab's list does not take --config at all.
    with pytest.raises(ConfigError) as info:
        parse_command(SERVE + "--config args.yaml", version=version)
    assert info.value.problem.startswith("'--config' is not a flag the lab lets a "
                                         f"configuration pass to vLLM {version}")


def test_a_dotted_argument_without_its_value_ends_vllm_with_an_index_error() -> None:
    with pytest.raises(EngineException) as raised:
        parse_launch(["vllm", "serve", "/models/kimi-k2", "--speculative-config.method"], {})
    assert raised.value.error_line == "IndexError: list index out of range"
    assert isinstance(raised.value, EngineArgError)


# -- the cited source ---------------------------------------------------------------------------
CITED = {
    # 0.29.0 line, 0.34.0 line, what the line holds
    "config": (317, 371, 'if "--config" in args:'),
    "dashes": (325, 379, r'pattern = re.compile(r"(?<=--)[^\.]*")'),
    "-O3": (341, 395, 'elif arg.startswith("-O") and arg != "-O":'),
    "-O3 level": (345, 399, 'processed_args += ["--optimization-level", optimization_level]'),
    "-O 3": (347, 401, 'arg == "-O"'),
    "-O 3 level": (352, 406, 'processed_args.append("--optimization-level")'),
    "dotted": (408, 462, 'if processed_arg.startswith("-") and "." in processed_arg:'),
    "value": (415, 469, "value_str = processed_args[i + 1]"),
    "list": (418, 472, 'if processed_arg.endswith("+"):'),
    "json": (424, 478, "value = json.loads(value_str)"),
    "human": (429, 483, "value = human_readable_int(value_str)"),
    "appended": (446, 500, "processed_args.append(json.dumps(dict_value))"),
    "two configs": (496, 551, 'assert args.count("--config") <= 1, "More than one config file '
                              'specified!"'),
    "no config": (501, 556, '"No config file specified! Please check your command-line '
                            'arguments."'),
    "extension": (574, 636, 'f"Config file must be of a yaml/yml type. {extension} supplied"'),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("what", sorted(CITED))
def test_the_cited_lines_say_what_the_platform_does(version: str, what: str) -> None:
    old, new, words = CITED[what]
    number = old if version == "0.29.0" else new
    assert words in line("vllm", version, ARGPARSE_UTILS, number)


@pytest.mark.parametrize(("version", "registered", "field", "enum"),
                         [("0.29.0", 1736, 419, 110), ("0.34.0", 1942, 465, 161)])
def test_o_stands_for_the_optimization_level(version: str, registered: int, field: int,
                                             enum: int) -> None:
    assert '"--optimization-level"' in line("vllm", version, "vllm/engine/arg_utils.py",
                                            registered)
    assert line("vllm", version, "vllm/config/vllm.py", field).strip().startswith(
        "optimization_level: OptimizationLevel")
    assert line("vllm", version, "vllm/config/vllm.py", enum) == "class OptimizationLevel(IntEnum):"
    option = release_parser("vllm", version).option("--optimization-level")
    assert option is not None and option.type_name == "str"
