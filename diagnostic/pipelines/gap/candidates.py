"""The candidate changes of the gap stage: every field where the configuration the day has
reached (the customer's, with every change proved so far) differs from the lab's baseline,
minus what the customer asked for and what an earlier stage decided with its own proof
(METHODOLOGY.md, "The gap to the lab's own best").

A candidate is one unit a restart can test on its own: a serving field, one environment
variable, one flag of `extra_args` (with its values), and the parallel layout as a whole
(tp and pp only make a runnable layout together: tp x pp is the node count). Each excluded
field is listed with why, so the report can say what was not compared and on whose say.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from diagnostic.pipelines.changes import Change, change

# Fields no restart may change: what the customer asked for, or what is not a setting.
REQUIREMENTS: dict[str, str] = {
    "model": "a requirement: the model the customer serves",
    "workloads": "a requirement: the customer's workloads",
    "reported": "what the customer asked to be reported, not a setting",
    "serving.max_model_len": "a requirement: context (never shortened without the customer's say)",
    "engine": "the engine and version the baseline was chosen for",
    "cluster": "the lab's hardware, not a setting",
    "schema": "the document's schema, not a setting",
}
# Decided by an earlier stage with its own proof: the gap stage never undoes it.
DECIDED: dict[str, str] = {
    "speculative": "decided by the speculative-decoding stage with its own proof",
    "serving.moe_backend": "decided by the FP4 stage, checked for correct output",
    "serving.linear_backend": "decided by the FP4 stage, checked for correct output",
}
# Environment that names this lab's own interfaces and devices (triage derives it from the
# lab's facts): the baseline's values are another lab's or another day's, never the customer's.
LAB_ENV = frozenset({
    "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX", "UCX_NET_DEVICES", "NVSHMEM_HCA_LIST", "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME",
})
# Environment that only makes the engine or its libraries say more: what a diagnostic sets
# for its own evidence, never a speed setting.
OBSERVATION_ENV = frozenset({
    "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "VLLM_LOGGING_LEVEL", "SGLANG_LOG_LEVEL",
    "TORCH_CPP_LOG_LEVEL", "TORCH_DISTRIBUTED_DEBUG", "CUDA_LAUNCH_BLOCKING",
})
# KV cache precision, lowest first: a change to a lower one lowers output quality.
KV_PRECISION = {"fp8": 0, "auto": 1, "bf16": 1}
LAYOUT = ("tp", "pp")


@dataclass(frozen=True)
class Candidate:
    """One difference: `path` names it (findings and the section), `customer` and `baseline`
    are the two values, `kind` says how it is applied."""

    path: str
    kind: str  # "field" | "layout" | "env" | "flag"
    customer: Any
    baseline: Any

    @property
    def code(self) -> str:
        return finding_code(self.path)

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "customer": copy.deepcopy(self.customer),
                "baseline": copy.deepcopy(self.baseline)}


# The order the search splits candidates in: settings known to change the decode step first
# (the layout sets how many ranks read the weights and how many hops a token makes; eager
# mode gives up the captured graphs), then flags and environment, then the memory and loader
# settings, which size caches and shape the start rather than the step. Delta debugging
# measures the first half of a set first and skips the second when the first carried the
# whole gain, so this order saves restarts when it is right and costs none when it is not.
SEARCH_ORDER = {"layout": 0, "serving.enforce_eager": 0, "flag": 1, "env": 1}


def search_order(candidates: Sequence[Candidate]) -> list[Candidate]:
    """`candidates` in the order the search tries them (stable within a rank)."""
    return sorted(candidates, key=lambda c: SEARCH_ORDER.get(c.path, SEARCH_ORDER.get(c.kind, 2)))


def finding_code(path: str) -> str:
    """`gap.<path>` in the findings schema's code alphabet: lower case, digits and `_`
    between dots (an environment variable's name and a flag's dashes are folded)."""
    parts = []
    for part in path.split("."):
        slug = re.sub(r"[^a-z0-9]+", "_", part.lower()).strip("_")
        parts.append(slug or "x")
    return "gap." + ".".join(parts)


def _flag_name(token: str) -> str:
    return token.split("=", 1)[0]


def split_flags(args: Sequence[str]) -> dict[str, list[str]]:
    """`extra_args` as {flag: its tokens}: a flag owns the words after it up to the next
    flag (`--max-num-seqs 4`), or its `=value` (`--max-num-seqs=4`). Words before any flag
    are kept under the empty name."""
    out: dict[str, list[str]] = {}
    current = ""
    for token in args:
        if token.startswith("-") and len(token) > 1 and not _is_number(token):
            current = _flag_name(token)
            out[current] = [token]
        else:
            out.setdefault(current, []).append(token)
    return out


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _exclusion(path: str) -> str | None:
    for prefix, why in (*REQUIREMENTS.items(), *DECIDED.items()):
        if path == prefix or path.startswith(prefix + "."):
            return why
    return None


def diff(config: Mapping[str, Any],
         baseline: Mapping[str, Any]) -> tuple[list[Candidate], list[dict[str, Any]]]:
    """The candidates (in the configuration's field order) and the excluded differences
    ({path, customer, baseline, why}) between `config` and the baseline's configuration,
    both normalized `diagnostic.config/1` mappings."""
    candidates: list[Candidate] = []
    excluded: list[dict[str, Any]] = []

    def exclude(path: str, mine: Any, theirs: Any, why: str) -> None:
        excluded.append({"path": path, "customer": copy.deepcopy(mine), "baseline": copy.deepcopy(theirs),
                         "why": why})

    keys = list(dict.fromkeys([*config, *baseline]))
    for key in keys:
        mine, theirs = config.get(key), baseline.get(key)
        if mine == theirs or key == "launch_command":
            continue
        if key == "env":
            _env(dict(mine or {}), dict(theirs or {}), candidates, exclude)
        elif key == "extra_args":
            _flags(list(mine or []), list(theirs or []), candidates)
        elif key == "parallel" and isinstance(mine, Mapping) and isinstance(theirs, Mapping):
            layout_mine = {k: mine.get(k) for k in LAYOUT}
            layout_theirs = {k: theirs.get(k) for k in LAYOUT}
            if layout_mine != layout_theirs:
                candidates.append(Candidate("parallel", "layout", layout_mine, layout_theirs))
            for sub in dict.fromkeys([*mine, *theirs]):
                if sub not in LAYOUT and mine.get(sub) != theirs.get(sub):
                    candidates.append(Candidate(f"parallel.{sub}", "field", mine.get(sub), theirs.get(sub)))
        elif isinstance(mine, Mapping) and isinstance(theirs, Mapping) and _exclusion(key) is None:
            for sub in dict.fromkeys([*mine, *theirs]):
                a, b = mine.get(sub), theirs.get(sub)
                if a == b:
                    continue
                path = f"{key}.{sub}"
                why = _exclusion(path) or _quality(path, a, b)
                if why:
                    exclude(path, a, b, why)
                else:
                    candidates.append(Candidate(path, "field", a, b))
        else:
            exclude(key, mine, theirs, _exclusion(key) or "not a setting the gap stage changes")
    return candidates, excluded


def _quality(path: str, mine: Any, theirs: Any) -> str | None:
    """Why a change would lower output quality (None when it does not): a KV cache of
    lower precision than the customer's."""
    if path == "serving.kv_cache_dtype":
        if KV_PRECISION.get(str(theirs), 1) < KV_PRECISION.get(str(mine), 1):
            return (f"output quality: a {theirs} KV cache is of lower precision than the customer's "
                    f"{mine}; changed only on the customer's say")
    return None


def _env(mine: dict[str, Any], theirs: dict[str, Any], out: list[Candidate], exclude: Any) -> None:
    for name in dict.fromkeys([*mine, *theirs]):
        a, b = mine.get(name), theirs.get(name)
        if a == b:
            continue
        path = f"env.{name}"
        if name in LAB_ENV:
            exclude(path, a, b,
                    "the lab's own interfaces and devices (triage sets them from the lab's facts)")
        elif name in OBSERVATION_ENV:
            exclude(path, a, b, "makes the engine or its libraries log more; not a speed setting")
        else:
            out.append(Candidate(path, "env", a, b))


def _flags(mine: list[str], theirs: list[str], out: list[Candidate]) -> None:
    a, b = split_flags(mine), split_flags(theirs)
    for name in dict.fromkeys([*a, *b]):
        if a.get(name) == b.get(name):
            continue
        path = f"extra_args.{name}" if name else "extra_args"
        out.append(Candidate(path, "flag", a.get(name), b.get(name)))


# -- applying candidates ------------------------------------------------------------------


def _apply_flag(args: list[str], name: str, tokens: list[str] | None) -> list[str]:
    flags = split_flags(args)
    if tokens is None:
        flags.pop(name, None)
    else:
        flags[name] = list(tokens)
    return [t for group in flags.values() for t in group]


def changes_for(config: Mapping[str, Any], candidate: Candidate, *, finding: str | None = None,
                why: str = "") -> list[Change]:
    """The changes (diagnostic/pipelines/changes.py shape) that give `config` the baseline's
    value of `candidate`: one per field, two for a layout (tp and pp), the whole list for a
    flag of `extra_args` (a list has no dotted path of its own)."""
    code = finding or candidate.code
    if candidate.kind == "layout":
        return [change(f"parallel.{k}", (config.get("parallel") or {}).get(k), candidate.baseline[k],
                       finding=code, why=why) for k in LAYOUT if candidate.baseline.get(k) is not None]
    if candidate.kind == "flag":
        before = list(config.get("extra_args") or [])
        name = candidate.path[len("extra_args."):] if candidate.path != "extra_args" else ""
        after = _apply_flag(before, name, candidate.baseline)
        return [change("extra_args", before, after, finding=code, why=why)]
    parts = candidate.path.split(".")
    node: Any = config
    for part in parts:
        node = node.get(part) if isinstance(node, Mapping) else None
    return [change(candidate.path, node, candidate.baseline, finding=code, why=why)]


def with_candidates(config: Mapping[str, Any], candidates: Iterable[Candidate]) -> list[Change]:
    """The changes for several candidates at once, each computed on the configuration the
    ones before it produced (flags of one `extra_args` list compose)."""
    from diagnostic.pipelines.changes import apply_changes

    out: list[Change] = []
    current: dict[str, Any] = dict(config)
    for candidate in candidates:
        step = changes_for(current, candidate)
        out.extend(step)
        current = apply_changes(current, step)
    return out
