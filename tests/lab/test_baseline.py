"""A lab's baseline file (lab.baseline/1): written and read back unchanged, numbered by
version with the newest winning, found for a model, node count and engine version and
called stale in words when the engine or the nodes changed, refused with the field named
when it is malformed; and the firm's best-known configurations, one per model, node count
and engine, naming no lab's own hardware."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.baseline import (
    BEST_KNOWN_DIR,
    Baseline,
    BaselineError,
    Engine,
    age_words,
    baseline_dir_for,
    baseline_dir_of,
    baseline_from_mapping,
    best_known,
    best_known_entries,
    engine_version_of,
    find_baseline,
    load_baseline,
    load_best_known,
    node_fingerprint,
    read_baselines,
    save_baseline,
    staleness,
    superseded_by,
)
from lab.catalog import load_catalog
from lab.engines import normalize_config

REPO = Path(__file__).resolve().parents[2]
KIMI = "moonshotai/Kimi-K2-Instruct-0905"
REFERENCE_SCENARIO = REPO / "lab" / "scenarios" / "reference-kimi-k2-8spark.yaml"


def node_facts(i: int, *, gpu: str = "NVIDIA GB10", mem_kib: int = 127_600_000,
               nics: tuple[str, ...] = ("enP7s7", "enp1s0f0np0", "enP2p1s0f0np0")) -> dict[str, Any]:
    """One node's facts as the agent reports them (lab/agent/agent.py `facts`)."""
    return {
        "host": f"spark-{i:02d}", "time": 1_700_000_000.0 + i, "kernel": "6.11.0-1016-nvidia",
        "arch": "aarch64", "cpu_count": 20, "mem_total_kib": mem_kib, "mem_available_kib": 100_000_000 - i,
        "gpus": [{"name": gpu, "compute_capability": "12.1", "driver": "580.95.05",
                  "memory_total_mib": None}],
        "nics": [{"name": n, "speed_mbps": 200_000, "mtu": 9000, "operstate": "up", "ipv4": [f"10.0.{k}.{i}"],
                  "default_route": k == 0} for k, n in enumerate(nics)],
        "rdma": [], "model_dir": {"path": "/models/kimi-k2", "exists": True, "free_bytes": 10**12},
        "engines": {"vllm": "0.34.0", "sglang": "0.5.23"}, "python": "3.12.3",
    }


def lab_facts(n: int = 8, **kw: Any) -> dict[str, Any]:
    return {f"spark-{i:02d}": node_facts(i, **kw) for i in range(1, n + 1)}


FINGERPRINT = node_fingerprint(lab_facts())


def kimi_config(version: str = "0.34.0") -> dict[str, Any]:
    config = best_known(KIMI, 8, "vllm")
    assert config is not None
    config["engine"]["version"] = version
    return config


def rate(mean: float) -> dict[str, Any]:
    samples = [round(mean + d, 3) for d in (-0.4, -0.2, 0.0, 0.2, 0.4)] * 3
    ci = [round(mean - 0.5, 3), round(mean + 0.5, 3)]
    return {"n": 15, "mean_tps": mean, "ci95": ci, "samples": samples}


def make(version: str = "0.34.0", *, made_at: str = "2026-11-30T09:00:00Z", fingerprint: str = FINGERPRINT,
         code: float = 27.1) -> Baseline:
    return Baseline(
        lab="reference-kimi-k2-8spark", model=KIMI, nodes=8, engine=Engine("vllm", version), version=1,
        made_at=made_at, source="calibrate", nodes_fingerprint=fingerprint, config=kimi_config(version),
        rates={"code": rate(code), "prose": rate(23.9)},
        cold_start={"n": 2, "mean_s": 148.2, "samples": [148.5, 147.9]},
        job="aff777cc-0444-469d-bb74-13986b8ed956", lab_time_s=6479.3,
    )


# -- the file -----------------------------------------------------------------------------------

