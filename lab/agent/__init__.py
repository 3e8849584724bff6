"""The node agent as the platform sees it: where agent.py is, and the `lab.agent/1` JSON
Schema that the real agent's answers and the simulated nodes' answers are both validated
against. The bytes pushed to nodes (agent.py with the lab's policies written in) are
lab.agent_push's: the policies build on the agent's own constants, not the reverse.

agent.py itself is stdlib-only and runs on the nodes; nothing here is imported there.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

AGENT_PATH = Path(__file__).with_name("agent.py")
SCHEMA_PATH = Path(__file__).with_name("schema.json")


class AgentResponseError(ValueError):
    """An agent answer that does not match schema.json; the message names each field."""


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
