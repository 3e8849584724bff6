"""A lab session: what the pipelines use to drive a lab, real or simulated.

It pushes the node agent, launches a configuration on the nodes it needs and waits for
the engine to serve, collects telemetry and logs, and fetches the tokenizer. It is the
one place in the platform that converts wall time to lab time (`LabClock`).

Secrets (lab.config, "secrets"): a configuration reaches the session with its API key
masked, and every spec the session shows (`specs_for`, `LaunchResult.specs`) keeps the
mask. An engine whose configuration turns authentication on (`--api-key`, `VLLM_API_KEY`)
still runs with it, with the session's own key for its job (`engine_api_key`) put in place
of the mask only in the spec uploaded to the node; the measurement client sends that key.
Engine logs read back through the session have it masked again (an SGLang log prints it).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from lab.agent_push import agent_source
from lab.clock import LabClock
from lab.config import AUTH_ENV, argv_secrets, auth_flag, mask_argv, mask_env, mask_secret, mask_text
from lab.inventory import Inventory, Node, load_inventory
from lab.ssh import LabSSH, NodeConnection, SSHError

log = logging.getLogger(__name__)

AGENT_TIMEOUT_S = 60.0
# The end of a dead engine's log read for its error: room for its traceback and, after it,
# the API process' own traceback that points back at it (vLLM V1 logs both).
FAILED_LOG_TAIL_BYTES = 16 * 1024


class LabError(Exception):
    """Something on the lab went wrong; `transient` errors are worth a retry."""

    transient = False


class NodeUnreachable(LabError):
    transient = True

    def __init__(self, nodes: Mapping[str, BaseException]) -> None:
        detail = "; ".join(f"{exc}" for exc in nodes.values())
        super().__init__(f"unreachable: {', '.join(nodes)} ({detail})")
        self.nodes = dict(nodes)


class AgentError(LabError):
    def __init__(self, node: str, verb: str, code: str, message: str) -> None:
        super().__init__(f"{node}: agent {verb} failed ({code}): {message}")
        self.node, self.verb, self.code, self.message = node, verb, code, message


class LaunchFailed(LabError):
    """The engine exited on `node` before it served. `engine_error` is the engine's own last
    word on why (the final exception line of its traceback, or its last error line; None
    when its log holds none), and `reason` says both: "engine exited with code 1: ValueError:
    not enough memory for KV cache ..."."""

    def __init__(self, node: str, exit_code: int | None, log_tail: str,
                 engine_error: str | None = None) -> None:
        reason = f"engine exited with code {exit_code}"
        if engine_error:
            reason += f": {engine_error}"
        super().__init__(f"{node}: the engine did not start: {reason}")
        self.node, self.reason, self.log_tail = node, reason, log_tail
        self.exit_code, self.engine_error = exit_code, engine_error


class LaunchTimeout(LabError):
    transient = True


@dataclass(frozen=True)
class LaunchResult:
    endpoint: str
    cold_start_s: float  # lab seconds from launch to the first healthy answer
    started_at: float  # lab epoch
    ready_at: float  # lab epoch
    specs: list[dict[str, Any]]
    warm: bool  # caches were not dropped first: not a cold start
    # Node -> lab seconds added to the start time the node reported (by its own clock) to
    # bring it inside the platform's window around that node's launch call: 0 where the
    # clocks agree; a skewed node's clock shows here instead of in cold_start_s.
    start_corrections_s: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ServingState:
    """What the lab runs, held against one configuration (`LabSession.serving_state`):
    the nodes' own evidence (each agent's status, with the hash of the launch spec its
    engine was started from) and whether the API answered."""

    expected_sha256: dict[str, str]  # node -> sha256 of the spec the configuration renders for it
    status: dict[str, dict[str, Any]]  # node -> its agent's `status` data
    healthy: bool | None  # /health answered 200; None when not asked (the nodes already said no)
    # node -> hashes of the same configuration launched with observation-only environment
    # (OBSERVATION_ENV): it serves the same engine, so nothing needs restarting for it.
    observed_sha256: dict[str, frozenset[str]] = field(default_factory=dict)

    def _matches(self, name: str, sha: object) -> bool:
        return sha == self.expected_sha256[name] or sha in self.observed_sha256.get(name, ())

    @property
    def other_nodes(self) -> list[str]:
        """Nodes whose engine runs from a spec this configuration does not render."""
        return [name for name, st in self.status.items()
                if st.get("running") and not self._matches(name, st.get("spec_sha256"))]

    @property
    def idle_nodes(self) -> list[str]:
        """Nodes the configuration uses where no engine runs."""
        return [name for name, st in self.status.items() if not st.get("running")]

    @property
    def other_configuration(self) -> bool:
        """A different configuration (or one launched without a spec hash) runs."""
        return bool(self.other_nodes)

    @property
    def serving(self) -> bool:
        return not self.other_nodes and not self.idle_nodes and self.healthy is True

    @property
    def reason(self) -> str:
        """Why the configuration is not serving, in a few words ("serving" when it is)."""
        if self.other_nodes:
            return f"a different configuration is running on {', '.join(self.other_nodes)}"
        if self.idle_nodes:
            return f"no engine runs on {', '.join(self.idle_nodes)}"
        if not self.healthy:
            return "the engine runs but /health does not answer 200"
        return "serving"


