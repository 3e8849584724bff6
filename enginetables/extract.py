"""Each modelled engine version as data, taken from its released package.

    python -m enginetables.extract vllm==0.34.0 [sglang==0.5.23 ...] [--out DIR] [--check]

For each `package==version` the tool fetches the release from the package index (the
wheel a DGX Spark node installs: manylinux aarch64 for CPython 3.12, or a stable-ABI
`abi3` wheel, which 3.12 installs too; else a pure-Python wheel; the sdist only when the
release ships no wheel: vLLM's wheel holds code its sdist lacks, the kernels' Python
copied in at build time, which reads its own environment variables), checks it against
the index's sha256, reads its Python sources
straight out of the archive and parses them with `ast` (nothing of the package is
imported or run; see enginetables.source_eval), and writes `lab/engines/releases/
<engine>-<version>.json`:

- `flags`: every option of the serve command (`vllm serve`, SGLang's `python -m
  sglang.launch_server`) as the version's argparse registers it: option strings, dest,
  action, whether it takes a value and its converter, nargs, and the choices when they
  are known statically (`null` with `choices_source` when they are not: never invented);
- `env`: the environment variables the version declares (vLLM's `vllm/envs.py`
  registry, SGLang's `Envs`) and the names its code reads directly;
- `lines`: for each log line the platform reads (LINE_FINDERS), the format strings in
  the package that write it, with file and line, or `null` when the version writes none;
  where the string is a logger call's message, its `level` (debug, info, warning, error,
  critical) and, for vLLM's `*_once` calls, `once`: the call's scope (`local` by default:
  each node's first rank; `global`: rank 0 only; `process`: every process); and, for the
  keys whose writer the platform relies on, `writers` ("rank 0": the head's engine core,
  which --headless nodes do not run; "every rank": each node's worker), read from the code
  that calls the line and kept in LINE_FINDERS;
- `metrics`: the Prometheus metric names it registers (`vllm:`/`sglang:`);
- `notes`: what the evaluator could not follow (a condition or loop it could not decide,
  a call that received the parser), so a gap is visible rather than silent.

A flag entry, keyed by its first long option string: `option_strings` (as argparse holds
them: a BooleanOptionalAction's `--no-X` right after `--X`, and whatever the release's
own Action class adds), `dest`, `action` (and `action_base`, the argparse action a
custom one builds on), `takes_value`, `type` (the converter as written: int,
human_readable_int, optional_type(json.loads), a lambda's source), `nargs`, `choices`
(argparse refuses other values; `choices_unordered` when the release passes a set),
`metavar` (a list shown in help but not enforced), `required`, `deprecated`,
`action_kwargs`, `source` (the add_argument call) and `origin` (the config field the
flag was derived from), and `condition` when it is registered under a condition the
evaluator could not decide.

pip cannot fetch vLLM's sdist on its own (`pip download` builds the sdist's metadata,
which needs torch), so the tool asks the index's JSON API (PEP 691) for the file list,
picks the artifact by the rule above and downloads it over HTTPS, as pip does. Archives
stay in the cache directory (`--cache`, default out/engine-downloads/), never in the
repository. Output is JSON with sorted keys, two-space indent and a trailing newline, so
the same release always gives the same bytes; `--check` extracts again and fails, naming
the file, when a committed table differs. Run it with the project's Python (3.11): how
`ast` prints an expression, and which files it can parse, depend on the version.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import itertools
import json
import os
import re
import sys
import tarfile
import urllib.request
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enginetables.source_eval import (
    LITERAL,
    NONE_TYPE,
    UNION,
    BudgetExceeded,
    ClassVal,
    Ext,
    Frame,
    Instance,
    Module,
    Opaque,
    ParserRecorder,
    SourceEval,
    SubparsersRecorder,
    TypeForm,
    Unknown,
    display_callable,
    flag_entries,
    is_unresolved,
    node_fingerprint,
)

SCHEMA = "lab.engine-release/1"
REPO = Path(__file__).resolve().parents[1]
RELEASES_DIR = REPO / "lab" / "engines" / "releases"
DEFAULT_CACHE = REPO / "out" / "engine-downloads"
DEFAULT_INDEX = "https://pypi.org/simple"
# The wheel a lab node installs: DGX Spark runs CPython 3.12 on aarch64 (manylinux); a
# stable-ABI wheel built for an older CPython (vLLM's cp38-abi3) installs there too.
WHEEL_PYTHON = "cp312"
WHEEL_ABI3_FROM = (3, 8)
WHEEL_PLATFORM = "aarch64"
ENGINES = {"vllm": "vllm", "sglang": "sglang"}  # engine -> package name


class ExtractError(RuntimeError):
    pass


# -- the registry ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Artifact:
    filename: str
    url: str
    sha256: str
    size: int | None


def _index_files(package: str, index_url: str) -> list[dict[str, Any]]:
    url = f"{index_url.rstrip('/')}/{package}/"
    request = urllib.request.Request(url, headers={  # noqa: S310 - an https index URL
        "Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
            data = json.load(response)
    except (OSError, ValueError) as exc:
        raise ExtractError(f"{url}: {exc}") from None
    files = data.get("files")
    if not isinstance(files, list):
        raise ExtractError(f"{url} did not answer with a PEP 691 file list")
    return files


def choose_artifact(package: str, version: str, files: Sequence[Mapping[str, Any]]) -> Artifact:
    """The wheel a DGX Spark node installs (CPython 3.12 or abi3, aarch64 manylinux); else
    a pure-Python wheel; else the sdist."""
    sdist = re.compile(rf"^{re.escape(package)}-{re.escape(version)}\.tar\.gz$", re.IGNORECASE)
    wheel = re.compile(rf"^{re.escape(package)}-{re.escape(version)}-(?P<py>[^-]+)-(?P<abi>[^-]+)-"
                       r"(?P<plat>[^-]+)\.whl$", re.IGNORECASE)

    def installs(py: str, abi: str) -> bool:
        if py == WHEEL_PYTHON:
            return True
        m = re.fullmatch(r"cp3(\d+)", py)
        return abi == "abi3" and m is not None and (3, int(m[1])) >= WHEEL_ABI3_FROM

    def rank(name: str) -> int | None:
        if sdist.match(name):
            return 2
        m = wheel.match(name)
        if not m:
            return None
        if m["plat"] == "any":
            return 1
        if installs(m["py"], m["abi"]) and WHEEL_PLATFORM in m["plat"] and "manylinux" in m["plat"]:
            return 0
        return None

    ranked = sorted((r, f["filename"], f) for f in files
                    if not f.get("yanked") and (r := rank(f["filename"])) is not None)
    if not ranked:
        raise ExtractError(f"{package}=={version}: no {WHEEL_PYTHON} (or abi3) {WHEEL_PLATFORM} "
                           "wheel, pure wheel or sdist on the index")
    _, filename, chosen = ranked[0]
    sha = chosen.get("hashes", {}).get("sha256")
    if not sha:
        raise ExtractError(f"{filename}: the index gives no sha256")
    return Artifact(filename=filename, url=chosen["url"], sha256=sha, size=chosen.get("size"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(package: str, version: str, *, cache: Path, index_url: str = DEFAULT_INDEX,
          pinned: Artifact | None = None, log: Callable[[str], None] = print) -> tuple[Path, Artifact]:
    """The release's archive in `cache` (downloaded unless already there with the right
    sha256), and what the index says about it. With `pinned` (the artifact a committed
    table names) and that file in the cache, the index is not asked at all."""
    if pinned is not None and (cache / pinned.filename).exists() \
            and _sha256(cache / pinned.filename) == pinned.sha256:
        return cache / pinned.filename, pinned
    artifact = choose_artifact(package, version, _index_files(package, index_url))
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / artifact.filename
    if path.exists() and _sha256(path) == artifact.sha256:
        return path, artifact
    log(f"downloading {artifact.filename} ({(artifact.size or 0) / 1e6:.1f} MB)")
    partial = path.with_suffix(path.suffix + ".part")
    try:
        with urllib.request.urlopen(artifact.url, timeout=600) as response, \
                partial.open("wb") as out:  # noqa: S310 - the index's https file URL
            while block := response.read(1 << 20):
                out.write(block)
    except OSError as exc:
        raise ExtractError(f"{artifact.url}: {exc}") from None
    got = _sha256(partial)
    if got != artifact.sha256:
        partial.unlink()
        raise ExtractError(f"{artifact.filename}: sha256 {got} differs from the index's "
                           f"{artifact.sha256}")
    partial.replace(path)
    return path, artifact


def read_sources(archive: Path, package: str) -> dict[str, str]:
    """The package's .py files, path (from the package directory on) -> text."""
    out: dict[str, str] = {}
    prefix = f"{package}/"

    def keep(name: str) -> str | None:
        parts = name.split("/")
        if archive.name.endswith(".tar.gz"):
            parts = parts[1:]  # the sdist's top directory (vllm-0.34.0/)
        rel = "/".join(parts)
        return rel if rel.startswith(prefix) and rel.endswith(".py") else None

    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if (rel := keep(info.filename)) is not None:
                    out[rel] = zf.read(info).decode("utf-8", errors="replace").removeprefix("\ufeff")
    else:
        with tarfile.open(archive, "r:gz") as tf:
            for member in tf:
                if member.isfile() and (rel := keep(member.name)) is not None:
                    handle = tf.extractfile(member)
                    if handle is not None:
                        out[rel] = handle.read().decode("utf-8", errors="replace").removeprefix("\ufeff")
    if not out:
        raise ExtractError(f"{archive.name}: no {prefix}*.py files inside")
    return out


