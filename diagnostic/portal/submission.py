"""The three ways a customer hands over their configuration (structured form, YAML file,
pasted launch command), each ending in the same validated `diagnostic.config/1`, and
the preview of what the lab will launch.

Validation is lab.config's and the engines' own (through bookings.configs); this module
only turns each input into their terms and their errors back into the input field they
concern, keeping the dotted configuration field or the unparsed token in the message.
Each input is admitted by the catalog of the booked lab (`catalog`, from
bookings.configs.booking_catalog): a lab holding another model admits that model, and
refuses one it does not hold with the list of what it holds.
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import ValidationError

from diagnostic.bookings.configs import form_text, lab_catalog, normalize_submission, text_control_problem
from diagnostic.bookings.models import ClusterConfiguration, Lab
from diagnostic.portal.configform import REQUIRED_WORDS, form_fields
from lab.catalog import Catalog, CatalogError
from lab.config import ConfigError, read_config_text
from lab.engines import normalize_config, render
from lab.inventory import Node

Source = ClusterConfiguration.Source
YAML_MAX_BYTES = 64 * 1024
COMMAND_MAX_CHARS = 16 * 1024
# A structured form's one-line inputs, and its environment box (one NAME=value a line).
FIELD_MAX_CHARS = 500
ENV_MAX_CHARS = 16 * 1024
NON_FIELD = "__all__"


class SubmissionError(Exception):
    """What is wrong with a submission, per input field (NON_FIELD for the whole)."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(m for ms in errors.values() for m in ms))
        self.errors = errors


@dataclass
class Submission:
    source: str
    raw_text: str
    normalized: dict[str, Any] = field(default_factory=dict)


# -- the structured form ---------------------------------------------------------------
# (dotted configuration field, kind); the form's input is named with "__" for ".". The form's
# sections, words and defaults are diagnostic.portal.configform's.
STRUCTURED_FIELDS: tuple[tuple[str, str], ...] = tuple((f.dotted, f.value_kind) for f in form_fields())
REQUIRED_FIELDS = tuple(f.dotted for f in form_fields() if f.required)


def input_name(dotted: str) -> str:
    return dotted.replace(".", "__")


def _typed(text: str, kind: str) -> Any:
    """The value a form input stands for. Text that is not a number stays text, so the
    validator names the field and says what it accepts."""
    value = text.strip()
    try:
        if kind == "int":
            return int(value.replace(",", "").replace("_", ""))
        if kind == "number":
            return float(value)
    except ValueError:
        return value
    return value


def parse_env(text: str) -> dict[str, str]:
    """KEY=VALUE lines (blank lines and # comments skipped) -> the env mapping."""
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, sep, value = stripped.partition("=")
        if not sep or not name.strip():
            raise ConfigError("env", f"line {number}: {stripped!r} is not NAME=value")
        env[name.strip()] = value.strip()
    return env


