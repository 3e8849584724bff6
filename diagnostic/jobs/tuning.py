"""The tuned configuration of a job: the customer's configuration with every change the
stages proved, and the files a customer launches it from.

Only what a stage proved goes in: each stage's result lists its `config_changes`, each
naming the finding that justifies it, and they compose in stage order
(diagnostic/pipelines/changes.py). From the composed configuration come
`tuned-config.yaml` (diagnostic.config/1), `tuned-command.txt` (the head node's launch
command in the engine's own syntax, with its environment) and `tuned.diff` against what
the customer submitted. All are admitted and rendered by the catalog of the job's lab
(lab.catalog): the files the command names are those that lab holds.

A customer's API key (or other secret) was never kept (lab.config, "secrets"): the tuned
configuration keeps their flag or variable with the masked value (`••••` and at most the
last four characters), and the files say to put their own key back. No key is made up.
"""

from __future__ import annotations

import difflib
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from diagnostic.jobs.labaccess import job_lab_catalog
from diagnostic.jobs.models import DiagnosticJob, StageRun
from diagnostic.pipelines.changes import apply_changes
from lab.catalog import Catalog
from lab.config import SECRET_MASK, argv_secrets, mask_config, secret_env_name
from lab.engines import normalize_config, render
from lab.inventory import Node

# Placeholders for what only the customer's own cluster knows.
HEAD_ADDRESS = "HEAD_NODE_DATA_ADDRESS"
CACHE_DIR = "/var/cache/diag"


def proved_changes(job: DiagnosticJob) -> list[dict[str, Any]]:
    """Every succeeded stage's config_changes, in stage order, each tagged with its stage."""
    changes: list[dict[str, Any]] = []
    rows = job.stage_runs.filter(status__in=StageRun.WITH_RESULT).order_by("order")
    for stage in rows:
        result = stage.result if isinstance(stage.result, dict) else {}
        for item in result.get("config_changes") or []:
            if isinstance(item, dict):
                changes.append({**item, "stage": stage.name})
    return changes


def _customer_node(config: dict[str, Any]) -> Node:
    """A stand-in head node for rendering the command a customer runs on their own cluster."""
    return Node(
        name="head", host=HEAD_ADDRESS, port=22, user="", key_file=Path(), role="head",
        mgmt_nic="", data_nics=(), data_addr=HEAD_ADDRESS, model_dir=str(config["model"]["path"]),
        cache_dir=CACHE_DIR, work_dir="", api_port=8000, python="python3",
    )


def secret_notes(config: dict[str, Any]) -> list[str]:
    """One line per masked secret of `config` (its flag or variable and the mask), saying to
    put the customer's own value back; [] when it holds none."""
    config = mask_config(config)
    args = list(config.get("extra_args") or [])
    found = argv_secrets(args)
    named = [(flag, args[i].partition("=")[2] if inline else args[i]) for i, flag, inline in found]
    # A URL's credential, masked inside a value: the value's flag or variable is named.
    held = {i for i, _, _ in found}
    named += [(args[i - 1] if i and args[i - 1].startswith("-") else "argument", token)
              for i, token in enumerate(args) if i not in held and SECRET_MASK in token]
    named += [(name, value) for name, value in sorted((config.get("env") or {}).items())
              if (secret_env_name(name) and value) or SECRET_MASK in value]
    return [f"{name} {value}: your own value goes here; we do not keep it, so it is shown masked "
            f"({SECRET_MASK} and at most its last four characters)." for name, value in named]


