"""Issue 37, item 5: each engine reads sizes its own way. The tables of both engines name
the converter `human_readable_int`; the function is each engine's own.

SGLang, sglang/srt/utils/common.py `human_readable_int` (0.5.12 lines 2383-2418, 0.5.23
lines 3394-3429, the same code): suffixes are case-sensitive; SI `k`/`M`/`G`/`T` are decimal
(line 2395 / 3406; a decimal number is allowed and multiplied exactly with Decimal), IEC
`Ki`/`Mi`/`Gi`/`Ti` are binary (line 2396 / 3407; an integer only: "Decimals are not allowed
with IEC suffixes like 'Ki'. ..." at line 2404 / 3415); the match is
`(\\d+(?:\\.\\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)` (line 2398 / 3409); anything else goes to int(),
and int()'s failure is "Invalid integer value: '<value>'. Use a plain integer, SI suffixes
(1k, 1M), or IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive." (line 2415 / 3426).
It is the type of --context-length (0.5.12 sglang/srt/server_args.py:4611, 0.5.23
sglang/srt/arg_groups/fields/model.py:110), --max-total-tokens (4863; schedule.py:39),
--max-prefill-tokens (4889; schedule.py:71) and 0.5.23's --cuda-graph-prefill-max-context
(exec_.py:648).

vLLM, vllm/utils/argparse_utils.py `human_readable_int` (0.29.0 lines 29-72, 0.34.0 lines
30-74): `k`/`m`/`g`/`t` decimal (multiplied as a float), `K`/`M`/`G`/`T` binary (an integer
only: "Decimals are not allowed with binary suffixes like K. Did you mean to use 1.5k
instead?", line 66 / 68), anything else int() (whose ValueError argparse reports as
"invalid human_readable_int value").
"""

from __future__ import annotations

import ast

import pytest

from lab.config import ConfigError
from lab.engines import parse_command
from lab.engines.argv import EngineArgError, release_parser
from lab.engines.tables import release
from tests.lab.engines.release_source import function_node, line

SGLANG = ("0.5.12", "0.5.23")
VLLM = ("0.29.0", "0.34.0")
SGLANG_LINES = {"0.5.12": 2383, "0.5.23": 3394}
VLLM_LINES = {"0.29.0": 29, "0.34.0": 30}
SGLANG_FLAGS = {"0.5.12": ("--context-length", "--max-total-tokens", "--max-prefill-tokens"),
                "0.5.23": ("--context-length", "--max-total-tokens", "--max-prefill-tokens",
                           "--cuda-graph-prefill-max-context")}
INVALID = ("Invalid integer value: '{}'. Use a plain integer, SI suffixes (1k, 1M), or IEC "
           "suffixes (1Ki, 1Mi). Suffixes are case-sensitive.")
SGLANG_COMMAND = "python3 -m sglang.launch_server --model-path /models/kimi-k2 --tp-size 8 "


def sglang_value(version: str, text: str, flag: str = "--context-length") -> object:
    parsed = release_parser("sglang", version).parse([flag, text], partial=True)
    return parsed.given[0].value


def sglang_refusal(version: str, text: str, flag: str = "--context-length") -> EngineArgError:
    with pytest.raises(EngineArgError) as info:
        release_parser("sglang", version).parse([flag, text], partial=True)
    return info.value


@pytest.mark.parametrize("version", SGLANG)
def test_both_tables_name_the_converter_alike_and_each_engine_reads_its_own(version: str) -> None:
    flags = release("sglang", version)["flags"]
    for flag in SGLANG_FLAGS[version]:
        assert flags[flag]["type"] == "human_readable_int", flag
    # the same name in vLLM's table (vllm/engine/arg_utils.py human_readable_int_args)
    assert release("vllm", "0.34.0")["flags"]["--max-num-batched-tokens"]["type"] == \
        "human_readable_int"
    sglang = release_parser("sglang", version).option("--context-length")
    vllm = release_parser("vllm", "0.34.0").option("--max-num-batched-tokens")
    assert sglang is not None and vllm is not None
    assert sglang.convert("1M") == 1_000_000  # SI mega
    assert vllm.convert("1M") == 1_048_576  # binary mega


@pytest.mark.parametrize("version", SGLANG)
@pytest.mark.parametrize(("text", "value"), [
    ("262144", 262144), ("256Ki", 262144), ("1Mi", 1_048_576), ("1Gi", 2**30), ("1Ti", 2**40),
    ("1k", 1000), ("128k", 128_000), ("1M", 1_000_000), ("2G", 2 * 10**9), ("1T", 10**12),
    ("25.6k", 25_600), ("262.144k", 262_144),
    # exact Decimal arithmetic where vLLM's float gives 1000 and 8199999
    ("1.001k", 1001), ("8.2M", 8_200_000),
    (" 64k ", 64_000), ("+5", 5), ("1_000", 1000),  # stripped, then int() as Python reads it
])
def test_sglang_reads_si_as_decimal_and_iec_as_binary(version: str, text: str, value: int) -> None:
    for flag in SGLANG_FLAGS[version]:
        assert sglang_value(version, text, flag) == value, flag


@pytest.mark.parametrize("version", SGLANG)
@pytest.mark.parametrize("text", ["256K", "1m", "1g", "1t", "1KI", "1ki", "x", "1.5", "1e3", ""])
def test_sglang_refuses_what_is_no_suffix_of_its_in_its_words(version: str, text: str) -> None:
    err = sglang_refusal(version, text)
    assert err.message == "argument --context-length: " + INVALID.format(text.strip())
    assert err.error_line == "sglang serve: error: " + err.message


