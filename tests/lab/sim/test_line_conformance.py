"""Every line the simulated vLLM writes with a source is its release's: the format string at
that file and line of the table (lab/engines/releases/*.json), at the level of the release's
logger call, on the ranks the table says write it, and a `*_once` line no more than once per
message on a node; SGLang's lines are its release's strings, on the ranks that write them."""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml

from lab.engines.lines import pattern_text
from lab.engines.tables import release
from lab.scenarios import scenario_path
from lab.sim.lab import SimLab
from lab.sim.scenario import load_scenario

from .conftest import REPO, launch, load_path_fixed, out_of_box, stop_all, wait_ready

# tqdm's bar (model_loader/weight_utils.py, rank 0 only): no logger prefix, only its own
# elapsed field. Its description is the table's shard_progress string; the rest is tqdm's.
TQDM_BAR = re.compile(r"^(?P<desc>.+?): +\d+% Completed \| \d+/\d+ "
                      r"\[[\d:]+<[\d:?]+, +[\d.?]+(?:s/it|it/s)\]$")
VLLM_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d "
                       r"\[([\w.]+):(\d+)\] (.*)$")


def _entries(version: str) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The table's format strings by (file name, line), as vLLM's prefix names them."""
    out: dict[tuple[str, int], list[dict[str, Any]]] = collections.defaultdict(list)
    for key, entry in release("vllm", version)["lines"].items():
        for found in (entry or {}).get("found") or []:
            out[(PurePosixPath(found["file"]).name, int(found["line"]))].append(
                {**found, "key": key, "writers": (entry or {}).get("writers")})
    return out


def _written(lab: SimLab, config: dict[str, Any]) -> dict[str, list[str]]:
    for node in lab.nodes.values():
        node.drop_caches()
    procs = launch(lab, config)
    wait_ready(procs)
    logs = {p.node.name: p.log_path.read_text().splitlines() for p in procs}
    stop_all(lab)
    return logs


def _conforming(version: str, logs: dict[str, list[str]], head: str = "spark-01") -> tuple[int, int]:
    """Check every node's lines against vLLM `version`'s table; (lines checked, bar updates)."""
    entries = _entries(version)
    bar_texts = {f["text"] for f in release("vllm", version)["lines"]["shard_progress"]["found"]}
    checked = bars = 0
    for node, lines in logs.items():
        seen: collections.Counter[tuple[str, str]] = collections.Counter()
        for text in lines:
            if bar := TQDM_BAR.match(text):
                assert node == head, f"{node}: only rank 0 draws the shards' bar: {text}"
                assert bar["desc"] in bar_texts, text
                bars += 1
                continue
            m = VLLM_LINE.match(text)
            if m is None:
                continue  # tracebacks, NCCL's own lines
            level, name, number, message = m.group(1), m.group(2), int(m.group(3)), m.group(4)
            candidates = entries.get((name, number))
            assert candidates, f"{node}: no format string at {name}:{number} in vllm {version}: {text}"
            match = next((c for c in candidates if re.fullmatch(pattern_text(c["text"]), message)), None)
            if match is None and all(c["key"].startswith("stats_") for c in candidates):
                # The periodic stats line is assembled from pieces (v1/metrics/loggers.py),
                # each its own string: every piece at the call's line is in the message.
                if all(re.search(pattern_text(c["text"]), message) for c in candidates):
                    checked += 1
                    continue
            assert match is not None, f"{node}: {message!r} is not {candidates[0]['text']!r}"
            if "level" in match:
                assert level == match["level"].upper(), f"{node}: {text} (the release logs {match['level']})"
            if match["writers"] == "rank 0":
                assert node == head, f"{node}: only the head's engine core writes {text}"
            if "once" in match:
                seen[(f"{name}:{number}", message)] += 1
                assert seen[(f"{name}:{number}", message)] == 1, f"{node}: written twice: {text}"
                assert match["once"] != "global" or node == head, f"{node}: rank 0 only: {text}"
            checked += 1
    return checked, bars


@pytest.mark.parametrize("version", ["0.29.0", "0.34.0"])
def test_every_sourced_line_is_the_releases_at_its_level_and_once_where_it_says(
    make_lab: Callable[..., SimLab], version: str,
) -> None:
    base = load_scenario(scenario_path("reference-kimi-k2-8spark"))
    lab = make_lab(dataclasses.replace(base, engine={**base.engine, "version": version}))
    # Eager mode with Marlin: no torch.compile lines, the init line without its compilation
    # part, Marlin's warning after the weights (the process_weights_after_loading hook).
    eager_marlin = load_path_fixed()
    eager_marlin["serving"].update(enforce_eager=True, moe_backend="marlin")
    checked = bars = 0
    for config in (out_of_box(), load_path_fixed(), eager_marlin):
        config["engine"] = {"name": "vllm", "version": version}
        got = _conforming(version, _written(lab, config))
        checked, bars = checked + got[0], bars + got[1]
    assert checked > 100 and bars > 2


def test_the_four_node_deepseek_lab_writes_only_its_releases_lines(make_lab: Callable[..., SimLab]) -> None:
    # Another model (registered architecture, MTP drafting) on four nodes: the same rules.
    lab = make_lab(load_scenario(scenario_path("deepseek-v3-4spark")))
    config = yaml.safe_load((REPO / "examples" / "configs" / "deepseek-v3-4spark.yaml").read_text())
    logs = _written(lab, config)
    checked, bars = _conforming(str(config["engine"]["version"]), logs)
    assert len(logs) == 4 and checked > 40 and bars > 0


SGLANG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: TP\d+)?\] (.*)$")


@pytest.mark.parametrize("version", ["0.5.12", "0.5.23"])
def test_every_sglang_line_is_one_of_its_releases_format_strings(
    make_lab: Callable[..., SimLab], version: str,
) -> None:
    # SGLang's prefix names no source: each message must be one of the release's strings
    # (the KV pool's own line, the main graph runner's capture line, not rarer variants).
    base = load_scenario(scenario_path("reference-kimi-k2-8spark-sglang"))
    lab = make_lab(dataclasses.replace(base, engine={**base.engine, "version": version}))
    table = release("sglang", version)["lines"]
    patterns = [(key, re.compile(pattern_text(found["text"])))
                for key, entry in table.items() for found in (entry or {}).get("found") or []]
    config = yaml.safe_load((REPO / "examples" / "configs" / "kimi-k2-8spark-sglang.yaml").read_text())
    config["engine"] = {"name": "sglang", "version": version}
    keys: set[str] = set()
    for node, lines in _written(lab, config).items():
        for text in lines:
            m = SGLANG_LINE.match(text)
            if m is None:
                continue
            hit = next((key for key, p in patterns if p.fullmatch(m.group(1))), None)
            assert hit is not None, f"{node}: not a string of sglang {version}: {text}"
            if table[hit].get("writers") == "rank 0":  # the TP rank 0 scheduler's, or node 0's server
                assert node == "spark-01", f"{node}: only rank 0 writes {text}"
            if "Capture draft " in text:  # the EAGLE worker's, TP rank 0 only (its key mixes writers)
                assert node == "spark-01", text
            # Where the release words a line by device, the CUDA wording.
            assert "available_cpu_mem" not in text and "cpu graph" not in text.lower(), text
            keys.add(hit)
    assert {"kv_cache_allocated", "cuda_graph_capture_end", "server_ready"} <= keys