def test_a_baseline_reads_back_as_written(tmp_path: Path) -> None:
    written = make()
    path = save_baseline(tmp_path, written)
    assert path == tmp_path / "moonshotai-kimi-k2-instruct-0905-8n-vllm-0.34.0" / "v1.yaml"
    read = load_baseline(path)
    assert read == written and read.path == path
    data = yaml.safe_load(path.read_text())
    assert data["schema"] == "lab.baseline/1" and data["engine"] == {"name": "vllm", "version": "0.34.0"}
    assert list(data)[:6] == ["schema", "lab", "model", "nodes", "engine", "version"]
    # The engine reads as the file's mapping too.
    assert read.engine["version"] == "0.34.0" and read.engine.words() == "vLLM 0.34.0"
    assert read.rate("code") == 27.1 and read.rate("missing") is None and read.cold_start_s == 148.2
    assert read.made_when == dt.datetime(2026, 11, 30, 9, tzinfo=dt.UTC)
    assert read.age(dt.datetime(2026, 12, 3, 9, tzinfo=dt.UTC)) == dt.timedelta(days=3)


def test_versions_number_up_and_the_newest_wins(tmp_path: Path) -> None:
    first = save_baseline(tmp_path, make(code=26.0))
    second = save_baseline(tmp_path, make(made_at="2026-12-01T09:00:00Z", code=27.5))
    assert (first.name, second.name) == ("v1.yaml", "v2.yaml")
    assert first.read_text() != second.read_text()  # the first version is kept as it was
    found = find_baseline(tmp_path, model=KIMI, nodes=8, engine="vllm", version="0.34.0",
                          fingerprint=FINGERPRINT)
    assert found.baseline is not None and found.baseline.version == 2 and found.baseline.rate("code") == 27.5
    assert found.stale is None and found.fresh
    assert [b.version for b in found.all] == [2, 1]
    assert superseded_by(found.all[1], found.all) == 2 and superseded_by(found.all[0], found.all) is None


def test_a_file_whose_version_disagrees_with_its_name_is_refused(tmp_path: Path) -> None:
    path = save_baseline(tmp_path, make())
    path.write_text(path.read_text().replace("version: 1\n", "version: 4\n"))
    with pytest.raises(BaselineError, match=r"v1\.yaml: version: 4, but the file is named v1\.yaml"):
        load_baseline(path)


def test_the_lookup_says_why_a_baseline_is_stale(tmp_path: Path) -> None:
    save_baseline(tmp_path, make("0.29.0", made_at="2026-10-01T09:00:00Z"))
    lookup = find_baseline(tmp_path, model=KIMI.lower(), nodes=8, engine="vllm", version="0.34.0",
                           fingerprint=FINGERPRINT)
    assert lookup.baseline is not None and lookup.baseline.engine.version == "0.29.0"
    assert lookup.stale == "made on vLLM 0.29.0, the lab runs vLLM 0.34.0" and not lookup.fresh

    save_baseline(tmp_path, make(made_at="2026-11-30T09:00:00Z"))
    changed = node_fingerprint(lab_facts(gpu="NVIDIA GB200"))
    lookup = find_baseline(tmp_path, model=KIMI, nodes=8, engine="vllm", version="0.34.0",
                           fingerprint=changed)
    assert lookup.baseline is not None and lookup.baseline.engine.version == "0.34.0"
    assert lookup.stale is not None and lookup.stale.startswith("the lab's nodes changed since 2026-11-30")
    # Without the nodes' fingerprint, only the engine version is held against it.
    lookup = find_baseline(tmp_path, model=KIMI, nodes=8, engine="vllm", version="0.34.0")
    assert lookup.fresh

    # Both at once are both said.
    both = staleness(make("0.29.0"), version="0.34.0", fingerprint=changed)
    assert both is not None and "0.29.0" in both and "nodes changed" in both


def test_an_older_version_made_on_these_nodes_beats_a_newer_one_from_other_nodes(tmp_path: Path) -> None:
    save_baseline(tmp_path, make(made_at="2026-11-01T09:00:00Z", code=27.0))
    other = node_fingerprint(lab_facts(mem_kib=255_000_000))
    save_baseline(tmp_path, make(made_at="2026-11-20T09:00:00Z", fingerprint=other, code=31.0))
    lookup = find_baseline(tmp_path, model=KIMI, nodes=8, engine="vllm", version="0.34.0",
                           fingerprint=FINGERPRINT)
    assert lookup.baseline is not None and lookup.baseline.version == 1 and lookup.fresh


