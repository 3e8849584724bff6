"""Issue 37, item 7: --speculative-config's keys as each release's SpeculativeConfig takes them.

vLLM builds `SpeculativeConfig(**speculative_config)` (vllm/engine/arg_utils.py 0.29.0 line
1952, 0.34.0 line 2172) after turning `-` into `_` in every key (0.29.0 lines 1939-1941,
0.34.0 lines 2159-2161). SpeculativeConfig (vllm/config/speculative.py, 0.29.0 class at line
374 with its fields at lines 377-590, 0.34.0 class at line 449 with its fields at lines
452-711) is a pydantic dataclass made by vllm/config/utils.py `config`, which forbids extra
fields (`ConfigDict(extra="forbid")`, 0.29.0 line 69, 0.34.0 line 72); 0.34.0's
`custom_method` (line 479) is `init=False`, so not a keyword either. A key it does not take
ends the start with pydantic's ValidationError, printed as

    pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig
    draft_foo
      Unexpected keyword argument [type=unexpected_keyword_argument, input_value=1, input_type=int]

(then a "For further information visit https://errors.pydantic.dev/<version>/..." line that
depends on the pydantic installed, left out). A key it takes that the lab does not model is
refused in the lab's words; the modelled keys work as before.
"""

from __future__ import annotations

import ast
import json
from typing import Any

import pytest

from lab.config import ConfigError
from lab.engines import parse_command, parse_launch
from lab.engines.argv import EngineArgError, EngineException, NotReproduced
from lab.engines.vllm import SPEC_KEYS, SPECULATIVE_CONFIG_KEYS
from tests.lab.engines.release_source import class_node, line

VERSIONS = ("0.29.0", "0.34.0")
SERVE = ["vllm", "serve", "/models/kimi-k2"]
DRAFT = "/models/kimi-k2-eagle3"
EAGLE3 = {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3}
HEADER = "pydantic_core._pydantic_core.ValidationError: "


def unexpected(key: str, shown: str, kind: str) -> str:
    return (f"{key}\n  Unexpected keyword argument [type=unexpected_keyword_argument, "
            f"input_value={shown}, input_type={kind}]")


def refusal(spec: dict[str, Any], version: str) -> EngineArgError:
    with pytest.raises(EngineArgError) as info:
        parse_launch([*SERVE, "--speculative-config", json.dumps(spec)], {}, version=version)
    return info.value


@pytest.mark.parametrize("version", VERSIONS)
def test_a_key_the_release_lacks_is_refused_in_pydantic_s_words(version: str) -> None:
    err = refusal({**EAGLE3, "draft_foo": 1}, version)
    assert isinstance(err, EngineException)
    assert err.flag == "--speculative-config"
    assert err.error_line == str(err) == (
        HEADER + "1 validation error for SpeculativeConfig\n" + unexpected("draft_foo", "1", "int"))
    # pasted at intake: the same words, not an argparse "vllm serve: error:" line
    with pytest.raises(ConfigError) as info:
        parse_command(" ".join([*SERVE, "-sc", json.dumps(json.dumps({**EAGLE3, "draft_foo": 1}))]),
                      version=version)
    assert info.value.problem == err.error_line


@pytest.mark.parametrize("version", VERSIONS)
def test_every_unexpected_key_is_listed_as_pydantic_prints_it(version: str) -> None:
    spec = {**EAGLE3, "Foo-Bar": True, "a.b": "x" * 60, "nested": {"k": [1, 2]}, "nothing": None,
            "ratio": 0.5, "draft-tensor-parallel-size": 1}
    err = refusal(spec, version)
    assert isinstance(err, EngineException)
    # keys with `-` are read with `_`; a location holding `.` is shown in backticks; an
    # input's repr is cut to its first 25 and last 24 bytes; draft_tensor_parallel_size is a
    # key the release has, so pydantic does not list it
    lines = err.message.splitlines()
    assert lines[0] == "5 validation errors for SpeculativeConfig"
    assert lines[1:] == "\n".join([
        unexpected("Foo_Bar", "True", "bool"),
        unexpected("`a.b`", "'" + "x" * 24 + "..." + "x" * 23 + "'", "str"),
        unexpected("nested", "{'k': [1, 2]}", "dict"),
        unexpected("nothing", "None", "NoneType"),
        unexpected("ratio", "0.5", "float"),
    ]).splitlines()


@pytest.mark.parametrize(("version", "key"), [
    # 0.34.0's keys that 0.29.0 lacks, and 0.29.0's that 0.34.0 lacks
    ("0.29.0", "draft_decode_context_parallel_size"), ("0.29.0", "xpress_topc"),
    ("0.29.0", "fly_window_size"), ("0.34.0", "disable_padded_drafter_batch"),
    ("0.34.0", "use_heterogeneous_vocab"),
    # init=False in 0.34.0, absent from 0.29.0
    ("0.34.0", "custom_method"), ("0.29.0", "custom_method"),
])
def test_each_release_is_held_to_its_own_fields(version: str, key: str) -> None:
    err = refusal({**EAGLE3, key: 2}, version)
    assert isinstance(err, EngineException)
    assert err.message == "1 validation error for SpeculativeConfig\n" + \
        unexpected(key, "2", "int")


