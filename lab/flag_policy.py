"""The lab's flag policy (`lab.flag-policy/1`): which flags a launch of each modelled engine
release may carry, who sets each, and what its value must be.

Each modelled release has its reviewed list beside its table:
lab/engines/releases/<engine>-<version>.flags.yaml (the header of vllm-0.34.0.flags.yaml
says how a list is written). This module is the one finder: `release_list` reads a list,
checks it against the release's table (every option string listed exists in that
release, a switch takes no value and a flag with a value rule takes one, `choices:
release` names the choices the table holds) and returns it compiled: each flag with its
rule and the number of values the release's argparse gives it (`nargs`).

Four readers use the same lists: intake (lab.engines.base `Engine.check_extra_args`, which
refuses any flag not listed for a customer and stores each under its listed spelling),
rendering (lab.engines.render holds every rendered argv to the list before a node sees
it), the simulated nodes and the node agent, which receives every list compiled into its
own bytes when it is pushed (`policy_json`; lab.agent_push.agent_source) and refuses a launch
spec whose argv is not the engine's entry point with listed flags only. The value rules
are the agent's functions (lab/agent/agent.py `flag_value_problem`, `argv_problem`),
imported here, so that no two readers can disagree about a flag or a value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from lab.agent.agent import (
    FLAG_RULES,
    JSON_KEY_RULES,
    argv_problem,
    flag_rule_text,
    flag_value_problem,
)
from lab.env_policy import RELEASES_DIR, _release, label, modelled

SCHEMA = "lab.flag-policy/1"
# What a flag's value makes the engine load (lab.engines.admission's checks).
LOADS = ("remote_code", "tokenizer", "chat_template", "generation_config")
_FLAG_KEYS = {"rule", "set_by", "passes", "loads", "words", "why"}
_RULE_KEYS: dict[str, set[str]] = {
    "switch": set(),
    "number": {"type", "min", "max"},
    "choice": {"choices"},
    "identifier": set(),
    "name": set(),
    "models-path": set(),
    "secret": set(),
    "address": set(),
    "host-port": set(),
    "json": {"keys"},
    "bool": set(),
    "ints": {"min", "max"},
}
_FIELD = re.compile(r"^(lab|[a-z_]+(\.[a-z_]+)?)$")

__all__ = ["argv_problem", "flag_rule_text", "flag_value_problem"]


class FlagPolicyError(ValueError):
    """A release's flag list is malformed or does not match the release (a reviewer's typo
    must not open or close the lab silently)."""


def list_path(engine: str, version: str) -> Path:
    return RELEASES_DIR / f"{engine}-{version}.flags.yaml"


def shown_path(engine: str, version: str) -> str:
    """Where the list is, as messages name it (relative to the repository)."""
    return f"lab/engines/releases/{list_path(engine, version).name}"


def _number_rule(rule: Mapping[str, Any], where: str, *, typed: bool = True) -> None:
    if typed and rule.get("type") not in ("int", "float"):
        raise FlagPolicyError(f"{where}: a number needs type int or float")
    for bound in ("min", "max"):
        if not isinstance(rule.get(bound), int | float) or isinstance(rule.get(bound), bool):
            raise FlagPolicyError(f"{where}: needs {bound}, a number")


def _check_rule(rule: Any, where: str, allowed: Sequence[str], table_entry: Mapping[str, Any] | None,
                extra_keys: set[str]) -> dict[str, Any]:
    if not isinstance(rule, Mapping) or rule.get("rule") not in allowed:
        raise FlagPolicyError(f"{where}: needs rule: one of {', '.join(allowed)}")
    kind = str(rule["rule"])
    unknown = set(rule) - {"rule", "words"} - extra_keys - _RULE_KEYS[kind]
    if unknown:
        raise FlagPolicyError(f"{where}: {sorted(unknown)} do not apply to rule {kind}")
    out = dict(rule)
    if kind == "number":
        _number_rule(rule, where)
    elif kind == "ints":
        _number_rule(rule, where, typed=False)
    elif kind == "choice":
        choices = rule.get("choices")
        if choices == "release":
            held = (table_entry or {}).get("choices")
            if not held:
                raise FlagPolicyError(f"{where}: choices: release, but the release's table holds "
                                      "no choices for it; list them")
            choices = [str(c) for c in held if c is not None]
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
            raise FlagPolicyError(f"{where}: a choice needs choices, a list of strings (or release)")
        out["choices"] = choices
    elif kind == "json":
        keys = rule.get("keys")
        if not isinstance(keys, Mapping) or not keys:
            raise FlagPolicyError(f"{where}: a json rule needs keys")
        out["keys"] = {str(k): _check_rule(v, f"{where}.keys.{k}", JSON_KEY_RULES, None, set())
                       for k, v in keys.items()}
    words = rule.get("words")
    if words is not None and (not isinstance(words, list) or not all(isinstance(w, str) for w in words)):
        raise FlagPolicyError(f"{where}: words must be a list of strings")
    return out


def _flag(name: str, raw: Any, table: Mapping[str, Mapping[str, Any]], where: str) -> dict[str, Any]:
    entry = table.get(name)
    if entry is None:
        raise FlagPolicyError(f"{where}: the release has no option {name}")
    rule = _check_rule(raw, where, FLAG_RULES, entry, _FLAG_KEYS)
    switch = rule["rule"] == "switch"
    if switch == bool(entry.get("takes_value")):
        raise FlagPolicyError(f"{where}: the release's {name} "
                              f"{'takes a value' if entry.get('takes_value') else 'takes no value'}, "
                              f"but the rule is {rule['rule']}")
    set_by = rule.get("set_by")
    if set_by is not None and not (isinstance(set_by, str) and _FIELD.match(set_by)):
        raise FlagPolicyError(f"{where}: set_by must be lab or a configuration field")
    if rule.get("loads") is not None and rule["loads"] not in LOADS:
        raise FlagPolicyError(f"{where}: loads must be one of {', '.join(LOADS)}")
    passes = rule.get("passes")
    if passes is not None and (set_by in (None, "lab") or not isinstance(passes, list)):
        raise FlagPolicyError(f"{where}: passes is a list, for a flag a field sets")
    rule.pop("why", None)
    if not switch:
        rule["nargs"] = entry.get("nargs")
    return rule


@cache
def release_list(engine: str, version: str) -> dict[str, Any]:
    """The list of `engine` `version`, checked against its table and compiled:
    {engine, version, label, list, entry, positionals, flags}. LookupError for a version
    the platform does not model; FlagPolicyError for a malformed list."""
    release = _release(engine, version)
    path = list_path(engine, version)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FlagPolicyError(f"{path}: {engine} {version} is modelled but has no flag list; "
                              "review one (see vllm-0.34.0.flags.yaml)") from None
    where = path.name
    if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
        raise FlagPolicyError(f"{where}: schema must be {SCHEMA}")
    if data.get("engine") != engine or str(data.get("version")) != version:
        raise FlagPolicyError(f"{where}: names {data.get('engine')} {data.get('version')}, "
                              f"not {engine} {version}")
    entry = data.get("entry")
    if not isinstance(entry, list) or not entry or not all(isinstance(e, str) for e in entry):
        raise FlagPolicyError(f"{where}: entry must be the program and its first arguments")
    table: dict[str, Mapping[str, Any]] = {}
    for flag_entry in release["flags"].values():
        for option in flag_entry["option_strings"]:
            table.setdefault(option, flag_entry)
    raw_flags = data.get("flags")
    if not isinstance(raw_flags, Mapping) or not raw_flags:
        raise FlagPolicyError(f"{where}: flags must map option strings to rules")
    flags = {str(name): _flag(str(name), rule, table, f"{where}: {name}")
             for name, rule in raw_flags.items()}
    positionals = []
    for index, raw in enumerate(data.get("positionals") or []):
        at = f"{where}: positionals[{index}]"
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
            raise FlagPolicyError(f"{at}: needs name")
        rule = _check_rule({k: v for k, v in raw.items() if k != "name"}, at, FLAG_RULES, None,
                           {"set_by"})
        positionals.append({"name": raw["name"], **rule})
    return {"engine": engine, "version": version, "label": label(engine, version),
            "list": shown_path(engine, version), "entry": list(entry),
            "positionals": positionals, "flags": flags}


def listed_spelling(engine: str, version: str, option_strings: Sequence[str], written: str,
                    negative: bool | None = None) -> str | None:
    """The spelling the list holds for the option a command gave as `written` (the option
    string the release's parser matched, an abbreviation already expanded): `written`
    itself when listed, else another listed string of the same option with the same
    sense (`negative`: whether `written` switches it off), else None."""
    flags = release_list(engine, version)["flags"]
    if written in flags:
        return written
    for option in option_strings:
        if option in flags and (negative is None or _negative(option) == negative):
            return option
    return None


def _negative(option: str) -> bool:
    return option.startswith(("--no-", "--disable-"))


def rule_of(engine: str, version: str, option: str) -> dict[str, Any] | None:
    """The listed rule of the exact option string `option`, None when not listed."""
    found: dict[str, Any] | None = release_list(engine, version)["flags"].get(option)
    return found


@cache
def compiled_policy() -> dict[str, Any]:
    """Every modelled release's list, as the agent reads it."""
    from lab.env_policy import load_policy  # the engines the lab knows

    engines = sorted(load_policy()["engines"])
    return {"schema": SCHEMA,
            "releases": {engine: {version: release_list(engine, version)
                                  for version in modelled(engine)} for engine in engines}}


def policy_json() -> str:
    """compiled_policy as the text written into the pushed agent (stable, ASCII)."""
    return json.dumps(compiled_policy(), sort_keys=True, separators=(",", ":"))


def launch_argv_problem(argv: Sequence[str], engine: Any, version: Any,
                        models_dir: str | None) -> tuple[str, str] | None:
    """The agent's check of a launch spec's argv (field, why), for rendering and the
    simulated nodes: what the real agent answers for the same argv."""
    return argv_problem(list(argv), engine, version, compiled_policy(), models_dir)


def main() -> None:
    """`python -m lab.flag_policy`: every release's list, for a reviewer."""
    for versions in compiled_policy()["releases"].values():
        for listed in versions.values():
            print(f"{listed['label']} ({listed['list']}): {' '.join(listed['entry'])}")
            for name, rule in listed["flags"].items():
                who = rule.get("set_by")
                by = " [the lab, per node]" if who == "lab" else (f" [from {who}]" if who else "")
                print(f"  {name}{by}: {flag_rule_text(rule)}")


if __name__ == "__main__":
    main()
