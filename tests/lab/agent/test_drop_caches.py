"""drop-caches: either the page cache is dropped, or the node says why it cannot be."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from lab.agent import AGENT_PATH, validate_response
from tests.lab.agent.conftest import run_agent

NOBODY = 65534


def test_it_drops_the_page_cache_or_says_it_is_not_permitted() -> None:
    ans = run_agent("drop-caches")
    if ans.envelope["ok"]:
        assert ans.exit_status == 0
        assert ans.data["dropped"] is True
        assert ans.data["mem_cached_kib_after"] <= ans.data["mem_cached_kib_before"]
    else:
        assert ans.exit_status == 1
        assert ans.error["code"] == "not_permitted"
        assert "root" in ans.error["message"]


def test_it_is_not_permitted_for_an_unprivileged_user() -> None:
    # The test interpreter may live where nobody cannot read it; the system one will do.
    python = Path("/usr/bin/python3")
    if os.geteuid() != 0 or not python.exists():
        pytest.skip("needs root (to become nobody) and /usr/bin/python3")
    # The checkout may sit in a directory nobody cannot enter (a private temp or home
    # directory): run a copy of the agent from a folder everyone can read.
    public = Path(tempfile.mkdtemp(prefix="diag-agent-", dir="/tmp"))
    try:
        public.chmod(0o755)
        agent = public / "agent.py"
        shutil.copyfile(AGENT_PATH, agent)
        agent.chmod(0o644)
        res = subprocess.run([str(python), str(agent), "drop-caches", "--json"],
                             capture_output=True, text=True, user=NOBODY, group=NOBODY,
                             extra_groups=[], cwd="/")
    finally:
        shutil.rmtree(public, ignore_errors=True)
    envelope = json.loads(res.stdout)
    validate_response(envelope)
    assert res.returncode == 1
    assert envelope["error"]["code"] == "not_permitted"
    assert f"uid {NOBODY}" in envelope["error"]["message"]