@pytest.mark.parametrize(("version", "key"), [
    ("0.29.0", "draft_tensor_parallel_size"), ("0.34.0", "draft_tensor_parallel_size"),
    ("0.29.0", "disable_padded_drafter_batch"), ("0.34.0", "draft_decode_context_parallel_size"),
    ("0.34.0", "fly_window_size"), ("0.29.0", "quantization"), ("0.34.0", "target_model_config"),
])
def test_a_key_the_release_has_but_the_lab_does_not_model_is_refused_in_the_lab_s_words(
        version: str, key: str) -> None:
    err = refusal({**EAGLE3, key: 1}, version)
    assert isinstance(err, NotReproduced)
    words = (f"--speculative-config: {key!r} is a key of vLLM {version}'s SpeculativeConfig that "
             "the lab does not reproduce (it models only method, model, num_speculative_tokens, "
             "prompt_lookup_max, prompt_lookup_min); remove it")
    assert err.message == err.error_line == str(err) == words
    with pytest.raises(ConfigError) as info:
        parse_command(" ".join([*SERVE, "--speculative-config",
                                json.dumps(json.dumps({**EAGLE3, key: 1}))]), version=version)
    assert info.value.problem == words
    assert "error:" not in info.value.problem
    # written with dashes, or as a dotted argument, it is the same key
    dashed = refusal({**EAGLE3, key.replace("_", "-"): 1}, version)
    assert isinstance(dashed, NotReproduced) and dashed.message == words
    with pytest.raises(NotReproduced):
        parse_launch([*SERVE, "--speculative-config", json.dumps(EAGLE3),
                      f"--speculative-config.{key}", "1"], {}, version=version)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("written", "read"), [
    (EAGLE3, {"method": "eagle3", "draft_model": DRAFT, "num_speculative_tokens": 3,
              "prompt_lookup_max": None, "prompt_lookup_min": None}),
    ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5,
      "prompt_lookup_min": 2},
     {"method": "ngram", "draft_model": None, "num_speculative_tokens": 4,
      "prompt_lookup_max": 5, "prompt_lookup_min": 2}),
    ({"model": "[ngram]", "num_speculative_tokens": 2},
     {"method": "ngram", "draft_model": None, "num_speculative_tokens": 2,
      "prompt_lookup_max": None, "prompt_lookup_min": None}),
    ({"method": "deepseek_mtp", "num_speculative_tokens": 1},
     {"method": "mtp", "draft_model": None, "num_speculative_tokens": 1,
      "prompt_lookup_max": None, "prompt_lookup_min": None}),
    ({"method": "ngram", "num-speculative-tokens": 3, "prompt-lookup-min": 2},
     {"method": "ngram", "draft_model": None, "num_speculative_tokens": 3,
      "prompt_lookup_max": None, "prompt_lookup_min": 2}),
])
def test_the_modelled_keys_work_as_before(version: str, written: dict[str, Any],
                                          read: dict[str, Any]) -> None:
    parsed = parse_launch([*SERVE, "--speculative-config", json.dumps(written)], {},
                          version=version)
    assert parsed.config["speculative"] == read


def test_the_modelled_keys_are_keys_of_every_release() -> None:
    for version in VERSIONS:
        assert set(SPEC_KEYS) <= SPECULATIVE_CONFIG_KEYS[version]


# -- the cited source ---------------------------------------------------------------------------
@pytest.mark.parametrize(("version", "first"), [("0.29.0", 374), ("0.34.0", 449)])
def test_the_keys_are_the_release_s_init_fields(version: str, first: int) -> None:
    path = "vllm/config/speculative.py"
    node = class_node("vllm", version, path, "SpeculativeConfig")
    assert node.lineno == first and not node.bases
    assert [ast.unparse(d) for d in node.decorator_list] == ["config"]
    fields: dict[str, ast.AnnAssign] = {}
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) \
                and "ClassVar" not in ast.unparse(statement.annotation):
            fields[statement.target.id] = statement
    init = {name for name, s in fields.items()
            if not (s.value is not None and "init=False" in ast.unparse(s.value))}
    assert init == SPECULATIVE_CONFIG_KEYS[version]
    no_init = set(fields) - init
    assert no_init == ({"custom_method"} if version == "0.34.0" else set())


@pytest.mark.parametrize(("version", "forbid", "dashes", "built"),
                         [("0.29.0", 69, 1940, 1952), ("0.34.0", 72, 2160, 2172)])
def test_the_release_forbids_extra_keys_and_reads_dashes_as_underscores(
        version: str, forbid: int, dashes: int, built: int) -> None:
    assert 'ConfigDict(extra="forbid")' in line("vllm", version, "vllm/config/utils.py", forbid)
    assert "from pydantic.dataclasses import dataclass" in \
        line("vllm", version, "vllm/config/utils.py", 20)
    arg_utils = "vllm/engine/arg_utils.py"
    assert 'k.replace("-", "_")' in line("vllm", version, arg_utils, dashes)
    assert "SpeculativeConfig(**self.speculative_config)" in line("vllm", version, arg_utils, built)