# -- flags: vLLM -----------------------------------------------------------------------------
_VLLM_COMPUTE_KWARGS_CHECKED = {
    # _compute_kwargs as in the releases this emulation was checked against.
    "058f39447898d325": "0.29.0", "fd560d0b69424d6d": "0.34.0",
}
_VLLM_HUMAN_READABLE_DEFAULT = ("max_num_batched_tokens", "max_num_scheduled_tokens",
                                "kv_cache_memory_bytes", "safetensors_prefetch_block_size",
                                "max_num_queued_tokens")


@dataclass
class _VllmRules:
    """What differs between releases in vLLM's _compute_kwargs, read from its source."""

    dict_subclasses_are_dicts: bool = False
    none_choice: Any = None
    human_readable: tuple[str, ...] = _VLLM_HUMAN_READABLE_DEFAULT
    max_model_len_type: str = "human_readable_int_or_auto"
    fingerprint: str = ""


def _vllm_rules(ev: SourceEval) -> _VllmRules:
    mod = ev.module("vllm.engine.arg_utils")
    assert mod is not None
    node = next((n for n in mod.tree.body if isinstance(n, ast.FunctionDef)
                 and n.name == "_compute_kwargs"), None)
    rules = _VllmRules()
    if node is None:
        ev.note("vllm.engine.arg_utils._compute_kwargs not found: flags derived from config "
                "fields follow the 0.34.0 rules")
        return rules
    rules.fingerprint = node_fingerprint(node)
    text = ast.unparse(node)
    rules.dict_subclasses_are_dicts = "is_dict_subclass" in text
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) \
                and sub.func.attr == "append" and "choices" in ast.unparse(sub.func.value) \
                and sub.args and isinstance(sub.args[0], ast.Constant):
            rules.none_choice = sub.args[0].value
        if isinstance(sub, ast.Assign) and any(isinstance(t, ast.Name) and t.id ==
                                               "human_readable_int_args" for t in sub.targets):
            names = ev.eval(sub.value, _module_frame(ev, mod))
            if isinstance(names, set):
                rules.human_readable = tuple(sorted(names))
    m = re.search(r"if name == 'max_model_len':\s*kwargs\[name\]\['type'\] = (\w+)", text)
    if m:
        rules.max_model_len_type = m[1]
    if rules.fingerprint not in _VLLM_COMPUTE_KWARGS_CHECKED:
        ev.note(f"vllm.engine.arg_utils._compute_kwargs (fingerprint {rules.fingerprint}) "
                "differs from the releases its emulation was checked against "
                f"({', '.join(sorted(_VLLM_COMPUTE_KWARGS_CHECKED.values()))}): review "
                "enginetables.extract._vllm_field_kwargs")
    return rules


def _module_frame(ev: SourceEval, mod: Module) -> Frame:
    ev.run_module(mod)
    return Frame(module=mod, locals=mod.globals)


def _hints(hint: Any) -> list[Any]:
    """vLLM's get_type_hints: Annotated unwrapped, unions flattened."""
    if isinstance(hint, TypeForm) and hint.origin == Ext("typing.Annotated"):
        return _hints(hint.args[0])
    if isinstance(hint, TypeForm) and hint.origin == UNION:
        out: list[Any] = []
        for arg in hint.args:
            for h in _hints(arg):
                if h not in out:
                    out.append(h)
        return out
    return [hint]


def _origin(hint: Any) -> Any:
    return hint.origin if isinstance(hint, TypeForm) else None


def _contains(hints: list[Any], kind: Any) -> bool:
    return any(h is kind or h == kind or _origin(h) == kind for h in hints)


def _first(hints: list[Any], kind: Any) -> Any:
    return next(h for h in hints if h is kind or h == kind or _origin(h) == kind)


def _module_of(hint: Any) -> str:
    if isinstance(hint, type):
        return "builtins"
    if isinstance(hint, TypeForm):
        return hint.module
    if isinstance(hint, ClassVal):
        return hint.module.name
    if isinstance(hint, Ext):
        return hint.module
    return "?"


def _is_dataclass(ev: SourceEval, hint: Any) -> bool:
    if not isinstance(hint, ClassVal):
        return False
    for base in ev.mro(hint):
        if isinstance(base, ClassVal) and any(
                re.search(r"(^|\.)(dataclass|config)$", ast.unparse(d).split("(")[0])
                for d in base.node.decorator_list):
            return True
    return False


