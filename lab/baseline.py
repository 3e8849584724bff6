"""A lab's baseline: its own best configuration for a model, node count and engine
version, with the rates and cold start measured on it (METHODOLOGY.md, "The gap to the
lab's own best").

A baseline file (`lab.baseline/1`, YAML) belongs to its lab and lives with it: a real lab
keeps them in `baselines/` beside its inventory, a simulated lab in
`baselines/<scenario stem>/` beside its scenario file (`baseline_dir_for`). Each key
(model, node count, engine and version) has its own folder of versions, `v1.yaml`,
`v2.yaml`, ...; the highest version wins and the older ones stay as the record of what
the lab delivered before. `manage.py calibrate` writes them.

A baseline says what the lab can deliver only while the lab is what it was when it was
measured: one made on another engine version, or before the lab's nodes changed (the
facts that matter, `node_fingerprint`), is stale, and `find_baseline` says why in words.

The firm's best-known configurations (`lab/best_known/*.yaml`, `lab.best-known/1`) stand
in where a lab has no baseline of its own for a model: what the firm found best for that
model and node count, without anything that names one lab's hardware (its NIC and RDMA
device names are the lab's own; the triage derives them from the lab's facts).

No Django here: the platform, the commands and the GAP stage all read these files.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import math
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab.config import ENGINES, WORKLOADS, ConfigError, shown
from lab.engines import renormalize

SCHEMA = "lab.baseline/1"
BEST_KNOWN_SCHEMA = "lab.best-known/1"
BEST_KNOWN_DIR = Path(__file__).with_name("best_known")
SOURCES = ("calibrate", "best-known")
FIELDS = ("schema", "lab", "model", "nodes", "engine", "version", "made_at", "source",
          "nodes_fingerprint", "config", "rates", "cold_start", "job", "lab_time_s")
OPTIONAL = ("job", "lab_time_s")
BEST_KNOWN_FIELDS = ("schema", "model", "nodes", "engine", "source", "config")
RATE_FIELDS = ("n", "mean_tps", "ci95", "samples")
COLD_START_FIELDS = ("n", "mean_s", "samples")
ENGINE_WORDS = {"vllm": "vLLM", "sglang": "SGLang"}
# A baseline holds two workloads of fifteen runs: a few kilobytes. Anything far larger is
# not one, and is refused before YAML spends time on it.
MAX_FILE_BYTES = 256 * 1024
_VERSION_FILE = re.compile(r"v([1-9][0-9]*)\.yaml")
_SLUG_UNSAFE = re.compile(r"[^a-z0-9.]+")
# Environment that names one lab's own hardware: interface and RDMA device names. A
# best-known configuration is for any lab, so it carries none of them.
LAB_SPECIFIC_ENV = re.compile(r".*(IFNAME|_IB_HCA|_HCA)$")
# Interfaces that come and go with containers and VPNs on a node without its hardware
# changing; the fingerprint leaves them out.
VIRTUAL_NIC = re.compile(r"^(lo|docker|veth|br-|virbr|cni|flannel|cali|vxlan|tailscale|tun|tap|wg)")


class BaselineError(ValueError):
    """A baseline or best-known file that cannot be used; `field` names the culprit."""

    def __init__(self, field: str, problem: str, *, path: Path | None = None) -> None:
        where = f"{path}: " if path is not None else ""
        super().__init__(f"{where}{field}: {problem}" if field else f"{where}{problem}")
        self.field = field
        self.problem = problem
        self.path = path


@dataclass(frozen=True)
class Engine:
    """The engine a baseline was made on. Reads like the file's mapping too
    (`engine["version"]`), so code written against either shape works."""

    name: str
    version: str

    def __getitem__(self, key: str) -> str:
        if key not in ("name", "version"):
            raise KeyError(key)
        return str(getattr(self, key))

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version}

    def words(self) -> str:
        """As people write it: "vLLM 0.34.0"."""
        return f"{ENGINE_WORDS.get(self.name, self.name)} {self.version}"


@dataclass(frozen=True)
class Baseline:
    """One version of a lab's baseline, as its file holds it. `made_at` is the file's ISO
    8601 UTC text (JSON takes it as it is); `made_when` is the same moment as a datetime.
    `rates` maps each workload to {n, mean_tps, ci95, samples}; `cold_start` is
    {n, mean_s, samples}; `config` is a normalized diagnostic.config/1 mapping."""

    lab: str
    model: str
    nodes: int
    engine: Engine
    version: int
    made_at: str
    source: str
    nodes_fingerprint: str
    config: dict[str, Any]
    rates: dict[str, dict[str, Any]]
    cold_start: dict[str, Any]
    job: str | None = None
    lab_time_s: float | None = None
    path: Path | None = field(default=None, compare=False)

    @property
    def made_when(self) -> dt.datetime:
        return parse_moment(self.made_at, "made_at")

    def age(self, now: dt.datetime | None = None) -> dt.timedelta:
        """How long ago it was made (never negative: a clock behind the file's is now)."""
        now = now if now is not None else dt.datetime.now(dt.UTC)
        return max(dt.timedelta(0), now - self.made_when)

    @property
    def key(self) -> tuple[str, int, str, str]:
        return (self.model.casefold(), self.nodes, self.engine.name, self.engine.version)

    def rate(self, workload: str) -> float | None:
        """The mean delivered rate of `workload`, tok/s; None when not measured."""
        entry = self.rates.get(workload)
        return float(entry["mean_tps"]) if entry else None

    @property
    def cold_start_s(self) -> float:
        return float(self.cold_start["mean_s"])

    def describe(self) -> str:
        """One line for a log or a message: what it is and what it delivers."""
        rates = ", ".join(f"{w} {r['mean_tps']:.1f} tok/s [{r['ci95'][0]:.1f}, {r['ci95'][1]:.1f}]"
                          for w, r in self.rates.items())
        return (f"{self.model} on {self.nodes} nodes, {self.engine.words()}, v{self.version} "
                f"({self.source}, {self.made_at}): {rates}; cold start {self.cold_start_s:.0f} s")

    def as_dict(self) -> dict[str, Any]:
        """The file's mapping, in the file's field order."""
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "lab": self.lab,
            "model": self.model,
            "nodes": self.nodes,
            "engine": self.engine.as_dict(),
            "version": self.version,
            "made_at": self.made_at,
            "source": self.source,
            "nodes_fingerprint": self.nodes_fingerprint,
            "config": copy.deepcopy(self.config),
            "rates": copy.deepcopy(self.rates),
            "cold_start": copy.deepcopy(self.cold_start),
        }
        if self.job is not None:
            out["job"] = self.job
        if self.lab_time_s is not None:
            out["lab_time_s"] = self.lab_time_s
        return out