def command_text(config: dict[str, Any], *, catalog: Catalog | None = None) -> str:
    """The head node's launch command for `config`, with its environment as NAME=value
    prefixes, one flag pair a line; the workers' differ only as the comment says. `catalog`:
    the job's lab's, whose files the command names."""
    config = mask_config(config)
    head = _customer_node(config)
    nodes = [head] + [
        replace(head, name=f"worker-{i}", role="worker") for i in range(1, int(config["cluster"]["nodes"]))
    ]
    specs = render(config, nodes, catalog=catalog)
    spec = specs[0]
    lines = [
        f"# {config['engine']['name']} {config['engine']['version']}: the head node's command (rank 0).",
    ]
    if len(specs) > 1:
        lines.append("# Workers run the same with --node-rank 1..N-1 (vLLM adds --headless); replace "
                     f"{HEAD_ADDRESS} with the head node's data-network address.")
        if "VLLM_HOST_IP" in spec["env"]:
            lines.append("# VLLM_HOST_IP is each node's own data-network address (the head's here; "
                         "each worker sets its own): vLLM's head binds its broadcast queue there, and "
                         "without it on the default-route interface (or 0.0.0.0, where no route is "
                         "set, which hangs the start).")
    env = spec["env"]
    if any(k.startswith("NCCL_") for k in env):
        lines.append("# The NCCL interface names are our lab's; use your nodes' own management NIC and "
                     "RDMA devices (see the report).")
    if config["serving"]["jit_cache"] == "persisted":
        lines.append(f"# {CACHE_DIR} must be a volume kept across restarts (the JIT cache).")
    lines += [f"# {note}" for note in secret_notes(config)]
    words = [f"{name}={shlex.quote(value)}" for name, value in sorted(env.items())]
    argv = [shlex.quote(a) for a in spec["argv"]]
    # One flag (with its value) per line, as people paste launch commands.
    parts: list[str] = [" ".join([*words, *argv[:3]])]
    i = 3
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            parts.append(f"{argv[i]} {argv[i + 1]}")
            i += 2
        else:
            parts.append(argv[i])
            i += 1
    lines.append(" \\\n  ".join(parts))
    return "\n".join(lines) + "\n"


def config_yaml(config: dict[str, Any], changes: list[dict[str, Any]] | None = None) -> str:
    config = mask_config(config)
    header = "# The customer's configuration with every change the diagnostic proved.\n"
    for item in changes or []:
        header += f"#   {item['path']}: {item.get('from')!r} -> {item.get('to')!r}  ({item.get('finding')})\n"
    header += "".join(f"# {note}\n" for note in secret_notes(config))
    return header + yaml.safe_dump(config, sort_keys=False, default_flow_style=False, allow_unicode=True)


def config_diff(before: dict[str, Any], after: dict[str, Any], *, catalog: Catalog | None = None) -> str:
    # Both sides in the normalizer's field order: a configuration read back from PostgreSQL
    # (jsonb keeps its own key order) would otherwise differ on every line.
    before = mask_config(normalize_config(before, catalog=catalog))
    after = mask_config(after)
    a = yaml.safe_dump(before, sort_keys=False, allow_unicode=True).splitlines(keepends=True)
    b = yaml.safe_dump(after, sort_keys=False, allow_unicode=True).splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, fromfile="submitted-config.yaml", tofile="tuned-config.yaml"))


def tuned_section(job: DiagnosticJob) -> dict[str, Any] | None:
    """findings.json `tuned`: the composed configuration, its changes, command and diff;
    None until a stage has proved a change."""
    changes = proved_changes(job)
    if not changes:
        return None
    # Stored masked since intake; masked again for a configuration stored before that.
    customer = mask_config(job.config.normalized)
    catalog = job_lab_catalog(job.lab)
    tuned = mask_config(apply_changes(customer, changes, catalog=catalog))
    return {
        "config": tuned,
        "changes": changes,
        "command": command_text(tuned, catalog=catalog),
        "diff": config_diff(customer, tuned, catalog=catalog),
    }


def write_tuned_files(section: dict[str, Any], out: Path) -> list[Path]:
    """tuned-config.yaml, tuned-command.txt and tuned.diff in `out`."""
    files = {
        "tuned-config.yaml": config_yaml(section["config"], section["changes"]),
        "tuned-command.txt": section["command"],
        "tuned.diff": section["diff"],
    }
    written = []
    for name, text in files.items():
        path = out / name
        path.write_text(text, encoding="utf-8")  # a masked key is "••••"
        written.append(path)
    return written
