"""The simulated engine holds its API to the key it was started with, as vLLM and SGLang
do, and the lab session starts engines with a key of its own in place of the customer's
mask and shows only the mask (the measurement client's side is in
tests/diagnostic/test_secrets.py).

Each test is the request (without the key, with a wrong one, with the right one) and the
engine's answer."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from lab.clock import LabClock
from lab.config import SECRET_MASK, mask_config
from lab.inventory import parse_inventory
from lab.session import LabSession, engine_key, spec_sha256
from lab.sim.http import ServingEngine
from lab.sim.lab import SimLab
from lab.sim.tokenizer import default_cache_dir, ensure_tokenizer

from .test_http import CONFIG, LabScenario

KEY = "sk-live-4f9c2b7e11d04a6e8c3b5a9d7e1f0c2b"
CHAT = {"max_tokens": 4,
        "messages": [{"role": "user", "content": "Describe a walk along the harbour at dusk."}]}


@pytest.fixture(scope="module")
def tokenizer_path() -> Path:
    return ensure_tokenizer(default_cache_dir())


@pytest.fixture
def serve(tokenizer_path: Path) -> Iterator[Callable[..., httpx.Client]]:
    """serve(engine, extra_args, env) -> a client of a simulated engine started with them."""
    started: list[tuple[ServingEngine, httpx.Client]] = []

    def make(engine: str = "vllm", extra_args: list[str] | None = None,
             env: dict[str, str] | None = None) -> httpx.Client:
        config = copy.deepcopy(CONFIG)
        config["engine"]["name"] = engine
        config["extra_args"] = list(extra_args or [])
        config["env"] = dict(env or {})
        server = ServingEngine(scenario=LabScenario(), config=config, backend="cutlass", backend_state="ok",
                               error_rate=0.0, clock=LabClock(500.0, time.time()), log=lambda _: None,
                               tokenizer_path=tokenizer_path, host="127.0.0.1", port=0, seed=7,
                               argv=[*config["extra_args"], "--enable-metrics"])
        server.start()
        client = httpx.Client(base_url=server.url, timeout=30, trust_env=False)
        started.append((server, client))
        return client

    yield make
    for server, client in started:
        client.close()
        server.stop()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(("extra_args", "env"), [
    (["--api-key", KEY], {}),
    ([f"--api-key={KEY}"], {}),
    ([], {"VLLM_API_KEY": KEY}),
    (["--api-key", KEY], {"VLLM_API_KEY": "sk-the-flag-overrides-this-one"}),
], ids=["flag", "flag=", "VLLM_API_KEY", "flag over variable"])
def test_vllm_refuses_every_v1_request_without_its_key(
    serve: Callable[..., httpx.Client], extra_args: list[str], env: dict[str, str]
) -> None:
    client = serve("vllm", extra_args, env)
    for headers in ({}, bearer("sk-wrong"), {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"},
                    bearer("sk-the-flag-overrides-this-one")):
        models = client.get("/v1/models", headers=headers)
        assert (models.status_code, models.json()) == (401, {"error": "Unauthorized"})
        chat = client.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert (chat.status_code, chat.json()) == (401, {"error": "Unauthorized"})
    assert client.get("/v1/models", headers=bearer(KEY)).status_code == 200
    assert client.post("/v1/chat/completions", json=CHAT, headers=bearer(KEY)).status_code == 200
    # vLLM guards /v1 and its kin only: probes and Prometheus need no key.
    for path in ("/health", "/metrics", "/version"):
        assert client.get(path).status_code == 200, path


def test_sglang_guards_everything_but_health_and_metrics_and_reads_no_variable(
    serve: Callable[..., httpx.Client],
) -> None:
    client = serve("sglang", ["--api-key", KEY])
    assert client.get("/v1/models").status_code == 401
    assert client.get("/version").status_code == 401
    assert client.get("/version", headers=bearer(KEY)).status_code == 200
    assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200
    open_ = serve("sglang", [], {"VLLM_API_KEY": KEY})
    assert open_.get("/v1/models").status_code == 200


def test_an_engine_without_a_key_asks_for_none(serve: Callable[..., httpx.Client]) -> None:
    client = serve("vllm", ["--api-key", ""])  # an empty key turns nothing on
    assert client.get("/v1/models").status_code == 200
    assert client.get("/v1/models", headers=bearer("anything")).status_code == 200


def test_the_session_key_is_the_jobs_own_and_stored_nowhere(tmp_path: Path) -> None:
    key_file = tmp_path / "id_ed25519"
    key_file.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n")
    inventory = parse_inventory({
        "schema": "lab.inventory/1", "name": "keys", "defaults": {"key_file": str(key_file)},
        "catalog": str(Path(__file__).resolve().parents[3] / "lab" / "catalog.yaml"),
        "nodes": [{"name": f"spark-0{i}", "host": "127.0.0.1", "port": 40000 + i,
                   "role": "head" if i == 1 else "worker"} for i in range(1, 9)],
    }, base=tmp_path)
    job_a = {"platform": "gb10-diag", "job": "a"}
    sessions = [LabSession(inventory) for _ in range(3)]
    sessions[0].owner = sessions[1].owner = job_a
    sessions[2].owner = {"platform": "gb10-diag", "job": "b"}
    try:
        keys = [s.engine_api_key for s in sessions]
        # Every process of one job derives the same key; another job's differs; the key
        # holds nothing of the owner in clear and cannot be made without the SSH key.
        assert keys[0] == keys[1] != keys[2]
        assert keys[0] != engine_key(b"another secret", job_a)
        config = mask_config({**CONFIG, "extra_args": ["--api-key", KEY]})
        shown = sessions[0].specs_for(config)
        uploaded = sessions[0].uploaded_specs(config)
        assert shown[0]["argv"][shown[0]["argv"].index("--api-key") + 1] == SECRET_MASK + KEY[-4:]
        assert uploaded[0]["argv"][uploaded[0]["argv"].index("--api-key") + 1] == keys[0]
        assert keys[0] not in json.dumps(shown)
        assert spec_sha256(uploaded[0]) != spec_sha256(shown[0])
        # A configuration without authentication is uploaded exactly as shown; an empty key
        # is authentication off in both engines, and stays off.
        assert sessions[0].uploaded_specs(CONFIG) == sessions[0].specs_for(CONFIG)
        off = {**CONFIG, "extra_args": ["--api-key", ""]}
        assert sessions[0].uploaded_specs(off) == sessions[0].specs_for(off)
        # What an engine prints of its key comes back masked.
        log = f"server_args=ServerArgs(api_key='{keys[0]}', port=30000)\nready {keys[0]}\n"
        assert keys[0] not in sessions[0].redact(log)
        assert sessions[0].redact(log).count(SECRET_MASK) == 2
    finally:
        for s in sessions:
            s.close()


@pytest.mark.ssh
def test_the_lab_runs_the_engine_with_its_own_key_and_measures_it(make_lab: Callable[..., SimLab]) -> None:
    """The customer's configuration as stored (key masked) is started on the simulated lab
    over SSH: the engine demands a key, it is the session's, not the mask and not the
    customer's, and the node's spec holds it where the platform shows the mask."""
    lab = make_lab()
    stored = mask_config({**CONFIG, "extra_args": ["--api-key", KEY], "env": {"VLLM_API_KEY": KEY}})
    with LabSession.open(lab.inventory_path) as session:
        session.owner = {"platform": "gb10-diag", "job": "secrets-test"}
        launched = session.launch(stored, cold=False, timeout_s=3600)
        shown = json.dumps(launched.specs, ensure_ascii=False)
        assert KEY not in shown and session.engine_api_key not in shown and SECRET_MASK + KEY[-4:] in shown
        # The spec the head's agent read holds the session's key, for the flag and the variable.
        spec = json.loads(lab.nodes["spark-01"].host_path(
            f"{lab.nodes['spark-01'].paths.work_dir}/launch/spec.json").read_text())
        assert spec["argv"][spec["argv"].index("--api-key") + 1] == session.engine_api_key
        assert spec["env"]["VLLM_API_KEY"] == session.engine_api_key
        assert session.serves(stored)  # the node's spec hash is the uploaded spec's
        with httpx.Client(base_url=launched.endpoint, trust_env=False, timeout=30) as http:
            for wrong in ({}, bearer(KEY), bearer(KEY[-4:])):
                assert http.get("/v1/models", headers=wrong).status_code == 401
            assert http.get("/v1/models", headers=bearer(session.engine_api_key)).status_code == 200
        session.stop()
