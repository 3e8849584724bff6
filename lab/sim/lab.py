"""A whole simulated lab: its nodes, their SSH servers, and the state folder it lives in.

`SimLab(scenario, state_dir)` builds what a real lab would hand the platform -- an
inventory (`lab.inventory/1`, with the lab's time dilation and origin), a known_hosts
file with every node's own host key, and a client key every node accepts -- and runs
one loopback SSH server per node over the node's sandbox. Each node's model directory
holds a real tokenizer.json, a config.json and a safetensors index (no weights); each
draft's directory a config.json.

The lab's catalog (`lab.catalog/1`, LAB_MODEL.md section 10) is written beside the
inventory, which names it: the scenario's model (its id, path, whether its code needs
review, its drafts) with its section 2 profile, and nothing else. `scenario_catalog`
builds it from the scenario alone, so what a lab will hold is known before it serves.

State folder layout:

    inventory.yaml  catalog.yaml  known_hosts  id_ed25519(.pub)  agent-calls.log
    hostkeys/<node>_ed25519      nodes/<node>/root/...

The trained tokenizer is cached once per machine (lab.sim.tokenizer.default_cache_dir).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import random
import shutil
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import paramiko
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from lab.catalog import SCHEMA as CATALOG_SCHEMA
from lab.catalog import Catalog, parse_catalog
from lab.clock import LabClock
from lab.sim.engine import SHARDS, RendezvousHub
from lab.sim.hardware import data_address
from lab.sim.node import LabContext, SimNode
from lab.sim.paths import NodePaths
from lab.sim.scenario import Scenario, load_scenario
from lab.sim.sshd import NodeSSHServer

WORK_DIR = "/var/lib/diag"
MODELS_DIR = "/models"
CACHE_DIR = "/var/cache/diag"
# The built-in kimi-k2 profile's identity in the lab (LAB_MODEL.md section 10), for a
# scenario.model that does not carry it (lab.sim.scenario adds these fields to `model`).
KIMI_K2_IDENTITY: dict[str, Any] = {
    "id": "moonshotai/Kimi-K2-Instruct-0905",
    "path": "/models/kimi-k2",
    "remote_code": True,
    "drafts": [{"id": "AQ-MedAI/Kimi-K2-Instruct-eagle3", "path": "/models/kimi-k2-eagle3",
                "method": "eagle3", "remote_code": True}],
}
# The catalog profile's fields, as LAB_MODEL.md section 2 names them.
PROFILE_KEYS = ("total_params_b", "active_params_b", "layers", "experts", "experts_per_token",
                "shared_experts", "hidden", "vocab", "max_context", "kv_bytes_per_token",
                "checkpoint_gb", "decode_bytes_per_token_gb", "mtp_heads")


def write_ed25519_key(path: Path) -> paramiko.Ed25519Key:
    """Create an OpenSSH ed25519 private key at path (and path.pub) unless one is there."""
    if not path.exists():
        key = Ed25519PrivateKey.generate()
        private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                    serialization.NoEncryption())
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                               serialization.PublicFormat.OpenSSH)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(private)
        path.with_name(path.name + ".pub").write_bytes(public + b" labsim\n")
    return paramiko.Ed25519Key(filename=str(path))


# Where the kernel's ephemeral ports begin when /proc does not say (Linux's default).
EPHEMERAL_LOW_DEFAULT = 32768
# Listener ports are picked at or above this (below it: well-known and common service ports).
LISTENER_LOW = 10000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW_DEFAULT


def free_port() -> int:
    """A port for a listener bound later (the engine's API server binds it at every start,
    minutes after the lab picks it): one outside the kernel's ephemeral range, which no
    client connection of this machine is handed in the meantime (a port from bind(0) is
    one of those, and was seen taken by the time the engine bound it)."""
    rng = random.SystemRandom()
    low = _ephemeral_low()
    for _ in range(200):
        port = rng.randrange(LISTENER_LOW, max(LISTENER_LOW + 1, low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def model_identity(model: dict[str, Any]) -> dict[str, Any]:
    """{id, path, remote_code, drafts} of a scenario's model: its own fields where the
    scenario gives them, the built-in identity for the kimi-k2 profile otherwise. A model
    of another profile must name at least its id and path."""
    named = {key: model[key] for key in ("id", "path", "remote_code", "drafts") if model.get(key) is not None}
    if "id" in named and "path" in named:
        return {"remote_code": False, "drafts": [], **named}
    if model.get("name", "kimi-k2") == "kimi-k2" and "id" not in named:
        return {**KIMI_K2_IDENTITY, **named}
    missing = [key for key in ("id", "path") if key not in named]
    raise ValueError(f"model {model.get('name')!r}: a model other than the built-in kimi-k2 names its "
                     f"{' and '.join(missing)} (LAB_MODEL.md section 10)")


def scenario_catalog(scenario: Scenario) -> Catalog:
    """The catalog a simulated lab writes for its scenario: the scenario's model and its
    drafts, with the model's section 2 profile. Its version follows the model's figures."""
    model = scenario.model
    identity = model_identity(model)
    profile = {key: model[key] for key in PROFILE_KEYS if model.get(key) is not None}
    profile["kv_bytes_per_token"] = dict(profile["kv_bytes_per_token"])
    profile["source"] = (f"simulated lab {scenario.name}: the scenario's model profile "
                         "(LAB_MODEL.md section 2)")
    drafts = [{"id": d["id"], "path": d["path"], "method": d["method"],
               "remote_code": bool(d.get("remote_code", False))} for d in identity["drafts"]]
    entry = {"id": identity["id"], "path": identity["path"], "remote_code": bool(identity["remote_code"]),
             "drafts": drafts, "profile": profile}
    digest = hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()[:12]
    return parse_catalog({"schema": CATALOG_SCHEMA, "version": f"sim-{digest}",
                          "models_dir": posixpath.dirname(identity["path"]) or MODELS_DIR,
                          "models": [entry], "lab_nodes": len(scenario.node_names)})


def model_config(model: dict[str, Any]) -> dict[str, Any]:
    """A config.json in the shape of a DeepSeek-V3-architecture checkpoint (Kimi K2 is one)."""
    model_id = str(model_identity(model)["id"])
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2" if "kimi" in model_id.casefold() else "deepseek_v3",
        "hidden_size": model["hidden"],
        "num_hidden_layers": model["layers"],
        "first_k_dense_replace": 1,
        "n_routed_experts": model["experts"],
        "num_experts_per_tok": model["experts_per_token"],
        "n_shared_experts": model["shared_experts"],
        "vocab_size": model["vocab"],
        "max_position_embeddings": model["max_context"],
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "num_nextn_predict_layers": model["mtp_heads"],
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                 "kv_cache_quant_algo": "FP8"},
    }


def draft_config(model: dict[str, Any]) -> dict[str, Any]:
    """A config.json in the shape of a one-layer EAGLE-3 draft for the model."""
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": model["hidden"], "vocab_size": model["vocab"], "torch_dtype": "bfloat16"}


def safetensors_index(model: dict[str, Any]) -> dict[str, Any]:
    """The index of a 64-shard checkpoint: which shard holds each tensor (no weights).
    Tensors are listed in checkpoint order and spread evenly over the shards."""
    names = ["model.embed_tokens.weight"]
    for layer in range(int(model["layers"])):
        prefix = f"model.layers.{layer}"
        names += [f"{prefix}.{n}" for n in (
            "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_a_proj.weight",
            "self_attn.q_b_proj.weight", "self_attn.kv_a_proj_with_mqa.weight",
            "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight")]
        if layer == 0:  # the first layer is dense
            names += [f"{prefix}.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")]
            continue
        names.append(f"{prefix}.mlp.gate.weight")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names.append(f"{prefix}.mlp.shared_experts.{proj}.weight")
            names += [f"{prefix}.mlp.experts.{proj}.{part}"
                      for part in ("weight", "weight_scale", "weight_scale_2", "input_scale")]
    names += ["model.norm.weight", "lm_head.weight"]
    weight_map = {name: f"model-{i * SHARDS // len(names) + 1:05d}-of-{SHARDS:05d}.safetensors"
                  for i, name in enumerate(names)}
    return {"metadata": {"total_size": int(model["checkpoint_gb"] * 1e9)}, "weight_map": weight_map}


class SimLab:
    """The simulated lab on loopback; a context manager that starts and stops it."""

    def __init__(self, scenario: Scenario | str | Path, state_dir: str | Path, *,
                 dilation: float | None = None, tokenizer_cache: str | Path | None = None) -> None:
        loaded = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        if dilation is not None:
            loaded = dataclasses.replace(loaded, dilation=float(dilation))
        self.scenario = loaded
        self.state_dir = Path(state_dir).resolve()
        self.tokenizer_cache = Path(tokenizer_cache) if tokenizer_cache else None
        self.clock = LabClock(loaded.dilation, 0.0)
        self.catalog = scenario_catalog(loaded)
        self.nodes: dict[str, SimNode] = {}
        self.servers: dict[str, NodeSSHServer] = {}
        self.api_port = 0
        self._started = False

    # -- paths -------------------------------------------------------------------------------
    @property
    def inventory_path(self) -> Path:
        return self.state_dir / "inventory.yaml"

    @property
    def catalog_path(self) -> Path:
        return self.state_dir / "catalog.yaml"

    @property
    def known_hosts_path(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def client_key_path(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def calls_log_path(self) -> Path:
        return self.state_dir / "agent-calls.log"

    @property
    def head(self) -> SimNode:
        return self.nodes[self.scenario.node_names[0]]

    def node(self, name: str) -> SimNode:
        try:
            return self.nodes[name]
        except KeyError:
            raise KeyError(f"no node {name!r}; this lab has {', '.join(self.nodes)}") from None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> SimLab:
        if self._started:
            return self
        from lab.sim.tokenizer import default_cache_dir, ensure_tokenizer

        self.state_dir.mkdir(parents=True, exist_ok=True)
        # The trained tokenizer is the same for every lab on this machine: train it once.
        tokenizer = ensure_tokenizer(self.tokenizer_cache or default_cache_dir())
        # Warm this process's corpus cache now: building it when the API comes up would
        # take wall-clock time that the dilation turns into a longer cold start.
        from lab.sim.text import encoded_corpora

        encoded_corpora(tokenizer)
        self.clock = LabClock(self.scenario.dilation, time.time())
        load = self.scenario.truth["load"]
        hub = RendezvousHub(self.scenario.seed, load["rendezvous"]["stall_s"], load["rendezvous"]["needs"])
        ctx = LabContext(self.scenario, self.clock, self.state_dir, hub, self.calls_log_path)
        self.calls_log_path.touch()
        client_key = write_ed25519_key(self.client_key_path)
        paths = NodePaths(work_dir=WORK_DIR, model_dir=self.model_dir, cache_dir=CACHE_DIR)
        down = {f["node_down"] for f in self.scenario.faults("node_down")}
        self.api_port = free_port()
        known_hosts = []
        try:
            for index, name in enumerate(self.scenario.node_names):
                node = SimNode(ctx, index, paths)
                self._populate_model_dir(node, tokenizer)
                self.nodes[name] = node
                host_key = write_ed25519_key(self.state_dir / "hostkeys" / f"{name}_ed25519")
                server = NodeSSHServer(node, host_key, client_key)
                port = server.start()
                self.servers[name] = server
                known_hosts.append(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}")
                if name in down:
                    server.stop()  # powered off: its port refuses connections
        except BaseException:
            self.stop()
            raise
        self.known_hosts_path.write_text("\n".join(known_hosts) + "\n")
        self._write_catalog()
        self._write_inventory()
        self._started = True
        return self

    def stop(self) -> None:
        """Stop every engine (and its HTTP endpoint), then every SSH server."""
        for node in self.nodes.values():
            node.shutdown()
        for server in self.servers.values():
            server.stop()
        self._started = False

    def __enter__(self) -> SimLab:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def set_node_down(self, name: str, down: bool = True) -> None:
        """Power a node off (its SSH port refuses connections, its engine dies) or back on."""
        server = self.servers[name]
        if down:
            self.node(name).shutdown()
            server.stop()
        elif not server.listening:
            server.start()

    @property
    def model_dir(self) -> str:
        """Where the nodes keep the scenario's model: its path in the lab's catalog."""
        return self.catalog.models[0].path

    # -- what the lab hands the platform -------------------------------------------------------
    def _populate_model_dir(self, node: SimNode, tokenizer: Path) -> None:
        model_dir = node.host_path(node.paths.model_dir)
        model_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tokenizer, model_dir / "tokenizer.json")
        (model_dir / "config.json").write_text(json.dumps(model_config(self.scenario.model), indent=2) + "\n")
        (model_dir / "model.safetensors.index.json").write_text(
            json.dumps(safetensors_index(self.scenario.model), indent=1) + "\n")
        # Each draft the catalog lists is in the lab's models directory too (a config, no weights).
        for draft in self.catalog.models[0].drafts:
            draft_dir = node.host_path(draft.path)
            draft_dir.mkdir(parents=True, exist_ok=True)
            config = draft_config(self.scenario.model)
            (draft_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    def _write_catalog(self) -> None:
        header = (f"# The models simulated lab {self.scenario.name!r} holds (lab.catalog/1), written "
                  "from its scenario's model.\n")
        self.catalog_path.write_text(header + yaml.safe_dump(self.catalog.as_data(), sort_keys=False))

    def _write_inventory(self) -> None:
        nics = self.scenario.node["nics"]
        inventory = {
            "schema": "lab.inventory/1",
            "name": self.scenario.name,
            "time_dilation": self.scenario.dilation,
            "time_origin": self.clock.origin,
            "known_hosts": self.known_hosts_path.name,
            "catalog": self.catalog_path.name,
            "defaults": {
                "user": "diag",  # as on a real lab: never root (lab/agent/README.md)
                "key_file": self.client_key_path.name,
                "python": "python3",
                "work_dir": WORK_DIR,
                "model_dir": self.model_dir,
                "cache_dir": CACHE_DIR,
                "mgmt_nic": nics["mgmt"],
                "data_nics": list(nics["data"]),
                "api_port": self.api_port,
            },
            # Each node is reached over loopback; its data address is its first data NIC's, as
            # its facts show it (the rendezvous and each vLLM rank's VLLM_HOST_IP name it).
            "nodes": [
                {"name": name, "host": "127.0.0.1", "port": self.servers[name].port,
                 "role": self.nodes[name].role, "data_addr": data_address(index)}
                for index, name in enumerate(self.scenario.node_names)
            ],
        }
        header = (f"# Simulated lab {self.scenario.name!r}: lab time runs {self.scenario.dilation:g}x "
                  "wall time from time_origin.\n")
        self.inventory_path.write_text(header + yaml.safe_dump(inventory, sort_keys=False))
