"""Held-out log lines: each modelled release's lines, written from the format strings its
table quotes (lab.engines.lines.fill), parse to the right events, for that version and
for `version=None` (any modelled release)."""

from __future__ import annotations

from typing import Any

import pytest

from lab.engines import modelled_versions, parse_log
from lab.engines.lines import fill, formats, placeholders

VLLM = modelled_versions("vllm")
SGLANG = modelled_versions("sglang")
STAMP = {"vllm": "INFO 12-02 10:00:00 [x.py:1] ", "sglang": "[2026-12-02 10:00:00 TP0] "}


def events(engine: str, line: str, version: str | None) -> list[dict[str, Any]]:
    return list(parse_log(engine, [STAMP[engine] + line], version=version))


def the(engine: str, line: str, version: str | None, kind: str) -> dict[str, Any]:
    for v in (version, None):
        found = [e for e in events(engine, line, v) if e["kind"] == kind]
        assert len(found) == 1, (line, v, events(engine, line, v))
    return found[0]


def numbers(text: str, values: list[Any]) -> list[Any]:
    """Values for the printf placeholders of `text`, from `values` in order (a leading %s
    that prefixes the line, as in '%storch.compile took ...', gets '')."""
    printf, _ = placeholders(text)
    out: list[Any] = []
    for i, spec in enumerate(printf):
        out.append("" if i == 0 and spec == "s" and text.startswith("%s") else values.pop(0))
    return out


# -- vLLM ---------------------------------------------------------------------------------
@pytest.mark.parametrize("version", VLLM)
def test_vllm_timed_startup_lines(version: str) -> None:
    for text in formats("vllm", version, "weights_loaded"):
        assert the("vllm", fill(text, [186.23]), version, "weights_loaded")["seconds"] == 186.23
    for text in formats("vllm", version, "model_loading"):
        event = the("vllm", fill(text, ["74.62", 190.54]), version, "model_loaded")
        assert (event["seconds"], event["memory_gib"]) == (190.54, 74.62)
    for text in formats("vllm", version, "torch_compile"):
        line = fill(text, numbers(text, [150.31]))
        assert the("vllm", line, version, "compile")["seconds"] == 150.31
    for text in formats("vllm", version, "graph_capture"):
        event = the("vllm", fill(text, [75, 0.52]), version, "graph_capture")
        assert (event["seconds"], event["memory_gib"]) == (75.0, 0.52)
    for text in formats("vllm", version, "engine_init"):
        line = fill(text, [240.12, 150.31, 120.0, 30.31][:len(placeholders(text)[0])])
        assert the("vllm", line, version, "engine_init")["seconds"] == 240.12
    for text in formats("vllm", version, "api_server_start"):
        assert the("vllm", fill(text, ["http://0.0.0.0:8000"]), version,
                   "api_ready")["url"] == "http://0.0.0.0:8000"


@pytest.mark.parametrize("version", VLLM)
def test_vllm_fp4_backend_lines(version: str) -> None:
    (text,) = formats("vllm", version, "moe_backend")
    line = fill(text, fields={"backend.value": "FLASHINFER_CUTLASS", "self.name": "NvFp4",
                              "lora": "", "available": " out of potential backends: [MARLIN]",
                              "available_backend_strs": "[FLASHINFER_CUTLASS, MARLIN]"})
    event = the("vllm", line, version, "fp4_backend")
    assert (event["backend"], event["layer"]) == ("flashinfer_cutlass", "moe")
    # each release's own form only, when the release is known
    other = next(v for v in VLLM if v != version)
    (text,) = formats("vllm", other, "moe_backend")
    other_line = fill(text, fields={"backend.value": "MARLIN", "self.name": "NvFp4", "lora": "",
                                    "available": "", "available_backend_strs": "[]"})
    assert not [e for e in events("vllm", other_line, version) if e["kind"] == "fp4_backend"]
    # an oracle of another quantization is no FP4 backend
    if "{self.name}" in text:
        fp8 = fill(text, fields={"backend.value": "TRITON", "self.name": "Fp8", "lora": "",
                                 "available": ""})
        assert not [e for e in events("vllm", fp8, None) if e["kind"] == "fp4_backend"]
    for text in formats("vllm", version, "nvfp4_linear_kernel"):
        event = the("vllm", fill(text, ["FlashInferCutlassNvFp4LinearKernel"]), version,
                    "fp4_backend")
        assert (event["backend"], event["layer"]) == ("flashinfer_cutlass", "linear")
    for text in formats("vllm", version, "marlin_fp4"):
        assert the("vllm", text, version, "fp4_backend")["backend"] == "marlin"