# Environment that only makes the engine say more (NCCL writes its interface choice and its
# retries with NCCL_DEBUG=INFO; triage's own starts set it to read the rendezvous). An engine
# launched with it serves the configuration without it: the next stage measures that engine
# rather than restarting it (a restart of minutes on an eight-node lab).
OBSERVATION_ENV = {"NCCL_DEBUG": "INFO"}

# What the engine key is derived from, besides the platform's SSH key and the job (v1).
ENGINE_KEY_CONTEXT = b"gb10-diag engine api key/1"
ENGINE_KEY_PREFIX = "diag-"


def engine_key(secret: bytes, owner: Mapping[str, str] | None) -> str:
    """The API key of the engines launched for `owner` (a job): HMAC-SHA256 of the owner
    under `secret`. Every session of one job, in any process, derives the same key, so a
    later stage measures (and recognises by its spec hash) the engine an earlier one
    started; another job's key differs, and no one without `secret` can work it out."""
    message = ENGINE_KEY_CONTEXT + b"\n" + json.dumps(dict(owner or {}), sort_keys=True).encode()
    return ENGINE_KEY_PREFIX + hmac.new(secret, message, hashlib.sha256).hexdigest()[:40]


def authenticated(spec: Mapping[str, Any], key: str) -> dict[str, Any]:
    """`spec` as uploaded to its node: where its configuration turns API authentication on
    (`--api-key`, `VLLM_API_KEY`) the key there, whatever it was (a mask), is `key`. A spec
    without either is returned unchanged: authentication stays as the customer had it."""
    argv = list(spec.get("argv") or [])
    for index, flag, inline in argv_secrets(argv):
        # An empty key turns authentication off in both engines: it stays off.
        if auth_flag(flag) and (argv[index].partition("=")[2] if inline else argv[index]):
            argv[index] = f"{flag}={key}" if inline else key
    env = {name: key if name in AUTH_ENV and value else value
           for name, value in dict(spec.get("env") or {}).items()}
    return {**spec, "argv": argv, "env": env}


def shown_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """`spec` as it may be shown or kept: every secret in its argv and env masked."""
    shown = dict(spec)
    if isinstance(spec.get("argv"), list | tuple):
        shown["argv"] = mask_argv(list(spec["argv"]))
    if isinstance(spec.get("env"), Mapping):
        shown["env"] = mask_env(dict(spec["env"]))
    return shown


def spec_bytes(spec: Mapping[str, Any]) -> bytes:
    """A launch spec exactly as the session uploads it: the bytes the agent hashes at launch
    and reports back in `status` as `spec_sha256`."""
    return json.dumps(spec, indent=2).encode()


def spec_sha256(spec: Mapping[str, Any]) -> str:
    return hashlib.sha256(spec_bytes(spec)).hexdigest()


@dataclass(frozen=True)
class LogChunk:
    node: str
    path: str
    offset: int
    next_offset: int
    size: int
    text: str