@pytest.mark.parametrize("version", SGLANG)
def test_sglang_refuses_a_decimal_iec_value_in_its_words(version: str) -> None:
    assert sglang_refusal(version, "1.5Ki").message == (
        "argument --context-length: Decimals are not allowed with IEC suffixes like 'Ki'. Use an "
        "integer IEC value such as '1Ki', or an SI value such as '1.5K'.")
    assert sglang_refusal(version, "2.75Mi", "--max-total-tokens").message == (
        "argument --max-total-tokens: Decimals are not allowed with IEC suffixes like 'Mi'. Use "
        "an integer IEC value such as '2Mi', or an SI value such as '2.75M'.")


@pytest.mark.parametrize("version", VLLM)
@pytest.mark.parametrize(("text", "value"), [
    ("256K", 262_144), ("1M", 1_048_576), ("1G", 2**30), ("1k", 1000), ("1m", 1_000_000),
    ("25.6k", 25_600), ("1.001k", 1000), ("8.2m", 8_199_999),  # float arithmetic
])
def test_vllm_keeps_its_own_rule(version: str, text: str, value: int) -> None:
    parser = release_parser("vllm", version)
    given = parser.parse(["--max-model-len", text], partial=True).given[0]
    assert given.value == value


@pytest.mark.parametrize("version", VLLM)
def test_vllm_refuses_what_sglang_reads_in_its_own_words(version: str) -> None:
    parser = release_parser("vllm", version)
    for text in ("256Ki", "1Mi"):
        with pytest.raises(EngineArgError) as info:
            parser.parse(["--max-model-len", text], partial=True)
        assert info.value.message == \
            f"argument --max-model-len: invalid human_readable_int_or_auto value: '{text}'"
    with pytest.raises(EngineArgError) as info:
        parser.parse(["--max-model-len", "1.5K"], partial=True)
    assert info.value.message == ("argument --max-model-len: Decimals are not allowed with "
                                  "binary suffixes like K. Did you mean to use 1.5k instead?")


@pytest.mark.parametrize("version", SGLANG)
def test_a_pasted_sglang_command_is_read_with_sglang_s_rule(version: str) -> None:
    assert parse_command(SGLANG_COMMAND + "--context-length 256Ki",
                         version=version)["serving"]["max_model_len"] == 262_144
    assert parse_command(SGLANG_COMMAND + "--context-length 1M",
                         version=version)["serving"]["max_model_len"] == 1_000_000
    config = parse_command(SGLANG_COMMAND + "--max-total-tokens 1M", version=version)
    assert config["extra_args"] == ["--max-total-tokens", "1000000"]
    with pytest.raises(ConfigError) as info:
        parse_command(SGLANG_COMMAND + "--context-length 256K", version=version)
    assert info.value.field == "launch_command"
    assert info.value.problem == ("sglang serve: error: argument --context-length: "
                                  + INVALID.format("256K"))


# -- the cited source ---------------------------------------------------------------------------
def _constant(node: ast.expr) -> object:
    """A literal of the release's source, `10**3` included (evaluated here, not run there)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, power = _constant(node.left), _constant(node.right)
        assert isinstance(base, int) and isinstance(power, int)
        return base**power
    if isinstance(node, ast.Dict):
        return {_constant(k): _constant(v) for k, v in zip(node.keys, node.values, strict=True)
                if k is not None}
    assert isinstance(node, ast.Constant), ast.dump(node)
    return node.value


@pytest.mark.parametrize("version", SGLANG)
def test_the_cited_sglang_function_is_the_one_reimplemented(version: str) -> None:
    from lab.engines import argv

    path = "sglang/srt/utils/common.py"
    first = SGLANG_LINES[version]
    assert line("sglang", version, path, first).startswith("def human_readable_int(value: str)")
    func = function_node("sglang", version, path, "human_readable_int")
    assert (func.lineno, func.end_lineno) == (first, first + 35)
    assigned = {t.id: _constant(n.value) for n in ast.walk(func) if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Dict)}
    assert assigned["si_multiplier"] == argv._SGLANG_SI
    assert assigned["iec_multiplier"] == argv._SGLANG_IEC
    patterns = [n.args[0].value for n in ast.walk(func) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute) and n.func.attr == "fullmatch"
                and isinstance(n.args[0], ast.Constant)]
    assert patterns == [argv._SGLANG_HUMAN.pattern]
    text = "\n".join(line("sglang", version, path, n) for n in range(first, first + 36))
    for words in ("Decimals are not allowed with IEC suffixes like '{suffix}'. ",
                  "Use an integer IEC value such as '{int(Decimal(number))}{suffix}', ",
                  "or an SI value such as '{number}{suffix[0]}'.",
                  "Invalid integer value: '{value}'. ",
                  "Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). ",
                  "Suffixes are case-sensitive."):
        assert words in text, words


@pytest.mark.parametrize("version", VLLM)
def test_the_cited_vllm_function_is_the_one_reimplemented(version: str) -> None:
    from lab.engines import argv

    path = "vllm/utils/argparse_utils.py"
    first = VLLM_LINES[version]
    assert line("vllm", version, path, first).startswith("def human_readable_int(value: str)")
    func = function_node("vllm", version, path, "human_readable_int")
    assigned = {t.id: _constant(n.value) for n in ast.walk(func) if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Dict)}
    assert assigned["decimal_multiplier"] == argv._VLLM_DECIMAL
    assert assigned["binary_multiplier"] == argv._VLLM_BINARY
