"""Engine log parsing: the simulated lab's lines, real-world variants, fixtures from the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lab.engines import FAILURE_MESSAGE_CHARS, failure_message, parse_log, parse_log_file
from lab.engines.logs import normalize_backend, read_line, seconds_of_year

FIXTURES = Path(__file__).parent / "fixtures"
KINDS = {"stats", "specdec", "weights_loaded", "model_loaded", "graph_capture", "engine_init",
         "fp4_backend", "api_ready", "error", "shard_progress", "compile", "kv_budget",
         "kv_cache", "nccl", "unknown_env", "trust_remote_code"}


def fixture(name: str) -> list[dict[str, Any]]:
    """Events of a fixture; its '#' header lines are blanked so line numbers stay true."""
    engine = "sglang" if name.startswith("sglang") else "vllm"
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    return list(parse_log(engine, ["\n" if line.startswith("#") else line for line in lines]))


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]


def one(events: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (event,) = [e for e in events if e["kind"] == kind]
    return event


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.log")))
def test_every_fixture_yields_known_events_on_real_line_numbers(name: str) -> None:
    text = (FIXTURES / name).read_text()
    assert text.startswith("# source: ")
    assert "# engine version: " in text
    events = fixture(name)
    assert events
    for event in events:
        assert event["kind"] in KINDS
        assert 1 <= event["line"] <= len(text.splitlines())


def test_the_simulated_labs_vllm_lines_all_parse() -> None:
    events = fixture("vllm_lab_contract.log")
    assert kinds(events) == ["unknown_env", "shard_progress", "shard_progress", "weights_loaded",
                             "model_loaded", "fp4_backend", "compile", "graph_capture",
                             "engine_init", "api_ready", "stats", "specdec"]
    assert one(events, "unknown_env")["name"] == "VLLM_USE_FLASHINFER_MOE_FP4"
    assert events[1] | {"ts": 0} == {"kind": "shard_progress", "line": 4, "ts": 0,
                                     "ts_text": "12-02 10:00:21", "done": 16, "total": 64,
                                     "percent": 25, "loader": "safetensors", "elapsed_s": 62.0}
    assert one(events, "weights_loaded")["seconds"] == 186.23
    model = one(events, "model_loaded")
    assert (model["seconds"], model["memory_gib"]) == (190.54, 74.62)
    assert one(events, "fp4_backend")["backend"] == "flashinfer_cutlass"
    assert one(events, "compile")["seconds"] == 150.31
    assert one(events, "graph_capture")["seconds"] == 75.0
    assert (one(events, "engine_init")["seconds"], one(events, "engine_init")["compilation_s"]) == \
        (240.12, 150.31)
    assert one(events, "api_ready")["url"] == "http://0.0.0.0:8000"
    stats = one(events, "stats")
    assert (stats["generation_tps"], stats["prompt_tps"], stats["running"], stats["waiting"]) == \
        (40.7, 0.0, 1, 0)
    spec = one(events, "specdec")
    assert (spec["accepted"], spec["drafted"], spec["mean_acceptance_length"]) == (271, 407, 3.05)
    assert spec["per_position"] == [0.86, 0.76, 0.66, 0.45]
    assert spec["acceptance_rate"] == pytest.approx(0.666)


def test_timestamps_give_seconds_of_the_year_and_keep_the_text() -> None:
    events = fixture("vllm_lab_contract.log")
    weights, model = one(events, "weights_loaded"), one(events, "model_loaded")
    assert weights["ts_text"] == "12-02 10:03:27"
    assert model["ts"] - weights["ts"] == 4.0
    assert seconds_of_year(1, 1, 0, 0, 10, None) == 10.0
    assert seconds_of_year(2, 29, 0, 0, 0, None) == 59 * 86400
    assert seconds_of_year(2, 30, 0, 0, 0, None) is None


def test_multinode_worker_progress_and_prefixed_load_lines() -> None:
    events = fixture("vllm_multinode_worker_startup.log")
    progress = [e for e in events if e["kind"] == "shard_progress"]
    assert [(e["done"], e["total"]) for e in progress][:2] == [(5, 9), (6, 9)]
    assert "ts" not in progress[0]  # tqdm lines carry no timestamp
    loaded = one(events, "weights_loaded")
    assert (loaded["seconds"], loaded["process"], loaded["line"]) == \
        (24.84, "Worker_TP0 pid=34322", 10)
    assert one(events, "model_loaded")["seconds"] == 31.657031


def test_vllm_0_9_startup_without_process_prefixes() -> None:
    events = fixture("vllm_0_9_startup.log")
    assert kinds(events) == ["compile", "kv_cache", "graph_capture", "engine_init", "api_ready"]
    assert one(events, "kv_cache")["available_gib"] == 26.91
    assert one(events, "graph_capture") | {"ts": 0} == {
        "kind": "graph_capture", "line": 8, "ts": 0, "ts_text": "06-22 02:55:02",
        "seconds": 14.0, "memory_gib": 0.84}
    assert one(events, "api_ready")["url"] == "http://0.0.0.0:8000"


def test_docker_compose_prefixes_are_peeled() -> None:
    events = fixture("vllm_compose_specdec.log")
    assert kinds(events) == ["stats", "specdec", "stats"]
    assert events[0]["process"] == "APIServer pid=1"
    assert events[0]["generation_tps"] == 17.0
    assert events[1]["per_position"] == [0.865, 0.769, 0.654]
    assert events[2]["generation_tps"] == 85.5


def test_container_timestamps_are_kept_beside_the_engines() -> None:
    first, second = fixture("vllm_container_timestamps.log")
    assert second["container_ts"] - first["container_ts"] == pytest.approx(10.001089, abs=1e-6)
    assert second["ts"] - first["ts"] == 10.0
    assert (second["running"], second["waiting"]) == (9, 1)


def test_vllm_v0_metrics_and_speculative_lines() -> None:
    events = fixture("vllm_v0_metrics.log")
    assert kinds(events) == ["stats", "specdec", "specdec", "stats"]
    assert (events[3]["running"], events[3]["waiting"]) == (2, 3)  # Pending counts as waiting
    doubled = events[1]
    assert (doubled["accepted"], doubled["drafted"], doubled["emitted"]) == (0, 42272, 2642)
    spec = events[2]
    assert (spec["accepted"], spec["drafted"], spec["num_speculative_tokens"]) == (8547, 13311, 3)
    # emitted per verification step: 10616 / (13311 / 3)
    assert spec["mean_acceptance_length"] == pytest.approx(2.3926, abs=1e-4)
    assert spec["per_position"] == []


def test_an_engine_core_traceback_is_one_error_with_its_exception() -> None:
    events = fixture("vllm_engine_core_failed.log")
    assert kinds(events) == ["compile", "kv_cache", "error", "error", "kv_budget"]
    logged, traceback, kv = events[2], events[3], events[4]
    assert (logged["message"], logged["traceback"]) == ("EngineCore failed to start.", False)
    assert traceback["traceback"] is True
    assert (traceback["first_line"], traceback["line"]) == (7, 15)
    assert traceback["exception"] == "ValueError"
    assert traceback["message"].startswith("ValueError: To serve at least one request")
    # The refusal read from the traceback's final line, under that line's stamp.
    assert kv == {"kind": "kv_budget", "line": 15, "ts_text": "10-11 10:42:14",
                  "ts": seconds_of_year(10, 11, 10, 42, 14, None),
                  "process": "EngineCore_DP0 pid=1937911", "max_model_len": 131072,
                  "kv_needed_gib": 4.11, "kv_available_gib": 4.0,
                  "estimated_max_model_len": 127776}


# vLLM's KV-budget refusal: V1's wording as quoted in vllm-project/vllm#34076 (with the
# estimate) and #16118 (before the estimate was added); V0's as quoted in vllm-project/vllm#2418.
KV_V1 = ("ValueError: To serve at least one request with the models's max seq len (262144), (24.0 GiB "
         "KV cache is needed, which is larger than the available KV cache memory (3.18 GiB). Based on "
         "the available memory, the estimated maximum model length is 34736. Try increasing "
         "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
KV_V1_NO_ESTIMATE = (
    "ValueError: To serve at least one request with the models's max seq len (1048576), (24.00 GiB KV "
    "cache is needed, which is larger than the available KV cache memory (9.97 GiB). Try increasing "
    "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
KV_V0 = ("ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that "
         "can be stored in KV cache (3664). Try increasing `gpu_memory_utilization` or decreasing "
         "`max_model_len` when initializing the engine.")
KV_FIGURES = [
    (KV_V1, {"max_model_len": 262144, "kv_needed_gib": 24.0, "kv_available_gib": 3.18,
             "estimated_max_model_len": 34736}),
    (KV_V1_NO_ESTIMATE, {"max_model_len": 1048576, "kv_needed_gib": 24.0, "kv_available_gib": 9.97,
                         "estimated_max_model_len": None}),
    (KV_V0, {"max_model_len": 4096, "kv_needed_gib": None, "kv_available_gib": None,
             "estimated_max_model_len": 3664}),
]


@pytest.mark.parametrize(("message", "figures"), KV_FIGURES)
@pytest.mark.parametrize("form", ["bare line", "error line", "end of a traceback"])
def test_the_kv_budget_refusal_is_read_in_every_wording_and_form(
        message: str, figures: dict[str, Any], form: str) -> None:
    lines = {
        "bare line": [f"(EngineCore_DP0 pid=1094) {message}\n"],
        "error line": [f"ERROR 04-05 01:12:55 [core.py:390] {message}\n"],
        "end of a traceback": ["Traceback (most recent call last):\n",
                               '  File "core.py", line 92, in __init__\n',
                               "    raise ValueError(\n", f"{message}\n"],
    }[form]
    events = list(parse_log("vllm", ["INFO 04-05 01:12:50 [core.py:1] earlier line\n", *lines,
                                     "INFO 04-05 01:12:56 [launcher.py:80] Shutting down\n"]))
    (kv,) = [e for e in events if e["kind"] == "kv_budget"]
    assert {k: v for k, v in kv.items() if k in figures} == figures
    assert kv["line"] == 1 + len(lines)
    # An error line or a traceback is still its error, followed by the figures read from it.
    if form != "bare line":
        assert kinds(events) == ["error", "kv_budget"]
        assert events[0]["message"].endswith(message)


def test_other_start_failures_and_other_engines_give_no_kv_budget() -> None:
    other = list(parse_log("vllm", ["ERROR 04-05 01:12:55 [core.py:390] RuntimeError: NCCL error: "
                                    "unhandled system error\n"]))
    assert kinds(other) == ["error"]
    assert "kv_budget" not in kinds(list(parse_log("sglang", [KV_V1 + "\n"])))


def test_failure_message_is_the_exception_that_stopped_the_engine() -> None:
    text = (FIXTURES / "vllm_engine_core_failed.log").read_text()
    assert failure_message("vllm", text) == KV_V1.replace(
        "(262144), (24.0", "(131072), (4.11").replace("(3.18 GiB)", "(4.0 GiB)").replace(
        "34736", "127776")


def test_failure_message_skips_an_error_that_points_above_and_the_shutdown_chatter() -> None:
    core = [f"(EngineCore_DP0 pid=7) ERROR 10-11 10:42:14 [core.py:708] {line}" for line in (
        "EngineCore failed to start.", "Traceback (most recent call last):",
        '  File "core.py", line 92, in __init__', "    raise ValueError(", KV_V1)]
    api = [f"(APIServer pid=1) {line}" for line in (
        "Traceback (most recent call last):", '  File "/usr/local/bin/vllm", line 8, in <module>',
        "    sys.exit(main())",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")]
    chatter = ["(APIServer pid=1) ERROR 10-11 10:42:15 [async_llm.py:485] AsyncLLM output_handler failed."]
    assert failure_message("vllm", "\n".join(core + api + chatter)) == KV_V1
    # When the pointer is all there is, it is what the engine said.
    only = (FIXTURES / "vllm_plain_traceback.log").read_text()
    assert failure_message("vllm", only) == ("RuntimeError: Engine core initialization failed. "
                                             "See root cause above.")


def test_failure_message_of_an_argparse_refusal_a_clean_log_and_a_long_error() -> None:
    refused = "usage: vllm serve [model_tag] [options]\nvllm serve: error: unrecognized arguments: --foo\n"
    assert failure_message("vllm", refused) == "vllm serve: error: unrecognized arguments: --foo"
    assert failure_message("vllm", "INFO 09-01 12:00:00 [x.py:1] start\n") is None
    long = failure_message("vllm", "ERROR 09-01 12:00:01 [core.py:1] " + "x" * 5000 + "\n")
    assert long is not None and len(long) == FAILURE_MESSAGE_CHARS and long.endswith("…")


def test_a_chained_traceback_is_one_error_with_the_final_exception() -> None:
    events = fixture("vllm_plain_traceback.log")
    assert kinds(events) == ["error"]
    (error,) = events
    assert (error["first_line"], error["line"]) == (5, 16)
    assert error["message"] == "RuntimeError: Engine core initialization failed. See root cause above."


def test_a_traceback_cut_off_at_the_end_still_reports() -> None:
    events = list(parse_log("vllm", ["Traceback (most recent call last):\n",
                                     '  File "x.py", line 1, in <module>\n']))
    assert events == [{"kind": "error", "line": 2, "traceback": True, "first_line": 1,
                       "exception": None, "message": 'File "x.py", line 1, in <module>'}]


def test_a_line_after_the_exception_is_parsed_normally() -> None:
    events = list(parse_log("vllm", [
        "Traceback (most recent call last):\n",
        "  File \"x.py\", line 1, in <module>\n",
        "torch.OutOfMemoryError: CUDA out of memory.\n",
        "INFO 09-01 12:00:00 [default_loader.py:1] Loading weights took 1.50 seconds\n"]))
    assert kinds(events) == ["error", "weights_loaded"]
    assert events[0]["exception"] == "torch.OutOfMemoryError"


def test_argparse_failures_are_errors() -> None:
    (error,) = parse_log("vllm", ["usage: vllm serve [model_tag] [options]\n",
                                  "vllm serve: error: unrecognized arguments: --foo\n"])
    assert error == {"kind": "error", "line": 2, "traceback": False,
                     "message": "vllm serve: error: unrecognized arguments: --foo",
                     "prog": "vllm serve"}


def test_error_lines_are_errors_and_warnings_are_not() -> None:
    events = list(parse_log("vllm", [
        "WARNING 09-01 12:00:00 [utils.py:1] Not enough memory for everything\n",
        "ERROR 09-01 12:00:01 [core.py:1] not enough memory for KV cache\n"]))
    assert events == [{"kind": "error", "line": 2, "ts_text": "09-01 12:00:01",
                       "ts": seconds_of_year(9, 1, 12, 0, 1, None), "traceback": False,
                       "message": "not enough memory for KV cache"}]


def test_thousands_separators_and_trailing_commas_are_tolerated() -> None:
    (stats,) = parse_log("vllm", [
        "INFO 09-01 12:00:00 [loggers.py:1] Engine 001: Avg prompt throughput: 1,234.5 tokens/s, "
        "Avg generation throughput: 2,345.6 tokens/s, Running: 1,024 reqs, Waiting: 3 reqs, "
        "GPU KV cache usage: 0.1%, Prefix cache hit rate: 0.0%, MM cache hit rate: 0.0%,   \n"])
    assert (stats["prompt_tps"], stats["generation_tps"], stats["running"], stats["engine"]) == \
        (1234.5, 2345.6, 1024, 1)


def test_carriage_return_progress_updates_share_their_line_number() -> None:
    events = list(parse_log("vllm", [
        "INFO 09-01 12:00:00 [x.py:1] start\n",
        "Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]\r"
        "Loading safetensors checkpoint shards:  25% Completed | 1/4 [01:10<03:30, 70.0s/it]\n"]))
    assert [(e["line"], e["done"], e.get("elapsed_s")) for e in events] == [(2, 0, 0.0),
                                                                            (2, 1, 70.0)]


def test_fastsafetensors_progress_names_its_loader() -> None:
    (event,) = parse_log("vllm", ["Loading fastsafetensors checkpoint shards:  20% Completed | "
                                  "1/5 [00:00<00:02,  1.77it/s]\n"])
    assert (event["loader"], event["percent"]) == ("fastsafetensors", 20)


def test_vllm_fp4_backend_lines_in_their_real_wordings() -> None:
    events = fixture("vllm_fp4_backends.log")
    assert [(e["backend"], e["layer"]) for e in events] == [
        ("cutlass", "linear"), ("marlin", "moe"), ("marlin", "linear"), ("flashinfer_b12x", "moe")]


@pytest.mark.parametrize(("logged", "name"), [
    ("FlashInferCutlass", "flashinfer_cutlass"), ("Cutlass", "cutlass"), ("Marlin", "marlin"),
    ("'FLASHINFER_CUTLASS'", "flashinfer_cutlass"), ("VLLM_CUTLASS", "cutlass"),
    ("FlashInferTRTLLM", "flashinfer_trtllm"), ("CutlassNvFp4LinearKernel", "cutlass"),
    ("flashinfer-cutlass", "flashinfer_cutlass"), ("FLASHINFER_CUTEDSL", "flashinfer_cutedsl"),
    ("FlashInferTrtllm", "flashinfer_trtllm"), ("TritonKernel", "triton_kernel"),
])
def test_backend_names_are_normalized_to_snake_case(logged: str, name: str) -> None:
    assert normalize_backend(logged) == name


def test_sglang_eagle3_decode_lines_give_stats_and_acceptance() -> None:
    events = fixture("sglang_eagle3_decode.log")
    assert kinds(events) == ["stats", "stats", "specdec", "stats", "specdec"]
    prefill, decode, spec = events[:3]
    assert (prefill["phase"], prefill["running"], prefill["waiting"]) == ("prefill", 0, 0)
    assert (decode["phase"], decode["generation_tps"], decode["running"]) == ("decode", 0.39, 1)
    assert decode["process"] == "TP0"
    assert (spec["mean_acceptance_length"], spec["acceptance_rate"]) == (2.17, 0.54)
    assert events[3]["generation_tps"] == 178.86


def test_sglang_newer_wording_with_commas() -> None:
    events = fixture("sglang_decode_newer.log")
    assert kinds(events) == ["stats", "stats", "stats", "specdec"]
    assert (events[0]["generation_tps"], events[0]["running"]) == (1635.11, 32)
    assert (events[1]["phase"], events[1]["prompt_tps"]) == ("prefill", 559.53)
    assert events[2]["process"] == "TP0 EP0"
    assert events[3]["mean_acceptance_length"] == 3.05


def test_sglang_load_time_comes_from_begin_and_end_stamps_when_not_logged() -> None:
    events = fixture("sglang_startup.log")
    assert kinds(events) == ["shard_progress", "shard_progress", "weights_loaded", "kv_cache",
                             "error"]
    assert one(events, "kv_cache")["tokens"] == 30192
    loaded = one(events, "weights_loaded")
    assert (loaded["seconds"], loaded["memory_gb"]) == (2.0, 1.18)
    assert events[0]["loader"] == "pt"
    assert "sigquit" in one(events, "error")["message"]


def test_sglang_capture_ready_and_moe_runner_lines() -> None:
    events = fixture("sglang_capture_ready.log")
    assert kinds(events) == ["weights_loaded", "fp4_backend", "graph_capture", "api_ready"]
    assert one(events, "weights_loaded")["seconds"] == 74.12
    assert one(events, "fp4_backend")["backend"] == "flashinfer_cutlass"
    assert one(events, "graph_capture")["seconds"] == 18.07


def test_sglang_scheduler_exception_is_one_error_with_context() -> None:
    events = fixture("sglang_scheduler_exception.log")
    assert kinds(events) == ["error", "error"]
    assert events[0]["context"] == "Scheduler hit an exception"
    assert events[0]["exception"] == "RuntimeError"
    assert events[0]["first_line"] == 4
    assert (events[0]["process"], events[0]["ts_text"]) == ("TP2", "2025-04-23 21:31:41")


def test_sglang_newer_capture_and_startup_timing_lines() -> None:
    # Wording of sglang/srt/model_executor/model_runner.py (newer releases).
    events = list(parse_log("sglang", [
        "[2026-01-01 00:00:00] Capture target decode CUDA graph end. elapsed=25.74 s, "
        "mem usage=2.66 GB, avail mem=24.45 GB.\n",
        "[2026-01-01 00:01:00] Engine startup timings (s): load_weight=312.45, "
        "scheduler_e2e=361.83, tokenizer_e2e=366.77\n"]))
    assert kinds(events) == ["graph_capture", "engine_init"]
    assert (events[0]["seconds"], events[0]["graph"]) == (25.74, "target decode")
    assert events[1]["seconds"] == 361.83
    assert events[1]["timings"]["load_weight"] == 312.45


def test_python_logging_headers_are_peeled() -> None:
    line = read_line(1, "2025-03-27 21:33:31,320 - INFO - flashinfer.jit: Prebuilt kernels not "
                        "found, using JIT backend")
    assert (line.level, line.source, line.ts_text) == ("INFO", "flashinfer.jit",
                                                       "2025-03-27 21:33:31.320")
    assert line.message == "Prebuilt kernels not found, using JIT backend"
    # Line quoted in https://github.com/sgl-project/sglang-omni/pull/712.
    (stats,) = parse_log("sglang", [
        "2026-06-07 10:59:31,659 [INFO] sglang.srt.managers.scheduler_metrics_mixin: Decode "
        "batch, #running-req: 1, #token: 227, token usage: 0.00, cuda graph: True, "
        "gen throughput (token/s): 126.29, #queue-req: 0,\n"])
    assert stats["generation_tps"] == 126.29


def test_the_simulated_labs_sglang_backend_line_parses() -> None:
    (event,) = parse_log("sglang", ["[2025-12-02 14:53:00] Using flashinfer_cutlass as MoE runner "
                                    "backend for NVFP4 (ModelOptNvFp4FusedMoEMethod)\n"])
    assert (event["backend"], event["layer"]) == ("flashinfer_cutlass", "moe")


def test_torch_cpp_log_lines_are_peeled_and_their_errors_reported() -> None:
    # Warning line quoted in https://github.com/qi-hua/async_cosyvoice/issues/21.
    warning = read_line(1, "[rank0]:[W318 08:42:30.204625808 ProcessGroupGloo.cpp:715] Warning: "
                           "Unable to resolve hostname to a (local) address.")
    assert (warning.level, warning.source, warning.process, warning.ts_text) == (
        "WARNING", "ProcessGroupGloo.cpp:715", "rank0", "03-18 08:42:30.204625808")
    assert warning.message.startswith("Warning: Unable to resolve")
    (error,) = parse_log("vllm", ["[E1202 15:18:16.000000 8101 ProcessGroupNCCL.cpp:616] "
                                  "Watchdog caught collective operation timeout\n"])
    assert (error["kind"], error["message"]) == ("error",
                                                 "Watchdog caught collective operation timeout")


def test_an_unknown_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="'tgi' is not known"):
        list(parse_log("tgi", []))


def test_parse_log_file_keeps_physical_line_numbers(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"INFO 09-01 12:00:00 [x.py:1] \xff odd bytes\r\n"
                    b"progress 1\rINFO 09-01 12:00:01 [default_loader.py:1] "
                    b"Loading weights took 3.00 seconds\n")
    (event,) = parse_log_file("vllm", log)
    assert (event["kind"], event["line"], event["seconds"]) == ("weights_loaded", 2, 3.0)
