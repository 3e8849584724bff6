"""A configuration that does not start: the reproduce stage reports the engine's own words.

`manage.py diagnose` against the simulated lab with a configuration the engine refuses
(an FP4 MoE kernel the lab's vLLM build does not have), and what a consultant then reads:
the stage's log, the `config.engine_crash` finding's title and evidence, and why the job
stopped all carry the engine's final exception line, not only its exit code. A crash is the
configuration's only when it repeats the same way (METHODOLOGY "Money back"): the stage
started the configuration twice, and both starts are in the evidence.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from diagnostic.jobs.findings_document import validate_findings
from tests.diagnostic.conftest import REFERENCE_CONFIG, REFERENCE_SCENARIO
from tests.diagnostic.doubles import fast_scenario

pytestmark = pytest.mark.django_db(transaction=True)

# triton is a --moe-backend value vLLM 0.34.0 accepts (its release table's choices) whose
# NVFP4 MoE kernel cannot run on GB10 (sm_121): its MoE oracle refuses it at model init, in
# the core process, and names the backend as 0.34.0 logs it (upper case, no quotes).
ENGINE_ERROR = ("ValueError: NvFp4 MoE backend 'TRITON' does not support the deployment configuration "
                "since kernel does not support current device.")


def test_a_start_the_engine_refuses_is_reported_with_the_engines_error(
    tmp_path: Path, sim_state_dir: Path
) -> None:
    config = tmp_path / "triton.yaml"
    config.write_text(REFERENCE_CONFIG.read_text().replace("moe_backend: auto", "moe_backend: triton"))
    out = tmp_path / "out"
    with pytest.raises(CommandError, match="reproduce: the configuration did not start") as stopped:
        call_command("diagnose", "--config", str(config), "--lab",
                     f"sim:{fast_scenario(tmp_path, REFERENCE_SCENARIO)}", "--out", str(out),
                     "--stages", "preflight,reproduce", stdout=io.StringIO())
    reason = f"engine exited with code 1: {ENGINE_ERROR}"
    assert reason in str(stopped.value)

    document = json.loads((out / "findings.json").read_text())
    validate_findings(document)
    (finding,) = [f for f in document["findings"] if f["code"] == "config.engine_crash"]
    node = finding["evidence"]["node"]
    assert finding["title"] == f"The engine does not start with this configuration: {reason}"
    assert [start["engine_error"] for start in finding["evidence"]["starts"]] == [ENGINE_ERROR, ENGINE_ERROR]
    assert document["job"]["stop_side"] == "customer"
    assert not [f for f in document["findings"] if f["code"].startswith("lab.")], "not our lab's failure"
    evidence = finding["evidence"]
    assert (evidence["reason"], evidence["engine_error"], evidence["exit_code"]) == \
        (reason, ENGINE_ERROR, 1)
    # Errors as the log parser reads them: each traceback is one error, its final line. Every
    # node fails at model init in the same lab second, and the evidence is the first node
    # seen stopped. On the head the core's error comes first and the API server's that
    # follows only points back at it ("See root cause above"), so the engine's error is the
    # core's; a --headless node's worker (no engine core, no API server) ends on its own.
    assert ENGINE_ERROR in evidence["error_lines"]
    last = evidence["error_lines"][-1]
    if "Engine core initialization failed" in evidence["log_tail"]:
        assert last.startswith("RuntimeError: Engine core initialization failed")
    else:
        assert last == ENGINE_ERROR and "WorkerProc failed to start." in evidence["log_tail"]
    assert "Traceback (most recent call last):" in evidence["log_tail"]

    log = (out / "logs" / "01-reproduce.log").read_text()
    assert f"the engine did not start on {node}: {reason}" in log