def test_nothing_for_another_model_node_count_or_engine(tmp_path: Path) -> None:
    save_baseline(tmp_path, make())
    others = ((KIMI, 4, "vllm"), (KIMI, 8, "sglang"), ("nvidia/DeepSeek-V3-0324-FP4", 8, "vllm"))
    for model, nodes, engine in others:
        lookup = find_baseline(tmp_path, model=model, nodes=nodes, engine=engine, version="0.34.0")
        assert lookup.baseline is None and lookup.stale is None and len(lookup.all) == 1
    empty = find_baseline(tmp_path / "none", model=KIMI, nodes=8, engine="vllm", version="0.34.0")
    assert empty.baseline is None and empty.all == [] and empty.problems == []


def test_a_broken_file_is_reported_not_used(tmp_path: Path) -> None:
    good = save_baseline(tmp_path, make())
    bad = good.parent / "v2.yaml"
    text = good.read_text().replace("version: 1\n", "version: 2\n")
    bad.write_text(text.replace("mean_s: 148.2", "mean_s: -1"))
    found, problems = read_baselines(tmp_path)
    assert [b.version for b in found] == [1]
    assert len(problems) == 1 and "v2.yaml: cold_start.mean_s: must be greater than zero" in problems[0]
    lookup = find_baseline(tmp_path, model=KIMI, nodes=8, engine="vllm", version="0.34.0")
    assert lookup.baseline is not None and lookup.baseline.version == 1 and lookup.problems == problems


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for name in parents:
        data = data[name]
    if value is KeyError:
        del data[last]
    else:
        data[last] = value


@pytest.mark.parametrize(("dotted", "value", "field"), [
    ("schema", "lab.baseline/2", "schema"),
    ("model", "", "model"),
    ("nodes", 0, "nodes"),
    ("nodes", True, "nodes"),
    ("engine.version", 0.34, "engine.version"),
    ("engine.name", "trt", "engine.name"),
    ("engine", "vllm", "engine"),
    ("version", "two", "version"),
    ("made_at", "yesterday", "made_at"),
    ("made_at", "2026-11-30T09:00:00", "made_at"),
    ("source", "guess", "source"),
    ("nodes_fingerprint", "abc", "nodes_fingerprint"),
    ("rates.code.ci95", [28.0, 29.0], "rates.code.ci95"),
    ("rates.code.ci95", [28.0], "rates.code.ci95"),
    ("rates.code.n", 1, "rates.code.n"),
    ("rates.code.samples", [27.0, 27.2], "rates.code.samples"),
    ("rates.code.mean_tps", float("nan"), "rates.code.mean_tps"),
    ("rates.code.median", 27.0, "rates.code.median"),
    ("rates.batch", rate(10.0), "rates.batch"),
    ("rates", {}, "rates"),
    ("cold_start.samples", [148.0], "cold_start.samples"),
    ("cold_start.mean_s", KeyError, "cold_start.mean_s"),
    ("config.serving.kv_cache_dtype", "fp3", "config.serving.kv_cache_dtype"),
    ("config.engine.version", "0.29.0", "config.engine"),
    ("config.cluster.nodes", 4, "config"),
    ("config.model.id", "someone/else", "config.model.id"),
    ("lab", KeyError, "lab"),
    ("colour", "blue", "colour"),
])
def test_bad_input_names_the_field(dotted: str, value: Any, field: str) -> None:
    data = make().as_dict()
    _set(data, dotted, value)
    with pytest.raises(BaselineError) as caught:
        baseline_from_mapping(copy.deepcopy(data))
    assert caught.value.field == field or caught.value.field.startswith(field + "."), str(caught.value)
    assert str(caught.value).startswith(caught.value.field + ": ")


def test_a_file_that_is_not_a_baseline_says_so(tmp_path: Path) -> None:
    path = tmp_path / "v1.yaml"
    for text, words in (("- a list\n", "file: must be a mapping"), ("a: [b\n", "file: is not valid YAML"),
                        ("\xff", "file: is not UTF-8 text")):
        path.write_bytes(text.encode("latin-1"))
        with pytest.raises(BaselineError, match=words):
            load_baseline(path)
    with pytest.raises(BaselineError, match="file: cannot be read"):
        load_baseline(tmp_path / "absent.yaml")