def _is_dict_subclass(ev: SourceEval, hint: Any) -> bool:
    if not isinstance(hint, ClassVal):
        return False
    if ev.inherits(hint, ("TypedDict",)):
        return False
    return any(base is dict for base in ev.mro(hint))


def _literal_kwargs(hints: list[Any]) -> dict[str, Any]:
    literal = _first(hints, LITERAL)
    options = list(literal.args)
    option_type = type(options[0])
    key = "metavar" if _contains(hints, str) else "choices"
    try:
        ordered = sorted(options)
    except TypeError:
        ordered = options
    return {"type": option_type, key: ordered}


def _vllm_field_kwargs(ev: SourceEval, rules: _VllmRules, name: str, hint: Any) -> dict[str, Any]:
    """vllm.engine.arg_utils._compute_kwargs for one field, from its annotation."""
    hints = _hints(hint)
    if rules.dict_subclasses_are_dicts:
        hints = [dict if _is_dict_subclass(ev, h) else h for h in hints]
    kw: dict[str, Any] = {"default": Unknown(f"default of {name}"), "help": ""}
    dataclass_cls = next((h for h in hints if _is_dataclass(ev, h)), None)
    if dataclass_cls is not None:
        kw["type"] = Opaque(f"parse_dataclass({dataclass_cls.name})")
    elif set(map(_key, hints)) == {_key(bool), _key(str), _key(NONE_TYPE)}:
        kw.update({"type": str, "nargs": "?", "const": True})
    elif _contains(hints, bool):
        kw["action"] = Ext("argparse.BooleanOptionalAction")
    elif _contains(hints, LITERAL):
        kw.update(_literal_kwargs(hints))
    elif _contains(hints, tuple) or _contains(hints, list) or _contains(hints, set):
        kind = tuple if _contains(hints, tuple) else list if _contains(hints, list) else set
        collection = _first(hints, kind)
        types = list(collection.args) if isinstance(collection, TypeForm) else []
        if not types:
            kw["type"] = Unknown(f"{name}: bare {kind.__name__}")
        else:
            elem = types[0]
            if isinstance(elem, TypeForm) and elem.origin == UNION:
                elem = str
            kw["type"] = elem
            kw["nargs"] = "+" if kind is not tuple or Ellipsis in types else len(types)
    elif _contains(hints, int):
        if name == "max_model_len":
            kw["type"] = Opaque(rules.max_model_len_type)
        elif name in rules.human_readable:
            kw["type"] = Opaque("human_readable_int")
        else:
            kw["type"] = int
    elif _contains(hints, float):
        kw["type"] = float
    elif _contains(hints, dict) and (_contains(hints, str)
                                     or any(_module_of(h) != "builtins" for h in hints)):
        kw["type"] = Opaque("union_dict_and_str")
    elif _contains(hints, dict):
        kw["type"] = Opaque("parse_type(json.loads)")
    elif _contains(hints, str) or any(_module_of(h) != "builtins" for h in hints):
        kw["type"] = str
    else:
        ev.note(f"vLLM field {name}: type {hints!r} not understood")
        kw["type"] = Unknown(f"type of {name}")
    if isinstance(kw.get("type"), TypeForm) and kw["type"].origin == LITERAL:
        kw.update(_literal_kwargs([kw["type"]]))
    if _contains(hints, NONE_TYPE) and not _contains(hints, bool):
        kw["type"] = Opaque(f"optional_type({display_callable(kw['type'])})")
        if kw.get("choices"):
            kw["choices"].append(rules.none_choice)
    return kw