def form_document(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The configuration document a filled-in structured form describes (blank inputs are
    left out, so the configuration's defaults apply), and the problems of single inputs
    (too long, an env line that is not NAME=value, a required field left blank), every one
    of them, by input."""
    document: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    for dotted, kind in STRUCTURED_FIELDS:
        name = input_name(dotted)
        raw = data.get(name)
        limit = ENV_MAX_CHARS if kind == "env" else FIELD_MAX_CHARS
        if raw is not None and len(str(raw)) > limit:
            errors.setdefault(name, []).append(
                f"{dotted}: is {len(str(raw)):,} characters long; the limit is {limit:,}")
            continue
        if kind == "bool":
            value: Any = raw in ("on", "true", "1", True)
        elif raw is None or not str(raw).strip():
            if dotted in REQUIRED_FIELDS:
                errors.setdefault(name, []).append(f"{dotted}: is required; {REQUIRED_WORDS[dotted]}")
            continue
        elif kind == "env":
            try:
                value = parse_env(str(raw))
            except ConfigError as exc:
                errors.setdefault(name, []).append(str(exc))
                continue
        else:
            value = _typed(str(raw), kind)
        section, _, leaf = dotted.partition(".")
        if leaf:
            document.setdefault(section, {})[leaf] = value
        else:
            document[section] = value
    if "speculative" in document and "method" not in document["speculative"]:
        document.pop("speculative")  # no method chosen: no speculative decoding
    return document, errors


def _form_input_for(dotted: str) -> str:
    """The structured form's input a configuration field's error belongs beside."""
    names = [d for d, _ in STRUCTURED_FIELDS]
    if dotted in names:
        return input_name(dotted)
    for prefix in (dotted.split(".")[0] + ".",):
        if dotted.startswith("env"):
            return "env"
        if dotted == "parallel":
            return input_name("parallel.tp")
        matches = [d for d in names if d.startswith(prefix)]
        if matches:
            return input_name(matches[0])
    return NON_FIELD


# -- checking ----------------------------------------------------------------------------
def _messages(exc: ValidationError) -> list[str]:
    return [str(m) for m in exc.messages]


def _config_error(exc: BaseException) -> ConfigError | None:
    cause = exc.__cause__
    return cause if isinstance(cause, ConfigError) else None


def booked_catalog(lab: Lab) -> Catalog:
    """The catalog a booking's submissions are admitted by: its lab's (lab_catalog), or a
    SubmissionError on the whole submission when the lab's catalog cannot be known."""
    try:
        return lab_catalog(lab)
    except CatalogError as exc:
        raise SubmissionError({NON_FIELD: [f"the lab cannot admit a configuration now: {exc}; "
                                           "tell us and we will fix it"]}) from exc


def check(source: str, raw_text: str, *, target: str, catalog: Catalog | None = None) -> Submission:
    """Validate one submission against the lab's `catalog`; SubmissionError puts each message
    on `target` (the input that holds the text), or for the structured form on the input of
    the field at fault."""
    try:
        normalized = normalize_submission(raw_text, source, catalog=catalog)
    except ValidationError as exc:
        culprit = _config_error(exc)
        where = target
        if source == Source.FORM and culprit is not None:
            where = _form_input_for(culprit.field)
        raise SubmissionError({where: _messages(exc)}) from exc
    except (ValueError, TypeError, RecursionError, yaml.YAMLError) as exc:
        # Input the validator did not foresee (a YAML key that is a list, nesting deep
        # enough to exhaust the parser): still the customer's to fix, never a crash.
        raise SubmissionError(
            {target: [f"could not be read as a configuration ({type(exc).__name__})"]}
        ) from exc
    return Submission(source=source, raw_text=raw_text, normalized=normalized)


# -- every problem at once ----------------------------------------------------------------
# lab.config stops at a configuration's first problem. To list them all, the document is
# checked again without each field found at fault (its default stands in), until it passes
# or nothing more can be taken out: the customer fixes a form in one go, not one field per
# round trip. The list is bounded; the first problem is always the one the lab reports.
MAX_PROBLEMS = 20
_INDEXED = re.compile(r"^(?P<name>[^\[\]]+)\[(?P<index>\d+)\]$")


def _drop(document: dict[str, Any], dotted: str) -> bool:
    """Take the field `dotted` (as a ConfigError names it) out of `document`; False when it
    is not there to take (the search then stops)."""
    if dotted == "parallel":
        # tp x pp wants more nodes than cluster.nodes: the node count is the one to drop
        # (it then defaults to what the layout uses), else the layout itself.
        for section, leaf in (("cluster", "nodes"), ("parallel", "pp"), ("parallel", "tp")):
            part = document.get(section)
            if isinstance(part, dict) and leaf in part:
                del part[leaf]
                return True
        return False
    parts = dotted.split(".")
    if parts[0] == "env" and len(parts) > 1:
        parts = ["env", ".".join(parts[1:])]
    holder: Any = document
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        indexed = _INDEXED.match(part)
        key: Any = indexed.group("name") if indexed else part
        if not isinstance(holder, dict) or key not in holder:
            return False
        if indexed:
            items = holder[key]
            position = int(indexed.group("index"))
            if not isinstance(items, list) or position >= len(items):
                return False
            if not last:
                holder = items[position]
                continue
            del items[position]
            return True
        if last:
            del holder[key]
            return True
        holder = holder[key]
    return False


def config_problems(document: Mapping[str, Any], *, catalog: Catalog | None) -> list[ConfigError]:
    """Every problem of a configuration document the lab's checks find, first the one they
    stop at, then those found once each culprit is left out."""
    trial: dict[str, Any] = copy.deepcopy(dict(document))
    found: list[ConfigError] = []
    seen: set[tuple[str, str]] = set()
    while len(found) < MAX_PROBLEMS:
        try:
            normalize_config(trial, catalog=catalog)
            break
        except ConfigError as exc:
            key = (exc.field, exc.problem)
            if key in seen:
                break
            seen.add(key)
            found.append(exc)
            if not _drop(trial, exc.field):
                break
        except (ValueError, TypeError, RecursionError, yaml.YAMLError):
            break
    return found


def from_form(data: Mapping[str, Any], *, catalog: Catalog | None = None) -> Submission:
    document, errors = form_document(data)
    if errors:
        # The inputs' own problems and the required fields, with the rest of the form's.
        for problem in config_problems(document, catalog=catalog):
            where = _form_input_for(problem.field)
            if str(problem) not in errors.get(where, []):
                errors.setdefault(where, []).append(str(problem))
        raise SubmissionError(errors)
    try:
        return check(Source.FORM, form_text(document), target=NON_FIELD, catalog=catalog)
    except SubmissionError as first:
        problems = config_problems(document, catalog=catalog)
        if not problems:
            raise
        listed: dict[str, list[str]] = {}
        for problem in problems:
            listed.setdefault(_form_input_for(problem.field), []).append(str(problem))
        raise SubmissionError(listed) from first


def human_size(size: int) -> str:
    """A file size as people read it: 812 bytes, 12.5 KiB, 3.2 MiB."""
    if size < 1024:
        return f"{size:,} bytes"
    value, unit = size / 1024, "KiB"
    if value >= 1024:
        value, unit = value / 1024, "MiB"
    return f"{value:,.0f} {unit}" if value.is_integer() else f"{value:,.1f} {unit}"


def size_problem(size: int) -> str:
    return (f"file: is {human_size(size)} ({size:,} bytes); the limit is {human_size(YAML_MAX_BYTES)} "
            f"({YAML_MAX_BYTES:,} bytes)")


def yaml_text_from_upload(content: bytes, *, size: int | None = None) -> str:
    """The text of an uploaded file. `content` is read up to one byte past the limit;
    `size` is the whole file's, so that the message says how big it really is."""
    if len(content) > YAML_MAX_BYTES or (size is not None and size > YAML_MAX_BYTES):
        raise SubmissionError({"yaml_text": [size_problem(max(size or 0, len(content)))]})
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SubmissionError(
            {"yaml_text": [f"file: is not UTF-8 text (byte {exc.start} cannot be decoded); save it as UTF-8"]}
        ) from None
    # Refused here, before the text is shown again in the page's text box.
    problem = text_control_problem(text, "file")
    if problem is not None:
        raise SubmissionError({"yaml_text": [problem]})
    return text


def field_lines(text: str) -> dict[str, int]:
    """The line (1-based) of each field of a YAML configuration, by the dotted path its
    errors name (`parallel.tp`, `env.NCCL_DEBUG`, `extra_args[2]`); {} when it cannot be read."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError, ValueError):
        return {}
    lines: dict[str, int] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode):
                    continue
                here = f"{path}.{key.value}" if path else str(key.value)
                lines.setdefault(here, key.start_mark.line + 1)
                walk(value, here)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                here = f"{path}[{index}]"
                lines.setdefault(here, item.start_mark.line + 1)
                walk(item, here)

    walk(root, "")
    return lines


def _line_of(dotted: str, lines: Mapping[str, int]) -> int | None:
    """The line of `dotted`, else of the nearest field holding it."""
    path = dotted
    while path:
        if path in lines:
            return lines[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return None


def _with_line(problem: ConfigError, lines: Mapping[str, int]) -> str:
    line = _line_of(problem.field, lines)
    message = str(problem)
    return f"line {line}: {message}" if line is not None and not message.startswith("line ") else message


def from_yaml(text: str, *, catalog: Catalog | None = None) -> Submission:
    if not text.strip():
        raise SubmissionError({"yaml_text": ["file: is empty; upload or paste a diagnostic.config/1 file"]})
    size = len(text.encode("utf-8", errors="replace"))
    if size > YAML_MAX_BYTES:
        raise SubmissionError({"yaml_text": [size_problem(size)]})
    try:
        return check(Source.YAML, text, target="yaml_text", catalog=catalog)
    except SubmissionError as first:
        try:
            document = read_config_text(text, max_bytes=YAML_MAX_BYTES)
        except (ConfigError, ValueError, RecursionError, yaml.YAMLError):
            raise first from None  # the file itself cannot be read: that one problem
        problems = config_problems(document, catalog=catalog)
        if len(problems) <= 1:
            if problems:
                raise SubmissionError({"yaml_text": [_with_line(problems[0], field_lines(text))]}) from first
            raise
        lines = field_lines(text)
        # In the file's order, as the customer reads it top to bottom.
        ordered = sorted(problems, key=lambda p: _line_of(p.field, lines) or 0)
        raise SubmissionError({"yaml_text": [_with_line(p, lines) for p in ordered]}) from first


def from_command(text: str, *, catalog: Catalog | None = None) -> Submission:
    if len(text) > COMMAND_MAX_CHARS:
        raise SubmissionError({"command": [f"launch_command: is longer than {COMMAND_MAX_CHARS} characters"]})
    return check(Source.COMMAND, text, target="command", catalog=catalog)


# -- the preview -------------------------------------------------------------------------
def _placeholder_nodes(count: int) -> list[Node]:
    """Stand-ins for the lab's nodes: the command is the same but for the node addresses,
    which are the lab's business."""
    return [
        Node(
            name=f"node-{i + 1:02d}",
            host=f"node-{i + 1:02d}",
            port=22,
            user="diag",
            key_file=Path("/dev/null"),
            role="head" if i == 0 else "worker",
            mgmt_nic="",
            data_nics=(),
            data_addr=f"node-{i + 1:02d}",
            model_dir="/models",
            cache_dir="/cache",
            work_dir="/srv/diag",
            api_port=8000,
            python="python3",
        )
        for i in range(count)
    ]


def launch_preview(normalized: Mapping[str, Any], lab: Lab | None = None) -> str:
    """The head node's launch command the lab will reproduce this configuration with, as
    the customer would write it on their own nodes: node addresses and ports are stand-ins,
    never the lab's (its inventory's hosts, data addresses and API port stay internal). The
    files it names are those the lab's catalog holds (`lab`'s; the reference lab's without)."""
    wanted = int(normalized["parallel"]["tp"]) * int(normalized["parallel"]["pp"])
    nodes = _placeholder_nodes(max(wanted, int(normalized["cluster"]["nodes"])))
    catalog = lab_catalog(lab) if lab is not None else None
    head = render(normalized, nodes, catalog=catalog)[0]
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(head["env"].items()))
    command = shlex.join(head["argv"])
    return f"{env} {command}".strip()


def normalized_yaml(normalized: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(normalized), sort_keys=False, default_flow_style=False, allow_unicode=True)