def test_where_a_lab_keeps_its_baselines(tmp_path: Path) -> None:
    assert baseline_dir_for(tmp_path / "lab" / "inventory.yaml", None) == tmp_path / "lab" / "baselines"
    assert baseline_dir_for(None, REFERENCE_SCENARIO) == (
        REPO / "lab" / "scenarios" / "baselines" / "reference-kimi-k2-8spark")
    with pytest.raises(ValueError, match="inventory file or its scenario file"):
        baseline_dir_for(None, None)
    # As the platform stores a lab: an inventory path, or sim:SCENARIO (relative to a root).
    assert baseline_dir_of(str(tmp_path / "lab" / "inventory.yaml")) == tmp_path / "lab" / "baselines"
    assert baseline_dir_of("sim:lab/scenarios/reference-kimi-k2-8spark.yaml", root=REPO) == (
        REPO / "lab" / "scenarios" / "baselines" / "reference-kimi-k2-8spark")


def test_ages_in_words() -> None:
    assert [age_words(dt.timedelta(seconds=s)) for s in (5, 600, 3600 * 5, 86400 * 3, 86400 * 60)] == [
        "5 s", "10 min", "5 h", "3 days", "8 weeks"]


# -- the nodes' fingerprint ----------------------------------------------------------------------

def test_the_fingerprint_follows_the_hardware_not_the_moment() -> None:
    facts = lab_facts()
    assert FINGERPRINT.startswith("sha256:") and len(FINGERPRINT) == len("sha256:") + 64
    # Another moment: clocks, free memory, addresses, link states and installed engines move.
    later = lab_facts()
    for i, node in enumerate(later.values()):
        node.update(time=node["time"] + 3600, mem_available_kib=5, mem_total_kib=node["mem_total_kib"] + 3000)
        node["nics"][1]["operstate"] = "down"
        node["nics"][1]["speed_mbps"] = 10_000
        node["engines"] = {"vllm": "0.29.0"}
        node["nics"].append({"name": f"veth{i}abc", "operstate": "up"})
    assert node_fingerprint(later) == FINGERPRINT
    # Renamed nodes, in another order, are the same hardware.
    renamed = {f"node-{k}": v for k, v in reversed(list(facts.items()))}
    assert node_fingerprint(renamed) == FINGERPRINT
    # What the preflight keeps of the facts gives the same fingerprint as the facts.
    kept = {name: {k: f[k] for k in ("host", "arch", "kernel", "mem_total_kib", "mem_available_kib", "gpus",
                                     "nics", "model_dir", "engines")} for name, f in facts.items()}
    assert node_fingerprint(kept) == FINGERPRINT


@pytest.mark.parametrize("changed", [
    lab_facts(7),
    lab_facts(gpu="NVIDIA GB200"),
    lab_facts(mem_kib=255_000_000),
    lab_facts(nics=("enP7s7", "enp1s0f0np0")),
    {**lab_facts(), "spark-03": RuntimeError("did not answer")},
])
def test_the_fingerprint_changes_with_the_nodes(changed: dict[str, Any]) -> None:
    assert node_fingerprint(changed) != FINGERPRINT


def test_the_engine_version_the_nodes_agree_on() -> None:
    facts = lab_facts()
    assert engine_version_of(facts, "vllm") == "0.34.0"
    facts["spark-02"]["engines"]["vllm"] = "0.29.0"
    assert engine_version_of(facts, "vllm") is None
    assert engine_version_of({"a": {"engines": {"vllm": None}}}, "vllm") is None


# -- best-known configurations --------------------------------------------------------------------

