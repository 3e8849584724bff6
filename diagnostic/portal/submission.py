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

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import ValidationError

from diagnostic.bookings.configs import form_text, lab_catalog, normalize_submission, text_control_problem
from diagnostic.bookings.models import ClusterConfiguration, Lab
from lab.catalog import Catalog, CatalogError
from lab.config import ConfigError
from lab.engines import render
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
# (dotted configuration field, kind); the form's input is named with "__" for ".".
STRUCTURED_FIELDS: tuple[tuple[str, str], ...] = (
    ("engine.name", "text"),
    ("engine.version", "text"),
    ("model.id", "text"),
    ("model.quantization", "text"),
    ("model.path", "text"),
    ("cluster.nodes", "int"),
    ("cluster.node_type", "text"),
    ("cluster.link_gbps", "number"),
    ("parallel.tp", "int"),
    ("parallel.pp", "int"),
    ("parallel.expert_parallel", "bool"),
    ("serving.max_model_len", "int"),
    ("serving.kv_cache_dtype", "text"),
    ("serving.gpu_memory_utilization", "number"),
    ("serving.enforce_eager", "bool"),
    ("serving.load_format", "text"),
    ("serving.jit_cache", "text"),
    ("speculative.method", "text"),
    ("speculative.draft_model", "text"),
    ("speculative.num_speculative_tokens", "int"),
    ("env", "env"),
)


def input_name(dotted: str) -> str:
    return dotted.replace(".", "__")


def _typed(text: str, kind: str) -> Any:
    """The value a form input stands for. Text that is not a number stays text, so the
    validator names the field and says what it accepts."""
    value = text.strip()
    try:
        if kind == "int":
            return int(value)
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


def structured_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration document a filled-in structured form describes (blank inputs are
    left out, so the configuration's defaults apply)."""
    document: dict[str, Any] = {}
    for dotted, kind in STRUCTURED_FIELDS:
        raw = data.get(input_name(dotted))
        limit = ENV_MAX_CHARS if kind == "env" else FIELD_MAX_CHARS
        if raw is not None and len(str(raw)) > limit:
            raise ConfigError(dotted, f"is {len(str(raw)):,} characters long; the limit is {limit:,}")
        if kind == "bool":
            value: Any = raw in ("on", "true", "1", True)
        elif raw is None or not str(raw).strip():
            continue
        elif kind == "env":
            value = parse_env(str(raw))
        else:
            value = _typed(str(raw), kind)
        section, _, leaf = dotted.partition(".")
        if leaf:
            document.setdefault(section, {})[leaf] = value
        else:
            document[section] = value
    if "speculative" in document and "method" not in document["speculative"]:
        document.pop("speculative")  # no method chosen: no speculative decoding
    return document


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


def from_form(data: Mapping[str, Any], *, catalog: Catalog | None = None) -> Submission:
    try:
        document = structured_fields(data)
    except ConfigError as exc:
        raise SubmissionError({_form_input_for(exc.field): [str(exc)]}) from exc
    return check(Source.FORM, form_text(document), target=NON_FIELD, catalog=catalog)


def yaml_text_from_upload(content: bytes) -> str:
    if len(content) > YAML_MAX_BYTES:
        raise SubmissionError(
            {"yaml_text": [f"file: is {len(content)} bytes; the limit is {YAML_MAX_BYTES}"]}
        )
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


def from_yaml(text: str, *, catalog: Catalog | None = None) -> Submission:
    if not text.strip():
        raise SubmissionError({"yaml_text": ["file: is empty; upload or paste a diagnostic.config/1 file"]})
    if len(text.encode("utf-8", errors="replace")) > YAML_MAX_BYTES:
        raise SubmissionError({"yaml_text": [f"file: is larger than the {YAML_MAX_BYTES}-byte limit"]})
    return check(Source.YAML, text, target="yaml_text", catalog=catalog)


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
