"""Whatever a customer sends, the configuration layer answers with a valid configuration or
a ConfigError naming a field: never another exception (RecursionError, TypeError,
ValueError from an oversized integer), and never a configuration the database cannot store
(inf or NaN). Hypothesis drives YAML text, parsed mappings and pasted commands; the three
tests run 1,300 examples together."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.config import MAX_DEPTH, ConfigError, read_config_text, shown
from lab.engines import load_config_text, normalize_config, parse_command

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"
REFERENCE = yaml.safe_load((EXAMPLES / "kimi-k2-8spark-outofbox.yaml").read_text())
def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MESSAGE_LIMIT = 2000  # a message travels in a form error and a log line


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def huge(digits: int) -> int:
    """An integer Python will not print (more than 4,300 digits); built lazily, since
    hypothesis prints its strategies."""
    return int(10**digits)


def check_outcome(produce: Any) -> None:
    """The one property: a valid, storable configuration, or a ConfigError at a field."""
    try:
        config = produce()
    except ConfigError as exc:
        assert exc.field, f"no field in {exc!r}"
        assert len(str(exc)) < MESSAGE_LIMIT, str(exc)[:200]
        return
    json.dumps(config, allow_nan=False)  # what PostgreSQL's JSON accepts
    assert normalize_config(config) == config


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.integers(4301, 5000).map(huge), st.integers(4301, 5000).map(lambda n: -huge(n)),
    st.sampled_from([math.inf, -math.inf, math.nan, 1e308, 0.0, -0.0]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.sampled_from(["", "-x", "nvfp4", "eagle3", "vllm", "sglang", "/models/kimi-k2",
                     "AQ-MedAI/Kimi-K2-Instruct-eagle3", "a\x00b", "line\nbreak", "8", "auto"]),
)
keys = st.one_of(
    st.sampled_from(["schema", "engine", "model", "cluster", "parallel", "serving", "speculative",
                     "env", "extra_args", "workloads", "reported", "launch_command", "name",
                     "version", "id", "path", "tp", "pp", "nodes", "method", "draft_model",
                     "LD_PRELOAD", "NCCL_IB_HCA", "max_model_len", "gpu_memory_utilization"]),
    st.text(max_size=8), st.integers(-3, 3), st.none(), st.booleans(),
    st.integers(4301, 4400).map(huge), st.sampled_from([math.nan, (1, 2)]),
)
values = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=4),
                           st.dictionaries(keys, kids, max_size=4)),
    max_leaves=16,
) | st.integers(MAX_DEPTH - 2, 3000).map(nested)


@st.composite
def mutated_reference(draw: st.DrawFn) -> dict[str, Any]:
    """The reference configuration with a few of its fields (at any level) replaced: most
    examples then get past the first check and exercise the later ones."""
    data = json.loads(json.dumps(REFERENCE))
    for _ in range(draw(st.integers(1, 3))):
        section = draw(st.sampled_from([*sorted(data, key=shown), "launch_command", "reported",
                                        "other"]))
        if isinstance(data.get(section), dict) and data[section] and draw(st.booleans()):
            field = draw(st.sampled_from(sorted(data[section], key=shown)))
            data[section][field] = draw(values)
        else:
            data[section] = draw(values)
    return data


documents = st.one_of(mutated_reference(), st.dictionaries(keys, values, max_size=6))


def dump(data: Any) -> str:
    try:
        return yaml.safe_dump(data, allow_unicode=True)
    except (yaml.YAMLError, RecursionError, TypeError, ValueError):
        return "not: [representable"  # what YAML cannot write (an oversized integer) is text


yaml_texts = st.one_of(
    st.text(max_size=300),
    documents.map(dump),
    st.integers(MAX_DEPTH - 2, 6000).map(lambda n: "a: " + "[" * n + "]" * n),
    st.integers(MAX_DEPTH - 2, 6000).map(lambda n: "a: " + "{b: " * n + "1" + "}" * n),
    st.integers(1, 40).map(lambda n: "model:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(n))),
    st.sampled_from([
        "[" * 5000, "? [1, 2]\n: 3", "? {a: 1}\n: 3", "a: &x [1]\nb: *x", "!!python/object:os.system x",
        "cluster: {link_gbps: .inf}", "reported: {decode_tps: .nan}", "cluster: {link_gbps: -.Inf}",
        "serving: {gpu_memory_utilization: .NaN}", "reported: {cold_start_s: 1.0e+999}",
        "env: {NCCL_X: " + "9" * 5000 + "}", "parallel: {tp: " + "9" * 5000 + "}",
        "env: {NCCL_X: .inf}", "a: 1\na: 2", "- 1\n- 2", "\ufeffschema: diagnostic.config/1",
        "engine: {version: 0x" + "f" * 3000 + "}", "<<: {schema: x}", "a: !!binary aGVsbG8=",
        "a: 2001-13-45", "a: !!set {b, c}", "a: !!omap [b: 1]", "? !!binary aGVsbG8=\n: 1",
        "launch_command: " + json.dumps("vllm serve /models/kimi-k2 --speculative-config '"
                                        + "[" * 3000 + "'"),
    ]),
)

FLAGS = ["--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "--max-model-len",
         "--kv-cache-dtype", "--gpu-memory-utilization", "--speculative-config",
         "--enable-expert-parallel", "--trust-remote-code", "--tokenizer", "--chat-template",
         "--generation-config", "--download-dir", "--compilation-config", "--served-model-name",
         "--model", "--model-path", "--tp", "--tokenizer-path", "--speculative-algorithm",
         "--speculative-draft-model-path", "--speculative-num-steps", "--mem-fraction-static",
         "--context-length", "--", "=", "\\", "'", '"', "{", "}", "|", "&&", ";", "#", "\n"]
WORDS = st.one_of(
    st.sampled_from(FLAGS),
    st.sampled_from(["inf", "nan", "-inf", "1e999", "9" * 5000, "0x10", "auto", "EAGLE3", "/tmp/x",
                     "/models/kimi-k2", "/models/kimi-k2/../x", "evil/repo", "{{ 1 }}",
                     '{"backend": "x.y"}', '{"method": "eagle3", "model": "evil/d", '
                     '"num_speculative_tokens": 1e999}', '{"method": "ngram", '
                     '"num_speculative_tokens": NaN}', "[" * 2000]),
    st.text(max_size=10), st.integers(-5, 10**12).map(str),
)
ASSIGNMENTS = st.lists(st.sampled_from(["LD_PRELOAD=/x.so", "PATH=/tmp", "NCCL_IB_HCA=a", "A=1",
                                        "VLLM_USE_FLASHINFER_MOE_FP4=1", "HF_ENDPOINT=x",
                                        "NCCL_X=" + "9" * 5000]), max_size=3)
PROGRAMS = st.sampled_from(["vllm serve", "vllm serve /models/kimi-k2",
                            "python3 -m sglang.launch_server --model-path /models/kimi-k2",
                            "python3 -m vllm.entrypoints.openai.api_server", "nohup vllm serve",
                            "docker run x", "", "export"])
commands = st.one_of(
    st.text(max_size=200),
    st.tuples(ASSIGNMENTS, PROGRAMS, st.lists(WORDS, max_size=14)).map(
        lambda t: " ".join([*t[0], t[1], *t[2]])),
)


# 200: each YAML text costs ~35 ms (deep and huge documents), the suite's slowest unit test at 500.
@fuzz(200)
@given(text=yaml_texts)
def test_yaml_text_gives_a_configuration_or_a_field_error(text: str) -> None:
    check_outcome(lambda: load_config_text(text))
    try:
        read_config_text(text)
    except ConfigError as exc:
        assert exc.field


@fuzz(400)
@given(data=documents)
def test_a_parsed_mapping_gives_a_configuration_or_a_field_error(data: dict[Any, Any]) -> None:
    check_outcome(lambda: normalize_config(data))


@fuzz(400)
@given(command=commands, beside=st.dictionaries(
    st.sampled_from(["cluster", "workloads", "reported", "engine", "env"]), values, max_size=2))
def test_a_pasted_command_gives_a_configuration_or_a_field_error(command: str,
                                                                 beside: dict[str, Any]) -> None:
    check_outcome(lambda: parse_command(command))
    check_outcome(lambda: normalize_config({"launch_command": command, **beside}))
