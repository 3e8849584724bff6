"""The node agent as the platform sees it: where agent.py is, its bytes (with the lab's
environment and flag policies written in) and checksum for pushing it to nodes, and the `lab.agent/1`
JSON Schema that the real agent's answers and the simulated nodes' answers are both
validated against.

agent.py itself is stdlib-only and runs on the nodes; nothing here is imported there.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

AGENT_PATH = Path(__file__).with_name("agent.py")
SCHEMA_PATH = Path(__file__).with_name("schema.json")


class AgentResponseError(ValueError):
    """An agent answer that does not match schema.json; the message names each field."""


# The lines of agent.py that the push fills with the compiled environment and flag policies.
POLICY_LINE = b'ENV_POLICY_JSON = ""\n'
FLAG_POLICY_LINE = b'FLAG_POLICY_JSON = ""\n'


def agent_source() -> bytes:
    """The bytes of agent.py as copied to a node: the file with the lab's environment
    policy (lab.env_policy.policy_json) and flag policy (lab.flag_policy.policy_json)
    written into its ENV_POLICY_JSON and FLAG_POLICY_JSON lines, so that the agent holds
    launch specs to the same lists as intake and the checksum verified after the push
    covers them."""
    from lab.env_policy import policy_json  # reads the release tables: only when pushing
    from lab.flag_policy import policy_json as flag_policy_json

    source = AGENT_PATH.read_bytes()
    for line, text in ((POLICY_LINE, policy_json()), (FLAG_POLICY_LINE, flag_policy_json())):
        if source.count(line) != 1:
            raise RuntimeError(f"{AGENT_PATH} must hold the line {line!r} exactly once")
        name = line.split(b" = ")[0]
        source = source.replace(line, name + b" = " + repr(text).encode("ascii") + b"\n")
    return source


def agent_sha256() -> str:
    """What `self-check` must report on a node that holds this agent."""
    return hashlib.sha256(agent_source()).hexdigest()


@cache
def agent_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return schema


def _check(instance: Any, schema: dict[str, Any], what: str) -> None:
    from jsonschema import Draft202012Validator  # only the platform and tests need it

    errors = sorted(Draft202012Validator(schema).iter_errors(instance),
                    key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
                 for e in errors[:5]]
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        raise AgentResponseError(f"{what} does not match lab/agent/schema.json: "
                                 + "; ".join(lines) + more)


def validate_response(answer: Any) -> None:
    """Raise AgentResponseError unless `answer` is a well-formed `lab.agent/1` envelope
    whose data matches its verb."""
    _check(answer, agent_schema(), "agent answer")


def validate_sample(sample: Any) -> None:
    """Raise AgentResponseError unless `sample` is a well-formed telemetry sample line."""
    schema = agent_schema()
    _check(sample, {"$schema": schema["$schema"], "$defs": schema["$defs"],
                    "$ref": "#/$defs/telemetry_sample"}, "telemetry sample")