@dataclass
class LabSession:
    inventory: Inventory
    clock: LabClock = field(init=False)
    ssh: LabSSH = field(init=False)

    def __post_init__(self) -> None:
        self.clock = LabClock(self.inventory.time_dilation, self.inventory.time_origin)
        self.ssh = LabSSH(self.inventory)
        self._agent_ready: set[str] = set()
        self._tokenizer_dir: tempfile.TemporaryDirectory[str] | None = None
        self._tokenizer: Path | None = None
        self._launched: list[str] = []
        # Who launches: written into every launch spec as `owner` (the platform and its
        # job), so that the nodes can say whose engine they run (`status`).
        self.owner: dict[str, str] | None = None
        self._key_secret: bytes | None = None

    @classmethod
    def open(cls, inventory_path: str | Path) -> LabSession:
        return cls(load_inventory(inventory_path))

    def close(self) -> None:
        self.ssh.close()
        if self._tokenizer_dir is not None:
            self._tokenizer_dir.cleanup()
            self._tokenizer_dir = None
        self._tokenizer = None

    def __enter__(self) -> LabSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- nodes and the agent --------------------------------------------------------
    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.inventory.nodes

    def nodes_for(self, config: Mapping[str, Any]) -> list[Node]:
        """The nodes a configuration runs on: head first, then workers in inventory order."""
        par = config["parallel"]
        needed = int(par["tp"]) * int(par["pp"])
        ordered = [self.inventory.head] + [n for n in self.nodes if not n.is_head]
        if needed > len(ordered):
            raise LabError(
                f"the configuration needs tp x pp = {needed} nodes; lab {self.inventory.name!r} "
                f"has {len(ordered)}"
            )
        return ordered[:needed]

    def _names(self, nodes: Iterable[Node | str] | None) -> list[str]:
        if nodes is None:
            return [n.name for n in self.nodes]
        return [n if isinstance(n, str) else n.name for n in nodes]

    def _agent_call(
        self, conn: NodeConnection, args: Sequence[str], timeout: float, *, idempotent: bool = True
    ) -> dict[str, Any]:
        node = conn.node
        if node.name not in self._agent_ready:
            self._push_agent(conn)
        res = conn.run([node.python, node.agent_path, *args, "--json"], timeout=timeout,
                       idempotent=idempotent)
        try:
            answer = json.loads(res.out)
        except json.JSONDecodeError as exc:
            raise AgentError(node.name, args[0], "bad_output",
                             f"exit {res.exit_status}; stdout {res.out[:200]!r}; "
                             f"stderr {res.err[-300:]!r}") from exc
        if not answer.get("ok"):
            err = answer.get("error") or {}
            raise AgentError(node.name, args[0], str(err.get("code", "error")),
                             str(err.get("message", res.err[-300:])))
        data = answer.get("data")
        return data if isinstance(data, dict) else {}

    def agent(self, node: str, *args: str, timeout: float = AGENT_TIMEOUT_S) -> dict[str, Any]:
        """Run one agent verb on one node and return its data."""
        try:
            return self._agent_call(self.ssh[node], args, timeout)
        except SSHError as exc:
            if exc.transient:
                raise NodeUnreachable({node: exc}) from exc
            raise LabError(str(exc)) from exc

    def agent_all(
        self, *args: str, nodes: Iterable[Node | str] | None = None, timeout: float = AGENT_TIMEOUT_S,
        tolerate: bool = False,
    ) -> dict[str, Any]:
        """The same agent verb on many nodes at once. Unreachable nodes raise
        NodeUnreachable, unless `tolerate`, when their entry is the exception."""
        results = self.ssh.each(lambda c: self._agent_call(c, args, timeout), self._names(nodes))
        if tolerate:
            return {k: (_as_lab_error(k, v) if isinstance(v, Exception) else v) for k, v in results.items()}
        down = {k: v for k, v in results.items() if isinstance(v, SSHError) and v.transient}
        if down:
            raise NodeUnreachable(down)
        for v in results.values():
            if isinstance(v, LabError):
                raise v
            if isinstance(v, Exception):
                raise LabError(str(v)) from v
        return results

    def _push_agent(self, conn: NodeConnection) -> None:
        source = agent_source()
        expected = hashlib.sha256(source).hexdigest()
        node = conn.node
        conn.makedirs(node.work_dir)
        conn.put_bytes(source, node.agent_path, mode=0o755)
        res = conn.run([node.python, node.agent_path, "self-check", "--json"], timeout=AGENT_TIMEOUT_S)
        try:
            got = json.loads(res.out)["data"]["sha256"]
        except (ValueError, KeyError, TypeError) as exc:
            raise AgentError(node.name, "self-check", "bad_output",
                             f"exit {res.exit_status}: {res.err[-300:] or res.out[:200]}") from exc
        if got != expected:
            raise AgentError(node.name, "self-check", "checksum",
                             f"agent.py on the node has sha256 {got}, expected {expected}")
        self._agent_ready.add(node.name)

    def push_agent(self, nodes: Iterable[Node | str] | None = None) -> None:
        """Copy agent.py to the nodes and verify its checksum there."""
        names = self._names(nodes)
        for name in names:
            self._agent_ready.discard(name)
        results = self.ssh.each(self._push_agent, names)
        errors = {k: v for k, v in results.items() if isinstance(v, Exception)}
        if errors:
            transient = {k: v for k, v in errors.items() if isinstance(v, SSHError) and v.transient}
            if transient:
                raise NodeUnreachable(transient)
            first = next(iter(errors.values()))
            raise first if isinstance(first, LabError) else LabError(str(first))

    # -- facts, caches, telemetry -----------------------------------------------------
    def facts(self, nodes: Iterable[Node | str] | None = None, *, tolerate: bool = False) -> dict[str, Any]:
        model_dirs = {n.name: n.model_dir for n in self.nodes}
        names = self._names(nodes)
        results = self.ssh.each(
            lambda c: self._agent_call(c, ["facts", "--model-dir", model_dirs[c.node.name]], AGENT_TIMEOUT_S),
            names,
        )
        out: dict[str, Any] = {}
        down: dict[str, BaseException] = {}
        for name, value in results.items():
            if isinstance(value, Exception):
                err = _as_lab_error(name, value)
                if not tolerate:
                    if isinstance(err, NodeUnreachable):
                        down[name] = value
                        continue
                    raise err
                out[name] = err
            else:
                out[name] = value
        if down:
            raise NodeUnreachable(down)
        return out

    def drop_caches(self, nodes: Iterable[Node | str] | None = None) -> dict[str, Any]:
        return self.agent_all("drop-caches", nodes=nodes)

    def _sampler_file(self, node: Node) -> str:
        return f"{node.work_dir}/telemetry/samples.jsonl"

    def start_sampler(self, nodes: Iterable[Node | str] | None = None, interval_s: float = 1.0) -> None:
        """Start the telemetry sampler on the nodes, one sample per `interval_s` of the
        nodes' own clock (lab time: a simulated node's clock runs at the lab's dilation)."""
        names = self._names(nodes)

        def start(conn: NodeConnection) -> dict[str, Any]:
            conn.makedirs(f"{conn.node.work_dir}/telemetry")  # one round trip once it exists
            return self._agent_call(
                conn, ["sampler", "start", "--out", self._sampler_file(conn.node),
                       "--interval", f"{interval_s:.6g}"], AGENT_TIMEOUT_S)

        _raise_first(self.ssh.each(start, names))

    def stop_sampler(self, nodes: Iterable[Node | str] | None = None) -> None:
        names = self._names(nodes)
        _raise_first(self.ssh.each(
            lambda c: self._agent_call(c, ["sampler", "stop", "--out", self._sampler_file(c.node)],
                                       AGENT_TIMEOUT_S), names))

    def telemetry(
        self, since: float = 0.0, nodes: Iterable[Node | str] | None = None
    ) -> dict[str, list[dict[str, Any]]]:
        """Samples newer than `since` (lab epoch seconds) per node."""
        names = self._names(nodes)
        results = self.ssh.each(
            lambda c: self._agent_call(
                c, ["telemetry", "--out", self._sampler_file(c.node), "--since", repr(float(since))],
                AGENT_TIMEOUT_S),
            names,
        )
        _raise_first(results)
        return {k: list(v["samples"]) for k, v in results.items() if isinstance(v, dict)}

    # -- the engine -------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        head = self.inventory.head
        return f"http://{head.host}:{head.api_port}"

    def log_file(self, node: Node) -> str:
        return f"{node.work_dir}/logs/engine.log"

    def status(self, nodes: Iterable[Node | str] | None = None) -> dict[str, Any]:
        return self.agent_all("status", nodes=nodes, tolerate=True)

    def stop(self, nodes: Iterable[Node | str] | None = None) -> dict[str, Any]:
        """Stop the engine everywhere it may run; unreachable nodes are reported, not raised."""
        return self.agent_all("stop", nodes=nodes, tolerate=True)

    # -- the engine's API key ---------------------------------------------------------
    @property
    def engine_api_key(self) -> str:
        """The API key of the engines this session launches with authentication on, and
        what the measurement client sends them (`Authorization: Bearer`). Derived for the
        session's owner (its job) from the platform's SSH key for the lab, the one secret
        every process reaching the lab already holds, so it is stored nowhere; see
        `engine_key`."""
        return engine_key(self._engine_key_secret(), self.owner)

    def _engine_key_secret(self) -> bytes:
        if self._key_secret is None:
            try:
                material = Path(self.inventory.head.key_file).read_bytes()
            except OSError as exc:
                # No key file, no SSH either: a session that only renders. Keys derived here
                # hold for this process only.
                log.warning("engine key: the lab's SSH key cannot be read (%s); using a key "
                            "for this process only", exc)
                material = _process_secret()
            self._key_secret = hashlib.sha256(b"engine-key-secret\n" + material).digest()
        return self._key_secret

    def redact(self, text: str) -> str:
        """`text` (an engine log) with this session's engine key, and any secret an engine
        prints in its words (lab.config.mask_text), masked."""
        if not text:
            return text
        key = self.engine_api_key
        return mask_text(text.replace(key, mask_secret(key)))

    def specs_for(self, config: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The launch specs `config` renders to on this lab: one per node it uses, head first,
        every secret masked (`launch` puts the engine key in place of the API key's mask in
        what it uploads; `uploaded_specs`)."""
        from lab.engines import render  # engines import config validation; keep startup light
        from lab.engines.evidence import with_evidence_on

        # The lab runs a configuration with the evidence on (the engine's stats lines and
        # metrics, its INFO lines): a customer's setting that takes it away is theirs to
        # keep, and the report says what it hides (lab.engines.evidence).
        config = with_evidence_on(config)
        nodes = self.nodes_for(config)
        # The customer's model path names a model of the lab's catalog (render admits it
        # against that catalog first); on this lab its weights live at the catalog's path.
        catalog = self.inventory.catalog
        served = catalog.served(config)
        model_dir = served.path if served is not None else nodes[0].model_dir
        # An ephemeral JIT cache gets a folder of its own per launch (the agent empties it).
        rendered = render(config, nodes, model_dir=model_dir, catalog=catalog, per_launch_cache=True)
        specs = [shown_spec(spec) for spec in rendered]
        if self.owner:
            specs = [{**spec, "owner": dict(self.owner)} for spec in specs]
        return specs

    def uploaded_specs(self, config: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The specs `launch` uploads for `config`: `specs_for`'s with the engine key in place
        of the API key's mask (identical for a configuration without authentication). Their
        hashes are what the nodes report (`spec_sha256`)."""
        specs = self.specs_for(config)
        if not any(_authenticates(spec) for spec in specs):
            return specs
        key = self.engine_api_key
        return [authenticated(spec, key) for spec in specs]

    def _healthy(self) -> bool:
        try:
            with httpx.Client(timeout=httpx.Timeout(5.0, connect=2.0), trust_env=False) as http:
                return http.get(f"{self.endpoint}/health").status_code == 200
        except httpx.HTTPError:
            return False

    def serving_state(self, config: Mapping[str, Any]) -> ServingState:
        """Whether the lab serves `config` and, if not, why, from what the nodes say: one
        agent `status` per node the configuration uses (in parallel), each naming the hash
        of the spec its engine was launched from, then /health when every node matched.

        A 200 from /health alone cannot tell our configuration from the one another job
        left running. Raises NodeUnreachable when a node does not answer."""
        expected = {spec["node"]: spec_sha256(spec) for spec in self.uploaded_specs(config)}
        observed: dict[str, frozenset[str]] = {}
        env = dict(config.get("env") or {})
        extra = {name: value for name, value in OBSERVATION_ENV.items() if name not in env}
        if extra:
            variant = {**config, "env": {**env, **extra}}
            for spec in self.uploaded_specs(variant):
                observed[spec["node"]] = frozenset({spec_sha256(spec)})
        status = self.agent_all("status", nodes=list(expected))
        state = ServingState(expected, status, healthy=None, observed_sha256=observed)
        if state.other_nodes or state.idle_nodes:
            return state
        return ServingState(expected, status, healthy=self._healthy(), observed_sha256=observed)

    def serves(self, config: Mapping[str, Any]) -> bool:
        """True when every node `config` uses runs an engine started from the spec this
        configuration renders for it, and the API answers /health."""
        return self.serving_state(config).serving

    def relaunch_checked(self, config: Mapping[str, Any], *, timeout_s: float,
                         on_retry: Callable[[str], None] | None = None) -> ServingState:
        """Restart `config` warm and make sure every node then runs the spec it renders (its
        hash, as each agent reports it): measuring otherwise would measure the previous
        configuration under this one's name. One more restart when a node does not, after
        `on_retry(reason)`; the state after the last launch is returned. Raises what
        `launch` raises."""
        self.launch(config, cold=False, timeout_s=timeout_s)
        state = self.serving_state(config)
        if not state.serving:
            if on_retry is not None:
                on_retry(state.reason)
            self.launch(config, cold=False, timeout_s=timeout_s)
            state = self.serving_state(config)
        return state

    def launch(
        self, config: Mapping[str, Any], *, cold: bool = True, timeout_s: float = 3600.0
    ) -> LaunchResult:
        """Start `config` on the nodes it needs and wait until the API answers /health.

        `cold`: stop every engine and drop the page cache first, so the figure is a true
        cold start. `timeout_s` is in lab seconds.
        """
        nodes = self.nodes_for(config)
        specs = self.specs_for(config)
        uploads = self.uploaded_specs(config)
        by_node = {n.name: n for n in nodes}

        def prepare(conn: NodeConnection) -> None:
            # Every node in one parallel round, each doing its own steps in turn: stop any
            # engine (on every node of the lab: a rank of another configuration would hold
            # its GPU), then, on the nodes this configuration uses, drop the page cache for
            # a cold start and place the launch spec. One round instead of three: on a
            # simulated lab each round's slowest round trip is stretched into lab time.
            node = conn.node
            try:
                self._agent_call(conn, ["stop"], AGENT_TIMEOUT_S)
            except Exception as exc:
                # As `stop`: a node we do not need may be down; one we need fails below.
                log.info("launch: stopping the engine on %s failed: %s", node.name, exc)
            if node.name not in by_node:
                return
            if cold:
                self._agent_call(conn, ["drop-caches"], AGENT_TIMEOUT_S)
            spec = next(s for s in uploads if s["node"] == node.name)
            conn.makedirs(f"{node.work_dir}/launch", str(Path(spec["log_file"]).parent))
            conn.put_bytes(spec_bytes(spec), f"{node.work_dir}/launch/spec.json")

        prepared = self.ssh.each(prepare, self._names(None))
        _raise_first({name: value for name, value in prepared.items() if name in by_node})
        try:
            return self._start_and_wait(nodes, specs, timeout_s, cold=cold)
        except BaseException:
            # Ranks that did start would hold the GPUs of a launch that failed.
            self.stop(nodes)
            raise

    def _start_and_wait(
        self, nodes: Sequence[Node], specs: list[dict[str, Any]], timeout_s: float, *, cold: bool
    ) -> LaunchResult:
        by_node = {n.name: n for n in nodes}
        windows: dict[str, tuple[float, float]] = {}

        def start(conn: NodeConnection) -> dict[str, Any]:
            sent = self.clock.now()
            # Not idempotent: sent twice after a dropped connection, the second would find
            # the engine running and report a start that worked as failed.
            data = self._agent_call(conn, ["launch", "--spec", f"{conn.node.work_dir}/launch/spec.json"],
                                    AGENT_TIMEOUT_S, idempotent=False)
            windows[conn.node.name] = (sent, self.clock.now())
            return data

        started_wall = time.monotonic()
        results = self.ssh.each(start, list(by_node))
        _raise_first(results)
        self._launched = list(by_node)
        engines = {spec["node"]: str(spec["engine"]) for spec in specs}
        ready_wall = self._wait_healthy(nodes, engines, started_wall, timeout_s)
        ready_at = self.clock.at(time.time() - (time.monotonic() - ready_wall))
        # The cold start runs from the moment the last rank was started, by the nodes' own
        # clocks: the few tenths of a second our parallel SSH calls take to reach every node
        # are ours, not the engine's (and a simulated lab would inflate them by its dilation).
        # A node's clock may disagree with ours, though, and ready_at is ours: each reported
        # start is held inside the window of its own launch call (it did happen between our
        # sending the call and its answer), so a skew costs at most that call's duration.
        starts: dict[str, float] = {}
        corrections: dict[str, float] = {}
        for name, data in results.items():
            if not isinstance(data, dict):
                continue
            reported = float(data["started"])
            sent, answered = windows[name]
            starts[name] = min(max(reported, sent), answered)
            corrections[name] = round(starts[name] - reported, 3)
        # NTP keeps a real lab within milliseconds; only a skew worth a second is news.
        skewed = {name: c for name, c in corrections.items() if abs(c) >= 1.0}
        if skewed:
            log.warning("launch: start times outside their call windows (node clock skew?), "
                        "corrected by %s lab s", skewed)
        started_at = max(starts.values())
        return LaunchResult(
            endpoint=self.endpoint,
            cold_start_s=round(ready_at - started_at, 3),
            started_at=started_at,
            ready_at=ready_at,
            specs=specs,
            warm=not cold,
            start_corrections_s=corrections,
        )

    def _wait_healthy(self, nodes: Sequence[Node], engines: Mapping[str, str], started_wall: float,
                      timeout_s: float) -> float:
        """Poll /health until it answers 200; return the monotonic time it first did.

        A watcher thread asks the nodes every few seconds whether the engine still runs,
        so a start that died is reported with its log instead of waiting for the timeout,
        and so those SSH round trips never delay the moment we see the API come up.
        """
        deadline = started_wall + self.clock.wall_seconds(timeout_s)
        # About once a lab second, but no faster than 50 Hz on the wall clock.
        poll = min(1.0, max(0.02, self.clock.wall_seconds(1.0)))
        # Each status check is an SSH round trip to every node: at most twice a wall second,
        # or on a fast simulated lab the checks themselves would slow what they watch.
        status_every = max(0.5, min(2.0, self.clock.wall_seconds(10.0)))
        failure: list[LabError] = []
        done = threading.Event()

        def watch() -> None:
            while not done.wait(status_every):
                try:
                    self._check_running(nodes, engines)
                except LabError as exc:
                    failure.append(exc)
                    return
                except Exception as exc:  # a watcher that dies silently would hide a crash
                    failure.append(LabError(f"checking the engine failed: {exc}"))
                    return

        watcher = threading.Thread(target=watch, name="launch-watch", daemon=True)
        watcher.start()
        url = f"{self.endpoint}/health"
        try:
            with httpx.Client(timeout=httpx.Timeout(5.0, connect=2.0), trust_env=False) as http:
                while True:
                    try:
                        if http.get(url).status_code == 200:
                            return time.monotonic()
                    except httpx.HTTPError:
                        pass
                    if failure:
                        raise failure[0]
                    if time.monotonic() >= deadline:
                        raise LaunchTimeout(
                            f"the engine did not answer {url} within {timeout_s:g} lab seconds")
                    time.sleep(poll)
        finally:
            done.set()
            watcher.join()

    def _check_running(self, nodes: Sequence[Node], engines: Mapping[str, str]) -> None:
        """LaunchFailed for the first node whose engine is no longer running, with the
        error its log ends on (read by the log parser of `engines[node]`)."""
        from lab.engines import failure_message

        for name, st in self.status(nodes).items():
            if isinstance(st, NodeUnreachable):
                raise st
            if isinstance(st, dict) and not st.get("running"):
                tail = self.logs(name, tail_bytes=FAILED_LOG_TAIL_BYTES).text
                code = st.get("exit_code")
                raise LaunchFailed(name, None if code is None else int(code), tail,
                                   failure_message(engines[name], tail))

    def logs(self, node: str | None = None, since: int = 0, *, tail_bytes: int | None = None,
             max_bytes: int = 4 * 1024 * 1024) -> LogChunk:
        """The engine log of a node (the head by default) from byte `since`.

        `tail_bytes` asks for only the last bytes instead.
        """
        target = self.inventory.node(node) if node else self.inventory.head
        path = self.log_file(target)
        if tail_bytes is not None:
            size = int(self.agent(target.name, "logs", "--file", path, "--since", "0", "--max", "0")["size"])
            if tail_bytes <= 0:
                # Where the log ends now (what a later read starts from): nothing more to ask.
                return LogChunk(target.name, path, size, size, size, "")
            since = max(0, size - tail_bytes)
        data = self.agent(target.name, "logs", "--file", path, "--since", str(since), "--max", str(max_bytes))
        # Offsets are the file's bytes; the text is shown to people, so the engine key an
        # engine may print is masked in it (`redact`).
        return LogChunk(target.name, path, int(data["offset"]), int(data["next_offset"]),
                        int(data["size"]), self.redact(str(data["text"])))

    def tokenizer_path(self, cache_dir: Path | None = None) -> Path:
        """A local copy of the model's tokenizer from the head node's model directory.

        Without `cache_dir`, the session's own copy: fetched once, then reused (every
        measurement asks for it, and the model directory does not change under a session)."""
        head = self.inventory.head
        if cache_dir is None:
            if self._tokenizer is not None and self._tokenizer.is_file():
                return self._tokenizer
            if self._tokenizer_dir is None:
                self._tokenizer_dir = tempfile.TemporaryDirectory(prefix="diag-tokenizer-")
            self._tokenizer = self.tokenizer_path(Path(self._tokenizer_dir.name))
            return self._tokenizer
        dest_dir = Path(cache_dir)
        dest_dir.mkdir(parents=True, exist_ok=True)
        conn = self.ssh[head.name]
        errors: list[str] = []
        for name in ("tokenizer.json", "tiktoken.model"):
            try:
                data = conn.get_bytes(f"{head.model_dir}/{name}")
            except (SSHError, OSError) as exc:
                errors.append(f"{name}: {exc}")
                continue
            dest = dest_dir / name
            dest.write_bytes(data)
            return dest
        raise LabError(f"{head.name}: no tokenizer in {head.model_dir} ({'; '.join(errors)})")


_PROCESS_SECRET: list[bytes] = []


def _process_secret() -> bytes:
    if not _PROCESS_SECRET:
        _PROCESS_SECRET.append(secrets.token_bytes(32))
    return _PROCESS_SECRET[0]


def _authenticates(spec: Mapping[str, Any]) -> bool:
    """Whether a spec turns the engine's API authentication on (a key is given)."""
    argv = list(spec.get("argv") or [])
    if any(auth_flag(flag) and (argv[i].partition("=")[2] if inline else argv[i])
           for i, flag, inline in argv_secrets(argv)):
        return True
    return any(dict(spec.get("env") or {}).get(name) for name in AUTH_ENV)


def _as_lab_error(node: str, exc: BaseException) -> LabError:
    if isinstance(exc, LabError):
        return exc
    if isinstance(exc, SSHError) and exc.transient:
        return NodeUnreachable({node: exc})
    return LabError(str(exc))


def _raise_first(results: Mapping[str, Any]) -> None:
    down = {k: v for k, v in results.items() if isinstance(v, SSHError) and v.transient}
    if down:
        raise NodeUnreachable(down)
    for name, value in results.items():
        if isinstance(value, Exception):
            raise _as_lab_error(name, value) from value
