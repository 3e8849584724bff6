"""The engine never runs with the agent's privileges or environment: as root the agent
starts it as the node's service user, always with the node's fixed PATH and an
environment built from allow-lists, and it refuses a spec that sets a variable a
configuration may not; only drop-caches asks for privilege, through one sudo command."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import lab.config
import lab.env_policy
import lab.flag_policy
from lab.agent import AGENT_PATH, validate_response
from tests.lab.agent.conftest import (
    ENGINE_ARGV,
    Answer,
    Node,
    pushed_agent,
    run_agent,
    wait_until,
    write_spec,
)
from tests.lab.conftest import engine_user

NOBODY = 65534
SHOW_USER_AND_ENV = ("import os\nprint(os.getuid())\n"
                     "print('\\n'.join(f'{k}={v}' for k, v in sorted(os.environ.items())), flush=True)\n")


def load_agent_module(path: Path = AGENT_PATH):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("node_agent", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def agent_with(config: dict[str, object] | str, tmp_path: Path, *args: str,
               **env: str) -> Answer:
    path = tmp_path / "node-agent.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return run_agent(*args, env={**os.environ, "LAB_AGENT_CONFIG": str(path), **env})


def launched(node: Node, tmp_path: Path, config: dict[str, object],
             spec_env: dict[str, str] | None = None, **agent_env: str) -> tuple[Answer, str]:
    node.behave(SHOW_USER_AND_ENV)
    log = node.work_dir / "logs" / "engine.log"
    spec = write_spec(node.work_dir / "spec.json", ENGINE_ARGV, str(log), env=spec_env)
    ans = agent_with(config, tmp_path, "launch", "--spec", str(spec), "--work-dir",
                     str(node.work_dir), **agent_env)
    if not ans.envelope["ok"]:
        return ans, ""
    assert wait_until(lambda: log.exists() and "PATH=" in log.read_text())
    return ans, log.read_text()


def env_of(log: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in log.splitlines()[1:] if "=" in line)


def test_the_engine_gets_the_fixed_path_and_none_of_the_agents_loader_or_python_variables(
        node: Node, tmp_path: Path) -> None:
    config = {"engine_user": engine_user(), "engine_path": f"{node.bin_dir}:/usr/bin:/bin",
              "engine_env": {"HF_HOME": "/var/cache/diag/hf"}}
    ans, log = launched(
        node, tmp_path, config, {"NCCL_SOCKET_IFNAME": "eth0"},
        LD_LIBRARY_PATH="/tmp/evil", PYTHONPATH="/tmp/evil", PYTHONSTARTUP="/tmp/evil.py",
        https_proxy="http://proxy.example:3128", HF_ENDPOINT="https://hub.example",
        SSH_CONNECTION="10.0.0.1 1 10.0.0.2 22", LANG="C.UTF-8", PATH="/tmp/evil:/usr/bin:/bin")
    assert ans.envelope["ok"], ans.envelope
    env = env_of(log)
    assert env["PATH"] == f"{node.bin_dir}:/usr/bin:/bin"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"  # the spec's, allow-listed
    assert env["HF_HOME"] == "/var/cache/diag/hf"  # the operator's
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["LANG"] == "C.UTF-8"  # locale is kept
    for name in ("LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "https_proxy", "HF_ENDPOINT",
                 "SSH_CONNECTION", "LAB_AGENT_CONFIG"):
        assert name not in env, name


def test_argv0_is_looked_up_on_the_engine_path_not_the_agents(node: Node, tmp_path: Path) -> None:
    decoy = tmp_path / "bin"
    decoy.mkdir()
    (decoy / "vllm").write_text("#!/bin/sh\necho decoy\n")
    (decoy / "vllm").chmod(0o755)
    ans, _ = launched(node, tmp_path, {"engine_user": engine_user(), "engine_path": "/usr/bin:/bin"},
                      PATH=f"{decoy}:/usr/bin:/bin")
    assert ans.error["code"] == "launch_failed"
    assert "not found on the engine PATH /usr/bin:/bin" in ans.error["message"]


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PATH", "PYTHONPATH",
                                  "HF_ENDPOINT", "HTTPS_PROXY", "NCCL_NET_PLUGIN", "UCX_MODULE_DIR",
                                  "DIAG_ANYTHING", "UCX_GDB_COMMAND", "TRITON_CACHE_MANAGER",
                                  "NCCL_COMM_ID", "VLLM_DP_MASTER_IP", "VLLM_SERVER_DEV_MODE",
                                  "CUDA_VISIBLE_DEVICES"])
def test_a_spec_that_sets_a_refused_variable_is_invalid(name: str, work_dir: Path) -> None:
    path = write_spec(work_dir / "spec.json", ENGINE_ARGV, "engine.log", env={name: "x"})
    ans = run_agent("launch", "--spec", str(path), "--work-dir", str(work_dir))
    assert ans.error["code"] == "invalid_spec"
    assert ans.error["message"].startswith(f"spec.env.{name}:"), ans.error["message"]
    assert not (work_dir / "engine.json").exists()


def test_as_root_the_engine_runs_as_the_service_user(node: Node, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the agent switches users only when it runs as root")
    ans, log = launched(node, tmp_path, {"engine_user": "nobody",
                                         "engine_path": f"{node.bin_dir}:/usr/bin:/bin"})
    assert ans.envelope["ok"], ans.envelope
    assert log.splitlines()[0] == str(NOBODY)
    env = env_of(log)
    assert env["USER"] == "nobody"
    record = json.loads((node.work_dir / "engine.json").read_text())
    assert record["user"] == "nobody"
    # stop, as root, still takes the service user's engine down.
    stopped = run_agent("stop", "--work-dir", str(node.work_dir), "--grace", "1")
    assert stopped.envelope["ok"]


def test_as_root_a_missing_service_user_refuses_the_launch(node: Node, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the agent switches users only when it runs as root")
    ans, _ = launched(node, tmp_path, {"engine_user": "diag-no-such-user",
                                       "engine_path": f"{node.bin_dir}:/usr/bin:/bin"})
    assert ans.error["code"] == "not_permitted"
    assert "'diag-no-such-user' does not exist" in ans.error["message"]
    assert not (node.work_dir / "engine.json").exists()


def test_an_engine_never_runs_as_root(node: Node, tmp_path: Path) -> None:
    """A node config naming root is refused before anything is created: the log is not
    opened, no earlier log is moved aside."""
    if os.geteuid() != 0:
        pytest.skip("needs root: only a root agent could start a root engine")
    (node.work_dir / "logs").mkdir()
    (node.work_dir / "logs" / "engine.log").write_text("the last launch\n")
    ans, _ = launched(node, tmp_path, {"engine_user": "root",
                                       "engine_path": f"{node.bin_dir}:/usr/bin:/bin"})
    assert ans.error["code"] == "not_permitted"
    assert "is root; engines run customers' configurations and never as root" in ans.error["message"]
    assert (node.work_dir / "logs" / "engine.log").read_text() == "the last launch\n"
    assert not (node.work_dir / "logs" / "engine.log.1").exists()
    assert not (node.work_dir / "engine.json").exists()


@pytest.mark.parametrize(("config", "says"), [
    ("{not json", "cannot read it"),
    ('["a"]', "must hold a JSON object"),
    ('{"engine_user": 0}', "engine_user must be a string"),
    ('{"engine_env": {"A": 1}}', "engine_env must be a mapping of strings"),
    ('{"run_as_root": true}', "unknown key 'run_as_root'"),
])
def test_a_malformed_node_config_refuses_the_launch(config: str, says: str, work_dir: Path,
                                                    tmp_path: Path) -> None:
    path = write_spec(work_dir / "spec.json", ENGINE_ARGV, "engine.log")
    ans = agent_with(config, tmp_path, "launch", "--spec", str(path), "--work-dir", str(work_dir))
    assert ans.error["code"] == "not_permitted"
    assert says in ans.error["message"]


def test_the_pushed_agent_holds_the_platforms_policies() -> None:
    agent = load_agent_module(pushed_agent())
    assert agent.env_policy() == lab.env_policy.compiled_policy()
    assert agent.flag_policy() == json.loads(lab.flag_policy.policy_json())
    # The file in the repository holds neither: a copy that was not pushed launches nothing.
    assert load_agent_module(AGENT_PATH).env_policy() is None
    assert load_agent_module(AGENT_PATH).flag_policy() is None
    names = ["NCCL_IB_HCA", "VLLM_USE_FLASHINFER_MOE_FP4", "OMP_NUM_THREADS", "LD_PRELOAD",
             "PATH", "PYTHONPATH", "HF_TOKEN", "NCCL_NET_PLUGIN", "VLLM_HOST_IP", "CUDA_HOME",
             "TORCH_CUDA_ARCH_LIST", "http_proxy", "SGL_ENABLE_JIT_DEEPGEMM", "VLLM_API_KEY",
             "VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE"]
    for engine, version in (("vllm", "0.29.0"), ("vllm", "0.34.0"), ("sglang", "0.5.12"),
                            ("sglang", "0.5.23")):
        on_node = agent.permitted_env(agent.env_policy(), engine, version)
        for name in names:
            platform_ok = lab.config.env_name_problem(name, engine, version) is None
            # The node also takes the platform's own variables (the JIT cache folders, each
            # vLLM rank's address), which intake refuses in a configuration.
            own = name in (*lab.config.JIT_CACHE_ENV, lab.config.HOST_IP_ENV)
            assert (name in on_node) == (platform_ok or own), (engine, version, name)


def test_a_copy_that_was_not_pushed_launches_nothing(work_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "agent.py"
    shutil.copyfile(AGENT_PATH, copy)
    path = write_spec(work_dir / "spec.json", ENGINE_ARGV, "engine.log",
                      env={"NCCL_SOCKET_IFNAME": "eth0"})
    res = subprocess.run([sys.executable, str(copy), "launch", "--spec", str(path),
                          "--work-dir", str(work_dir), "--json"], capture_output=True, text=True,
                         timeout=60)
    error = json.loads(res.stdout)["error"]
    assert error["code"] == "invalid_spec"
    assert error["message"].startswith("spec.argv: this agent.py holds no flag policy")


def run_as_nobody(agent: Path, *args: str, **env: str) -> dict[str, object]:
    res = subprocess.run(["/usr/bin/python3", str(agent), *args, "--json"], capture_output=True,
                         text=True, user=NOBODY, group=NOBODY, extra_groups=[], cwd="/",
                         env={"PATH": "/usr/bin:/bin", **env}, timeout=60)
    envelope = json.loads(res.stdout)
    validate_response(envelope)
    return dict(envelope)


FAKE_SUDO = """#!/bin/sh
printf '%s\\n' "$@" > {out}/argv
cat > {out}/stdin
{then}
"""


@pytest.mark.parametrize("allowed", [True, False])
def test_without_root_drop_caches_asks_sudo_for_the_one_command(allowed: bool) -> None:
    if os.geteuid() != 0 or not Path("/usr/bin/python3").exists():
        pytest.skip("needs root (to become nobody) and /usr/bin/python3")
    public = Path(tempfile.mkdtemp(prefix="diag-sudo-", dir="/tmp"))
    try:
        public.chmod(0o777)
        agent = public / "agent.py"
        shutil.copyfile(AGENT_PATH, agent)
        sudo = public / "sudo"
        then = "exit 0" if allowed else "echo 'sudo: a password is required' >&2; exit 1"
        sudo.write_text(FAKE_SUDO.format(out=public, then=then))
        sudo.chmod(0o755)
        envelope = run_as_nobody(agent, "drop-caches", LAB_AGENT_SUDO=str(sudo))
        assert (public / "argv").read_text().split() == ["-n", "/usr/bin/tee",
                                                         "/proc/sys/vm/drop_caches"]
        assert (public / "stdin").read_text() == "3\n"
    finally:
        shutil.rmtree(public, ignore_errors=True)
    if allowed:
        assert envelope["ok"] is True
        assert envelope["data"]["dropped"] is True  # type: ignore[index]
    else:
        error = envelope["error"]
        assert error["code"] == "not_permitted"  # type: ignore[index]
        assert "a password is required" in error["message"]  # type: ignore[index]
        assert "sudoers rule" in error["message"]  # type: ignore[index]


CACHE_BEHAVIOUR = ("import os, pathlib\n"
                   "for var in ('VLLM_CACHE_ROOT', 'TRITON_CACHE_DIR'):\n"
                   "    folder = pathlib.Path(os.environ[var])\n"
                   "    folder.mkdir(parents=True, exist_ok=True)\n"
                   "    print(var, sorted(p.name for p in folder.iterdir()), flush=True)\n"
                   "    (folder / f'built-{os.getpid()}').write_text('kernels')\n"
                   "print('done', flush=True)\n")


def test_the_per_launch_cache_starts_empty_and_the_kept_one_does_not(node: Node, tmp_path: Path) -> None:
    # serving.jit_cache: ephemeral runs on the lab with its caches in the cache volume's
    # per-launch folder, which the agent empties before each launch (a start that compiles
    # as a container without a kept volume does); persisted folders are left as they are.
    cache = node.root / "cache"
    (cache / "triton").mkdir(parents=True)
    (cache / "triton").chmod(0o777)
    outside = node.root / "elsewhere"
    outside.mkdir()
    (outside / "keep").write_text("not the agent's to remove")
    (cache / lab.config.PER_LAUNCH_CACHE).symlink_to(outside)  # never followed
    config = {"engine_user": engine_user(), "engine_path": f"{node.bin_dir}:/usr/bin:/bin",
              "cache_dir": str(cache)}
    env = {"VLLM_CACHE_ROOT": f"{cache}/{lab.config.PER_LAUNCH_CACHE}/vllm",
           "TRITON_CACHE_DIR": f"{cache}/triton"}
    node.behave(CACHE_BEHAVIOUR)
    log = node.work_dir / "logs" / "engine.log"
    spec = write_spec(node.work_dir / "spec.json", ENGINE_ARGV, str(log), env=env)
    seen = []
    for _ in range(2):
        ans = agent_with(config, tmp_path, "launch", "--spec", str(spec), "--work-dir", str(node.work_dir))
        assert ans.envelope["ok"], ans.envelope
        assert wait_until(lambda: log.exists() and "done" in log.read_text())
        seen.append([line for line in log.read_text().splitlines() if line.startswith(("VLLM", "TRITON"))])
        assert wait_until(lambda: not agent_with(config, tmp_path, "status", "--work-dir", str(node.work_dir))
                          .envelope["data"]["running"])
    first, second = seen
    assert first == ["VLLM_CACHE_ROOT []", "TRITON_CACHE_DIR []"]
    assert second[0] == "VLLM_CACHE_ROOT []"  # emptied for the second launch
    assert second[1].startswith("TRITON_CACHE_DIR ['built-")  # kept across launches
    assert (outside / "keep").read_text() == "not the agent's to remove"
    assert not (cache / lab.config.PER_LAUNCH_CACHE).is_symlink()
