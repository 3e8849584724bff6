"""The lab's environment policy (`lab.env-policy/1`): which variables a configuration may
give an engine, per engine and version, and what each value must be.

lab/env_policy.yaml is the reviewed list (its header says how it is organised). A
version's list is the policy's variables for its engine that the version reads, by its
release table (lab/engines/releases/*.json `env`), plus the libraries' variables the lab
permits for every version (`common`). Exact names only: the family-and-word rules this
replaced let through variables that load code or reach the network (issue 29).

Two enforcers read this one policy: intake (lab.config `_env`, which words the refusals
for a customer) and the node agent, which receives it compiled into its own bytes when it
is pushed (`compiled_policy`, `policy_json`; lab.agent_push.agent_source) and refuses a launch
spec outside it. The value rules are the agent's functions (lab/agent/agent.py
`env_value_problem`), imported here, so the two cannot disagree about a value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from lab.agent.agent import (
    env_rule_text,
    env_value_problem,
    permitted_env,
    spec_env_problem,
)

SCHEMA = "lab.env-policy/1"
POLICY_PATH = Path(__file__).with_name("env_policy.yaml")
RULES = ("interface", "number", "choice", "bool", "path-in-cache", "secret", "address")
_RULE_KEYS = {
    "interface": {"ports"},
    "number": {"type", "min", "max"},
    "choice": {"choices", "list", "negatable"},
    "bool": set(),
    "path-in-cache": set(),
    "secret": set(),
    "address": set(),
}

__all__ = ["env_rule_text", "env_value_problem", "spec_env_problem"]


class PolicyError(ValueError):
    """lab/env_policy.yaml is malformed (a reviewer's typo must not open or close the lab
    silently)."""


def _rule(name: str, raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping) or raw.get("rule") not in RULES:
        raise PolicyError(f"{where}.{name}: needs rule: one of {', '.join(RULES)}")
    rule = dict(raw)
    extra = set(rule) - {"rule", "set_by"} - _RULE_KEYS[rule["rule"]]
    if extra:
        raise PolicyError(f"{where}.{name}: {sorted(extra)} do not apply to rule {rule['rule']}")
    if rule["rule"] == "number" and (rule.get("type") not in ("int", "float")
                                     or not isinstance(rule.get("min"), int | float)
                                     or not isinstance(rule.get("max"), int | float)):
        raise PolicyError(f"{where}.{name}: a number needs type (int or float), min and max")
    if rule["rule"] == "choice":
        choices = rule.get("choices")
        if not isinstance(choices, list) or not choices or \
                not all(isinstance(c, str) for c in choices):
            raise PolicyError(f"{where}.{name}: a choice needs choices, a list of strings")
    return rule


def _section(raw: Any, where: str) -> dict[str, dict[str, Any]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{where}: must map variable names to rules")
    return {str(name): _rule(str(name), rule, where) for name, rule in raw.items()}


@cache
def load_policy(path: Path = POLICY_PATH) -> dict[str, Any]:
    """lab/env_policy.yaml, checked: `labels`, `common`, `platform` and per engine its
    `variables` and `superseded` names. Shared: read it, do not change it."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
        raise PolicyError(f"{path}: schema must be {SCHEMA}")
    engines: dict[str, Any] = {}
    for engine, body in (data.get("engines") or {}).items():
        if not isinstance(body, Mapping):
            raise PolicyError(f"engines.{engine}: must hold variables and superseded")
        superseded = dict(body.get("superseded") or {})
        for name, entry in superseded.items():
            if not isinstance(entry, Mapping) or not {"flag", "field", "what"} <= set(entry):
                raise PolicyError(f"engines.{engine}.superseded.{name}: needs flag, field and what")
        engines[str(engine)] = {"variables": _section(body.get("variables"),
                                                      f"engines.{engine}.variables"),
                                "superseded": superseded}
    policy = {"labels": dict(data.get("labels") or {}),
              "common": _section(data.get("common"), "common"),
              "platform": _section(data.get("platform"), "platform"),
              "engines": engines}
    shared = set(policy["common"]) | set(policy["platform"])
    clash = set(policy["common"]) & set(policy["platform"])
    for body in engines.values():
        clash |= set(body["variables"]) & shared
    if clash:
        raise PolicyError(f"{sorted(clash)} listed twice: a name has one rule")
    return policy


# The release tables, read here directly rather than through lab.engines.tables: lab.config
# uses this module, and lab.engines builds on lab.config (a test keeps the two readings equal).
RELEASES_DIR = Path(__file__).resolve().parent / "engines" / "releases"
_RELEASE = re.compile(r"^(?P<engine>[a-z]+)-(?P<version>\d[\w.+-]*)\.json$")


def _version_key(version: str) -> tuple[tuple[int, str], ...]:
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"[.+-]", version))


