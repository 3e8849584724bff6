"""Turning what a customer submits (form fields, a YAML file, a pasted launch command) into
a validated `diagnostic.config/1` configuration.

Validation and normalization belong to the lab layer (lab.config, lab.engines); this
module maps its errors onto Django's ValidationError so forms and the admin show the
message, which names the configuration field (`parallel.tp: must be ...`).

A configuration is admitted by the catalog of the lab it will run on (lab.catalog: the
models that lab holds): `lab_catalog(lab)` finds it, and every function here takes the
`catalog` to admit by. A booking's configuration is admitted by its lab's; only what names
no lab at all (catalog None) is held to the reference lab's (lab.catalog.load_catalog).

It is also where secrets stop (lab.config, "secrets"): an API key (`--api-key`,
`VLLM_API_KEY`), a credential variable or a token in a URL is replaced by its mask
(`••••` and at most its last four characters) in the normalized configuration and in the
text kept as `raw_text`, so neither the database nor anything rendered from a stored
configuration ever holds it. The lab runs the engine with a key of its own for the job.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from functools import lru_cache
from typing import Any

import yaml
from django.conf import settings
from django.core.exceptions import ValidationError

from diagnostic.bookings.models import SIM_PREFIX, Booking, ClusterConfiguration, Lab
from lab.catalog import Catalog, CatalogError, parse_catalog
from lab.config import (
    COMMAND_WHITESPACE,
    CONTROL_ACCEPTED,
    ConfigError,
    config_secrets,
    control_character,
    control_name,
    control_problem,
    mask_argv,
    mask_config,
    mask_env,
    mask_secret,
    mask_text,
    read_config_text,
    shown,
)
from lab.engines import normalize_config
from lab.engines.command import split_command
from lab.inventory import InventoryError, load_inventory

CONFIG_SCHEMA = "diagnostic.config/1"
Source = ClusterConfiguration.Source
# How each source's text is named in its messages.
TEXT_NAMES: dict[str, str] = {Source.YAML: "file", Source.COMMAND: "launch_command", Source.FORM: "form data"}


# `python -m lab sim catalog` reads one scenario file (a second, with the interpreter's start).
SIM_CATALOG_TIMEOUT_S = 60


def lab_catalog(lab: Lab) -> Catalog:
    """The catalog of `lab` (_lab_catalog) with the lab's node count where the catalog was
    read without one (a real lab's mirrored nodes): admission refuses a layout the lab
    cannot run (lab.engines.admission)."""
    catalog = _lab_catalog(lab)
    if catalog.lab_nodes is None:
        nodes = lab.node_count()
        if nodes:
            catalog = dataclasses.replace(catalog, lab_nodes=nodes)
    return catalog


def _lab_catalog(lab: Lab) -> Catalog:
    """The catalog of `lab`: the one its inventory names (lab.inventory). A simulated lab
    that is not serving has no inventory yet: its catalog is the one it will write for its
    scenario's model (`python -m lab sim catalog`), which is what the lab holds. Raises
    CatalogError naming the lab when its catalog cannot be known; no lab ever falls back to
    another's."""
    path = lab.inventory_path()
    if path.is_file():
        try:
            inventory = load_inventory(path)
            if inventory.catalog_file is not None or not lab.is_simulated:
                return inventory.catalog
        except InventoryError as exc:
            if not lab.is_simulated:
                raise CatalogError(f"lab {lab.name}: {exc}") from exc
    if lab.is_simulated:
        # Asked of the lab's own entry point (`python -m lab sim catalog`), as anything of a
        # simulated lab is: the platform never imports the simulator.
        target = lab.inventory[len(SIM_PREFIX):]
        return _sim_catalog(lab.name, target, _mtime(target))
    raise CatalogError(f"lab {lab.name}: its inventory {path} cannot be read, so what it holds is not known")


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


@lru_cache(maxsize=32)
def _sim_catalog(name: str, target: str, mtime: float | None) -> Catalog:
    """A simulated lab's catalog by its scenario file (asked once per version of the file)."""
    done = subprocess.run(
        [sys.executable, "-m", "lab", "sim", "catalog", "--scenario", target],
        capture_output=True, text=True, timeout=SIM_CATALOG_TIMEOUT_S, check=False,
        cwd=settings.BASE_DIR)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise CatalogError(f"lab {name}: its scenario {target} cannot be read, so what it holds "
                           f"is not known ({why})")
    return parse_catalog(json.loads(done.stdout))


def booking_catalog(booking: Booking | None) -> Catalog | None:
    """The catalog of the lab a booking is for (None without a booking)."""
    return None if booking is None else lab_catalog(booking.lab_day.lab)


def text_control_problem(text: str, name: str) -> str | None:
    """Why a submitted text cannot be kept: the line and column of its first control
    character (lines and tabs are the text's own), or None."""
    found = control_character(text, allowed=COMMAND_WHITESPACE)
    if found is None:
        return None
    index, char = found
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return (f"{name}: line {line}, column {column} holds a control character ({control_name(char)}); "
            "give plain text: lines, spaces and tabs, no NUL, escape or other control character")


def _control_in(value: Any, path: str) -> str | None:
    """The first string of a normalized configuration (keys included) that holds a control
    character, as a message naming its field; None when there is none."""
    if isinstance(value, str):
        problem = control_problem(value)
        return None if problem is None else f"{path}: {shown(value)} {problem}; {CONTROL_ACCEPTED}"
    if isinstance(value, dict):
        for key, item in value.items():
            found = _control_in(key, path or "config") if isinstance(key, str) else None
            found = found or _control_in(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _control_in(item, f"{path}[{index}]")
            if found:
                return found
    return None


def normalize_submission(raw_text: str, source: str, *, catalog: Catalog | None = None) -> dict[str, Any]:
    """The normalized configuration for `raw_text`, its secrets masked, or ValidationError
    naming the field. `catalog`: the catalog of the lab it is for (lab_catalog).

    No control character is kept: the text may hold lines and tabs only, and no value of
    the configuration any (lab.config refuses them field by field; this checks the
    result again, since it is stored and reaches the lab's argv and environment)."""
    return masked_submission(raw_text, source, catalog=catalog)[1]


def masked_submission(raw_text: str, source: str, *,
                      catalog: Catalog | None = None) -> tuple[str, dict[str, Any]]:
    """(the text to keep, the normalized configuration) of a submission, both with every
    secret masked (lab.config.mask_config), or ValidationError naming the field.

    The text keeps the customer's own wording with each secret value replaced in place;
    where that cannot be shown to work (a secret written escaped, or short enough to occur
    elsewhere in the text) it is the same configuration written out again (`_rewritten`).
    Either way the kept text normalizes to exactly the configuration returned."""
    problem = text_control_problem(raw_text, TEXT_NAMES.get(source, "raw_text"))
    if problem is not None:
        raise ValidationError({"raw_text": problem}, code="control_character")
    clear = _normalize(raw_text, source, catalog)
    problem = _control_in(clear, "")
    if problem is not None:
        raise ValidationError({"raw_text": problem}, code="control_character")
    normalized = mask_config(clear)
    return _masked_text(raw_text, source, clear, normalized, catalog), normalized


# A secret at least this long is replaced wherever it occurs in the submitted text; a
# shorter one only where the text's syntax puts it (mask_text), since "abc" may be part of
# a path too.
REPLACE_ANYWHERE_CHARS = 8


def _masked_text(raw_text: str, source: str, clear: dict[str, Any], normalized: dict[str, Any],
                 catalog: Catalog | None) -> str:
    secrets = config_secrets(clear)
    candidate = raw_text
    for secret in secrets:
        if len(secret) >= REPLACE_ANYWHERE_CHARS:
            candidate = candidate.replace(secret, mask_secret(secret))
    candidate = mask_text(candidate)
    if candidate == raw_text and not secrets:
        return raw_text
    if _keeps(candidate, source, secrets, normalized, catalog):
        return candidate
    rewritten = _rewritten(raw_text, source)
    if rewritten is not None and _keeps(rewritten, source, secrets, normalized, catalog):
        return rewritten
    raise ValidationError(
        {"raw_text": f"{TEXT_NAMES.get(source, 'raw_text')}: holds an API key or other secret that "
                     "could not be taken out of the text we keep; remove it and submit again (the lab "
                     "runs your configuration with a key of its own)"},
        code="secret",
    )


def _keeps(text: str, source: str, secrets: list[str], normalized: dict[str, Any],
           catalog: Catalog | None) -> bool:
    """Whether `text` is safe to keep for `normalized`: it normalizes to exactly it, and no
    secret of the submission is left in it (except inside a value that is no secret, a
    model name say, which the configuration itself holds)."""
    try:
        if _normalize(text, source, catalog) != normalized:
            return False
    except (ValidationError, ConfigError, ValueError, RecursionError, yaml.YAMLError):
        return False
    held = json.dumps(normalized, ensure_ascii=False)
    return not any(s in text and s not in held for s in secrets if len(s) >= 4)


def _masked_command(command: str) -> str:
    env, tokens = split_command(command)
    words = [f"{name}={shlex.quote(value)}" for name, value in mask_env(env).items()]
    return " ".join([*words, shlex.join(mask_argv(tokens))])


def _rewritten(raw_text: str, source: str) -> str | None:
    """The submission written out again with its secrets masked, in its own format (the
    command as one line, the YAML or form fields as a document); None if it cannot be."""
    try:
        if source == Source.COMMAND:
            return _masked_command(raw_text.strip())
        if source == Source.YAML:
            document = dict(read_config_text(raw_text))
            if isinstance(document.get("launch_command"), str):
                document["launch_command"] = _masked_command(document["launch_command"])
            return yaml.safe_dump(mask_config(document), sort_keys=False, default_flow_style=False,
                                  allow_unicode=True)
        if source == Source.FORM:
            fields = json.loads(raw_text)
            return form_text(mask_config(fields)) if isinstance(fields, dict) else None
    except (ConfigError, ValueError, RecursionError, yaml.YAMLError):
        return None
    return None


def _normalize(raw_text: str, source: str, catalog: Catalog | None) -> dict[str, Any]:
    try:
        if source == Source.YAML:
            return normalize_config(read_config_text(raw_text), catalog=catalog)
        if source == Source.COMMAND:
            command = raw_text.strip()
            if not command:
                raise ValidationError({"raw_text": "launch_command: is empty; paste the full command"})
            return normalize_config({"schema": CONFIG_SCHEMA, "launch_command": command}, catalog=catalog)
        if source == Source.FORM:
            try:
                fields = json.loads(raw_text)
            except (ValueError, RecursionError) as exc:
                # JSONDecodeError, or the decoder's own limits (a 5,000-digit number, a
                # list nested past the recursion limit): a field error, never a traceback.
                why = exc.msg if isinstance(exc, json.JSONDecodeError) else \
                    "a value is too large or too deeply nested"
                raise ValidationError({"raw_text": f"form data is not JSON ({why})"}) from None
            if not isinstance(fields, dict):
                raise ValidationError({"raw_text": "form data must be a JSON object of configuration fields"})
            return normalize_config({"schema": CONFIG_SCHEMA, **fields}, catalog=catalog)
    except ConfigError as exc:
        raise ValidationError({"raw_text": str(exc)}, code="invalid_config") from exc
    accepted = ", ".join(choice.value for choice in Source)
    raise ValidationError({"source": f"unknown source {source!r}; accepted: {accepted}"})


def submit_configuration(
    *,
    raw_text: str,
    source: str,
    booking: Booking | None = None,
    submitted_by: Any = None,
    label: str = "",
    lab: Lab | None = None,
) -> ClusterConfiguration:
    """Validate and store a submitted configuration; ValidationError when it is not usable.
    Its secrets are stored masked, in the text and the normalized configuration alike.

    It is admitted by the catalog of the lab it is for: the booking's lab, else `lab`; one
    for no lab at all by the reference lab's. A lab whose catalog cannot be known refuses it."""
    where = booking.lab_day.lab if booking is not None else lab
    try:
        catalog = lab_catalog(where) if where is not None else None
    except CatalogError as exc:
        raise ValidationError({"raw_text": f"the lab cannot admit a configuration now: {exc}"},
                              code="lab_catalog") from exc
    kept, normalized = masked_submission(raw_text, source, catalog=catalog)
    return ClusterConfiguration.objects.create(
        raw_text=kept,
        source=source,
        normalized=normalized,
        booking=booking,
        submitted_by=submitted_by,
        label=label,
    )


def form_text(fields: dict[str, Any]) -> str:
    """The raw text kept for a form submission: its fields as stable, readable JSON."""
    return json.dumps(fields, indent=2, sort_keys=True)
