"""The simulated engine speaks the interface of the release it models (LAB_MODEL.md
section 9): argv parsed and refused with the version's table, the version's log lines
(format strings from lab/engines/releases), NCCL only with NCCL_DEBUG, FP4 from flags
only, SGLang's /metrics and decode lines, the offline and remote-code refusals."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from lab.engines import render
from lab.engines.lines import fill_fields as fill
from lab.engines.tables import release
from lab.inventory import load_inventory
from lab.scenarios import scenario_path
from lab.sim.engine import EngineProcess
from lab.sim.lab import SimLab
from lab.sim.release import Release
from lab.sim.scenario import ScenarioError, load_scenario, parse_scenario
from tests.lab.agent.conftest import wait_until

from .conftest import out_of_box, stop_all, wait_exit, wait_ready

AGENT = "/var/lib/diag/agent.py"


def launch_argv(lab: SimLab, config: dict[str, Any],
                edit: Callable[[list[str]], list[str]] = lambda a: a,
                env: dict[str, str] | None = None) -> list[EngineProcess]:
    """Render `config`, pass every node's argv through `edit` (the engine sees exactly
    that), add `env` to each spec, and launch."""
    specs = render(config, load_inventory(lab.inventory_path).nodes)
    procs = []
    for spec in specs:
        spec["argv"] = edit(list(spec["argv"]))
        spec["env"] = {**spec["env"], **(env or {})}
        node = lab.node(spec["node"])
        node.launch(spec, node.host_path(spec["log_file"]))
        procs.append(node.processes[-1])
    return procs


def without(*tokens: str) -> Callable[[list[str]], list[str]]:
    return lambda argv: [a for a in argv if a not in tokens]


def replacing(old: str, new: str) -> Callable[[list[str]], list[str]]:
    return lambda argv: [a.replace(old, new) for a in argv]


def log_of(proc: EngineProcess) -> str:
    return proc.log_path.read_text()


def sglang_lab(make_lab: Callable[..., SimLab], version: str = "0.5.23") -> SimLab:
    data = json.loads(json.dumps(load_scenario(scenario_path("reference-kimi-k2-8spark")).__dict__))
    raw = {"schema": "labsim.scenario/1", "name": "sglang", "seed": 7, "dilation": 1000.0,
           "engine": {"name": "sglang", "version": version},
           "truth": {"fp4": {"broken": [], "default_backend": "flashinfer_cutlass"},
                     "specdec": data["truth"]["specdec"], "server_counts": "emitted"},
           "serving": {"log_interval_s": 2.0}}
    return make_lab(parse_scenario(raw))


def sglang_config(version: str = "0.5.23") -> dict[str, Any]:
    config = copy.deepcopy(out_of_box())
    config["engine"] = {"name": "sglang", "version": version}
    config["serving"]["safetensors_load_strategy"] = "lazy"
    config["env"] = {"NCCL_SOCKET_IFNAME": "enP7s7", "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0"}
    return config


# -- the format strings ------------------------------------------------------------------------


def test_fill_names_each_expression_and_keeps_its_format_spec() -> None:
    text = ("Capture {capture_name} CUDA graph end. elapsed={capture_time:.2f} s, "
            "avail mem={after_mem:.2f} GB.")
    assert fill(text, {"capture_name": "decode", "capture_time": 75, "after_mem": 3.14159}) == \
        "Capture decode CUDA graph end. elapsed=75.00 s, avail mem=3.14 GB."
    assert fill("Engine {:03d}: ", {"": 0}) == "Engine 000: "
    expression = "quant_str + ', ' if quant_str else ''"
    assert fill("{" + expression + "}x", {expression: ""}) == "x"
    with pytest.raises(KeyError):
        fill("{missing}", {})


@pytest.mark.parametrize("version", ["0.29.0", "0.34.0"])
def test_every_vllm_line_the_sim_writes_is_a_format_string_of_the_version(
        sim_lab: SimLab, make_lab: Callable[..., SimLab], version: str) -> None:
    lab = sim_lab
    if version != "0.34.0":
        scenario = load_scenario(scenario_path("reference-kimi-k2-8spark"))
        lab = make_lab(parse_scenario({**_raw(scenario), "engine": {"name": "vllm", "version": version}}))
    config = out_of_box()
    config["engine"]["version"] = version
    head = wait_ready(launch_argv(lab, config))
    text = log_of(head)
    table = release("vllm", version)
    templates = [f["text"] for entry in table["lines"].values() for f in entry["found"] or []]
    patterns = [_template_regex(t) for t in templates]
    for line in text.splitlines():
        message = line.split("] ", 1)[1] if line.startswith(("INFO", "WARNING", "ERROR")) else line
        if not message:
            continue  # before the bar's first update: tqdm writes a carriage return first
        if message.startswith("Loading safetensors checkpoint shards"):
            continue  # tqdm's bar, its description from the table (shard_progress)
        if message.startswith("Engine 000: "):
            continue  # the stats line is composed of several table strings (tested in test_http)
        assert any(p.fullmatch(message) for p in patterns), f"not a {version} line: {message}"
    moe = re.search(r"Using (\S+) NvFp4 MoE backend", text)
    assert moe is not None
    assert moe[1] == ("'FLASHINFER_CUTLASS'" if version == "0.29.0" else "FLASHINFER_CUTLASS")
    assert "Using FlashInferCutlassNvFp4LinearKernel for NVFP4 GEMM" in text


def test_the_vllm_head_binds_its_broadcast_queue_where_vllm_host_ip_says(sim_lab: SimLab) -> None:
    # vllm/v1/executor/multiproc_executor.py: the DP group leader's line names get_ip(),
    # VLLM_HOST_IP else the default-route interface (the management NIC).
    inventory = load_inventory(sim_lab.inventory_path)
    head = wait_ready(launch_argv(sim_lab, out_of_box()))
    line = next(x for x in log_of(head).splitlines() if "DP group leader" in x)
    assert f"master_addr={inventory.head.data_addr}, mq_connect_ip={inventory.head.data_addr} (local)" in line
    assert "world_size=8" in line
    workers = [p for n in sim_lab.scenario.node_names[1:] for p in sim_lab.node(n).processes]
    assert workers and not any("DP group leader" in log_of(p) for p in workers)  # rank 0's line
    for name in sim_lab.scenario.node_names:
        for proc in sim_lab.node(name).processes:
            proc.terminate()
    # A spec naming another node's address is refused on the node, as the agent does.
    spec = render(out_of_box(), inventory.nodes)[1]
    spec["env"]["VLLM_HOST_IP"] = inventory.head.data_addr
    node = sim_lab.node(spec["node"])
    node.host_path("/var/lib/diag/launch").mkdir(parents=True, exist_ok=True)
    node.host_path("/var/lib/diag/launch/other.json").write_text(json.dumps(spec))
    answer = json.loads(node.run_agent(AGENT, ["launch", "--spec", "/var/lib/diag/launch/other.json",
                                               "--json"]).stdout)
    assert answer["error"]["code"] == "invalid_spec"
    assert answer["error"]["message"].startswith("spec.env.VLLM_HOST_IP:")


def _raw(scenario: Any) -> dict[str, Any]:
    return {"schema": "labsim.scenario/1", "name": scenario.name, "seed": scenario.seed,
            "dilation": 1000.0, "truth": {"fp4": {"default_backend": "flashinfer_cutlass",
                                                  "broken": ["flashinfer_cutlass"]}}}


def _template_regex(template: str) -> re.Pattern[str]:
    """A format string as a pattern: each placeholder matches anything."""
    parts = re.split(r"(%[-#0 +]*\d*(?:\.\d+)?[sdfx%]|\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})", template)
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            out.append(re.escape(part))
        else:
            out.append("%" if part == "%%" else ".*?")
    return re.compile("".join(out))


def test_the_phases_run_in_the_engines_order(sim_lab: SimLab) -> None:
    head = wait_ready(launch_argv(sim_lab, out_of_box()))
    names = [p.name for p in head.phases if p.name not in ("rendezvous_wait", "kv_wait")]
    assert names[:8] == ["process_start", "distributed_init", "model_init", "weights_load", "jit",
                         "kv_alloc", "graph_capture", "api_ready"]


# -- argv ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "message"), [
    (["--swap-space", "16"], "unrecognized arguments: --swap-space 16"),
    (["--moe-backend", "no_such_name"], "argument --moe-backend: invalid choice: 'no_such_name'"),
])
def test_a_flag_the_version_refuses_ends_in_seconds_with_argparses_words(
        sim_lab: SimLab, extra: list[str], message: str) -> None:
    head = launch_argv(sim_lab, out_of_box(), lambda argv: argv + extra)[0]
    assert wait_exit(head) == 2
    lines = log_of(head).splitlines()
    assert lines[0].startswith("usage: vllm serve")
    assert lines[-1].startswith("vllm serve: error: " + message)
    assert [p.name for p in head.phases] == []  # nothing started, no weight read
    assert head.exited_at is not None and head.exited_at - head.started < 60
    assert sim_lab.head.weights_cached_gb == 0


def test_b12x_backends_are_accepted_native_backends(sim_lab: SimLab) -> None:
    head = wait_ready(launch_argv(sim_lab, out_of_box(),
                                  lambda argv: [*argv, "--moe-backend", "flashinfer-b12x",
                                                "--linear-backend", "FLASHINFER_B12X"]))
    text = log_of(head)
    assert "Using FLASHINFER_B12X NvFp4 MoE backend" in text
    assert "Using FlashInferB12xNvFp4LinearKernel for NVFP4 GEMM" in text
    assert head.server is not None and head.server.core.backend_state == "ok"


# -- FP4 ----------------------------------------------------------------------------------------


def test_vllm_env_names_the_version_does_not_read_are_warned_about_and_ignored(sim_lab: SimLab) -> None:
    env = {"VLLM_NVFP4_GEMM_BACKEND": "cutlass", "VLLM_USE_FLASHINFER_MOE_FP4": "0"}
    head = wait_ready(launch_argv(sim_lab, out_of_box(), env=env))
    text = log_of(head)
    for name in env:
        assert re.search(rf"^WARNING .* Unknown vLLM environment variable detected: {name}$", text, re.M)
    assert "Using FLASHINFER_CUTLASS NvFp4 MoE backend" in text  # the default rule, not the env
    assert head.server is not None and head.server.core.backend_state == "broken"


def test_a_backend_that_cannot_run_nvfp4_here_fails_at_model_init(sim_lab: SimLab) -> None:
    head, *workers = launch_argv(sim_lab, out_of_box(),
                                 lambda argv: [*argv, "--moe-backend", "flashinfer_trtllm"])
    assert wait_exit(head) == 1
    text = log_of(head)
    assert "ERROR" in text and "Traceback (most recent call last):" in text
    assert "EngineCore failed to start." in text
    # A --headless node has workers and no engine core (v1/executor/multiproc_executor.py).
    assert workers and all(wait_exit(w) == 1 for w in workers)
    assert all("WorkerProc failed to start." in log_of(w) and "EngineCore" not in log_of(w)
               and "Engine core initialization failed" not in log_of(w) for w in workers)
    # oracle/base.py make_log_unsupported quotes the name in 0.34.0 as 0.29.0 did.
    assert ("ValueError: NvFp4 MoE backend 'FLASHINFER_TRTLLM' does not support the deployment "
            "configuration") in text
    assert "Engine core initialization failed. See root cause above." in text
    assert [p.name for p in head.phases][-1] == "model_init"
    assert "checkpoint shards" not in text


def test_the_moe_flag_picks_the_backend_that_runs(sim_lab: SimLab) -> None:
    head = wait_ready(launch_argv(sim_lab, out_of_box(), lambda argv: [*argv, "--moe-backend", "cutlass"]))
    # A forced backend still prints the oracle's whole list (return_or_raise passes it).
    assert ("Using VLLM_CUTLASS NvFp4 MoE backend out of potential backends: ['FLASHINFER_TRTLLM', "
            "'FLASHINFER_CUTEDSL', 'FLASHINFER_CUTEDSL_BATCHED', 'FLASHINFER_CUTLASS', 'VLLM_CUTLASS', "
            "'MARLIN', 'HUMMING', 'EMULATION'].") in log_of(head)
    assert head.server is not None and head.server.core.backend_state == "ok"


def test_marlin_says_so_after_the_weights_are_read(sim_lab: SimLab) -> None:
    head = wait_ready(launch_argv(sim_lab, out_of_box(), lambda argv: [*argv, "--moe-backend", "marlin"]))
    lines = log_of(head).splitlines()
    said = [i for i, x in enumerate(lines) if "Weight-only FP4 compression will be used" in x]
    took = next(i for i, x in enumerate(lines) if "Loading weights took" in x)
    total = next(i for i, x in enumerate(lines) if "Model loading took" in x)
    # warning_once in process_weights_after_loading (kernels/linear/nvfp4/marlin.py).
    assert len(said) == 1 and took < said[0] < total


def test_the_kv_budget_is_checked_by_the_heads_engine_core_only(sim_lab: SimLab) -> None:
    head, *workers = launch_argv(sim_lab, out_of_box(),
                                 lambda argv: [*argv, "--gpu-memory-utilization", "0.3"])
    assert wait_exit(head) == 1
    text = log_of(head)
    lines = text.splitlines()
    avail = next(i for i, x in enumerate(lines) if "Available KV cache memory" in x)
    refusal = next(i for i, x in enumerate(lines) if "ValueError: To serve at least one request" in x)
    assert avail < refusal and "EngineCore failed to start." in text
    # Each worker profiled its memory and said so; the check (check_enough_kv_cache_memory)
    # is the head's: a --headless node waits for the head's next call.
    # At the same lab second as the head's refusal: let each worker get there.
    assert workers and all(wait_until(lambda w=w: w.phases[-1].name == "wait_head", 20) for w in workers)
    assert all(w.running for w in workers)
    assert all("Available KV cache memory" in log_of(w) and "To serve at least one request" not in log_of(w)
               for w in workers)


# -- offline and model code ------------------------------------------------------------------------


def test_a_draft_named_by_hub_id_fails_offline(sim_lab: SimLab) -> None:
    head = launch_argv(sim_lab, out_of_box(),
                       replacing("/models/kimi-k2-eagle3", "AQ-MedAI/Kimi-K2-Instruct-eagle3"))[0]
    assert wait_exit(head) == 1
    text = log_of(head)
    assert text.splitlines()[-1].startswith("huggingface_hub.errors.LocalEntryNotFoundError: ")
    assert "outgoing traffic has been disabled" in text
    assert [p.name for p in head.phases] == ["process_start"]


def test_a_tokenizer_named_by_hub_id_fails_offline(sim_lab: SimLab) -> None:
    head = launch_argv(sim_lab, out_of_box(),
                       lambda argv: [*argv, "--tokenizer", "moonshotai/Kimi-K2-Instruct-0905"])[0]
    assert wait_exit(head) == 1
    assert "LocalEntryNotFoundError" in log_of(head)


def test_kimi_without_trust_remote_code_fails_at_tokenizer_load(sim_lab: SimLab) -> None:
    head, *workers = launch_argv(sim_lab, out_of_box(), without("--trust-remote-code"))
    assert wait_exit(head) == 1
    message = release("vllm", "0.34.0")["lines"]["trust_remote_code"]["found"][0]["text"]
    assert log_of(head).splitlines()[-1] == f"RuntimeError: {message}"
    # vLLM loads the tokenizer on the head only (API server, engine core): a --headless
    # worker reads Kimi K2's registered configuration and waits at the rendezvous.
    assert workers and all(w.headless for w in workers)
    assert all(w.running and "Failed to load the tokenizer" not in log_of(w) for w in workers)


# -- SGLang -------------------------------------------------------------------------------------------


def _serve_sglang(make_lab: Callable[..., SimLab], *, metrics: bool, version: str = "0.5.23",
                  extra: list[str] | None = None) -> tuple[SimLab, EngineProcess]:
    lab = sglang_lab(make_lab, version)
    def edit(argv: list[str]) -> list[str]:
        return argv + (extra or [])
    if not metrics:
        edit = lambda argv: [a for a in argv if a != "--enable-metrics"] + (extra or [])  # noqa: E731
    head = wait_ready(launch_argv(lab, sglang_config(version), edit))
    assert head.server is not None, log_of(head)[-3000:]
    return lab, head


@pytest.mark.parametrize("version", ["0.5.12", "0.5.23"])
def test_sglang_writes_its_versions_lines(make_lab: Callable[..., SimLab], version: str) -> None:
    _, head = _serve_sglang(make_lab, metrics=True, version=version)
    text = log_of(head)
    assert "The server is fired up and ready to roll!" in text
    assert "JIT kernels ready" not in text
    assert re.search(r"Load weight end\. elapsed=[\d.]+ s, type=DeepseekV3ForCausalLM", text)
    lines = text.splitlines()
    if version == "0.5.23":
        # The main runner's line (cuda_graph_setup.py): role and step, then the device's
        # graph name; with speculation it captured the verify step.
        assert re.search(r"Capture target (verify|decode) CUDA graph end\. bs=\[1, 2, 4, [\d, ]+\], "
                         r"elapsed=75\.00 s", text)
        assert "KV Cache is allocated. dtype: torch." in text
        assert "Engine startup timings (s): load_weight=" in text
        # arg_groups/overrides.py: an auto MoE runner for modelopt_fp4 on SM110/SM120 is
        # flashinfer_cutlass, said while the arguments are read, before the rendezvous.
        moe = next(i for i, x in enumerate(lines) if "as MoE runner backend on SM110/SM120" in x)
        begin = next(i for i, x in enumerate(lines) if x.endswith("Init parallel begin."))
        ends = next(i for i, x in enumerate(lines) if "Init parallel ends. elapsed=" in x)
        assert moe < begin < ends
    else:
        assert "Capture draft cuda graph end." in text
        assert "Capture cuda graph end. Time elapsed: 75.00 s." in text  # model_runner.py's own
        assert re.search(r"KV Cache is allocated\. #tokens: \d+, KV size: ", text)
        assert "Engine startup timings" not in text
        assert "MoE runner backend" not in text  # 0.5.12 has no SM120 rule
        begin = next(i for i, x in enumerate(lines) if x.endswith("Init torch distributed begin."))
        ends = next(i for i, x in enumerate(lines) if "Init torch distributed ends. elapsed=" in x)
        assert begin < ends


def test_sglang_serves_metrics_only_with_enable_metrics(make_lab: Callable[..., SimLab]) -> None:
    _, head = _serve_sglang(make_lab, metrics=False)
    assert head.server is not None
    assert httpx.get(head.server.url + "/metrics").status_code == 404


def test_sglang_logs_decode_batches_by_steps_and_serves_its_own_metric_names(
        make_lab: Callable[..., SimLab]) -> None:
    _, head = _serve_sglang(make_lab, metrics=True, extra=["--decode-log-interval", "10"])
    assert head.server is not None
    url = head.server.url
    r = httpx.post(url + "/v1/completions", json={"model": head.server.core.model_name,
                                                  "prompt": "write python code", "max_tokens": 200,
                                                  "ignore_eos": True}, timeout=60)
    assert r.status_code == 200
    steps = len(head.server.core.history()[-1].steps) - 1  # decode steps after the prefill
    decode = [line for line in log_of(head).splitlines() if "Decode batch, #running-req: " in line]
    assert len(decode) == steps // 10
    assert all(re.search(r"accept len: [\d.]+, accept rate: [\d.]+, cuda graph: True, "
                         r"gen throughput \(token/s\): [\d.]+, #queue-req: 0$", line) for line in decode)
    text = httpx.get(url + "/metrics").text
    for name in ("sglang:num_running_reqs", "sglang:gen_throughput", "sglang:spec_accept_length",
                 "sglang:prompt_tokens_total", "sglang:generation_tokens_total"):
        assert re.search(rf"^{name}{{", text, re.M), name
    assert "accepted" not in text and "vllm:" not in text
    assert 'is_streaming="true"' in text


# -- scenario -------------------------------------------------------------------------------------------


def test_a_scenario_naming_an_unmodelled_version_is_refused_with_the_modelled_ones() -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario({"schema": "labsim.scenario/1", "engine": {"name": "vllm", "version": "0.29.1"}})
    assert err.value.field == "engine.version" and "0.29.0, 0.34.0" in str(err.value)
    defaults = parse_scenario({"schema": "labsim.scenario/1"})
    assert defaults.engine == {"name": "vllm", "version": "0.34.0"}
    sglang = parse_scenario({"schema": "labsim.scenario/1", "engine": {"name": "sglang"}})
    assert sglang.engine["version"] == "0.5.23"


def test_the_kimi_profile_says_where_the_lab_holds_it() -> None:
    model = parse_scenario({"schema": "labsim.scenario/1"}).model
    assert (model["id"], model["path"], model["remote_code"]) == \
        ("moonshotai/Kimi-K2-Instruct-0905", "/models/kimi-k2", True)
    assert model["drafts"] == [{"id": "AQ-MedAI/Kimi-K2-Instruct-eagle3", "path": "/models/kimi-k2-eagle3",
                                "method": "eagle3", "remote_code": True}]
    custom = parse_scenario({"schema": "labsim.scenario/1", "model": {
        "name": "other", "id": "org/other", "path": "/models/other", "remote_code": False,
        "drafts": [{"id": "org/draft", "path": "/models/draft", "method": "eagle3"}]}}).model
    assert custom["drafts"][0]["path"] == "/models/draft" and custom["remote_code"] is False
    with pytest.raises(ScenarioError, match=r"model.drafts\[0\].path"):
        parse_scenario({"schema": "labsim.scenario/1", "model": {
            "drafts": [{"id": "org/draft", "path": "org/draft", "method": "eagle3"}]}})


def test_gloo_socket_ifname_may_join_the_rendezvous_needs(make_lab: Callable[..., SimLab]) -> None:
    raw = _raw(load_scenario(scenario_path("reference-kimi-k2-8spark")))
    needs = {"NCCL_SOCKET_IFNAME": "enP7s7", "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0",
             "GLOO_SOCKET_IFNAME": "enP7s7"}
    raw["truth"]["load"] = {"rendezvous": {"needs": needs, "stall_s": 60}}
    scenario = parse_scenario(raw)
    assert scenario.truth["load"]["rendezvous"]["needs"] == needs
    lab = make_lab(scenario)
    config = out_of_box()
    nccl_only = {k: v for k, v in needs.items() if k != "GLOO_SOCKET_IFNAME"}
    config["env"] = nccl_only
    head = wait_ready(launch_argv(lab, config))
    stalled = next(p.seconds for p in head.phases if p.name == "rendezvous_wait")
    assert stalled >= 60
    for node in lab.nodes.values():
        node.stop_engines()
    config["env"] = needs
    head = wait_ready(launch_argv(lab, config))
    assert next(p.seconds for p in head.phases if p.name == "rendezvous_wait") < 30


def test_release_reads_flags_as_the_version_does() -> None:
    rel = Release("vllm", "0.34.0")
    argv = ["vllm", "serve", "/m", "--moe_backend=cutlass", "--trust-remote-code", "-sc", "{}"]
    assert rel.option(argv, "--moe-backend") == (True, "cutlass")
    assert rel.flag_on(argv, "--trust-remote-code")
    assert rel.option(argv, "--speculative-config") == (True, "{}")
    assert not rel.flag_on([*argv, "--no-trust-remote-code"], "--trust-remote-code")
    assert Release("sglang", "0.5.23").option(["--enable-metrics"], "--enable-metrics") == (True, None)
    assert rel.unknown_vllm_env({"VLLM_CACHE_ROOT": "x", "VLLM_NVFP4_GEMM_BACKEND": "y"}) == \
        ["VLLM_NVFP4_GEMM_BACKEND"]
    assert rel.metric("vllm:spec_decode_num_drafts") == "vllm:spec_decode_num_drafts_total"


def test_vllms_prefetch_strategy_reads_like_a_fast_loader() -> None:
    # vllm/config/load.py: "prefetch" reads the checkpoint files into the page cache before
    # the workers load them: the drive's speed, not mmap's page faults.
    from lab.sim.engine import loader_for

    assert loader_for({"serving": {"safetensors_load_strategy": "prefetch"}}) == "eager"
    assert loader_for({"serving": {"safetensors_load_strategy": "lazy"}}) == "mmap"


@pytest.mark.parametrize("version", ["0.5.12", "0.5.23"])
def test_sglangs_kept_cache_is_its_own_variable(make_lab: Callable[..., SimLab], version: str) -> None:
    # SGLang ignores VLLM_CACHE_ROOT: a persisted cache is SGLANG_CACHE_DIR in the volume, and
    # the second start finds the compiled kernels there.
    lab = sglang_lab(make_lab, version)
    config = {**sglang_config(version), "serving": {**sglang_config(version)["serving"],
                                                    "jit_cache": "persisted"}}
    jit = []
    for _ in range(2):
        head = wait_ready(launch_argv(lab, config))
        assert head.env["SGLANG_CACHE_DIR"].endswith("/sglang")
        assert "VLLM_CACHE_ROOT" not in head.env
        jit.append(next(p.seconds for p in head.phases if p.name == "jit"))
        stop_all(lab)
    cold, warm = jit
    load = lab.scenario.truth["load"]
    assert (cold, warm) == (load["jit_cold_s"], load["jit_warm_s"])
