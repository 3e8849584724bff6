"""The node agent as pushed to the nodes: agent.py with the lab's environment and flag
policies written in, and the checksum its `self-check` must then report. Above both the
agent (whose constants the policies use) and the policies (lab.env_policy,
lab.flag_policy, which read the release tables)."""

from __future__ import annotations

import hashlib

from lab.agent import AGENT_PATH
from lab.env_policy import policy_json
from lab.flag_policy import policy_json as flag_policy_json

# The lines of agent.py that the push fills with the compiled environment and flag policies.
POLICY_LINE = b'ENV_POLICY_JSON = ""\n'
FLAG_POLICY_LINE = b'FLAG_POLICY_JSON = ""\n'


def agent_source() -> bytes:
    """The bytes of agent.py as copied to a node: the file with the lab's environment
    policy (lab.env_policy.policy_json) and flag policy (lab.flag_policy.policy_json)
    written into its ENV_POLICY_JSON and FLAG_POLICY_JSON lines, so that the agent holds
    launch specs to the same lists as intake and the checksum verified after the push
    covers them."""
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