@pytest.mark.parametrize("version", VLLM)
def test_vllm_unknown_environment_variables(version: str) -> None:
    for text in formats("vllm", version, "unknown_env_warning"):
        line = fill(text, ["VLLM_USE_FLASHINFER_MOE_FP4"], {"env": "VLLM_USE_FLASHINFER_MOE_FP4"})
        event = the("vllm", line, version, "unknown_env")
        assert event["name"] == "VLLM_USE_FLASHINFER_MOE_FP4"


@pytest.mark.parametrize("version", VLLM)
def test_vllm_stats_and_speculative_lines(version: str) -> None:
    prefix = fill(formats("vllm", version, "stats_engine_prefix")[0], [0],
                  {"self.engine_index": 0, "engine_idx": 0})
    throughput = formats("vllm", version, "stats_throughput")
    requests = formats("vllm", version, "stats_requests")
    usage = next(t for t in formats("vllm", version, "stats_kv_usage") if t.count("%") <= 4)
    usage_args = ["GPU", 12.5] if usage.startswith("%s") else [12.5]
    parts = [fill(throughput[0], [0.0]), fill(throughput[1], [40.7]), fill(requests[0], [1]),
             fill(requests[1], [0]), fill(usage, usage_args),
             fill(formats("vllm", version, "stats_prefix_cache")[0], [0.0])]
    event = the("vllm", prefix + ", ".join(parts), version, "stats")
    assert (event["generation_tps"], event["running"], event["waiting"],
            event["kv_cache_usage_pct"], event["engine"]) == (40.7, 1, 0, 12.5, 0)
    (text,) = formats("vllm", version, "specdec_header")
    line = fill(text, [3.05, 27.1, 40.7, 271, 407, "0.860, 0.760, 0.660, 0.450", 66.6])
    event = the("vllm", line, version, "specdec")
    assert (event["accepted"], event["drafted"], event["mean_acceptance_length"]) == \
        (271, 407, 3.05)
    assert event["per_position"] == [0.86, 0.76, 0.66, 0.45]


@pytest.mark.parametrize("version", VLLM)
def test_vllm_kv_cache_lines(version: str) -> None:
    (text,) = formats("vllm", version, "available_kv_memory")
    assert the("vllm", fill(text, ["21.37"]), version, "kv_cache")["available_gib"] == 21.37
    (text,) = formats("vllm", version, "kv_cache_size")
    args = ["GPU", "123,456", "262,144", 0.47] if text.startswith("%s") else \
        ["123,456", "262,144", 0.47]
    assert the("vllm", fill(text, args), version, "kv_cache")["tokens"] == 123456


@pytest.mark.parametrize(("engine", "version"), [("vllm", v) for v in VLLM] +
                         [("sglang", v) for v in SGLANG])
def test_the_request_for_remote_code_is_read(engine: str, version: str) -> None:
    texts = [t for t in formats(engine, version, "trust_remote_code")
             if t.startswith("Failed to load the tokenizer")]
    assert texts
    for text in texts:
        # as a plain line, and as the message of the exception that ends a traceback
        assert the(engine, text, version, "trust_remote_code")["what"] == "tokenizer"
        lines = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
                 f"ValueError: {text}"]
        found = list(parse_log(engine, lines, version=version))
        assert [e["kind"] for e in found] == ["error", "trust_remote_code"]


# -- SGLang -------------------------------------------------------------------------------
def sglang_decode_line(version: str, *, accept: bool, label: str) -> str:
    fields = formats("sglang", version, "batch_fields")
    head = next(t for t in fields if t.startswith("Decode batch"))
    accept_part = next(t for t in fields if t.startswith("accept len"))
    tail = next(t for t in fields if "gen throughput" in t and not t.startswith("Prefill"))
    values = {"iter_msg": "", "num_running_reqs": 3,
              "token_usage_msg": "#token: 1234, token usage: 0.05, ",
              "spec_accept_length": 2.91, "spec_accept_rate": 0.48,
              "self._graph_backend_label": label, "can_run_cuda_graph": True,
              "self.last_gen_throughput": 41.5, "len(self.waiting_queue)": 0,
              "len(self.scheduler.waiting_queue)": 0}
    return fill(head, fields=values) + (fill(accept_part, fields=values) if accept else "") + \
        fill(tail, fields=values)


@pytest.mark.parametrize("version", SGLANG)
@pytest.mark.parametrize("label", ["cuda graph", "CUDA graph"])
def test_sglang_decode_batch_lines_with_and_without_accept_len(version: str, label: str) -> None:
    line = sglang_decode_line(version, accept=True, label=label)
    stats = the("sglang", line, version, "stats")
    assert (stats["phase"], stats["running"], stats["waiting"], stats["generation_tps"],
            stats["token_usage"], stats["cuda_graph"]) == ("decode", 3, 0, 41.5, 0.05, True)
    spec = the("sglang", line, version, "specdec")
    assert (spec["mean_acceptance_length"], spec["acceptance_rate"]) == (2.91, 0.48)
    plain = sglang_decode_line(version, accept=False, label=label)
    assert [e["kind"] for e in events("sglang", plain, version)] == ["stats"]


