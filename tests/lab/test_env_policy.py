"""The environment by exact name (issue 29 item 3): lab/env_policy.yaml, per engine and
version, at intake (lab.config) and on the node (the agent's check, with the policy it is
pushed with; tests/lab/test_session.py runs it over real SSH)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lab import env_policy
from lab.config import HOST_IP_ENV, JIT_CACHE_ENV, ConfigError, env_name_problem
from lab.engines import modelled_versions, normalize_config
from lab.engines.base import jit_cache_env
from lab.engines.tables import release
from lab.inventory import Node
from lab.session import OBSERVATION_ENV

# The variables the platform renders itself: a configuration may not set them.
PLATFORM_ENV = {*JIT_CACHE_ENV, HOST_IP_ENV}
VERSIONS = [("vllm", "0.29.0"), ("vllm", "0.34.0"), ("sglang", "0.5.12"), ("sglang", "0.5.23")]
CACHE = "/var/cache/diag"


def refusal(env: dict[str, Any], engine: str = "vllm", version: str = "0.34.0") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        normalize_config({"engine": {"name": engine, "version": version}, "env": env})
    return info.value


def on_node(env: dict[str, str], engine: str = "vllm", version: str = "0.34.0",
            cache_dir: str = CACHE) -> tuple[str, str] | None:
    """What the pushed agent answers for a launch spec with `env` (its own function, with
    the policy written into it)."""
    return env_policy.launch_env_problem(env, engine, version, cache_dir)


# -- the hostile table ----------------------------------------------------------------------
# Every variable the issue names, and more from the engines' own environment lists: each
# loads code, reaches the network, reads or writes files, selects devices, or is a
# development switch. Refused at intake and on the node, for every modelled version.
HOSTILE = [
    ("UCX_GDB_COMMAND", "bash -c 'touch /tmp/owned'"), ("UCX_HANDLE_ERRORS", "debug"),
    ("UCX_ERROR_SIGNALS", "TERM"), ("TRITON_CACHE_MANAGER", "os:system"),
    ("NCCL_COMM_ID", "10.0.0.1:1234"), ("VLLM_DP_MASTER_IP", "10.0.0.1"),
    ("SGLANG_EXTERNAL_MODEL_PACKAGE", "evil"), ("VLLM_TUNED_CONFIG_FOLDER", "/tmp/x"),
    ("VLLM_ASSETS_CACHE", "/tmp/x"), ("VLLM_SERVER_DEV_MODE", "1"),
    ("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1"), ("VLLM_TEST_FORCE_LOAD_FORMAT", "dummy"),
    ("CUDA_VISIBLE_DEVICES", ""),
    # ... and from vLLM's and SGLang's own lists (release tables):
    ("VLLM_PLUGINS", "evil"), ("VLLM_HOST_IP", "10.0.0.1"), ("VLLM_PORT", "1234"),
    ("VLLM_DP_MASTER_PORT", "1234"), ("VLLM_USE_MODELSCOPE", "1"),
    ("VLLM_ALLOW_INSECURE_SERIALIZATION", "1"), ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1"),
    ("VLLM_LOGGING_CONFIG_PATH", "/tmp/log.json"), ("VLLM_RPC_BASE_PATH", "/tmp"),
    ("VLLM_NCCL_SO_PATH", "/tmp/libnccl.so"), ("VLLM_CUDART_SO_PATH", "/tmp/x.so"),
    ("VLLM_TRACE_FUNCTION", "1"), ("VLLM_DEBUG_DUMP_PATH", "/tmp"),
    ("VLLM_USAGE_STATS_SERVER", "https://evil.example"), ("VLLM_NIXL_SIDE_CHANNEL_HOST", "0.0.0.0"),
    ("VLLM_MODEL_REDIRECT_PATH", "/tmp/x.json"), ("VLLM_CONFIG_ROOT", "/tmp"),
    ("VLLM_MEDIA_URL_ALLOW_REDIRECTS", "1"), ("VLLM_RAY_EXTRA_ENV_VARS_TO_COPY", "LD_PRELOAD"),
    ("VLLM_ENABLE_RESPONSES_API_STORE", "1"), ("VLLM_LORA_RESOLVER_CACHE_DIR", "/tmp"),
    ("SGLANG_PLUGINS", "evil"), ("SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE", "evil"),
    ("SGLANG_USE_MODELSCOPE", "1"), ("SGLANG_PORT", "1234"), ("SGLANG_NCCL_SO_PATH", "/tmp/x.so"),
    ("SGLANG_TORCH_PROFILER_DIR", "/tmp"), ("SGLANG_S3_ENDPOINT_URL", "https://evil.example"),
    ("SGLANG_LOGGING_CONFIG_PATH", "/tmp/x"), ("SGLANG_ZMQ_SOURCE_IP", "10.0.0.1"),
    ("SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE", "tcp://evil:1"), ("SGLANG_TEST_RETRACT", "1"),
    ("SGLANG_TEST_SCRIPTED_RUNTIME_SYS_PATH_ENTRY", "/tmp"), ("SGLANG_CACHE_DIR", "/tmp"),
    # ... and what the old families let through or any loader reads:
    ("NCCL_NET_PLUGIN", "/tmp/x.so"), ("NCCL_DEBUG_FILE", "/etc/x"), ("NCCL_TOPO_FILE", "/tmp/x"),
    ("NCCL_GRAPH_FILE", "/tmp/x"), ("NCCL_TUNER_PLUGIN", "/tmp/x.so"),
    ("NCCL_PROFILER_PLUGIN", "/tmp/x.so"), ("UCX_MODULE_DIR", "/tmp"),
    ("UCX_NET_DEVICES", "mlx5_0:1"), ("TRITON_PTXAS_PATH", "/tmp/ptxas"),
    ("TRITON_CACHE_DIR", "/tmp"), ("TORCHINDUCTOR_CACHE_DIR", "/tmp"),
    ("TORCH_EXTENSIONS_DIR", "/tmp"), ("CUDA_HOME", "/tmp"), ("CUDA_INJECTION64_PATH", "/tmp/x.so"),
    ("CUDA_MPS_PIPE_DIRECTORY", "/tmp"), ("FLASHINFER_CUBINS_REPOSITORY", "https://evil.example"),
    ("NVSHMEM_REMOTE_TRANSPORT", "none"), ("GLOO_DEVICE_TRANSPORT", "tcp"),
    ("LD_PRELOAD", "/tmp/x.so"), ("LD_LIBRARY_PATH", "/tmp"), ("PATH", "/tmp"),
    ("PYTHONPATH", "/tmp"), ("PYTHONSTARTUP", "/tmp/x.py"), ("HF_ENDPOINT", "https://evil.example"),
    ("HF_HUB_OFFLINE", "0"), ("HF_TOKEN", "hf_x"), ("HTTPS_PROXY", "http://evil.example"),
    ("http_proxy", "http://evil.example"), ("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync"),
    ("TORCH_CUDA_ARCH_LIST", "12.1a"),
    # The platform's own: set by serving.jit_cache, never by a configuration.
    ("VLLM_CACHE_ROOT", "/var/cache/diag/vllm"), ("FLASHINFER_WORKSPACE_BASE", "/var/cache/diag/fi"),
]


def test_the_hostile_table_holds_the_issues_names_and_twenty_more_from_the_engines() -> None:
    names = {n for n, _ in HOSTILE}
    reads = set().union(*(env_policy.version_reads(e, v) for e, v in VERSIONS))
    issue = {"UCX_GDB_COMMAND", "UCX_HANDLE_ERRORS", "UCX_ERROR_SIGNALS", "TRITON_CACHE_MANAGER",
             "NCCL_COMM_ID", "VLLM_DP_MASTER_IP", "SGLANG_EXTERNAL_MODEL_PACKAGE",
             "VLLM_TUNED_CONFIG_FOLDER", "VLLM_ASSETS_CACHE", "VLLM_SERVER_DEV_MODE",
             "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "VLLM_TEST_FORCE_LOAD_FORMAT", "CUDA_VISIBLE_DEVICES"}
    assert issue <= names
    assert len((names - issue) & reads) >= 20


@pytest.mark.parametrize(("engine", "version"), VERSIONS)
@pytest.mark.parametrize(("name", "value"), HOSTILE, ids=[n for n, _ in HOSTILE])
def test_a_hostile_variable_is_refused_at_intake_and_on_the_node(
        name: str, value: str, engine: str, version: str) -> None:
    err = refusal({name: value}, engine, version)
    assert err.field == f"env.{name}"
    if name not in PLATFORM_ENV:
        assert name not in (env_policy.agent_permitted(engine, version) or {})
        problem = on_node({name: value}, engine, version)
        assert problem is not None and problem[0] == f"env.{name}"
        assert "is not a variable the lab permits for" in problem[1]


# -- what is accepted, per engine and version --------------------------------------------------
ACCEPTED = [
    # (engine, version, env)
    ("vllm", "0.34.0", {"NCCL_SOCKET_IFNAME": "enP7s7", "GLOO_SOCKET_IFNAME": "enP7s7",
                        "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0"}),  # triage's rendezvous fix
    ("vllm", "0.34.0", {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}),
    ("vllm", "0.34.0", {"NCCL_SOCKET_IFNAME": "^docker0,lo", "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"}),
    ("vllm", "0.34.0", {"NCCL_ALGO": "^NVLS", "NCCL_PROTO": "LL,LL128", "NCCL_IB_TIMEOUT": "22"}),
    ("vllm", "0.34.0", {"OMP_NUM_THREADS": "8", "CUDA_MODULE_LOADING": "LAZY",
                        "TOKENIZERS_PARALLELISM": "false"}),
    ("vllm", "0.34.0", {"VLLM_API_KEY": "sk-test-1234567890", "VLLM_LOGGING_LEVEL": "DEBUG",
                        "VLLM_USE_DEEP_GEMM": "0", "VLLM_LOG_STATS_INTERVAL": "2.5"}),
    ("vllm", "0.29.0", {"VLLM_ENGINE_ITERATION_TIMEOUT_S": "120"}),
    ("sglang", "0.5.23", {"SGLANG_ENABLE_JIT_DEEPGEMM": "0", "NCCL_SOCKET_IFNAME": "enP7s7"}),
    ("sglang", "0.5.12", {"SGLANG_CUTLASS_MOE": "1", "SGL_DG_USE_NVRTC": "1"}),
]


@pytest.mark.parametrize(("engine", "version", "env"), ACCEPTED)
def test_what_the_lab_permits_is_accepted_at_intake_and_on_the_node(
        engine: str, version: str, env: dict[str, str]) -> None:
    config = normalize_config({"engine": {"name": engine, "version": version}, "env": env})
    assert config["env"] == dict(sorted(env.items()))
    assert on_node(env, engine, version) is None


# -- a name the version does not read -----------------------------------------------------------
@pytest.mark.parametrize(("engine", "reads", "lacks", "name"), [
    ("vllm", "0.29.0", "0.34.0", "VLLM_ENGINE_ITERATION_TIMEOUT_S"),
    ("sglang", "0.5.12", "0.5.23", "SGLANG_CUTLASS_MOE"),
])
def test_a_variable_one_version_reads_and_another_does_not(engine: str, reads: str, lacks: str,
                                                           name: str) -> None:
    assert name in env_policy.permitted(engine, reads)
    err = refusal({name: "1"}, engine, lacks)
    label = env_policy.label(engine, lacks)
    assert err.problem.startswith(f"{label} does not read {name} (it is not among its "
                                  "environment variables); permitted for ")
    assert on_node({name: "1"}, engine, lacks) is not None


@pytest.mark.parametrize("version", ["0.29.0", "0.34.0"])
def test_a_belief_that_a_variable_pins_a_backend_is_answered_with_the_flag(version: str) -> None:
    err = refusal({"VLLM_NVFP4_GEMM_BACKEND": "cutlass"}, "vllm", version)
    assert err.problem == (f"vLLM {version} does not read VLLM_NVFP4_GEMM_BACKEND; the FP4 linear "
                           "backend is chosen by --linear-backend (set serving.linear_backend)")


def test_a_refusal_names_the_variable_the_version_and_the_whole_list() -> None:
    err = refusal({"UCX_GDB_COMMAND": "x"})
    assert str(err).startswith("env.UCX_GDB_COMMAND: is not a variable the lab permits for "
                               "vLLM 0.34.0; permitted for vLLM 0.34.0: ")
    assert not err.problem.endswith("…")
    listed = err.problem.split("permitted for vLLM 0.34.0: ", 1)[1].split(", ")
    assert listed == list(env_policy.permitted("vllm", "0.34.0"))
    # A pasted command's refusal names the variable as the customer wrote it.
    with pytest.raises(ConfigError) as pasted:
        normalize_config({"launch_command": "UCX_GDB_COMMAND=x vllm serve /models/kimi-k2"})
    assert pasted.value.field == "launch_command"
    assert pasted.value.problem.startswith("UCX_GDB_COMMAND: is not a variable the lab permits")


# -- values -------------------------------------------------------------------------------------
BAD_VALUES = [
    ("NCCL_SOCKET_IFNAME", "; rm -rf ~", "takes interface names"),
    ("NCCL_SOCKET_IFNAME", "eth0,,eth1", "takes interface names"),
    ("NCCL_SOCKET_IFNAME", "$(id)", "takes interface names"),
    ("NCCL_SOCKET_IFNAME", "eth0:1", "takes interface names"),  # ports are HCA's only
    ("NCCL_IB_HCA", "mlx5_0:x", "each optionally with :PORT"),
    ("GLOO_SOCKET_IFNAME", "", "takes interface names"),
    ("OMP_NUM_THREADS", "0", "takes a whole number from 1 to 1024"),
    ("OMP_NUM_THREADS", "8.5", "takes a whole number from 1 to 1024"),
    ("OMP_NUM_THREADS", "1e3", "takes a whole number from 1 to 1024"),
    ("VLLM_LOG_STATS_INTERVAL", "nan", "takes a number from 0.1 to 3600"),
    ("VLLM_LOG_STATS_INTERVAL", "inf", "takes a number from 0.1 to 3600"),
    ("NCCL_DEBUG", "EVERYTHING", "takes one of VERSION, WARN, INFO, TRACE"),
    ("NCCL_DEBUG_SUBSYS", "INIT,EVIL", "takes a comma-separated list of"),
    ("NCCL_PROTO", "LL;Simple", "takes a comma-separated list of LL, LL128, Simple"),
    ("VLLM_USE_DEEP_GEMM", "true", "takes 0 or 1"),  # vLLM reads it with int(): it would crash
    ("VLLM_USE_DEEP_GEMM", "2", "takes 0 or 1"),
]


@pytest.mark.parametrize(("name", "value", "rule"), BAD_VALUES, ids=[f"{n}={v}" for n, v, _ in BAD_VALUES])
def test_a_value_breaking_its_rule_is_refused_naming_the_rule(name: str, value: str, rule: str) -> None:
    err = refusal({name: value})
    assert err.field == f"env.{name}"
    assert f"is not accepted; {name} " in err.problem and rule in err.problem
    problem = on_node({name: value})
    assert problem is not None and problem[0] == f"env.{name}" and rule in problem[1]


def test_a_secret_is_never_quoted_back() -> None:
    assert "sk-" not in refusal({"VLLM_API_KEY": "sk-abcdef123456\n"}).problem


@pytest.mark.parametrize(("value", "ok"), [
    (f"{CACHE}/vllm", True), (CACHE, True), (f"{CACHE}/a/b", True),
    ("/etc", False), (f"{CACHE}/../etc", False), (f"{CACHE}/vllm/../../x", False),
    ("vllm", False), (f"{CACHE}x/vllm", False), (f"{CACHE}//vllm", False), ("", False),
])
def test_a_platform_path_must_lie_inside_the_nodes_cache_volume(value: str, ok: bool) -> None:
    problem = on_node({"VLLM_CACHE_ROOT": value})
    assert (problem is None) == ok, problem
    if not ok:
        assert problem is not None and "inside the node's cache volume (/var/cache/diag)" in problem[1]


def test_a_spec_without_a_known_version_sets_no_variable_on_the_node() -> None:
    assert on_node({"NCCL_DEBUG": "INFO"}, "vllm", None) == (
        "version", "'vllm' None is not an engine version the environment policy knows, so no "
        "variable may be set; known: sglang 0.5.12, sglang 0.5.23, vllm 0.29.0, vllm 0.34.0")
    assert on_node({}, "vllm", None) is None


# -- what the platform itself sets passes --------------------------------------------------------
@pytest.mark.parametrize(("engine", "version"), VERSIONS)
def test_everything_the_platform_renders_or_the_pipelines_set_is_permitted(engine: str,
                                                                          version: str) -> None:
    config_env = {**OBSERVATION_ENV,  # triage's own starts
                  "NCCL_SOCKET_IFNAME": "enP7s7", "GLOO_SOCKET_IFNAME": "enP7s7",
                  "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0"}  # the rendezvous fix
    if engine == "vllm":
        config_env["VLLM_API_KEY"] = "diag-0123456789abcdef"  # the session's engine key
    assert normalize_config({"engine": {"name": engine, "version": version},
                             "env": config_env})["env"] == dict(sorted(config_env.items()))
    node = Node(name="n", host="h", port=22, user="u", key_file=Path("k"), role="head",
                mgmt_nic="eth0", data_nics=(), data_addr="10.0.0.1", model_dir="/models",
                cache_dir=CACHE, work_dir="/var/lib/diag", api_port=8000, python="python3")
    for jit, per_launch in (("persisted", False), ("ephemeral", True)):
        caches = jit_cache_env(engine, version, jit, node, per_launch=per_launch)
        assert caches and set(caches) <= set(JIT_CACHE_ENV)
        assert on_node({**config_env, **caches}, engine, version) is None


def test_the_policy_agrees_with_the_tables_and_lab_config() -> None:
    assert set(env_policy.load_policy()["platform"]) == PLATFORM_ENV
    for engine in ("vllm", "sglang"):
        assert env_policy.modelled(engine) == modelled_versions(engine)
        for version in modelled_versions(engine):
            table = release(engine, version)["env"]
            reads = set(table["registry"]) | set(table["read_directly"])
            assert set(env_policy.engine_variables(engine, version)) <= reads | set(
                table.get("deprecated_aliases") or {})
    # Every engine variable the policy lists is read by at least one modelled version.
    for engine, body in env_policy.load_policy()["engines"].items():
        read = set().union(*(env_policy.version_reads(engine, v) for v in modelled_versions(engine)))
        assert set(body["variables"]) <= read, set(body["variables"]) - read


def test_the_compiled_policy_is_what_intake_permits() -> None:
    compiled = env_policy.compiled_policy()
    for engine, version in VERSIONS:
        on_node_names = set(env_policy.agent_permitted(engine, version) or {})
        assert on_node_names == set(env_policy.permitted(engine, version)) | PLATFORM_ENV
        for name in on_node_names - PLATFORM_ENV:
            assert env_name_problem(name, engine, version) is None
    assert compiled["schema"] == "lab.env-policy/1"


def test_each_vllm_rank_names_its_own_address_and_nothing_else_does() -> None:
    # The lab sets VLLM_HOST_IP (vLLM's head binds its broadcast queue to it, else to the
    # default-route interface): a configuration may not; the node holds it to an IP address
    # (and, resolved on the node, to one of its own: tests/lab/agent).
    assert "the lab sets this from each rank's own data-network address" in refusal(
        {"VLLM_HOST_IP": "10.0.0.1"}, "vllm", "0.34.0").problem
    assert on_node({"VLLM_HOST_IP": "10.11.0.11"}, "vllm", "0.34.0") is None
    problem = on_node({"VLLM_HOST_IP": "10.0.0.1; id"}, "vllm", "0.34.0")
    assert problem is not None and "takes an IP address" in problem[1]


def test_an_sgl_variable_0_5_23_renamed_points_to_its_new_name() -> None:
    # 0.5.12 reads SGL_DG_USE_NVRTC and SGLANG_DG_USE_NVRTC; 0.5.23 only the SGLANG_ one
    # (both releases' tables): the refusal names the variable to set instead.
    assert env_name_problem("SGL_DG_USE_NVRTC", "sglang", "0.5.12") is None
    problem = env_name_problem("SGL_DG_USE_NVRTC", "sglang", "0.5.23")
    assert problem == "SGLang 0.5.23 does not read SGL_DG_USE_NVRTC; it reads SGLANG_DG_USE_NVRTC instead"
    with pytest.raises(ConfigError, match="it reads SGLANG_DG_USE_NVRTC instead") as err:
        normalize_config({"engine": {"name": "sglang", "version": "0.5.23"},
                          "env": {"SGL_DG_USE_NVRTC": "1"}})
    assert err.value.field == "env.SGL_DG_USE_NVRTC"
    assert on_node({"SGL_DG_USE_NVRTC": "1"}, "sglang", "0.5.23") is not None


def test_a_variable_vllm_removed_is_refused_with_the_releases_own_hint() -> None:
    # vllm 0.34.0's envs.py removed_environment_variables: setting one is an error at start.
    with pytest.raises(ConfigError, match=r"vLLM 0\.34\.0 removed VLLM_MARLIN_INPUT_DTYPE and refuses to "
                                          r"start with it set: Marlin no longer supports 8-bit "
                                          r"activations\. Use `--quantization humming`") as err:
        normalize_config({"engine": {"name": "vllm", "version": "0.34.0"},
                          "env": {"VLLM_MARLIN_INPUT_DTYPE": "int8"}})
    assert err.value.field == "env.VLLM_MARLIN_INPUT_DTYPE"
    assert "removed" not in (env_name_problem("VLLM_MARLIN_INPUT_DTYPE", "vllm", "0.29.0") or "")