def test_the_firm_knows_kimi_on_eight_nodes_and_deepseek_on_four() -> None:
    keys = {(e.model, e.nodes, e.engine) for e in best_known_entries()}
    assert {(KIMI, 8, "vllm"), (KIMI, 8, "sglang"), ("nvidia/DeepSeek-V3-0324-FP4", 4, "vllm")} <= keys
    for entry in best_known_entries():
        assert entry.source and not any(n.endswith(("IFNAME", "HCA")) for n in entry.config["env"])
    vllm = best_known(KIMI, 8, "vllm")
    assert vllm is not None
    serving = vllm["serving"]
    assert (serving["jit_cache"], serving["moe_backend"], serving["safetensors_load_strategy"]) == (
        "persisted", "cutlass", "eager")
    assert vllm["speculative"]["num_speculative_tokens"] == 2 and "--trust-remote-code" in vllm["extra_args"]
    # The reference lab's catalog admits the Kimi K2 ones as they are.
    for engine in ("vllm", "sglang"):
        config = best_known(KIMI, 8, {"name": engine})
        assert config is not None and normalize_config(config, catalog=load_catalog()) == config
    # A copy: the caller sets the lab's engine version without changing the next answer.
    vllm["engine"]["version"] = "0.29.0"
    assert best_known(KIMI.upper(), 8, "vllm")["engine"]["version"] == "0.34.0"  # type: ignore[index]
    assert best_known(KIMI, 4, "vllm") is None and best_known("someone/else", 8, "vllm") is None


def _best_known_file(tmp_path: Path, name: str = "a.yaml", **changes: Any) -> Path:
    data = yaml.safe_load((BEST_KNOWN_DIR / "kimi-k2-8n-vllm.yaml").read_text())
    for dotted, value in changes.items():
        _set(data, dotted.replace("__", "."), value)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("changes", "words"), [
    ({"config__env": {"NCCL_SOCKET_IFNAME": "enP7s7"}}, "config.env.NCCL_SOCKET_IFNAME: names one lab's"),
    ({"config__env": {"NCCL_IB_HCA": "rocep1s0f0"}}, "config.env.NCCL_IB_HCA: names one lab's"),
    ({"engine": "sglang"}, "config.engine.name: vllm differs from the file's engine, sglang"),
    ({"nodes": 4}, "config.cluster.nodes: 8 differs from the file's node count, 4"),
    ({"schema": "lab.best-known/9"}, "schema: 'lab.best-known/9' is not accepted"),
    ({"config__parallel__tp": 0}, "config.parallel.tp"),
    ({"model": None}, "model: must be a non-empty string"),
])
def test_a_bad_best_known_file_names_the_field(tmp_path: Path, changes: dict[str, Any], words: str) -> None:
    path = _best_known_file(tmp_path, **changes)
    with pytest.raises(BaselineError, match=words.replace(".", r"\.").replace("(", r"\(")):
        load_best_known(path)


def test_two_best_known_files_for_one_key_are_an_error(tmp_path: Path) -> None:
    _best_known_file(tmp_path, "a.yaml")
    _best_known_file(tmp_path, "b.yaml")
    with pytest.raises(BaselineError, match=r"b\.yaml: model: .* is also in .*a\.yaml; keep one"):
        best_known(KIMI, 8, "vllm", directory=tmp_path)


# -- the shipped baselines ---------------------------------------------------------------------

@pytest.mark.parametrize(("scenario", "engine", "version"), [
    ("reference-kimi-k2-8spark", "vllm", "0.34.0"),
    ("reference-kimi-k2-8spark-sglang", "sglang", "0.5.23"),
])
def test_the_reference_labs_ship_with_their_baselines(scenario: str, engine: str, version: str) -> None:
    path = REPO / "lab" / "scenarios" / f"{scenario}.yaml"
    lookup = find_baseline(baseline_dir_for(None, path), model=KIMI, nodes=8, engine=engine, version=version)
    assert lookup.problems == []
    baseline = lookup.baseline
    assert baseline is not None and lookup.fresh and baseline.source == "calibrate"
    assert baseline.lab == scenario and yaml.safe_load(path.read_text())["name"] == scenario
    for workload in ("code", "prose"):
        assert baseline.rates[workload]["n"] == 15 and len(baseline.rates[workload]["samples"]) == 15
    assert baseline.cold_start["n"] >= 2
    # Its configuration is the best-known one with the lab's own interface names added.
    expected = best_known(KIMI, 8, engine)
    assert expected is not None
    assert {k: v for k, v in baseline.config.items() if k != "env"} == {
        k: v for k, v in expected.items() if k != "env"}
    assert set(baseline.config["env"]) >= {"NCCL_SOCKET_IFNAME", "NCCL_IB_HCA"}