def _key(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return id(value)
    return value


def _vllm_get_kwargs(rules_box: list[_VllmRules]) -> Callable[[SourceEval, list[Any], dict[str, Any]], Any]:
    def get_kwargs(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if not rules_box:
            rules_box.append(_vllm_rules(ev))
        cls = args[0] if args else None
        if not isinstance(cls, ClassVal):
            return Unknown(f"get_kwargs({display_callable(cls)})")
        out: dict[str, Any] = {}
        for name, stmt in ev.annotated_fields(cls):
            owner = ev.field_owner(cls, name)
            hint = ev.annotation(owner, stmt.annotation)
            kw = _vllm_field_kwargs(ev, rules_box[0], name, hint)
            kw["__origin__"] = f"{owner.name}.{name} ({owner.module.path}:{stmt.lineno})"
            out[name] = kw
        return out
    return get_kwargs


def vllm_flags(ev: SourceEval) -> ParserRecorder:
    """`vllm serve`'s parser: the serve subcommand's subparser_init, as `vllm` runs it."""
    rules: list[_VllmRules] = []
    hook = _vllm_get_kwargs(rules)
    ev.hooks["vllm.engine.arg_utils.get_kwargs"] = hook
    ev.hooks["vllm.engine.arg_utils._compute_kwargs"] = hook

    # Decided on the machine that runs vLLM, not by the package: which plugins are
    # installed (a plugin may add flags or choices) and which platform the GPU makes
    # current_platform. Neither is followed.
    def plugins(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
        ev.note("vllm.plugins.load_general_plugins not followed: installed plugins may add "
                "flags or choices")
        return None

    def platform(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
        name = args[0] if args else "?"
        ev.note(f"vllm.platforms.{name} is chosen at run time (CUDA, ROCm, CPU, ...): "
                "not evaluated")
        return Unknown(f"vllm.platforms.{name}")

    ev.hooks["vllm.plugins.load_general_plugins"] = plugins
    ev.hooks["vllm.platforms.__getattr__"] = platform
    # `vllm` builds its top parser as a FlexibleArgumentParser; subparsers take its class.
    main = ev.module("vllm.utils.argparse_utils")
    parser_cls = ev.module_global(main, "FlexibleArgumentParser") if main is not None else None
    root = ev.new_recorder({"prog": "vllm"},
                           cls=parser_cls if isinstance(parser_cls, ClassVal) else None)
    ev.recorders.clear()
    command = ev.run_function("vllm.entrypoints.cli.serve", "ServeSubcommand", [])
    ev.run_function("vllm.entrypoints.cli.serve", "ServeSubcommand.subparser_init",
                    [command, SubparsersRecorder(root)])
    if not root.subparsers:
        raise ExtractError("vllm.entrypoints.cli.serve.ServeSubcommand.subparser_init added "
                           "no subparser")
    return root.subparsers[0]


# -- flags: SGLang ---------------------------------------------------------------------------
_SGLANG_ARG_UTILS_CHECKED = {"49ffc65dc1242e53": "0.5.23"}


def _unwrap_annotated(ev: SourceEval, hint: Any) -> tuple[Any, Any]:
    if isinstance(hint, TypeForm) and hint.origin == Ext("typing.Annotated"):
        inner = hint.args[0]
        for meta in hint.args[1:]:
            if isinstance(meta, Instance) and meta.cls.name == "Arg":
                return inner, meta
            if isinstance(meta, str):
                return inner, {"help": meta}
        return inner, None
    return hint, None


def _arg_meta(ev: SourceEval, meta: Any, name: str) -> Any:
    if isinstance(meta, dict):
        return meta.get(name)
    value = ev.getattr(meta, name)
    return None if isinstance(value, Unknown) and name not in meta.attrs else value


def _sglang_add_cli_args_from_dataclass(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """sglang.srt.arg_groups.arg_utils.add_cli_args_from_dataclass, from the annotations."""
    parser = args[0] if args else kwargs.get("parser")
    cls = args[1] if len(args) > 1 else kwargs.get("cls")
    only = kwargs.get("fields")
    if not isinstance(cls, ClassVal) or parser is None:
        ev.note("add_cli_args_from_dataclass called with values not known statically")
        return None
    mod = ev.module("sglang.srt.arg_groups.arg_utils")
    if mod is not None:
        node = next((n for n in mod.tree.body if isinstance(n, ast.FunctionDef)
                     and n.name == "add_cli_args_from_dataclass"), None)
        fp = node_fingerprint(node) if node is not None else "missing"
        if fp not in _SGLANG_ARG_UTILS_CHECKED:
            ev.note(f"sglang add_cli_args_from_dataclass (fingerprint {fp}) differs from the "
                    "release its emulation was checked against "
                    f"({', '.join(sorted(_SGLANG_ARG_UTILS_CHECKED.values()))}): review "
                    "enginetables.extract._sglang_add_cli_args_from_dataclass")
    # ServerArgs gathers its fields from the namespace classes listed in _INPUT_NAMESPACES
    # (server_args.py builds the struct with msgspec.defstruct).
    sources: list[Any] = [cls]
    if cls.name == "ServerArgs":
        listed = ev.module_global(cls.module, "_INPUT_NAMESPACES")
        if isinstance(listed, list) and all(isinstance(c, ClassVal) for c in listed):
            sources = listed
        else:
            ev.note("ServerArgs: _INPUT_NAMESPACES not known statically; its own fields used")
    for source in sources:
        for name, stmt in ev.annotated_fields(source):
            if isinstance(only, list) and name not in only:
                continue
            owner = ev.field_owner(source, name)
            hint = ev.annotation(owner, stmt.annotation)
            raw, meta = _unwrap_annotated(ev, hint)
            if meta is None or _arg_meta(ev, meta, "no_cli") is True:
                continue
            _sglang_register(ev, parser, owner, stmt, name, raw, meta)
    return None


def _sglang_register(ev: SourceEval, parser: Any, owner: ClassVal, stmt: ast.AnnAssign, name: str,
                     raw: Any, meta: Any) -> None:
    cli_name = _arg_meta(ev, meta, "cli_name") or "--" + name.replace("_", "-")
    aliases = _arg_meta(ev, meta, "aliases") or []
    names = [cli_name, *aliases] if isinstance(aliases, list) else [cli_name]
    has_default = stmt.value is not None
    auto_dest = cli_name.lstrip("-").replace("-", "_")
    kw: dict[str, Any] = {"dest": name} if name != auto_dest else {}
    action = _arg_meta(ev, meta, "action")
    choices = _arg_meta(ev, meta, "choices")
    type_parser = _arg_meta(ev, meta, "type_parser")
    nargs = _arg_meta(ev, meta, "nargs")
    const = _arg_meta(ev, meta, "const")
    if action is not None:
        kw["action"] = action
        extra = _arg_meta(ev, meta, "action_kwargs")
        if isinstance(extra, dict):
            kw.update(extra)
    else:
        inner = raw
        if isinstance(raw, TypeForm) and raw.origin == UNION:
            non_none = [a for a in raw.args if a is not NONE_TYPE]
            if len(non_none) == 1:
                inner = non_none[0]

        def infer(tp: Any) -> Any:
            return tp if tp in (str, int, float) else str

        if isinstance(inner, TypeForm) and inner.origin == LITERAL:
            values = list(inner.args)
            kw["type"] = type_parser or infer(type(values[0]) if values else str)
            kw["choices"] = choices or values
            if const is not None:
                kw["const"] = const
        elif isinstance(inner, TypeForm) and inner.origin is list and type_parser is None:
            elem = inner.args[0] if inner.args else str
            kw["type"] = infer(elem)
            kw["nargs"] = nargs or "+"
            if choices:
                kw["choices"] = choices
            if const is not None:
                kw["const"] = const
        elif inner is bool:
            kw["action"] = "store_true"
        else:
            kw["type"] = type_parser or infer(inner)
            if choices:
                kw["choices"] = choices
            if nargs:
                kw["nargs"] = nargs
            if const is not None:
                kw["const"] = const
            required = _arg_meta(ev, meta, "required")
            if required is True or (required is None and not has_default):
                kw["required"] = True
    kw["__origin__"] = f"{owner.name}.{name} ({owner.module.path}:{stmt.lineno})"
    where = ev._where
    ev._where = f"{owner.module.path}:{stmt.lineno}"
    try:
        ev.recorder_method(parser, "add_argument", list(names), kw, "add_argument")
    finally:
        ev._where = where


def sglang_flags(ev: SourceEval) -> ParserRecorder:
    """The parser `python -m sglang.launch_server` builds (server_args.prepare_server_args)."""
    ev.hooks["sglang.srt.arg_groups.arg_utils.add_cli_args_from_dataclass"] = \
        _sglang_add_cli_args_from_dataclass
    ev.run_function("sglang.srt.server_args", "prepare_server_args", [[]])
    if not ev.recorders:
        raise ExtractError("sglang.srt.server_args.prepare_server_args made no parser")
    return ev.recorders[0]


# -- environment variables -------------------------------------------------------------------
_ENV_READERS = re.compile(r"^(os\.environ\.get|os\.getenv|environ\.get|getenv|os\.environ\.setdefault"
                          r"|get_(bool|int|float|str)_env_var|_get_(bool|int|float|str)_env)$")


def _is_test_path(path: str) -> bool:
    parts = path.split("/")
    return any(p in ("test", "tests", "testing") for p in parts[1:-1]) or \
        parts[-1].startswith("test_")


def _env_read(node: ast.AST) -> str | None:
    """NAME when `node` reads the environment variable NAME with a constant name."""
    name: str | None = None
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        if _ENV_READERS.match(ast.unparse(node.func)):
            name = node.args[0].value
    elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) \
            and ast.unparse(node.value) in ("os.environ", "environ"):
        name = node.slice.value
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 \
            and isinstance(node.ops[0], ast.In | ast.NotIn) \
            and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str) \
            and ast.unparse(node.comparators[0]) in ("os.environ", "environ"):
        name = node.left.value
    if name and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return name
    return None


def vllm_env(ev: SourceEval) -> dict[str, Any]:
    mod = ev.module("vllm.envs")
    if mod is None:
        raise ExtractError("vllm/envs.py is not in the release")
    registry = ev.module_global(mod, "environment_variables")
    if not isinstance(registry, dict) or is_unresolved(list(registry)):
        raise ExtractError("vllm.envs.environment_variables is not a dict known statically")
    out: dict[str, Any] = {"registry": sorted(registry),
                           "registry_source": f"{mod.path}: environment_variables"}
    # 0.34.0 refuses variables it removed, with a migration hint, where 0.29.0 warned of an
    # unknown one (envs.py removed_environment_variables; absent before).
    removed = ev.module_global(mod, "removed_environment_variables")
    if isinstance(removed, dict) and not is_unresolved(list(removed)) \
            and all(isinstance(v, str) for v in removed.values()):
        out["removed"] = dict(sorted(removed.items()))
    return out


def sglang_env(ev: SourceEval) -> dict[str, Any]:
    mod = ev.module("sglang.srt.environ")
    if mod is None:
        raise ExtractError("sglang/srt/environ.py is not in the release")
    envs = ev.module_global(mod, "Envs")
    if not isinstance(envs, ClassVal):
        raise ExtractError("sglang.srt.environ.Envs is not a class")
    names: list[str] = []
    aliases: dict[str, str] = {}
    frame = _module_frame(ev, mod)
    for stmt in envs.node.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
            else stmt.target if isinstance(stmt, ast.AnnAssign) else None
        value = stmt.value if isinstance(stmt, ast.Assign | ast.AnnAssign) else None
        if not isinstance(target, ast.Name) or not isinstance(value, ast.Call):
            continue
        kind = ev.eval(value.func, frame)
        if isinstance(kind, ClassVal) and ev.inherits(kind, ("EnvField",)):
            names.append(target.id)
            for kw in value.keywords:
                if kw.arg == "deprecated_name" and isinstance(kw.value, ast.Constant):
                    aliases[str(kw.value.value)] = target.id
    out: dict[str, Any] = {"registry": sorted(names), "registry_source": f"{mod.path}: class Envs"}
    if aliases:
        out["deprecated_aliases"] = dict(sorted(aliases.items()))
    return out


# -- log lines and metrics -------------------------------------------------------------------
@dataclass(frozen=True)
class LineFinder:
    """How to find one log line (or source line) the platform reads: string literals (or,
    with `code=True`, source lines) matching `pattern`, in files under `paths`."""

    pattern: str
    paths: tuple[str, ...] = ()
    code: bool = False
    why: str = ""
    # Which ranks write the line in a multi-node launch, read from the code that calls it
    # and kept with the table: "rank 0" (the head's engine core or API server, SGLang's TP
    # rank 0 scheduler, vLLM's tqdm bars) or "every rank" (each node's worker or scheduler);
    # "" for source lines and for keys whose lines have different writers (vLLM's
    # trust_remote_code: the tokenizer's message on the head, the model config's on every
    # rank; SGLang's graph capture: the main runner's on every rank, EAGLE's on TP rank 0).
    writers: str = ""


# Where SGLang writes its batch lines (0.5.12: observability/scheduler_metrics_mixin.py;
# 0.5.23: managers/scheduler_components/metrics_reporter.py).
_SGLANG_BATCH_LOGGERS = ("sglang/srt/observability/", "sglang/srt/managers/scheduler_components/",
                         "sglang/srt/managers/scheduler_metrics_mixin.py")

# What the platform reads from each engine (lab/engines/vllm.py, sglang.py and logs.py;
# LAB_MODEL.md sections 4-6). Kept as data: a key whose pattern finds nothing in a
# release is recorded as null, which says that release writes no such line.
LINE_FINDERS: dict[str, dict[str, LineFinder]] = {
    "vllm": {
        "stats_throughput": LineFinder(r"Avg prompt throughput|Avg generation throughput",
                                       why="the periodic stats line: throughputs", writers="rank 0"),
        "stats_requests": LineFinder(r"^(Running|Waiting|Pending): %d reqs",
                                     why="the stats line: running and waiting requests", writers="rank 0"),
        "stats_kv_usage": LineFinder(r"KV cache usage: %", why="the stats line: KV usage", writers="rank 0"),
        "stats_kv_device": LineFinder(r"kv_cache_device = ", paths=("vllm/v1/metrics/loggers.py",),
                                      code=True, why="what %s is in '%s KV cache usage'"),
        "stats_prefix_cache": LineFinder(r"^Prefix cache hit rate", why="the stats line", writers="rank 0"),
        "stats_engine_prefix": LineFinder(r"^Engine (%03d|\{[^}]*:03d\}): $",
                                          why="what the stats lines start with", writers="rank 0"),
        "specdec_header": LineFinder(r"SpecDecoding metrics", why="speculative decoding stats",
                                     writers="rank 0"),
        "specdec_fields": LineFinder(r"Mean acceptance length|^Accepted: |^Drafted: |"
                                     r"Per-position acceptance rate|Avg Draft acceptance rate|"
                                     r"Accepted throughput|Drafted throughput",
                                     paths=("vllm/v1/spec_decode/",), writers="rank 0"),
        "load_model_begin": LineFinder(r"^Starting to load model|^Loading model from scratch",
                                       paths=("vllm/v1/worker/gpu",),
                                       why="where model init ends and the weights are read",
                                       writers="every rank"),
        "weights_loaded": LineFinder(r"^Loading weights took", writers="every rank"),
        "checkpoint_fs": LineFinder(r"^Filesystem type for checkpoints",
                                    paths=("vllm/model_executor/model_loader/",),
                                    why="the filesystem and sizes the unset load strategy decides by",
                                    writers="every rank"),
        "prefetch_decision": LineFinder(r"Auto-prefetch is disabled|Skipping auto-prefetch|"
                                        r"'prefetch' was explicitly specified",
                                        paths=("vllm/model_executor/model_loader/",),
                                        why="whether the checkpoint is prefetched into the page cache",
                                        writers="every rank"),
        "prefetch_run": LineFinder(r"^Prefetching checkpoint files into page cache",
                                   paths=("vllm/model_executor/model_loader/",),
                                   why="a prefetch that started and when it finished", writers="every rank"),
        "model_loading": LineFinder(r"^Model loading took", writers="every rank"),
        "torch_compile": LineFinder(r"torch\.compile (takes|took)", writers="every rank"),
        "compile_cache_hit": LineFinder(r"^(%s)?Directly load the compiled graph",
                                        paths=("vllm/compilation/",),
                                        why="a start that loaded its graphs from the kept cache",
                                        writers="every rank"),
        "graph_capture": LineFinder(r"Graph capturing finished", writers="every rank"),
        "engine_init": LineFinder(r"init engine \(profile, create kv cache, warmup model\)",
                                  writers="rank 0"),
        "mq_leader": LineFinder(r"^DP group leader: ", paths=("vllm/v1/executor/",),
                                why="the address the head's broadcast queue binds (get_ip)",
                                writers="rank 0"),
        # kv_cache_utils.py, called by the engine core (core.py _initialize_kv_caches), which
        # only the head runs: --headless nodes run workers alone.
        "kv_cache_size": LineFinder(r"KV cache size: |Maximum concurrency for", writers="rank 0"),
        "available_kv_memory": LineFinder(r"Available KV cache memory", writers="every rank"),
        "api_server_start": LineFinder(r"^Starting vLLM (API )?server", writers="rank 0"),
        "moe_backend": LineFinder(r"^Using .*(NvFp4|\{self\.name\}) MoE .*backend",
                                  paths=("vllm/model_executor/layers/fused_moe/",),
                                  why="the NVFP4 MoE backend choice", writers="every rank"),
        "moe_oracle_name": LineFinder(r'^\s*name\s*=\s*"NvFp4"',
                                      paths=("vllm/model_executor/layers/fused_moe/oracle/",),
                                      code=True, why="what {self.name} is in the MoE line"),
        "nvfp4_linear_kernel": LineFinder(r"for NVFP4 GEMM", writers="every rank"),
        "marlin_fp4": LineFinder(r"Weight-only FP4 compression will be used", writers="every rank"),
        "kv_budget_error": LineFinder(r"KV cache is needed, which is larger than the available "
                                      r"KV cache memory|estimated maximum model length is", writers="rank 0"),
        "kv_budget_error_v0": LineFinder(r"larger than the maximum number of tokens that can be "
                                         r"stored in KV cache"),
        "unknown_env_warning": LineFinder(r"Unknown vLLM environment variable", writers="every rank"),
        "engine_core_failed": LineFinder(r"Engine core initialization failed", writers="rank 0"),
        "shard_progress": LineFinder(r"checkpoint shards", writers="rank 0"),
        "metrics_mount": LineFinder(r'Mount\("/metrics"', paths=("vllm/entrypoints/",), code=True,
                                    why="where /metrics is mounted"),
        "trust_remote_code": LineFinder(r"^(?=.{40}).*trust[_-]remote[_-]code",
                                        paths=("vllm/transformers_utils/", "vllm/tokenizers/"),
                                        why="the message asking for --trust-remote-code"),
    },
    "sglang": {
        "decode_batch": LineFinder(r"^Decode batch", paths=_SGLANG_BATCH_LOGGERS, writers="rank 0"),
        "prefill_batch": LineFinder(r"^Prefill batch", paths=_SGLANG_BATCH_LOGGERS, writers="rank 0"),
        "batch_fields": LineFinder(r"#running-req|#queue-req|gen throughput \(token/s\)|"
                                   r"token usage: |accept len|accept rate|cuda graph: ",
                                   paths=_SGLANG_BATCH_LOGGERS, writers="rank 0"),
        "dist_init_begin": LineFinder(r"^Init (torch distributed|parallel) begin",
                                      why="the rendezvous begins (0.5.12: torch distributed; "
                                          "0.5.23: parallel)", writers="every rank"),
        "dist_init_end": LineFinder(r"^Init (torch distributed|parallel) ends",
                                    why="the rendezvous has ended", writers="every rank"),
        "load_weight_begin": LineFinder(r"^Load weight begin", writers="every rank"),
        "load_weight_end": LineFinder(r"[Ll]oad weight end", writers="every rank"),
        "cuda_graph_capture_end": LineFinder(r"^Capture .*(cuda|CUDA) graph end|"
                                             r"^Capture (\{capture_name\} )?\{graph_backend\[[\w.]+\]\} end",
                                             why="the graphs are captured (the main runner's line "
                                                 "names its backend through graph_backend[device])"),
        "startup_timings": LineFinder(r"Engine startup timings", writers="rank 0"),
        "server_ready": LineFinder(r"The server is fired up and ready to roll", writers="rank 0"),
        "moe_runner_backend": LineFinder(r"as MoE runner backend", writers="every rank"),
        "child_failed": LineFinder(r"Received sigquit from a child process", writers="every rank"),
        "kv_cache_allocated": LineFinder(r"KV Cache is allocated|KV cache allocated\. |"
                                         r"^\{cache_name\} is allocated\. ",
                                         why="the KV pool's size (0.5.23 names the cache in "
                                             "cache_name: \"KV Cache\" unless labelled)",
                                         writers="every rank"),
        "memory_pool_end": LineFinder(r"Memory pool end", writers="every rank"),
        "memory_pool": LineFinder(r"^max_total_num_tokens=|max_total_num_tokens=\{", writers="rank 0"),
        "not_enough_memory": LineFinder(r"[Nn]ot enough memory", writers="every rank"),
        "fastsafetensors_missing": LineFinder(r"Please install fastsafetensors",
                                              paths=("sglang/srt/model_loader/",),
                                              why="--load-format fastsafetensors on a node without "
                                                  "the package (SGLang does not depend on it)",
                                              writers="every rank"),
        # A KV pool shorter than the context (0.5.23's tp_worker.py warns; 0.5.12 does not),
        # and the refusals of a request longer than the pool or the context.
        "kv_pool_short": LineFinder(r"^KV pool holds", paths=("sglang/srt/managers/",), writers="every rank"),
        "input_too_long": LineFinder(r"exceeds the maximum allowed length", paths=("sglang/srt/managers/",)),
        "context_too_long": LineFinder(r"is longer than the model's context length "
                                       r"\(\{self\.context_len\} tokens\)\.$|"
                                       r"^Requested token count exceeds the model's maximum context length",
                                       paths=("sglang/srt/managers/",)),
        "trust_remote_code": LineFinder(r"^(?=.{40}).*trust[_-]remote[_-]code",
                                        paths=("sglang/srt/utils/hf_transformers",
                                               "sglang/srt/configs/"), writers="every rank"),
        "metrics_enabled_check": LineFinder(r"^\s*if .*enable_metrics\b.*:$",
                                            paths=("sglang/srt/entrypoints/http_server.py",),
                                            code=True, why="when the HTTP server adds /metrics"),
        "metrics_mount": LineFinder(r'Mount\("/metrics"', paths=("sglang/srt/utils/",), code=True,
                                    why="where /metrics is mounted (add_prometheus_middleware)"),
    },
}
_METRIC_CALL = re.compile(r"(?i)(gauge|counter|histogram|summary)")


@dataclass
class SourceScan:
    """What one pass over every (non-test) file of a release finds: string literals,
    environment reads, and calls that register a metric."""

    trees: Mapping[str, ast.Module]
    literals: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    env_reads: dict[str, set[str]] = field(default_factory=dict)
    metric_calls: list[tuple[str, ast.Call]] = field(default_factory=list)
    # Literals that are a logger call's message: (path, line, text) -> level and once-scope.
    log_calls: dict[tuple[str, int, str], dict[str, str]] = field(default_factory=dict)


# logger.info(...), logger.warning_once(...), init_logger(...).error(...): the method names
# Python's logging has, and vLLM's `_once` forms (vllm/logger.py: printed once per message
# and arguments; by default only on each node's first rank, scope="local").
_LOG_METHOD = re.compile(r"^(debug|info|warning|warn|error|critical|exception)(_once)?$")
_LEVELS = {"warn": "warning", "exception": "error"}
VLLM_ONCE_DEFAULT_SCOPE = "local"


def _log_call(node: ast.Call) -> tuple[ast.AST, dict[str, str]] | None:
    """The message literal of a logger call and its level (and once-scope), else None."""
    func = node.func
    if not isinstance(func, ast.Attribute) or not node.args:
        return None
    match = _LOG_METHOD.match(func.attr)
    if match is None:
        return None
    message = node.args[0]
    while isinstance(message, ast.BinOp):  # "..." % args, "..." + "..."
        message = message.left
    if not (isinstance(message, ast.JoinedStr)
            or (isinstance(message, ast.Constant) and isinstance(message.value, str))):
        return None
    meta = {"level": _LEVELS.get(match.group(1), match.group(1))}
    if match.group(2):
        scope = next((kw.value for kw in node.keywords if kw.arg == "scope"), None)
        meta["once"] = (str(scope.value) if isinstance(scope, ast.Constant)
                        else VLLM_ONCE_DEFAULT_SCOPE)
    return message, meta


def scan_sources(trees: Mapping[str, ast.Module]) -> SourceScan:
    scan = SourceScan(trees=trees)
    for path in sorted(trees):
        if _is_test_path(path):
            continue
        literals: list[tuple[int, str]] = []
        skip: set[int] = set()
        messages: dict[int, dict[str, str]] = {}
        for node in ast.walk(trees[path]):  # breadth first: parents before children
            if id(node) in skip:
                continue
            text: str | None = None
            at = 0
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                skip.add(id(node.value))  # docstrings and bare strings are not output
            elif isinstance(node, ast.JoinedStr):
                skip.update(id(n) for n in ast.walk(node) if n is not node)
                at = node.lineno
                # Wording chosen inside a field ({'a' if c else 'b'}): each variant a literal.
                *variants, text = _templates(node)
                for variant in variants:
                    literals.append((at, variant))
                    if id(node) in messages:
                        scan.log_calls[(path, at, variant)] = messages[id(node)]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text, at = node.value, node.lineno
            elif isinstance(node, ast.Call):
                logged = _log_call(node)
                if logged is not None:
                    messages[id(logged[0])] = logged[1]
                if _METRIC_CALL.search(ast.unparse(node.func).rpartition(".")[2]):
                    scan.metric_calls.append((path, node))
            if text is not None:
                literals.append((at, text))
                if id(node) in messages:
                    scan.log_calls[(path, at, text)] = messages[id(node)]
            if isinstance(node, ast.Call | ast.Subscript | ast.Compare):
                name = _env_read(node)
                if name is not None:
                    scan.env_reads.setdefault(name, set()).add(path)
        scan.literals[path] = sorted(literals)
    return scan


def _templates(node: ast.JoinedStr) -> list[str]:
    """An f-string as written (`_template`), once for each choice of wording where a field
    is a conditional between two string constants, as SGLang 0.5.23's KV line is
    (`{'VA upper bound' if self.post_capture_active else 'is allocated'}`): the variants
    are what the package can print, so each is searched and quoted as its own string."""
    choices: list[list[str]] = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            choices.append([str(value.value)])
        elif (isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.IfExp)
              and value.conversion == -1 and value.format_spec is None
              and all(isinstance(v, ast.Constant) and isinstance(v.value, str)
                      for v in (value.value.body, value.value.orelse))):
            body, orelse = value.value.body, value.value.orelse
            assert isinstance(body, ast.Constant) and isinstance(orelse, ast.Constant)
            choices.append([str(body.value), str(orelse.value)])
        else:
            choices.append([_template(ast.JoinedStr(values=[value]))])
    if all(len(c) == 1 for c in choices):
        return [_template(node)]
    return ["".join(parts) for parts in itertools.product(*choices)]


def _template(node: ast.JoinedStr) -> str:
    """An f-string as written: literal text, and {expression[!conversion][:spec]}."""
    parts: list[str] = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value, ast.FormattedValue):
            text = ast.unparse(value.value)
            if value.conversion != -1:
                text += "!" + chr(value.conversion)
            if value.format_spec is not None:
                spec = value.format_spec
                text += ":" + (_template(spec) if isinstance(spec, ast.JoinedStr) else "")
            parts.append("{" + text + "}")
    return "".join(parts)


def find_lines(engine: str, sources: Mapping[str, str], scan: SourceScan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, finder in LINE_FINDERS[engine].items():
        regex = re.compile(finder.pattern)
        hits: list[dict[str, Any]] = []
        for path in sorted(scan.literals):
            if finder.paths and not path.startswith(finder.paths):
                continue
            if finder.code:
                for lineno, line in enumerate(sources[path].splitlines(), 1):
                    if regex.search(line):
                        hits.append({"file": path, "line": lineno, "text": line.strip()})
                continue
            for lineno, text in scan.literals[path]:
                if regex.search(text):
                    # The level (and once-scope) where the literal is a logger call's message.
                    hits.append({"file": path, "line": lineno, "text": text,
                                 **scan.log_calls.get((path, lineno, text), {})})
        out[key] = {"pattern": finder.pattern, "found": hits or None}
        if finder.writers:
            out[key]["writers"] = finder.writers
    return out


def find_metrics(prefix: str, scan: SourceScan) -> dict[str, Any]:
    """Metric names registered with a Prometheus-style constructor call (Gauge, Counter,
    Histogram, or a wrapper whose name says which) and a literal name."""
    out: dict[str, Any] = {}
    for path, node in scan.metric_calls:
        kind = _METRIC_CALL.search(ast.unparse(node.func).rpartition(".")[2])
        assert kind is not None
        name_node = next((kw.value for kw in node.keywords if kw.arg == "name"),
                         node.args[0] if node.args else None)
        if isinstance(name_node, ast.Constant) and isinstance(name_node.value, str):
            name = name_node.value
        elif isinstance(name_node, ast.JoinedStr):
            name = _template(name_node)
        else:
            continue
        if not name.startswith(prefix):
            continue
        entry: dict[str, Any] = {"type": kind[1].capitalize(), "file": path, "line": node.lineno}
        labels = next((kw.value for kw in node.keywords if kw.arg == "labelnames"), None)
        if isinstance(labels, ast.List | ast.Tuple) and all(
                isinstance(e, ast.Constant) for e in labels.elts):
            entry["labelnames"] = [e.value for e in labels.elts if isinstance(e, ast.Constant)]
        elif labels is not None:
            entry["labelnames_source"] = ast.unparse(labels)
        if entry["type"] == "Counter":
            entry["exposed_as"] = name.removesuffix("_total") + "_total"
        if name in out:
            out[name].setdefault("also", []).append(f"{path}:{node.lineno}")
            continue
        out[name] = entry
    # Names registered through a list (("vllm:spec_decode_num_drafts", doc), ...) that a
    # comprehension hands to the constructor: metric-shaped literals in the same files,
    # typed by the variable that holds them when its name says (counter_specs).
    shaped = re.compile(rf"^{re.escape(prefix)}[A-Za-z0-9_:]+$")
    for path in sorted({e["file"] for e in out.values()}):
        tree = scan.trees[path]
        for assign in ast.walk(tree):
            if not isinstance(assign, ast.Assign | ast.AnnAssign):
                continue
            targets = assign.targets if isinstance(assign, ast.Assign) else [assign.target]
            holder = " ".join(ast.unparse(t) for t in targets)
            kind = _METRIC_CALL.search(holder)
            for sub in ast.walk(assign):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str) \
                        and shaped.match(sub.value) and sub.value not in out:
                    listed: dict[str, Any] = {"type": kind[1].capitalize() if kind else None,
                                              "file": path, "line": sub.lineno,
                                              "registered_through": holder}
                    if listed["type"] == "Counter":
                        listed["exposed_as"] = sub.value.removesuffix("_total") + "_total"
                    out[sub.value] = listed
    return dict(sorted(out.items()))


# -- the table -------------------------------------------------------------------------------
@dataclass
class Release:
    engine: str
    version: str
    archive: Path
    artifact: Artifact
    notes: list[str] = field(default_factory=list)


def parse_spec(spec: str) -> tuple[str, str]:
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][0-9A-Za-z.+-]*)", spec.strip())
    if not m or m[1].lower() not in ENGINES:
        raise ExtractError(f"{spec!r}: expected ENGINE==VERSION with ENGINE one of "
                           f"{', '.join(ENGINES)} (e.g. vllm==0.34.0)")
    return m[1].lower(), m[2]