@dataclass(frozen=True)
class BaselineLookup:
    """What `find_baseline` found for one key: the baseline to use (None: the lab has none
    for it), why it is stale (None: it is not), every baseline in the folder newest first
    (for the staff page), and the files that could not be read, each with its error."""

    baseline: Baseline | None
    stale: str | None
    all: list[Baseline]
    problems: list[str] = field(default_factory=list)

    @property
    def fresh(self) -> bool:
        return self.baseline is not None and self.stale is None


# -- reading and writing -------------------------------------------------------------------

def now_moment() -> str:
    """The current UTC moment as baseline files write it (to the second)."""
    return moment_text(dt.datetime.now(dt.UTC))


def parse_moment(value: Any, field_name: str, path: Path | None = None) -> dt.datetime:
    """An ISO 8601 moment with its zone (YAML may have read it as a datetime already)."""
    if isinstance(value, dt.datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise BaselineError(field_name, f"{shown(value)} is not an ISO 8601 moment such as "
                                            "2026-12-05T10:00:00Z", path=path) from None
    else:
        raise BaselineError(field_name, f"must be an ISO 8601 moment such as 2026-12-05T10:00:00Z, "
                                        f"got {shown(value)}", path=path)
    if moment.tzinfo is None:
        raise BaselineError(field_name, f"{shown(value)} has no time zone; write it in UTC with a "
                                        "trailing Z", path=path)
    return moment.astimezone(dt.UTC)


def moment_text(moment: dt.datetime) -> str:
    """`moment` as baseline files write it: UTC, to the second, with a trailing Z."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _read_yaml(path: Path) -> Any:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise BaselineError("file", f"is {size} bytes; a baseline is a few kilobytes "
                                        f"(limit {MAX_FILE_BYTES})", path=path)
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BaselineError("file", f"cannot be read ({exc.strerror})", path=path) from exc
    except UnicodeDecodeError:
        raise BaselineError("file", "is not UTF-8 text", path=path) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BaselineError("file", f"is not valid YAML ({exc})", path=path) from exc
    except (ValueError, RecursionError) as exc:
        raise BaselineError("file", f"holds a value that cannot be read ({shown(str(exc))})",
                            path=path) from exc


class _Fields:
    """Checks of one file's fields, each error naming the field and the file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def fail(self, name: str, problem: str) -> BaselineError:
        return BaselineError(name, problem, path=self.path)

    def mapping(self, value: Any, name: str, accepted: tuple[str, ...] | None = None,
                required: tuple[str, ...] = ()) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(name or "file", f"must be a mapping, got {shown(value)}")
        prefix = f"{name}." if name else ""
        if accepted is not None:
            unknown = sorted(str(k) for k in value if k not in accepted)
            if unknown:
                raise self.fail(f"{prefix}{unknown[0]}", f"is not a field of this mapping; accepted: "
                                                         f"{', '.join(accepted)}")
        for key in required:
            if key not in value:
                raise self.fail(f"{prefix}{key}", "is missing")
        return value

    def text(self, value: Any, name: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(name, f"must be a non-empty string, got {shown(value)}")
        return value

    def whole(self, value: Any, name: str, lo: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise self.fail(name, f"must be a whole number of at least {lo}, got {shown(value)}")
        return value

    def number(self, value: Any, name: str, *, positive: bool = True) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(name, f"must be a finite number, got {shown(value)}")
        if positive and value <= 0:
            raise self.fail(name, f"must be greater than zero, got {shown(value)}")
        return float(value)

    def samples(self, value: Any, name: str, n: int) -> list[float]:
        if not isinstance(value, list) or not value:
            raise self.fail(name, f"must be the list of measured values, got {shown(value)}")
        numbers = [self.number(v, f"{name}[{i}]") for i, v in enumerate(value)]
        if len(numbers) != n:
            raise self.fail(name, f"holds {len(numbers)} values but n is {n}")
        return numbers

    def engine(self, value: Any, name: str = "engine") -> Engine:
        data = self.mapping(value, name, ("name", "version"), ("name", "version"))
        engine_name = self.text(data["name"], f"{name}.name")
        if engine_name not in ENGINES:
            raise self.fail(f"{name}.name", f"{shown(engine_name)} is not accepted; use one of "
                                            f"{', '.join(ENGINES)}")
        version = data["version"]
        if isinstance(version, int | float) and not isinstance(version, bool):
            # YAML reads 0.5 as a number: a version is text ("0.5").
            raise self.fail(f"{name}.version", f"{shown(version)} must be quoted text, e.g. \"0.34.0\"")
        return Engine(engine_name, self.text(version, f"{name}.version"))

    def config(self, value: Any, name: str = "config") -> dict[str, Any]:
        data = self.mapping(value, name)
        try:
            # The fields and the engine release's flags; not the lab's catalog, which is
            # the lab's to apply when it renders the configuration.
            return renormalize(data)
        except ConfigError as exc:
            raise self.fail(f"{name}.{exc.field}" if exc.field else name, exc.problem) from exc


def baseline_from_mapping(data: Any, path: Path | None = None) -> Baseline:
    """A Baseline from a file's mapping; BaselineError naming the field otherwise."""
    f = _Fields(path)
    data = f.mapping(data, "", FIELDS, tuple(x for x in FIELDS if x not in OPTIONAL))
    if data["schema"] != SCHEMA:
        raise f.fail("schema", f"{shown(data['schema'])} is not accepted; use {SCHEMA}")
    model = f.text(data["model"], "model")
    nodes = f.whole(data["nodes"], "nodes")
    engine = f.engine(data["engine"])
    source = data["source"]
    if source not in SOURCES:
        raise f.fail("source", f"{shown(source)} is not accepted; use one of {', '.join(SOURCES)}")
    fingerprint = f.text(data["nodes_fingerprint"], "nodes_fingerprint")
    if not fingerprint.startswith("sha256:"):
        raise f.fail("nodes_fingerprint", f"{shown(fingerprint)} must be sha256:<hex>, as "
                                          "node_fingerprint writes it")
    config = f.config(data["config"])
    if config["engine"]["name"] != engine.name or config["engine"]["version"] != engine.version:
        raise f.fail("config.engine", f"{config['engine']['name']} {config['engine']['version']} differs "
                                      f"from the baseline's engine, {engine.name} {engine.version}")
    if config["model"]["id"].casefold() != model.casefold():
        raise f.fail("config.model.id", f"{shown(config['model']['id'])} differs from the baseline's "
                                        f"model, {shown(model)}")
    if int(config["cluster"]["nodes"]) != nodes:
        raise f.fail("config.cluster.nodes", f"{config['cluster']['nodes']} differs from the baseline's "
                                             f"node count, {nodes}")
    rates_raw = f.mapping(data["rates"], "rates", WORKLOADS)
    if not rates_raw:
        raise f.fail("rates", f"holds no workload; measure at least one of {', '.join(WORKLOADS)}")
    rates: dict[str, dict[str, Any]] = {}
    for workload, raw in rates_raw.items():
        name = f"rates.{workload}"
        entry = f.mapping(raw, name, RATE_FIELDS, RATE_FIELDS)
        n = f.whole(entry["n"], f"{name}.n", lo=2)
        mean = f.number(entry["mean_tps"], f"{name}.mean_tps")
        ci = entry["ci95"]
        if not isinstance(ci, list | tuple) or len(ci) != 2:
            raise f.fail(f"{name}.ci95", f"must be [low, high], got {shown(ci)}")
        lo = f.number(ci[0], f"{name}.ci95[0]", positive=False)
        hi = f.number(ci[1], f"{name}.ci95[1]", positive=False)
        if not lo <= mean <= hi:
            raise f.fail(f"{name}.ci95", f"[{lo:g}, {hi:g}] does not hold mean_tps {mean:g}")
        samples = f.samples(entry["samples"], f"{name}.samples", n)
        rates[workload] = {"n": n, "mean_tps": mean, "ci95": [lo, hi], "samples": samples}
    cold = f.mapping(data["cold_start"], "cold_start", COLD_START_FIELDS, COLD_START_FIELDS)
    cold_n = f.whole(cold["n"], "cold_start.n")
    cold_start = {"n": cold_n, "mean_s": f.number(cold["mean_s"], "cold_start.mean_s"),
                  "samples": f.samples(cold["samples"], "cold_start.samples", cold_n)}
    job = data.get("job")
    if job is not None:
        job = f.text(job, "job")
    lab_time_s = data.get("lab_time_s")
    if lab_time_s is not None:
        lab_time_s = f.number(lab_time_s, "lab_time_s")
    return Baseline(
        lab=f.text(data["lab"], "lab"),
        model=model,
        nodes=nodes,
        engine=engine,
        version=f.whole(data["version"], "version"),
        made_at=moment_text(parse_moment(data["made_at"], "made_at", path)),
        source=source,
        nodes_fingerprint=fingerprint,
        config=config,
        rates=rates,
        cold_start=cold_start,
        job=job,
        lab_time_s=lab_time_s,
        path=path,
    )


def load_baseline(path: str | Path) -> Baseline:
    """The baseline in `path`; BaselineError naming the file and the field otherwise. A
    file in a version folder (`v3.yaml`) must say the same version it is named by."""
    path = Path(path)
    baseline = baseline_from_mapping(_read_yaml(path), path)
    named = _VERSION_FILE.fullmatch(path.name)
    if named and int(named.group(1)) != baseline.version:
        raise BaselineError("version", f"{baseline.version}, but the file is named {path.name}; "
                                       "one of the two was edited by hand", path=path)
    return baseline


def key_folder(model: str, nodes: int, engine: str, version: str) -> str:
    """The folder of one key's versions: `moonshotai-kimi-k2-instruct-0905-8n-vllm-0.34.0`."""
    def slug(text: str) -> str:
        return _SLUG_UNSAFE.sub("-", text.casefold()).strip("-.") or "x"

    return f"{slug(model)}-{nodes}n-{slug(engine)}-{slug(version)}"


def save_baseline(directory: str | Path, baseline: Baseline) -> Path:
    """Write `baseline` as the next version of its key under `directory` and return the
    file. The version it carries is replaced by that next number; a file is never
    overwritten (two calibrations at once each get their own version)."""
    folder = Path(directory) / key_folder(baseline.model, baseline.nodes, baseline.engine.name,
                                          baseline.engine.version)
    folder.mkdir(parents=True, exist_ok=True)
    # Checked once more as a file reads back: what is written must load.
    baseline_from_mapping(baseline.as_dict())
    while True:
        taken = [int(m.group(1)) for p in folder.iterdir() if (m := _VERSION_FILE.fullmatch(p.name))]
        version = max(taken, default=0) + 1
        data = {**baseline.as_dict(), "version": version}
        text = _HEADER + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, allow_unicode=True,
                                        width=100)
        path = folder / f"v{version}.yaml"
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".v", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            try:
                # A hard link fails where the name exists: the version is claimed whole or
                # not at all, and never over another writer's.
                os.link(tmp, path)
            except FileExistsError:
                continue
        finally:
            os.unlink(tmp)
        return path


_HEADER = ("# A lab's baseline (lab.baseline/1): its best configuration for this model, node count\n"
           "# and engine version, with what it delivered. Written by `manage.py calibrate`;\n"
           "# a newer calibration adds the next version beside this one.\n")


def baseline_dir_for(inventory_path: str | Path | None, scenario_path: str | Path | None) -> Path:
    """Where a lab keeps its baselines: a real lab's `baselines/` beside its inventory; a
    simulated lab's `baselines/<scenario stem>/` beside its scenario file (several
    scenarios share one folder of scenarios, each its own lab)."""
    if scenario_path is not None:
        scenario = Path(scenario_path)
        return scenario.parent / "baselines" / scenario.stem
    if inventory_path is not None:
        return Path(inventory_path).parent / "baselines"
    raise ValueError("baseline_dir_for needs the lab's inventory file or its scenario file")


def baseline_dir_of(lab_inventory: str, *, root: str | Path | None = None) -> Path:
    """baseline_dir_for a lab as the platform stores it (bookings.Lab.inventory): the path
    of its inventory file, or `sim:SCENARIO` for a simulated lab. A relative path is taken
    from `root` (default: the working folder)."""
    sim = lab_inventory.startswith("sim:")
    path = Path(lab_inventory[len("sim:"):].strip() if sim else lab_inventory.strip())
    if not path.is_absolute() and root is not None:
        path = Path(root) / path
    return baseline_dir_for(None, path) if sim else baseline_dir_for(path, None)


def read_baselines(directory: str | Path) -> tuple[list[Baseline], list[str]]:
    """Every baseline under `directory` (newest first: by made_at, then version) and one
    line per file that could not be read. A missing folder holds none."""
    root = Path(directory)
    found: list[Baseline] = []
    problems: list[str] = []
    if not root.is_dir():
        return found, problems
    for path in sorted(root.glob("*/v*.yaml")):
        if not _VERSION_FILE.fullmatch(path.name):
            continue
        try:
            found.append(load_baseline(path))
        except BaselineError as exc:
            problems.append(str(exc))
    found.sort(key=lambda b: (b.made_when, b.version), reverse=True)
    return found, problems


# -- staleness -------------------------------------------------------------------------------

def staleness(baseline: Baseline, *, version: str | None, fingerprint: str | None) -> str | None:
    """Why `baseline` no longer says what the lab delivers, in words; None when it still
    does. `version`: the engine version the lab runs; `fingerprint`: node_fingerprint of
    the lab's facts now. Either may be None (not known): it is then not held against it."""
    reasons = []
    if version is not None and version != baseline.engine.version:
        engine = ENGINE_WORDS.get(baseline.engine.name, baseline.engine.name)
        reasons.append(f"made on {baseline.engine.words()}, the lab runs {engine} {version}")
    if fingerprint is not None and fingerprint != baseline.nodes_fingerprint:
        reasons.append(f"the lab's nodes changed since {baseline.made_when.date().isoformat()} (their "
                       "GPUs, memory, CPU or network interfaces differ from when it was measured)")
    return "; ".join(reasons) or None


def find_baseline(
    directory: str | Path, *, model: str, nodes: int, engine: str, version: str,
    fingerprint: str | None = None,
) -> BaselineLookup:
    """The baseline for (model, nodes, engine, version) in `directory`, the newest version
    made on nodes like the lab's now; else the newest one for that engine version (stale:
    the nodes changed); else the newest made on another version of the engine (stale: the
    version). `fingerprint` None does not check the nodes."""
    every, problems = read_baselines(directory)
    same = [b for b in every if b.model.casefold() == model.casefold() and b.nodes == nodes
            and b.engine.name == engine]

    def newest(candidates: list[Baseline]) -> Baseline:
        return max(candidates, key=lambda b: (b.version, b.made_when))

    current = [b for b in same if b.engine.version == version]
    matching = [b for b in current if fingerprint is None or b.nodes_fingerprint == fingerprint]
    if matching:
        chosen = newest(matching)
    elif current:
        chosen = newest(current)
    elif same:
        # Versions number within one engine version: across them, the latest made wins.
        chosen = max(same, key=lambda b: (b.made_when, b.version))
    else:
        return BaselineLookup(None, None, every, problems)
    return BaselineLookup(chosen, staleness(chosen, version=version, fingerprint=fingerprint), every,
                          problems)


def superseded_by(baseline: Baseline, every: Iterable[Baseline]) -> int | None:
    """The newer version of the same key that replaces `baseline`, if any."""
    newer = [b.version for b in every if b.key == baseline.key and b.version > baseline.version]
    return max(newer) if newer else None


def age_words(age: dt.timedelta) -> str:
    """An age as people say it: 40 s, 12 min, 5 h, 3 days, 7 weeks."""
    seconds = max(0, int(age.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 48 * 3600:
        hours = seconds // 3600
        return f"{hours} h" if hours != 1 else "1 h"
    days = seconds // 86400
    if days < 28:
        return f"{days} days"
    return f"{days // 7} weeks"


# -- the nodes' fingerprint ------------------------------------------------------------------

def node_description(facts: Mapping[str, Any]) -> dict[str, Any]:
    """What of one node's facts a baseline depends on: its CPU architecture, its GPUs
    (name and memory), its memory to the GiB (the kernel's reserve moves the last digits),
    and the names of its network interfaces other than virtual ones."""
    gpus = sorted((str(g.get("name")), g.get("memory_total_mib"))
                  for g in facts.get("gpus") or [] if isinstance(g, Mapping))
    nics = sorted(str(n.get("name")) for n in facts.get("nics") or []
                  if isinstance(n, Mapping) and not VIRTUAL_NIC.match(str(n.get("name"))))
    mem = facts.get("mem_total_kib")
    return {
        "arch": facts.get("arch"),
        "gpus": [list(g) for g in gpus],
        "mem_gib": round(mem / (1 << 20)) if isinstance(mem, int | float) else None,
        "nics": nics,
    }


def node_fingerprint(facts: Mapping[str, Any]) -> str:
    """`sha256:<hex>` of the lab's nodes as far as a baseline depends on them: how many,
    and each one's node_description, in no particular order (a node renamed or racked
    elsewhere is the same hardware). `facts` maps node names to the agent's facts, as
    LabSession.facts() returns them or the preflight stage keeps them; an entry that is not
    a mapping (a node that did not answer) counts as no node."""
    described = sorted(json.dumps(node_description(f), sort_keys=True)
                       for f in facts.values() if isinstance(f, Mapping))
    text = json.dumps({"count": len(described), "nodes": described}, sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def engine_version_of(facts: Mapping[str, Any], engine: str) -> str | None:
    """The version of `engine` the nodes report installed, when they all agree; None
    when none reports it or they differ."""
    versions = {(f.get("engines") or {}).get(engine) for f in facts.values() if isinstance(f, Mapping)}
    versions.discard(None)
    return str(versions.pop()) if len(versions) == 1 else None


# -- the firm's best-known configurations ------------------------------------------------------

@dataclass(frozen=True)
class BestKnown:
    """One best-known configuration: for which model, node count and engine, and how the
    firm came by it (`source`, free text)."""

    model: str
    nodes: int
    engine: str
    config: dict[str, Any]
    source: str
    path: Path | None = None


def load_best_known(path: str | Path) -> BestKnown:
    """One `lab.best-known/1` file; BaselineError naming the field otherwise."""
    path = Path(path)
    f = _Fields(path)
    data = f.mapping(_read_yaml(path), "", BEST_KNOWN_FIELDS,
                     tuple(x for x in BEST_KNOWN_FIELDS if x != "source"))
    if data["schema"] != BEST_KNOWN_SCHEMA:
        raise f.fail("schema", f"{shown(data['schema'])} is not accepted; use {BEST_KNOWN_SCHEMA}")
    model = f.text(data["model"], "model")
    nodes = f.whole(data["nodes"], "nodes")
    engine = f.text(data["engine"], "engine")
    if engine not in ENGINES:
        raise f.fail("engine", f"{shown(engine)} is not accepted; use one of {', '.join(ENGINES)}")
    config = f.config(data["config"])
    if config["engine"]["name"] != engine:
        raise f.fail("config.engine.name", f"{config['engine']['name']} differs from the file's "
                                           f"engine, {engine}")
    if config["model"]["id"].casefold() != model.casefold():
        raise f.fail("config.model.id", f"{shown(config['model']['id'])} differs from the file's "
                                        f"model, {shown(model)}")
    if int(config["cluster"]["nodes"]) != nodes:
        raise f.fail("config.cluster.nodes", f"{config['cluster']['nodes']} differs from the file's "
                                             f"node count, {nodes}")
    for name in config["env"]:
        if LAB_SPECIFIC_ENV.fullmatch(name):
            raise f.fail(f"config.env.{name}", "names one lab's interfaces or devices; a best-known "
                                               "configuration is for any lab (the triage finds a lab's "
                                               "own names from its facts)")
    source = data.get("source", "")
    if not isinstance(source, str):
        raise f.fail("source", f"must be text saying where the configuration comes from, got {shown(source)}")
    return BestKnown(model=model, nodes=nodes, engine=engine, config=config, source=source, path=path)


def best_known_entries(directory: str | Path | None = None) -> list[BestKnown]:
    """Every best-known configuration in `directory` (default lab/best_known/); two files
    for the same model, node count and engine are an error naming both."""
    root = Path(directory) if directory is not None else BEST_KNOWN_DIR
    entries: list[BestKnown] = []
    seen: dict[tuple[str, int, str], Path | None] = {}
    for path in sorted(root.glob("*.yaml")):
        entry = load_best_known(path)
        key = (entry.model.casefold(), entry.nodes, entry.engine)
        if key in seen:
            raise BaselineError("model", f"{entry.model} on {entry.nodes} nodes with {entry.engine} is "
                                         f"also in {seen[key]}; keep one", path=path)
        seen[key] = path
        entries.append(entry)
    return entries


def best_known(
    model_id: str, nodes: int, engine: str | Mapping[str, Any], *, directory: str | Path | None = None,
) -> dict[str, Any] | None:
    """The firm's best-known diagnostic.config/1 mapping for `model_id` on `nodes` nodes
    with `engine` (a name, or a mapping with `name`), a copy the caller may change (it
    sets engine.version to the lab's); None when the firm has none for them."""
    name = engine if isinstance(engine, str) else str(engine.get("name"))
    for entry in best_known_entries(directory):
        if entry.model.casefold() == model_id.casefold() and entry.nodes == nodes and entry.engine == name:
            return copy.deepcopy(entry.config)
    return None
