"""The node agent as the last gate (issue 36): a launch spec written by anything but the
platform is held to the same flag lists as intake. The engine's entry point only, every
flag an exact name of the release's list with a value its rule accepts, cwd and log_file
inside the work dir, all checked before anything on the node is created or moved."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.lab.agent.conftest import ENGINE_ARGV, Node, run_agent, wait_until, write_spec
from tests.lab.test_hostile_flags import HOOK, SGLANG_ATTACKS, VLLM_ATTACKS, _has

SGLANG_ARGV = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/kimi-k2",
               "--served-model-name", "moonshotai/Kimi-K2-Instruct-0905", "--tp-size", "8",
               "--trust-remote-code", "--enable-metrics"]


def _launch(work_dir: Path, argv: list[str], engine: str = "vllm", version: str = "0.34.0",
            **spec: object) -> dict:
    log = spec.pop("log_file", "logs/engine.log")
    path = write_spec(work_dir / "spec.json", argv, str(log), engine=engine, version=version, **spec)
    return run_agent("launch", "--spec", str(path), "--work-dir", str(work_dir)).envelope


def _refused(envelope: dict, field: str) -> str:
    assert envelope["ok"] is False, envelope
    assert envelope["error"]["code"] == "invalid_spec", envelope
    message = str(envelope["error"]["message"])
    assert message.startswith(f"spec.{field}:"), message
    return message


def _nothing_started(work_dir: Path) -> None:
    assert not (work_dir / "engine.json").exists()
    assert not (work_dir / "logs").exists()
    assert not Path("/tmp/pwned").exists()


@pytest.mark.parametrize(("version", "attack"),
                         [(v, a) for v in ("0.5.12", "0.5.23") for a in SGLANG_ATTACKS
                          if _has("sglang", v, a[0])],
                         ids=lambda v: v if isinstance(v, str) else v[0])
def test_the_agent_refuses_every_sglang_flag_off_the_list(work_dir: Path, version: str,
                                                          attack: list[str]) -> None:
    message = _refused(_launch(work_dir, [*SGLANG_ARGV, *attack], "sglang", version),
                       f"argv[{len(SGLANG_ARGV)}]")
    assert f"{attack[0]!r} is not a flag the lab permits for SGLang {version}" in message
    assert f"lab/engines/releases/sglang-{version}.flags.yaml" in message
    _nothing_started(work_dir)


@pytest.mark.parametrize(("version", "attack"),
                         [(v, a) for v in ("0.29.0", "0.34.0") for a in VLLM_ATTACKS
                          if _has("vllm", v, a[0])],
                         ids=lambda v: v if isinstance(v, str) else v[0])
def test_the_agent_refuses_every_vllm_flag_off_the_list(work_dir: Path, version: str,
                                                        attack: list[str]) -> None:
    message = _refused(_launch(work_dir, [*ENGINE_ARGV, *attack], "vllm", version),
                       f"argv[{len(ENGINE_ARGV)}]")
    assert f"{attack[0]!r} is not a flag the lab permits for vLLM {version}" in message
    _nothing_started(work_dir)


@pytest.mark.parametrize(("argv", "field", "says"), [
    (["/bin/sh", "-c", "id > /tmp/pwned"], "argv[0]", "must start the engine (vllm)"),
    (["sh", "-c", "id"], "argv[0]", "must start the engine (vllm)"),
    (["/tmp/evil/vllm", "serve", "/models/kimi-k2"], "argv[0]", "is not on the engine PATH"),
    (["vllm", "chat"], "argv[1]", "must be 'serve'"),
    (["vllm"], "argv", "must start with vllm serve"),
    ([*ENGINE_ARGV, "--forward-h", HOOK], "argv[3]", "'--forward-h' is not a flag"),  # exact names only
    ([*ENGINE_ARGV, "--tensor_parallel_size", "8"], "argv[3]", "'--tensor_parallel_size' is not a flag"),
    ([*ENGINE_ARGV, "-tp", "8"], "argv[3]", "'-tp' is not a flag"),
    ([*ENGINE_ARGV, "--", "--worker-cls", "x"], "argv[3]", "'--' is not a flag"),
    ([*ENGINE_ARGV, "--enforce-eager=1"], "argv[3]", "takes no value"),
    ([*ENGINE_ARGV, "--tokenizer", "/etc"], "argv[3]", "inside the lab's models directory"),
    ([*ENGINE_ARGV, "--tokenizer", "/models/../etc"], "argv[3]", "without '..'"),
    ([*ENGINE_ARGV, "--tokenizer", "-x"], "argv[3]", "takes 1 value"),
    ([*ENGINE_ARGV, "--max-num-seqs", "0"], "argv[3]", "takes a whole number from 1 to 4096"),
    ([*ENGINE_ARGV, "--compilation-config", '{"backend": "os.system"}'], "argv[3]", "key 'backend'"),
    (["vllm", "serve", "/etc"], "argv[2]", "not accepted as model_tag"),
    ([*ENGINE_ARGV, "/models/other"], "argv[3]", "is not an argument vLLM 0.34.0 takes here"),
    ([*ENGINE_ARGV, "--served-model-name", "$(id)"], "argv[3]", "takes a name of letters"),
    ([*ENGINE_ARGV, "--master-addr", "10.0.0.1;id"], "argv[3]", "takes an IP address or a host name"),
])
def test_the_agent_refuses_a_hand_written_argv(work_dir: Path, argv: list[str], field: str,
                                               says: str) -> None:
    message = _refused(_launch(work_dir, argv), field)
    assert says in message, message
    _nothing_started(work_dir)


def test_the_agent_refuses_a_python_that_is_not_the_engine(work_dir: Path) -> None:
    message = _refused(_launch(work_dir, ["python3", "-c", "import os; os.system('id')"], "sglang",
                               "0.5.23"), "argv[1]")
    assert "must be '-m'" in message
    message = _refused(_launch(work_dir, ["python3", "-m", "http.server"], "sglang", "0.5.23"), "argv[2]")
    assert "must be 'sglang.launch_server'" in message


@pytest.mark.parametrize(("spec", "field"), [
    ({"cwd": "/"}, "cwd"),
    ({"cwd": "../.."}, "cwd"),
    ({"log_file": "/tmp/elsewhere.log"}, "log_file"),
    ({"log_file": "../../x.log"}, "log_file"),
    ({"log_file": "."}, "log_file"),
])
def test_cwd_and_log_file_stay_in_the_work_dir(work_dir: Path, spec: dict[str, str], field: str) -> None:
    (work_dir / "engine.log").write_text("the last launch\n")
    message = _refused(_launch(work_dir, ENGINE_ARGV, **spec), field)  # type: ignore[arg-type]
    assert "outside the work dir" in message or "inside the work dir" in message
    # Checked before anything is created or moved: the last launch's log is where it was.
    assert (work_dir / "engine.log").read_text() == "the last launch\n"
    assert not (work_dir / "engine.log.1").exists()
    _nothing_started(work_dir)


def test_a_link_out_of_the_work_dir_is_refused_before_anything_is_written(
        node: Node, tmp_path: Path) -> None:
    work_dir = node.work_dir
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "engine.log").write_text("someone else's log\n")
    (work_dir / "logs").symlink_to(outside)
    message = _refused(_launch(work_dir, ENGINE_ARGV), "log_file")
    assert "resolves (through a symbolic link) outside the work dir" in message
    assert (outside / "engine.log").read_text() == "someone else's log\n"
    assert sorted(p.name for p in outside.iterdir()) == ["engine.log"]
    (work_dir / "logs").unlink()
    (work_dir / "logs").mkdir()
    os.symlink(outside / "engine.log", work_dir / "logs" / "engine.log")
    message = _refused(_launch(work_dir, ENGINE_ARGV), "log_file")
    assert "is a symbolic link" in message
    assert not (work_dir / "engine.json").exists()


def test_a_spec_the_platform_would_write_launches(node: Node) -> None:
    node.behave("import json, sys\nprint(json.dumps(sys.argv[1:]), flush=True)\n")
    argv = [*ENGINE_ARGV, "--served-model-name", "moonshotai/Kimi-K2-Instruct-0905",
            "--tensor-parallel-size", "8", "--max-model-len", "262144", "--gpu-memory-utilization",
            "0.85", "--trust-remote-code", "--speculative-config",
            '{"method": "eagle3", "model": "/models/kimi-k2-eagle3", "num_speculative_tokens": 4}',
            "--api-key", "diag-0123", "--max-num-batched-tokens=16384"]
    envelope = _launch(node.work_dir, argv)
    assert envelope["ok"], envelope
    log = node.work_dir / "logs" / "engine.log"
    assert wait_until(lambda: log.exists() and log.read_text().strip() != "")
    assert json.loads(log.read_text().splitlines()[0]) == argv[1:]


def test_vllm_host_ip_must_be_an_address_of_the_node(node: Node) -> None:
    # The lab names each vLLM rank's own data address; a spec naming another host's would
    # make the head advertise its broadcast queue where no worker can reach it.
    message = _refused(_launch(node.work_dir, ENGINE_ARGV, env={"VLLM_HOST_IP": "192.0.2.77"}),
                       "env.VLLM_HOST_IP")
    assert "is not an address of this node" in message
    _nothing_started(node.work_dir)
    assert _launch(node.work_dir, ENGINE_ARGV, env={"VLLM_HOST_IP": "127.0.0.1"})["ok"]