def build_table(engine: str, version: str, archive: Path, artifact: Artifact) -> dict[str, Any]:
    """The release's table, from its archive (nothing downloaded here)."""
    package = ENGINES[engine]
    sources = read_sources(archive, package)
    trees: dict[str, ast.Module] = {}
    unparsed: list[str] = []
    for path, text in sources.items():
        try:
            trees[path] = ast.parse(text, filename=path)
        except SyntaxError:
            unparsed.append(path)
    scan = scan_sources(trees)
    try:
        if engine == "vllm":
            ev = SourceEval(sources, trees=trees, argv=["vllm", "serve"])
            parser = vllm_flags(ev)
            env = vllm_env(ev)
            metric_prefix = "vllm:"
        else:
            ev = SourceEval(sources, trees=trees, argv=["python3", "-m", "sglang.launch_server"])
            parser = sglang_flags(ev)
            env = sglang_env(ev)
            metric_prefix = "sglang:"
    except (LookupError, BudgetExceeded, RecursionError) as exc:
        raise ExtractError(f"{engine} {version}: {exc}") from None
    flags, positionals = flag_entries(ev, parser)
    env["read_directly"] = {name: sorted(paths) for name, paths in sorted(scan.env_reads.items())}
    table: dict[str, Any] = {
        "schema": SCHEMA,
        "engine": engine,
        "package": package,
        "version": version,
        "artifact": {"filename": artifact.filename, "sha256": artifact.sha256,
                     "size": artifact.size},
        "prog": parser.prog,
        "usage": parser.usage,
        "allow_abbrev": parser.allow_abbrev,
        "flags": dict(sorted(flags.items())),
        "positionals": positionals,
        "env": env,
        "lines": find_lines(engine, sources, scan),
        "metrics": find_metrics(metric_prefix, scan),
        **({"nvfp4_linear_kernels": kernels}
           if engine == "vllm" and (kernels := nvfp4_linear_kernels(trees)) is not None else {}),
        "notes": sorted(ev.notes | {f"{p}: not parsed (syntax this Python does not read)"
                                    for p in unparsed}),
    }
    return table


