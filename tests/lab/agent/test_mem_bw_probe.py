"""The memory bandwidth probe. Its GPU path needs torch with CUDA and cannot run here; what
can be checked is that it says so cleanly, that it refuses to run beside an engine (which
holds the memory), its arguments, and that the answer it would give fits the schema."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lab.agent import AgentResponseError, validate_response
from lab.agent.agent import MEM_BW_METHOD, median
from tests.lab.agent.conftest import ENGINE_ARGV, Node, run_agent, wait_until, write_spec


def test_it_is_unsupported_without_torch_and_cuda(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU node: the probe's real path applies here")
    ans = run_agent("mem-bw-probe", "--work-dir", str(tmp_path))
    assert ans.exit_status == 1
    assert ans.envelope["verb"] == "mem-bw-probe"
    assert ans.error == {"code": "unsupported",
                         "message": "mem-bw-probe needs torch with a CUDA GPU; none here"}


@pytest.mark.parametrize(("args", "named"), [
    (["--repeats", "0"], "--repeats"), (["--repeats", "101"], "--repeats"),
    (["--size-mib", "8"], "--size-mib"), (["--size-mib", "lots"], "--size-mib"),
])
def test_it_refuses_arguments_out_of_range(args: list[str], named: str) -> None:
    ans = run_agent("mem-bw-probe", *args)
    assert ans.exit_status == 2
    assert ans.error["code"] == "usage" and named in ans.error["message"]


def test_it_is_busy_while_an_engine_runs(node: Node) -> None:
    # The engine holds the GPU's memory and bandwidth: the probe does not touch the GPU.
    work_dir = node.work_dir
    pid_file = work_dir / "engine.pid"
    node.behave(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    spec = write_spec(work_dir / "spec.json", ENGINE_ARGV, "engine.log")
    assert run_agent("launch", "--spec", str(spec), "--work-dir", str(work_dir)).exit_status == 0
    assert wait_until(lambda: pid_file.exists() and pid_file.read_text() != "")
    ans = run_agent("mem-bw-probe", "--work-dir", str(work_dir))
    assert ans.exit_status == 1
    assert ans.error["code"] == "busy"
    assert "engine runs here" in ans.error["message"] and "stop it first" in ans.error["message"]


def test_the_answer_it_would_give_fits_the_schema() -> None:
    seconds = [0.0105, 0.0104, 0.0106]
    bytes_read = 2048 * (1 << 20)
    gbs = [bytes_read / s / 1e9 for s in seconds]
    answer = {"schema": "lab.agent/1", "verb": "mem-bw-probe", "ok": True,
              "data": {"device": "NVIDIA GB10", "size_mib": 2048, "repeats": 3, "bytes_read": bytes_read,
                       "seconds": seconds, "gbs": gbs, "median_gbs": median(gbs),
                       "method": MEM_BW_METHOD.format(size_mib=2048)}}
    validate_response(json.loads(json.dumps(answer)))
    assert median(gbs) == gbs[0] and median([1.0, 2.0, 4.0, 3.0]) == 2.5
    with pytest.raises(AgentResponseError):
        validate_response({**answer, "data": {**answer["data"], "gbs": [-1.0]}})
    busy = {"schema": "lab.agent/1", "verb": "mem-bw-probe", "ok": False,
            "error": {"code": "busy", "message": "an engine runs here"}}
    validate_response(busy)

