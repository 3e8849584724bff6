"""What the lab accepts from a well-formed configuration: only what its catalog holds.

A configuration reaches root-owned nodes, so beyond being well-formed (lab.config) it may
make an engine load nothing the lab did not place there: the model must be one of the
catalog's (model.path its path or id), an EAGLE-3 draft one listed under that model, and
the pass-through flags that load something (`Engine.loads`, by the flag's dest in
the configuration's version) are held to the catalog too:
remote code only for a model the catalog marks as reviewed, tokenizers, chat templates
and generation configs only from the models directory, no download directory, and no
compilation config that names code. Every refusal is a ConfigError naming the field.

`lab.engines.normalize_config` applies this to every customer configuration; reading a
launch back (`parse_launch`, what the simulated engine does) does not, as an engine knows
nothing of the lab's catalog.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from lab.catalog import Catalog, CatalogModel
from lab.config import ConfigError, shown
from lab.engines.base import Engine

# vLLM --compilation-config keys that only tune compilation and CUDA graphs; the others
# (backend, custom passes, inductor settings) can name code to import and run.
COMPILATION_KEYS = ("level", "mode", "cudagraph_mode", "cudagraph_capture_sizes",
                    "max_cudagraph_capture_size", "use_cudagraph", "full_cuda_graph",
                    "use_inductor", "compile_sizes", "cudagraph_num_of_warmups")
# --generation-config also takes these words instead of a folder.
GENERATION_CONFIG_WORDS = ("auto", "vllm")


def served_model(config: Mapping[str, Any], catalog: Catalog) -> CatalogModel:
    """The catalog entry `config` serves (ConfigError at model.path when it has none)."""
    path = config["model"]["path"]
    model = catalog.model(path)
    if model is None:
        raise ConfigError("model.path", f"{shown(path)} is not a model this lab holds; the lab "
                                        f"serves only models from its catalog: {catalog.describe()}")
    return model


def _draft(config: Mapping[str, Any], model: CatalogModel) -> None:
    spec = config["speculative"]
    if spec is None or spec.get("draft_model") is None:
        return
    if model.draft(spec["draft_model"], spec["method"]) is None:
        held = [d.id for d in model.drafts if d.method == spec["method"]]
        offer = f"use {', '.join(held)}" if held else f"the lab holds no {spec['method']} draft for it"
        raise ConfigError("speculative.draft_model",
                          f"{shown(spec['draft_model'])} is not a {spec['method']} draft the lab "
                          f"holds for {model.id}; {offer}")


def _refuse(flag: str, problem: str) -> ConfigError:
    return ConfigError("extra_args", f"{flag!r} {problem}")


def _remote_code(flag: str, value: Any, model: CatalogModel, catalog: Catalog) -> None:
    if value and not model.remote_code:
        raise _refuse(flag, f"runs code from the model's own files; the lab allows it only for "
                            f"models its catalog marks as reviewed, and {model.id} is not one")


def _tokenizer(flag: str, value: Any, model: CatalogModel, catalog: Catalog) -> None:
    if model.named(str(value)) or catalog.holds_file(str(value)):
        return
    raise _refuse(flag, f"{shown(value)}: a tokenizer must come from the lab's models directory "
                        f"({catalog.models_dir}/...) or be the served model's own ({model.id}); "
                        "remove the flag to use the model's")


def _chat_template(flag: str, value: Any, model: CatalogModel, catalog: Catalog) -> None:
    if catalog.holds_file(str(value)):
        return
    raise _refuse(flag, f"{shown(value)}: a chat template must be a file in the lab's models "
                        f"directory ({catalog.models_dir}/...); inline templates and other paths "
                        "are not accepted, and without the flag the model's own template is used")


def _generation_config(flag: str, value: Any, model: CatalogModel, catalog: Catalog) -> None:
    if value in GENERATION_CONFIG_WORDS or catalog.holds_file(str(value)):
        return
    raise _refuse(flag, f"{shown(value)}: use {' or '.join(GENERATION_CONFIG_WORDS)}, or a "
                        f"folder in the lab's models directory ({catalog.models_dir}/...)")


def _download_dir(flag: str, value: Any, model: CatalogModel, catalog: Catalog) -> None:
    raise _refuse(flag, f"would make the engine fetch weights; the lab serves its own copies from "
                        f"{catalog.models_dir} and runs engines offline; remove it")


def _compilation_config(flag: str, value: Any, model: CatalogModel, catalog: Catalog) -> None:
    text = str(value).strip()
    if text.isdigit() and len(text) == 1:
        return  # an optimization level, -O3 style
    parsed: Any = value  # the version's parser has read its JSON already
    if not isinstance(value, dict):
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            parsed = None
    if not isinstance(parsed, dict):
        raise _refuse(flag, f"{shown(value)} is not a level (0-3) or a JSON object")
    named = [k for k in parsed if k not in COMPILATION_KEYS]
    if named:
        raise _refuse(flag, f"key {shown(named[0])} is not accepted: keys that can name code "
                            f"(backend, passes, inductor settings) are refused; accepted: "
                            f"{', '.join(COMPILATION_KEYS)}")


CHECKS: dict[str, Callable[[str, Any, CatalogModel, Catalog], None]] = {
    "remote_code": _remote_code,
    "tokenizer": _tokenizer,
    "chat_template": _chat_template,
    "generation_config": _generation_config,
    "download_dir": _download_dir,
    "compilation_config": _compilation_config,
}


# What else a configuration loads files from, with its own code once remote code is on.
CODE_SOURCES = ("tokenizer", "generation_config")


def _reviewed_source(flag: str, value: Any, model: CatalogModel, catalog: Catalog) -> None:
    """With --trust-remote-code, a tokenizer or generation config from another model's
    files runs that model's code: it must be the served model's own, or a model the
    catalog marks as reviewed."""
    if str(value) in GENERATION_CONFIG_WORDS:
        return
    owner = catalog.owner_of(str(value))
    if owner is not None and (owner == model or owner.remote_code):
        return
    whose = f"{owner.id}, whose code is not reviewed" if owner else "no model of the catalog"
    raise _refuse(flag, f"{shown(value)} with --trust-remote-code would run the code of {whose}; "
                        f"with remote code on, every file loaded must be {model.id}'s own or a "
                        "reviewed model's")


def admit(config: Mapping[str, Any], engine: Engine, catalog: Catalog) -> None:
    """ConfigError unless everything `config` makes a node load is in `catalog`. `config`
    is normalized and its extra_args already checked to be pass-through flags of its
    version. Remote code is judged on every file the configuration loads, not the served
    model's alone."""
    model = served_model(config, catalog)
    _draft(config, model)
    parser = engine.parser(config["engine"]["version"])
    given = parser.parse(config["extra_args"], partial=True).given
    loaded = [(g, engine.loads(parser, g.option)) for g in given]
    remote = any(kind == "remote_code" and g.value for g, kind in loaded)
    for g, kind in loaded:
        flag = g.option.option_strings[0]
        if kind:
            CHECKS[kind](flag, g.value, model, catalog)
        if remote and kind in CODE_SOURCES:
            _reviewed_source(flag, g.value, model, catalog)