# Where vLLM maps each --linear-backend choice to the kernel classes it covers.
_LINEAR_KERNEL_MAP = ("vllm/model_executor/kernels/linear/__init__.py", "_LINEAR_BACKEND_KERNEL_MAP")


def nvfp4_linear_kernels(trees: Mapping[str, ast.Module]) -> dict[str, str] | None:
    """vLLM: each NVFP4 linear kernel class -> the --linear-backend choice that covers it
    (the release's _LINEAR_BACKEND_KERNEL_MAP, a literal dict of sets of class names); a
    class of the nvfp4 kernel folder no choice covers is automatic only and absent. None
    when the release has no such map."""
    path, name = _LINEAR_KERNEL_MAP
    tree = trees.get(path)
    if tree is None:
        return None
    for node in tree.body:
        target: ast.expr
        literal: ast.expr | None
        if isinstance(node, ast.AnnAssign):
            target, literal = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, literal = node.targets[0], node.value
        else:
            continue
        if not (isinstance(target, ast.Name) and target.id == name and isinstance(literal, ast.Dict)):
            continue
        out: dict[str, str] = {}
        for key, value in zip(literal.keys, literal.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(value, (ast.Set, ast.List, ast.Tuple))):
                continue
            for element in value.elts:
                if isinstance(element, ast.Name) and re.search(r"NvFp4\w*LinearKernel$", element.id):
                    out[element.id] = str(key.value)
        return dict(sorted(out.items()))
    return None


