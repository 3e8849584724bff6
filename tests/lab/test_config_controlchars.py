"""Control characters in a configuration (issue 29, item 5): no single value (a name, a
path, a version, an env value, an extra_args token) may hold NUL, a tab, a newline, an
escape or any other control character, a lone surrogate or a line separator; a pasted
command may hold its lines and tabs but nothing else. Each refusal names the field and
says what is accepted; and whatever the input, a configuration that is accepted holds no
control character anywhere (what reaches the engine's argv and environment)."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.config import CONTROL_CATEGORIES, ConfigError, control_character, control_problem
from lab.engines import load_config_text, normalize_config, parse_command

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"
REFERENCE_TEXT = (EXAMPLES / "kimi-k2-8spark-outofbox.yaml").read_text()
REFERENCE = yaml.safe_load(REFERENCE_TEXT)
ACCEPTED = "use printable text on one line: no NUL, tab, newline or other control character"


def with_(path: str, value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(REFERENCE))
    section, _, leaf = path.partition(".")
    if leaf:
        data[section][leaf] = value
    else:
        data[section] = value
    return data


# -- one value at a time ----------------------------------------------------------------------
CONTROLS = [
    ("\x00", "U+0000, NUL"), ("\t", "U+0009, a tab"), ("\n", "U+000A, a newline"),
    ("\r", "U+000D, a carriage return"), ("\x1b", "U+001B, escape"), ("\x7f", "U+007F, DEL"),
    ("\x85", "U+0085, a next-line character"), ("\u2028", "U+2028, a line separator"),
    ("\ud800", "U+D800"), ("\x01", "U+0001"),
]


@pytest.mark.parametrize("char, named", CONTROLS)
@pytest.mark.parametrize("path, field", [
    ("model.id", "model.id"), ("model.path", "model.path"), ("engine.version", "engine.version"),
    ("cluster.node_type", "cluster.node_type"), ("speculative.draft_model", "speculative.draft_model"),
])
def test_a_control_character_in_a_text_field_is_refused_at_the_field(
    char: str, named: str, path: str, field: str
) -> None:
    value = {"model.path": "/models/kimi", "engine.version": "0.29"}.get(path, "moonshotai/Kimi") + char + "x"
    with pytest.raises(ConfigError) as caught:
        normalize_config(with_(path, value))
    assert caught.value.field == field
    assert f"holds a control character ({named})" in caught.value.problem
    assert ACCEPTED in caught.value.problem


@pytest.mark.parametrize("char, named", CONTROLS)
def test_a_control_character_in_an_extra_args_token_never_reaches_the_argv(char: str, named: str) -> None:
    for extra, index in ((["--tokenizer-mode", f"slow{char}"], 1), ([f"--tokenizer-mode=slow{char}"], 0)):
        with pytest.raises(ConfigError) as caught:
            normalize_config(with_("extra_args", extra))
        assert caught.value.field == f"extra_args[{index}]"
        assert named in caught.value.problem and "the value of '--tokenizer-mode'" in caught.value.problem


def test_the_reported_attack_a_newline_smuggling_a_second_flag_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"extra_args\[0\].*U\+000A, a newline"):
        normalize_config(with_("extra_args", ["--tokenizer-mode=slow\n--trust-remote-code"]))
    # Without the newline the same flag is a pass-through the engine takes.
    assert normalize_config(with_("extra_args", ["--tokenizer-mode=hf"]))["extra_args"] == [
        "--tokenizer-mode=hf"]


@pytest.mark.parametrize("char, named", CONTROLS)
def test_a_control_character_in_an_env_value_is_refused(char: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        normalize_config(with_("env", {"NCCL_DEBUG": f"INFO{char}LD_PRELOAD=/tmp/x.so"}))
    assert caught.value.field == "env.NCCL_DEBUG" and named in caught.value.problem


@pytest.mark.parametrize("name", ["NCCL_DEBUG\n", "NCCL_DEBUG\x00", "NCCL\tDEBUG", "\nNCCL_DEBUG"])
def test_an_env_name_with_a_control_character_is_not_a_name(name: str) -> None:
    # "$" in a regular expression matches before a final newline: the name must match whole.
    with pytest.raises(ConfigError, match="is not a valid environment variable name"):
        normalize_config(with_("env", {name: "INFO"}))


@pytest.mark.parametrize("escape, named", [
    ("\\0", "U+0000, NUL"), ("\\e", "U+001B, escape"), ("\\n", "U+000A, a newline"), ("\\t", "U+0009, a tab"),
    ("\\x07", "U+0007"), ("\\N", "U+0085, a next-line character"), ("\\L", "U+2028, a line separator"),
    ("\\ud800", "U+D800"),
])
def test_yaml_escapes_cannot_smuggle_a_control_character(escape: str, named: str) -> None:
    text = REFERENCE_TEXT.replace('extra_args: ["--trust-remote-code"]',
                                  f'extra_args: ["--trust-remote-code", "--tokenizer-mode", "slow{escape}"]')
    assert text != REFERENCE_TEXT
    with pytest.raises(ConfigError) as caught:
        load_config_text(text)
    assert caught.value.field == "extra_args[2]" and named in caught.value.problem


# -- a pasted command ---------------------------------------------------------------------------
def test_a_pasted_command_keeps_its_lines_and_tabs() -> None:
    command = ("VLLM_USE_DEEP_GEMM=1 \\\r\n\tvllm serve /models/kimi-k2 \\\n"
               "\t--served-model-name moonshotai/Kimi-K2-Instruct-0905")
    assert normalize_config({"launch_command": command})["env"] == {"VLLM_USE_DEEP_GEMM": "1"}


@pytest.mark.parametrize("char, named", [c for c in CONTROLS if c[0] not in "\t\n\r"])
def test_a_pasted_command_with_another_control_character_is_refused(char: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        normalize_config({"launch_command": f"vllm serve /models/kimi-k2 --tokenizer-mode slow{char}"})
    assert caught.value.field == "launch_command"
    at = len("vllm serve /models/kimi-k2 --tokenizer-mode slow") + 1
    assert f"holds a control character ({named}) at character {at}" in caught.value.problem


def test_a_quoted_line_break_inside_one_argument_is_refused_naming_its_flag() -> None:
    with pytest.raises(ConfigError) as caught:
        normalize_config({"launch_command": 'vllm serve /models/kimi-k2 --tokenizer-mode "slow\n--x"'})
    assert caught.value.field == "launch_command"
    assert "'--tokenizer-mode'" in caught.value.problem and "U+000A, a newline" in caught.value.problem
    with pytest.raises(ConfigError, match=r"NCCL_DEBUG: .*U\+0009, a tab"):
        parse_command("NCCL_DEBUG='INFO\tWARN' vllm serve /models/kimi-k2")


def test_what_counts_as_a_control_character_is_exactly_the_unicode_categories() -> None:
    # Cc (C0, DEL, C1), Cs (lone surrogates), Zl and Zp all live in the first plane.
    for code in [*range(0x10000), 0x1F642, 0xE0001, 0x10FFFF]:
        char = chr(code)
        is_control = unicodedata.category(char) in CONTROL_CATEGORIES
        assert (control_character(char) is not None) == is_control, code


def test_the_helpers_find_the_first_control_character() -> None:
    assert control_character("abc") is None
    assert control_character("a\tb\x00", allowed="\t") == (3, "\x00")
    assert control_problem("ab\x1b[31m") == "holds a control character (U+001B, escape) at character 3"
    assert control_problem("é ü → 中文 🙂") is None  # printable text of any script passes


# -- whatever the input ---------------------------------------------------------------------------
def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings(k) + strings(v)]
    if isinstance(value, list):
        return [s for item in value for s in strings(item)]
    return []


NASTY_TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=12)
FIELDS = ["model.id", "model.path", "engine.version", "cluster.node_type", "env", "extra_args"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), text=NASTY_TEXT,
       pre=st.sampled_from(["", "moonshotai/", "--tokenizer-mode="]))
def test_an_accepted_configuration_holds_no_control_character(field: str, text: str, pre: str) -> None:
    value: Any = pre + text
    if field == "env":
        value = {"NCCL_DEBUG": value}
    elif field == "extra_args":
        value = ["--tokenizer-mode", value] if not pre.startswith("--") else [value]
    try:
        config = normalize_config(with_(field, value))
    except ConfigError as exc:
        assert exc.field and len(str(exc)) < 2000
        return
    for found in strings(config):
        assert control_character(found) is None, (field, found)
