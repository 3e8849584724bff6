"""The measurement workloads: fixed, versioned prompt sets shipped with the package.

Each workload file (`code.yaml`, `prose.yaml`) holds its version, the fixed request
parameters (temperature 0, max_tokens, ignore_eos, streaming with usage), two warm-up
prompts and the measured prompts; run i of a measurement uses prompt i.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

WORKLOAD_SCHEMA = "diagnostic.workload/1"
BUILT_IN = ("code", "prose")

# LAB_MODEL.md section 7: a prompt is `code` when it holds a code fence or one of these
# words (whole words, any case); otherwise it is `prose`.
CODE_WORDS = (
    "code",
    "function",
    "implement",
    "program",
    "class",
    "def",
    "Python",
    "script",
    "bug",
    "refactor",
)
_CODE_WORD = re.compile(r"\b(?:" + "|".join(CODE_WORDS) + r")\b", re.IGNORECASE)
CODE_FENCE = "```"


class WorkloadError(ValueError):
    """A workload file that cannot be used; the message names the file and the field."""


def classify_prompt(prompt: str) -> str:
    """`code` or `prose`, by LAB_MODEL.md section 7's rule."""
    return "code" if CODE_FENCE in prompt or _CODE_WORD.search(prompt) else "prose"


@dataclass(frozen=True)
class Workload:
    name: str
    version: int
    request: dict[str, Any]
    warmup: tuple[str, ...]
    prompts: tuple[str, ...]

    @property
    def digest(self) -> str:
        """sha256 of the prompts and request parameters: what was measured, exactly."""
        blob = json.dumps(
            {"request": self.request, "warmup": self.warmup, "prompts": self.prompts}, sort_keys=True
        ).encode()
        return hashlib.sha256(blob).hexdigest()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "sha256": self.digest,
            "prompts": len(self.prompts),
            "warmup": len(self.warmup),
        }


def load_workload(name: str) -> Workload:
    """A built-in workload by name (`code`, `prose`)."""
    if name not in BUILT_IN:
        raise WorkloadError(f"workload {name!r}: not one of {', '.join(BUILT_IN)}")
    text = resources.files(__name__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    return parse_workload(yaml.safe_load(text), source=f"{name}.yaml")


def parse_workload(data: Any, *, source: str = "workload") -> Workload:
    if not isinstance(data, dict):
        raise WorkloadError(f"{source}: expected a mapping, got {type(data).__name__}")
    if data.get("schema") != WORKLOAD_SCHEMA:
        raise WorkloadError(f"{source}: schema must be {WORKLOAD_SCHEMA!r}, got {data.get('schema')!r}")
    fields = (("name", str), ("version", int), ("request", dict), ("warmup", list), ("prompts", list))
    for key, kind in fields:
        if not isinstance(data.get(key), kind):
            raise WorkloadError(f"{source}: {key} must be a {kind.__name__}, got {data.get(key)!r}")
    for key in ("warmup", "prompts"):
        for i, prompt in enumerate(data[key]):
            if not isinstance(prompt, str) or not prompt.strip():
                raise WorkloadError(f"{source}: {key}[{i}] must be a non-empty string")
    return Workload(
        name=data["name"],
        version=data["version"],
        request=dict(data["request"]),
        warmup=tuple(data["warmup"]),
        prompts=tuple(data["prompts"]),
    )