def dumps(table: Mapping[str, Any]) -> str:
    return json.dumps(table, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def table_path(out_dir: Path, engine: str, version: str) -> Path:
    return out_dir / f"{engine}-{version}.json"


def _pinned_artifact(path: Path) -> Artifact | None:
    """The artifact a committed table was extracted from, if there is a readable one."""
    try:
        data = json.loads(path.read_text())
        art = data["artifact"]
        return Artifact(filename=art["filename"], url="", sha256=art["sha256"], size=art["size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run(specs: Sequence[str], *, out_dir: Path, cache: Path, check: bool, index_url: str,
        log: Callable[[str], None] = print) -> int:
    stale: list[Path] = []
    for spec in specs:
        engine, version = parse_spec(spec)
        path = table_path(out_dir, engine, version)
        archive, artifact = fetch(ENGINES[engine], version, cache=cache, index_url=index_url,
                                  pinned=_pinned_artifact(path), log=log)
        text = dumps(build_table(engine, version, archive, artifact))
        shown = os.path.relpath(path) if path.is_absolute() else str(path)
        if check:
            if not path.exists() or path.read_bytes() != text.encode():
                stale.append(path)
                log(f"{shown} is stale: regenerate it with python -m enginetables.extract "
                    f"{engine}=={version}")
            else:
                log(f"{shown} is up to date")
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode())
        log(f"wrote {shown}")
    return 1 if stale else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m enginetables.extract",
        description="Extract an engine release's flags, environment variables, log lines "
                    "and metrics from its package into lab/engines/releases/.")
    parser.add_argument("specs", nargs="+", metavar="ENGINE==VERSION")
    parser.add_argument("--out", type=Path, default=RELEASES_DIR,
                        help="where the tables are (default lab/engines/releases/)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                        help="where downloaded archives are kept (default out/engine-downloads/)")
    parser.add_argument("--index-url", default=DEFAULT_INDEX,
                        help="a PEP 691 simple index (default https://pypi.org/simple)")
    parser.add_argument("--check", action="store_true",
                        help="extract again and fail if a table in --out differs")
    args = parser.parse_args(argv)
    try:
        return run(args.specs, out_dir=args.out, cache=args.cache, check=args.check,
                   index_url=args.index_url, log=lambda m: print(m, file=sys.stderr))
    except ExtractError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["LINE_FINDERS", "Artifact", "ExtractError", "build_table", "choose_artifact", "dumps",
           "fetch", "main", "parse_spec", "read_sources", "run"]
