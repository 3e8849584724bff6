"""What the lab accepts from a well-formed configuration: only what its catalog holds.

A configuration reaches the lab's nodes, so beyond being well-formed (lab.config) and
passing only listed flags (lab.flag_policy) it may make an engine load nothing the lab did
not place and review there. The model must be one of the catalog's (model.path its path or
id), an EAGLE-3 draft one listed under that model, and every flag that loads something
(`loads` in the version's list) is held to the catalog: a tokenizer, chat template or
generation config only from a catalog entry's folder, and a compilation config only with
keys that cannot name code. Remote code is judged on the command as the lab launches it
(lab.engines.as_launched adds --trust-remote-code for a model the catalog marks as
reviewed): once remote code is on, every folder the launch loads (the model's, the
tokenizer's, the generation config's, the draft's) must be the served model's own or an
entry the catalog marks as reviewed. Every refusal is a ConfigError naming the field.

`lab.engines.normalize_config` applies this to every customer configuration and
`lab.engines.render` again to the launched command; reading a launch back
(`parse_launch`, what the simulated engine does) does not, as an engine knows nothing of
the lab's catalog.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lab.catalog import Catalog, CatalogModel
from lab.config import ConfigError, shown
from lab.engines.base import Engine

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


def _in_entry(flag: str, value: Any, model: CatalogModel, catalog: Catalog, what: str,
              words: tuple[str, ...] = ()) -> None:
    """A file `flag` loads must lie in a catalog entry's folder (or name the served model)."""
    if str(value) in words or model.named(str(value)) or catalog.folder_of(str(value)) is not None:
        return
    also = f"use {' or '.join(words)}, or " if words else ""
    raise _refuse(flag, f"{shown(value)}: {what} must come from a folder of the lab's catalog "
                        f"({catalog.describe()}); {also}remove the flag to use the model's own")


def _tokenizer(flag: str, value: Any, model: CatalogModel, catalog: Catalog) -> None:
    _in_entry(flag, value, model, catalog, "a tokenizer")


def _chat_template(flag: str, value: Any, model: CatalogModel, catalog: Catalog) -> None:
    if not catalog.holds_file(str(value)):
        raise _refuse(flag, f"{shown(value)}: a chat template must be a file in the lab's models "
                            f"directory ({catalog.models_dir}/...); inline templates and other paths "
                            "are not accepted, and without the flag the model's own template is used")
    _in_entry(flag, value, model, catalog, "a chat template")


def _generation_config(flag: str, value: Any, model: CatalogModel, catalog: Catalog) -> None:
    _in_entry(flag, value, model, catalog, "a generation config", GENERATION_CONFIG_WORDS)


CHECKS: dict[str, Callable[[str, Any, CatalogModel, Catalog], None]] = {
    "remote_code": _remote_code,
    "tokenizer": _tokenizer,
    "chat_template": _chat_template,
    "generation_config": _generation_config,
}


# What else a launch loads files from, with their own code once remote code is on.
CODE_SOURCES = ("tokenizer", "generation_config")


def _reviewed_source(flag: str, value: Any, model: CatalogModel, catalog: Catalog) -> None:
    """With --trust-remote-code (the customer's, or the lab's for a reviewed model), a
    tokenizer or generation config from another entry's folder runs that entry's code: it
    must be the served model's own, or an entry the catalog marks as reviewed."""
    if str(value) in GENERATION_CONFIG_WORDS:
        return
    found = catalog.folder_of(str(value))
    if found is not None:
        owner, draft = found
        reviewed = draft.remote_code if draft is not None else (owner == model or owner.remote_code)
        if reviewed:
            return
        whose = f"{draft.id if draft is not None else owner.id}, whose code is not reviewed"
    else:
        whose = "no entry of the catalog"
    raise _refuse(flag, f"{shown(value)} with --trust-remote-code would run the code of {whose}; "
                        f"with remote code on, every folder loaded must be {model.id}'s own or a "
                        "reviewed entry's")


def _reviewed_draft(config: Mapping[str, Any], model: CatalogModel) -> None:
    spec = config["speculative"]
    if spec is None or spec.get("draft_model") is None:
        return
    draft = model.draft(spec["draft_model"], spec["method"])
    if draft is not None and not draft.remote_code:
        raise ConfigError("speculative.draft_model",
                          f"{shown(spec['draft_model'])} would load with --trust-remote-code (the lab "
                          f"launches {model.id} with it), and the lab has not reviewed the draft's "
                          "code: its catalog entry needs remote_code: true")


def _fits_the_lab(config: Mapping[str, Any], catalog: Catalog) -> None:
    """A layout the lab cannot run is refused before a day is spent on it: tp × pp ranks
    are one node each (the engines' multi-node launch), and a cluster larger than the lab
    cannot be reproduced node for node."""
    nodes = catalog.lab_nodes
    if nodes is None:
        return
    tp, pp = config["parallel"]["tp"], config["parallel"]["pp"]
    if tp * pp > nodes:
        raise ConfigError("parallel.tp", f"tp {tp} x pp {pp} needs {tp * pp} nodes (one rank on "
                                         f"each), and this lab has {nodes}; accepted: a layout of at "
                                         f"most {nodes} nodes (tp x pp <= {nodes})")
    cluster = config["cluster"]["nodes"]
    if cluster > nodes:
        raise ConfigError("cluster.nodes", f"{cluster} nodes: this lab has {nodes}, so a cluster of "
                                           f"{cluster} cannot be reproduced node for node; give the "
                                           f"nodes your layout runs on (tp × pp = {tp * pp})")


def remote_code_on(config: Mapping[str, Any], engine: Engine, model: CatalogModel) -> bool:
    """Whether the command the lab launches for `config` runs remote code: the customer's
    --trust-remote-code, or the lab's, which as_launched adds for a model the catalog marks
    as reviewed."""
    parser = engine.parser(config["engine"]["version"])
    values = parser.parse(config["extra_args"], partial=True).values()
    option = parser.option("--trust-remote-code")
    if option is None:
        return False
    if option.dest in values:
        return bool(values[option.dest])
    return model.remote_code


def admit(config: Mapping[str, Any], engine: Engine, catalog: Catalog) -> None:
    """ConfigError unless everything the launch of `config` makes a node load is in
    `catalog`. `config` is normalized and its extra_args already held to the version's
    list. Remote code is judged on the command as launched (the lab's own
    --trust-remote-code included) and on every folder it loads."""
    model = served_model(config, catalog)
    _draft(config, model)
    _fits_the_lab(config, catalog)
    parser = engine.parser(config["engine"]["version"])
    given = parser.parse(config["extra_args"], partial=True).given
    loaded = [(g, engine.loads(parser, g.option)) for g in given]
    remote = remote_code_on(config, engine, model)
    for g, kind in loaded:
        flag = g.option.option_strings[0]
        if kind:
            CHECKS[kind](flag, g.value, model, catalog)
        if remote and kind in CODE_SOURCES:
            _reviewed_source(flag, g.value, model, catalog)
    if remote:
        _reviewed_draft(config, model)