@pytest.mark.parametrize("version", SGLANG)
def test_sglang_startup_lines(version: str) -> None:
    (begin,) = formats("sglang", version, "load_weight_begin")
    end = formats("sglang", version, "load_weight_end")[0]
    values = {"get_available_gpu_memory(self.device, self.gpu_id)": 110.0,
              "time.perf_counter() - tic_total": 312.45, "self.weight_load_time": 312.45,
              "type(self.model).__name__": "DeepseekV3ForCausalLM",
              "quant_str + ', ' if quant_str else ''": "quant=modelopt_fp4, ",
              "after_avail_memory": 35.2, "self.weight_load_mem_usage": 74.8}
    found = list(parse_log("sglang", [STAMP["sglang"] + fill(begin, fields=values),
                                      STAMP["sglang"] + fill(end, fields=values)], version=version))
    (loaded,) = [e for e in found if e["kind"] == "weights_loaded"]
    assert (loaded["seconds"], loaded["memory_gb"]) == (312.45, 74.8)
    timed = [t for t in formats("sglang", version, "cuda_graph_capture_end") if "{" in t]
    assert timed
    for text in timed:
        values = {"capture_name": "target decode", "capture_time": 25.74,
                  "time.perf_counter() - tic": 25.74, "mem_usage": 2.66, "memory_usage_gb": 2.66,
                  "self.graph_mem_usage": 2.66, "graph_backend[self.device]": "cuda graph",
                  "graph_backend[model_runner.device]": "CUDA graph", "runner.capture_bs": [1, 2, 4],
                  "before_mem - after_mem": 2.66, "after_mem": 30.1, "step": 2}
        event = the("sglang", fill(text, fields=values), version, "graph_capture")
        assert (event["seconds"], event["memory_gb"]) == (25.74, 2.66)
    for text in formats("sglang", version, "server_ready"):
        the("sglang", text, version, "api_ready")
    for text in formats("sglang", version, "child_failed"):
        assert "sigquit" in the("sglang", text, version, "error")["message"]
    for text in formats("sglang", version, "startup_timings"):
        event = the("sglang", fill(text, [312.45, 15.0, 361.83, "decode=25.74", 2.0]), version,
                    "engine_init")
        assert event["seconds"] == 361.83
    for text in formats("sglang", version, "kv_cache_allocated"):
        if "draft" in text:
            continue
        line = fill(text, ["fp8_e4m3", 30192, 4.12, 20.5],
                    {"num_tokens": 30192, "k_size_GB": 2.06, "v_size_GB": 2.06,
                     "kv_size_GB": 4.12, "cache_name": "KV Cache", "self.dtype": "torch.float8_e4m3fn"})
        assert the("sglang", line, version, "kv_cache")["tokens"] == 30192


@pytest.mark.parametrize("version", SGLANG)
def test_sglang_moe_runner_lines(version: str) -> None:
    for text in formats("sglang", version, "moe_runner_backend"):
        line = fill(text, fields={"model_arch": "DeepseekV3ForCausalLM",
                                  "hf_config.architectures[0]": "DeepseekV3ForCausalLM",
                                  "model_config.quantization": "modelopt_fp4"})
        event = the("sglang", line, version, "fp4_backend")
        assert event["backend"] == text.split()[1]


# -- lines of no engine's package: NCCL's, written only with NCCL_DEBUG=INFO ---------------
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_nccl_bootstrap_net_and_retry_lines(engine: str) -> None:
    lines = [
        "spark-01:3121:3121 [0] NCCL INFO Bootstrap : Using enP2p1s0f0np0:10.10.0.1<0>",
        "spark-02:3188:3188 [0] NCCL INFO Bootstrap: Using enp1s0f0np0:10.10.0.2<0>",
        "spark-01:3121:3121 [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [RO]; OOB "
        "enP2p1s0f0np0:10.10.0.1<0>",
        "spark-03:3201:3260 [0] NCCL INFO Call to connect returned Connection refused, "
        "retrying (3/20)",
        "spark-03:3201:3260 [0] NCCL WARN Net : Connect to 10.10.0.1<43211> failed",
    ]
    found = list(parse_log(engine, lines))
    assert [(e["kind"], e["what"]) for e in found] == [
        ("nccl", "bootstrap"), ("nccl", "bootstrap"), ("nccl", "net"), ("nccl", "retry"),
        ("nccl", "warning")]
    assert (found[0]["interface"], found[0]["address"]) == ("enP2p1s0f0np0", "10.10.0.1")
    assert found[1]["interface"] == "enp1s0f0np0"
    assert found[2]["transport"] == "IB"
    assert (found[3]["attempt"], found[3]["of"]) == (3, 20)
