"""LabSession end to end against a real sshd node running the real agent.

There is no vLLM here, so the node's PATH holds a stand-in `vllm` program: it records
the argv and environment it was started with and answers /health on its --port. That is
enough to prove the path a customer value takes: configuration -> rendered launch spec
-> SFTP -> agent -> engine argv, without any shell on the way.
"""

from __future__ import annotations

import hashlib
import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.config import PER_LAUNCH_CACHE, ConfigError
from lab.engines import normalize_config
from lab.session import AgentError, LabSession, LaunchFailed, spec_sha256

from .conftest import Sshd, engine_python

pytestmark = pytest.mark.ssh

FAKE_ENGINE = """#!{python}
import json, os, sys, http.server
port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 0
with open(os.path.join(os.getcwd(), "engine-argv.json"), "w") as fh:
    env = {{k: v for k, v in os.environ.items() if k.startswith(("NCCL", "VLLM", "TRITON"))}}
    json.dump({{"argv": sys.argv, "env": env}}, fh)
if os.path.exists("fail-with"):
    # As vLLM refuses a KV cache that cannot hold one request: an uncaught exception, whose
    # traceback Python prints on stderr (the agent sends it to the log) before exiting 1.
    print("INFO 10-11 10:42:13 [gpu_worker.py:298] Available KV cache memory: 0.37 GiB", flush=True)
    raise ValueError("not enough memory for KV cache: " + open("fail-with").read())
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
print("Starting vLLM API server 0 on http://0.0.0.0:%d" % port, flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def session(sshd: Sshd) -> Iterator[LabSession]:
    engine = sshd.bin_dir / "vllm"
    engine.write_text(FAKE_ENGINE.format(python=engine_python()))
    engine.chmod(0o755)
    (sshd.root / "models").mkdir()
    (sshd.root / "models" / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    inv = sshd.inventory(api_port=free_port(), python=sys.executable)
    s = LabSession(inv)
    yield s
    s.stop()
    s.close()


def one_node_config(speculative: dict[str, object] | None = None, **serving: object) -> dict[str, object]:
    return normalize_config({
        "schema": "diagnostic.config/1",
        "engine": {"name": "vllm", "version": "0.34.0"},
        "model": {"id": "moonshotai/Kimi-K2-Instruct-0905", "quantization": "nvfp4",
                  "path": "/models/kimi-k2"},
        "cluster": {"nodes": 1, "node_type": "dgx-spark", "link_gbps": 100},
        "parallel": {"tp": 1, "pp": 1, "expert_parallel": False},
        "serving": serving,
        "speculative": speculative,
        "workloads": ["code"],
    })


def test_it_pushes_the_agent_and_verifies_its_checksum(session: LabSession, sshd: Sshd) -> None:
    session.push_agent()
    node = session.inventory.head
    assert Path(node.agent_path).read_bytes().startswith(b"#!")
    facts = session.facts()
    assert facts["node-a"]["cpu_count"] >= 1
    assert facts["node-a"]["model_dir"]["exists"] is True


def test_a_hostile_configuration_value_is_refused_before_any_node_sees_it(
    session: LabSession, sshd: Sshd
) -> None:
    config = one_node_config()
    config["model"]["id"] = "$(touch owned)"  # type: ignore[index]
    # The served model name is held to the rule the release's flag list gives
    # --served-model-name (the agent's own check): shell syntax never reaches a node.
    with pytest.raises(ConfigError) as info:
        session.launch(config, cold=False, timeout_s=60)
    assert info.value.field == "model.id"
    assert "the served model name takes a name of letters, digits" in str(info.value)
    assert not list(sshd.root.rglob("owned"))
    assert not (Path(session.inventory.head.work_dir) / "engine-argv.json").exists()


def test_configuration_values_reach_the_engine_as_literal_arguments(
    session: LabSession, sshd: Sshd
) -> None:
    config = one_node_config()
    # An env value is held to its rule (an interface name here).
    config["env"] = {"NCCL_SOCKET_IFNAME": "lo"}
    config["extra_args"] = ["--max-num-seqs", "4", "--seed", "7"]
    result = session.launch(config, cold=False, timeout_s=60)
    assert result.endpoint == f"http://127.0.0.1:{session.inventory.head.api_port}"
    seen = json.loads((Path(session.inventory.head.work_dir) / "engine-argv.json").read_text())
    assert seen["argv"][-5:] == ["--max-num-seqs", "4", "--seed", "7", "--trust-remote-code"]
    assert seen["env"]["NCCL_SOCKET_IFNAME"] == "lo"
    assert result.cold_start_s > 0
    assert "Starting vLLM API server" in session.logs().text


def test_a_launch_that_dies_says_what_the_engine_said(session: LabSession) -> None:
    config = one_node_config()
    why = "the estimated maximum model length is 1863"
    work = Path(session.inventory.head.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    (work / "fail-with").write_text(why)  # the stand-in engine's cue to fail
    with pytest.raises(LaunchFailed) as info:
        session.launch(config, cold=False, timeout_s=60)
    failed = info.value
    assert "Traceback (most recent call last):" in failed.log_tail
    # The final exception line of the engine's traceback, not only its exit code.
    assert failed.exit_code == 1
    assert failed.engine_error == f"ValueError: not enough memory for KV cache: {why}"
    assert failed.reason == f"engine exited with code 1: {failed.engine_error}"
    assert str(failed) == f"node-a: the engine did not start: {failed.reason}"


def test_it_fetches_the_tokenizer_from_the_model_directory(session: LabSession, tmp_path: Path) -> None:
    path = session.tokenizer_path(tmp_path)
    assert json.loads(path.read_text())["model"]["type"] == "BPE"


def test_the_sessions_own_tokenizer_copy_is_fetched_once(session: LabSession, sshd: Sshd) -> None:
    first = session.tokenizer_path()
    (sshd.root / "models" / "tokenizer.json").write_text('{"model": {"type": "changed"}}')
    again = session.tokenizer_path()
    assert again == first and json.loads(again.read_text())["model"]["type"] == "BPE"
    session.close()  # the copy goes with the session; a new one is fetched afterwards
    assert not first.exists()
    assert json.loads(session.tokenizer_path().read_text())["model"]["type"] == "changed"


def test_the_end_of_a_log_is_one_agent_call(session: LabSession, monkeypatch: pytest.MonkeyPatch) -> None:
    session.launch(one_node_config(), cold=False, timeout_s=60)
    verbs: list[tuple[str, ...]] = []
    real = session.agent

    def counted(node: str, *args: str, **kw: float) -> dict[str, object]:
        verbs.append(args)
        return real(node, *args, **kw)

    monkeypatch.setattr(session, "agent", counted)
    end = session.logs(tail_bytes=0)
    assert len(verbs) == 1 and end.text == "" and end.offset == end.next_offset == end.size > 0
    assert "Starting vLLM API server" in session.logs(tail_bytes=end.size).text


def test_it_knows_which_configuration_the_node_runs_from_the_agents_spec_hash(session: LabSession) -> None:
    eagle = {"method": "eagle3", "draft_model": "AQ-MedAI/Kimi-K2-Instruct-eagle3"}
    ours = one_node_config({**eagle, "num_speculative_tokens": 4})
    other = one_node_config({**eagle, "num_speculative_tokens": 3})
    assert session.serves(ours) is False  # nothing launched yet
    session.launch(ours, cold=False, timeout_s=60)
    assert session.serves(ours) is True
    state = session.serving_state(other)
    assert (state.serving, state.other_nodes, state.idle_nodes) == (False, ["node-a"], [])
    # The real agent hashed the very bytes the session wrote over SFTP.
    written = (Path(session.inventory.head.work_dir) / "launch" / "spec.json").read_bytes()
    assert state.status["node-a"]["spec_sha256"] == hashlib.sha256(written).hexdigest() \
        == spec_sha256(session.specs_for(ours)[0])
    session.stop()
    stopped = session.serving_state(ours)
    assert (stopped.serving, stopped.idle_nodes) == (False, ["node-a"])


def test_an_engine_started_with_observation_env_serves_the_configuration_without_it(
        session: LabSession) -> None:
    # Triage starts with NCCL_DEBUG=INFO to read the rendezvous; the stage after it measures
    # that engine instead of restarting it for one variable that only adds log lines.
    ours = one_node_config()
    observed = {**ours, "env": {**(ours.get("env") or {}), "NCCL_DEBUG": "INFO"}}
    session.launch(observed, cold=False, timeout_s=60)
    assert session.serves(ours) is True
    assert session.serves(observed) is True
    # Any other variable is another configuration.
    other = {**ours, "env": {**(ours.get("env") or {}), "NCCL_DEBUG": "WARN"}}
    assert session.serving_state(other).other_nodes == ["node-a"]


# -- the environment on the node ------------------------------------------------------------
# The agent is pushed with the lab's environment policy inside it: a launch spec written by
# anything but the platform's intake is held to the same list and value rules there.
HOSTILE_ENV = [
    ("UCX_GDB_COMMAND", "bash -c 'touch owned'"),
    ("UCX_HANDLE_ERRORS", "debug"),
    ("TRITON_CACHE_MANAGER", "os:system"),
    ("NCCL_COMM_ID", "10.0.0.1:1234"),
    ("VLLM_DP_MASTER_IP", "10.0.0.1"),
    ("VLLM_SERVER_DEV_MODE", "1"),
    ("CUDA_VISIBLE_DEVICES", ""),
    ("LD_PRELOAD", "/tmp/x.so"),
    ("NCCL_SOCKET_IFNAME", "; rm -rf ~ ; touch owned"),
    ("OMP_NUM_THREADS", "0"),
    ("VLLM_CACHE_ROOT", "/etc"),
    ("VLLM_CACHE_ROOT", "CACHE/../../etc"),
    ("VLLM_CACHE_ROOT", "CACHE/escape/vllm"),  # a symbolic link out of the volume
]


def hand_written_spec(session: LabSession, env: dict[str, str]) -> str:
    """A launch spec placed on the node without the platform's intake, as the platform's
    own would be for one_node_config() but with `env`; its path on the node."""
    spec = {**session.uploaded_specs(one_node_config())[0], "env": env}
    node = session.inventory.head
    path = f"{node.work_dir}/launch/hand.json"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize(("name", "value"), HOSTILE_ENV, ids=[f"{n}={v}" for n, v in HOSTILE_ENV])
def test_a_spec_written_by_other_means_is_refused_by_the_agent(
        session: LabSession, sshd: Sshd, name: str, value: str) -> None:
    cache = sshd.root / "cache"
    cache.mkdir(exist_ok=True)
    escape = cache / "escape"
    if not escape.is_symlink():
        escape.symlink_to(sshd.root / "models")
    value = value.replace("CACHE", str(cache))
    # Intake refuses it first, with the variable's name.
    with pytest.raises(ConfigError) as refused:
        normalize_config({**one_node_config(), "env": {name: value}})
    assert refused.value.field == f"env.{name}"
    session.push_agent()
    path = hand_written_spec(session, {name: value})
    with pytest.raises(AgentError) as info:
        session.agent("node-a", "launch", "--spec", path)
    assert info.value.code == "invalid_spec"
    assert info.value.message.startswith(f"spec.env.{name}:"), info.value.message
    if "escape" in value:  # inside the volume as written; outside once resolved on the node
        assert "symbolic link" in info.value.message
    assert not (Path(session.inventory.head.work_dir) / "engine-argv.json").exists()
    assert not list(sshd.root.rglob("owned"))


def test_the_agent_names_the_list_when_it_refuses_a_variable(session: LabSession) -> None:
    session.push_agent()
    path = hand_written_spec(session, {"VLLM_TUNED_CONFIG_FOLDER": "/tmp/x"})
    with pytest.raises(AgentError) as info:
        session.agent("node-a", "launch", "--spec", path)
    message = info.value.message
    assert "is not a variable the lab permits for vLLM 0.34.0; permitted: " in message
    for name in ("NCCL_SOCKET_IFNAME", "VLLM_API_KEY", "VLLM_CACHE_ROOT", "OMP_NUM_THREADS"):
        assert name in message


def test_the_platforms_own_cache_paths_pass_on_the_node(session: LabSession, sshd: Sshd) -> None:
    # serving.jit_cache: persisted renders VLLM_CACHE_ROOT and FlashInfer's workspace inside
    # the node's cache volume, which the node's agent config names.
    config = one_node_config(jit_cache="persisted")
    session.launch(config, cold=False, timeout_s=60)
    seen = json.loads((Path(session.inventory.head.work_dir) / "engine-argv.json").read_text())
    assert seen["env"]["VLLM_CACHE_ROOT"] == f"{sshd.root / 'cache'}/vllm"
    assert seen["env"]["TRITON_CACHE_DIR"] == f"{sshd.root / 'cache'}/triton"
    # An ephemeral cache is the volume's per-launch folder, which the agent made empty.
    session.stop()
    session.launch(one_node_config(), cold=False, timeout_s=60)
    seen = json.loads((Path(session.inventory.head.work_dir) / "engine-argv.json").read_text())
    assert seen["env"]["VLLM_CACHE_ROOT"] == f"{sshd.root / 'cache'}/{PER_LAUNCH_CACHE}/vllm"
    assert (sshd.root / "cache" / PER_LAUNCH_CACHE).is_dir()


def test_the_lab_runs_a_configuration_with_its_evidence_on(session: LabSession) -> None:
    config = one_node_config()
    config["extra_args"] = ["--disable-log-stats"]
    config["env"] = {"VLLM_LOGGING_LEVEL": "ERROR"}
    [spec] = session.specs_for(config)
    assert "--disable-log-stats" not in spec["argv"]
    assert "VLLM_LOGGING_LEVEL" not in spec["env"]
