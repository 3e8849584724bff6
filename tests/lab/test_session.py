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

from lab.engines import normalize_config
from lab.session import LabSession, LaunchFailed, spec_sha256

from .conftest import Sshd

pytestmark = pytest.mark.ssh

FAKE_ENGINE = """#!{python}
import json, os, sys, http.server
port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 0
with open(os.path.join(os.getcwd(), "engine-argv.json"), "w") as fh:
    env = {{k: v for k, v in os.environ.items() if k.startswith(("NCCL", "VLLM"))}}
    json.dump({{"argv": sys.argv, "env": env}}, fh)
if os.environ.get("VLLM_FAKE_ENGINE_FAIL"):
    # As vLLM refuses a KV cache that cannot hold one request: an uncaught exception, whose
    # traceback Python prints on stderr (the agent sends it to the log) before exiting 1.
    print("INFO 10-11 10:42:13 [gpu_worker.py:298] Available KV cache memory: 0.37 GiB", flush=True)
    raise ValueError("not enough memory for KV cache: " + os.environ["VLLM_FAKE_ENGINE_FAIL"])
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
    engine.write_text(FAKE_ENGINE.format(python=sys.executable))
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


def test_a_hostile_configuration_value_reaches_the_engine_as_one_literal_argument(
    session: LabSession, sshd: Sshd
) -> None:
    config = one_node_config()
    config["model"]["id"] = "$(touch owned)"  # type: ignore[index]
    config["env"] = {"NCCL_SOCKET_IFNAME": "; rm -rf ~ ; touch owned"}
    result = session.launch(config, cold=False, timeout_s=60)
    assert result.endpoint == f"http://127.0.0.1:{session.inventory.head.api_port}"
    seen = json.loads((Path(session.inventory.head.work_dir) / "engine-argv.json").read_text())
    assert "$(touch owned)" in seen["argv"]
    assert seen["env"]["NCCL_SOCKET_IFNAME"] == "; rm -rf ~ ; touch owned"
    assert not list(sshd.root.rglob("owned"))
    assert not (Path.home() / "owned").exists()
    assert result.cold_start_s > 0
    assert "Starting vLLM API server" in session.logs().text


def test_a_launch_that_dies_says_what_the_engine_said(session: LabSession) -> None:
    config = one_node_config()
    why = "the estimated maximum model length is 1863"
    config["env"] = {"VLLM_FAKE_ENGINE_FAIL": why}
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