@cache
def modelled(engine: str) -> tuple[str, ...]:
    """The versions of `engine` that have a release table, oldest first."""
    found = [m["version"] for path in RELEASES_DIR.glob("*.json")
             if (m := _RELEASE.match(path.name)) and m["engine"] == engine]
    return tuple(sorted(found, key=_version_key))


@cache
def _release(engine: str, version: str) -> dict[str, Any]:
    if version not in modelled(engine):
        raise LookupError(f"{engine} {version} is not a modelled release; modelled: "
                          f"{', '.join(modelled(engine)) or 'none'}")
    table: dict[str, Any] = json.loads((RELEASES_DIR / f"{engine}-{version}.json").read_text("utf-8"))
    return table


def version_reads(engine: str, version: str) -> frozenset[str]:
    """The variables `engine` `version` reads, by its release table (its registry, its
    direct reads and the deprecated aliases it still honours). LookupError for a version
    the platform does not model."""
    env = _release(engine, version)["env"]
    return frozenset(env.get("registry") or ()) | frozenset(env.get("read_directly") or {}) | \
        frozenset(env.get("deprecated_aliases") or {})


def removed_hint(engine: str, version: str, name: str) -> str | None:
    """The release's own migration hint for a variable it removed and refuses at start
    (vLLM 0.34.0's envs.py removed_environment_variables), else None."""
    hint = (_release(engine, version)["env"].get("removed") or {}).get(name)
    return str(hint) if hint is not None else None


def has_flag(engine: str, version: str, option: str) -> bool:
    """Whether `engine` `version` has the command-line option `option`."""
    return any(option in entry["option_strings"]
               for entry in _release(engine, version)["flags"].values())


@cache
def engine_variables(engine: str, version: str) -> dict[str, dict[str, Any]]:
    """The engine's own variables the lab permits for `version`: the policy's list for the
    engine that the version reads. LookupError for an unmodelled version."""
    reads = version_reads(engine, version)
    listed = load_policy()["engines"].get(engine, {}).get("variables", {})
    return {name: rule for name, rule in listed.items() if name in reads}


def permitted(engine: str, version: str) -> dict[str, dict[str, Any]]:
    """Every variable a configuration for `engine` `version` may set -> its rule: the
    libraries' (common) and the engine's own that the version reads. The platform's own
    (the JIT cache directories) are not among them: serving.jit_cache sets those."""
    return dict(sorted({**load_policy()["common"], **engine_variables(engine, version)}.items()))


def platform_rule(name: str) -> dict[str, Any] | None:
    """The rule of a variable the platform renders itself (None for any other)."""
    rule: dict[str, Any] | None = load_policy()["platform"].get(name)
    return rule


def superseded(engine: str, name: str) -> dict[str, str] | None:
    """What a customer meant to choose with `name`, which the engine chooses by a flag
    (`flag`, `field`, `what`), or None."""
    entry = load_policy()["engines"].get(engine, {}).get("superseded", {}).get(name)
    return dict(entry) if entry else None


def listed_for_engine(engine: str, name: str) -> bool:
    """Whether the policy lists `name` for `engine` at all (some version may not read it)."""
    return name in load_policy()["engines"].get(engine, {}).get("variables", {})


def label(engine: str, version: str) -> str:
    """"vLLM 0.34.0"."""
    return f"{load_policy()['labels'].get(engine, engine)} {version}"


@cache
def compiled_policy() -> dict[str, Any]:
    """The policy as the agent reads it: per engine, per modelled version, the engine's
    variables that version reads; the common and platform variables once."""
    policy = load_policy()
    return {
        "schema": SCHEMA,
        "labels": policy["labels"],
        "common": policy["common"],
        "platform": policy["platform"],
        "engines": {engine: {version: engine_variables(engine, version)
                             for version in modelled(engine)}
                    for engine in sorted(policy["engines"])},
    }


def policy_json() -> str:
    """compiled_policy as the text written into the pushed agent (stable, ASCII)."""
    return json.dumps(compiled_policy(), sort_keys=True, separators=(",", ":"))


def launch_env_problem(env: Mapping[str, str], engine: Any, version: Any,
                       cache_dir: str | None) -> tuple[str, str] | None:
    """The agent's check of a launch spec's env (field, why), for the simulated nodes and
    tests: what the real agent answers for the same spec."""
    return spec_env_problem(dict(env), engine, version, cache_dir, compiled_policy())


def agent_permitted(engine: str, version: str) -> dict[str, Any] | None:
    """What the agent accepts in a launch spec of `engine` `version` (platform variables
    included); None for a version the policy does not know."""
    return permitted_env(compiled_policy(), engine, version)


def main() -> None:
    """`python -m lab.env_policy`: every engine version's list, for a reviewer."""
    for engine in sorted(load_policy()["engines"]):
        for version in modelled(engine):
            print(f"{label(engine, version)}:")
            for name, rule in permitted(engine, version).items():
                print(f"  {name}: {env_rule_text(rule)}")


if __name__ == "__main__":
    main()
