"""`manage.py calibrate`: the lab's baseline for a model (METHODOLOGY.md, "The gap to the
lab's own best").

    python manage.py calibrate --lab sim:SCENARIO.yaml|inventory:FILE --model ID
        [--config FILE] [--engine NAME[==VERSION]] [--dilation N] [--seed N] [--out DIR]

It runs the day's pipelines (preflight, reproduce, triage, fp4, specdec, measure: not the
gap stage, which compares against a baseline, nor the report) on the lab's starting
configuration: `--config`, else the firm's best-known configuration for the model and the
lab's node count (lab/best_known/), on the engine and version the lab runs. Whatever the
day proves goes into the configuration, and the measure stage's measurement of the result
(rates n = 15 per workload with intervals, its true cold starts) becomes the baseline,
written as the next version under the lab's baseline folder with the fingerprint of the
nodes it was measured on. The day itself is the diagnose command's (`--stages`), so a
baseline is measured exactly as a customer's configuration is.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from diagnostic.jobs.models import DiagnosticJob, StageRun
from diagnostic.jobs.tuning import tuned_section
from diagnostic.pipelines.triage import section as triage_section
from lab.baseline import (
    Baseline,
    BaselineError,
    Engine,
    baseline_dir_for,
    best_known,
    best_known_entries,
    load_baseline,
    moment_text,
    node_fingerprint,
    now_moment,
    save_baseline,
)
from lab.config import ENGINES, ConfigError, read_config_text
from lab.engines import renormalize
from lab.inventory import InventoryError, load_inventory
from lab.session import LabError, LabSession

# The day's pipelines up to and including the measurement; the gap stage measures against
# a baseline (this makes one) and the report is the customer's.
CALIBRATE_STAGES = ("preflight", "reproduce", "triage", "fp4", "specdec", "measure")
CONFIG_MAX_BYTES = 1024 * 1024
SCENARIO_MAX_BYTES = 1024 * 1024


class Command(BaseCommand):
    help = "Measure the lab's best configuration for a model and keep it as the lab's baseline."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--lab", required=True,
                            help="sim:SCENARIO.yaml (a simulated lab, started for the run) or "
                                 "inventory:FILE (a real lab; a bare inventory path works too)")
        parser.add_argument("--model", required=True, help="the model's id, as the lab's catalog lists it")
        parser.add_argument("--config", type=Path, default=None,
                            help="starting configuration (diagnostic.config/1 YAML or a launch command); "
                                 "default: the firm's best-known one for the model and the lab's node count")
        parser.add_argument("--engine", default=None,
                            help="NAME or NAME==VERSION (vllm, sglang); default: what the lab runs")
        parser.add_argument("--dilation", type=float, default=None,
                            help="with --lab sim:, lab seconds per wall second instead of the scenario's")
        parser.add_argument("--seed", type=int, default=0, help="seed for the pipelines' sampling")
        parser.add_argument("--out", type=Path, default=None,
                            help="folder for the day's files (default: OUT_DIR/calibrate/<lab>-<time>)")
        parser.add_argument("--time-limit-s", type=float, default=None,
                            help="give up after this many wall seconds (diagnose's default otherwise)")

    def handle(self, *args: Any, **options: Any) -> None:
        lab = parse_lab(options["lab"])
        model = str(options["model"]).strip()
        if not model:
            raise CommandError("--model must name the model's id, e.g. moonshotai/Kimi-K2-Instruct-0905")
        wanted = parse_engine(options["engine"])
        dilation = options["dilation"]
        if dilation is not None and not (0 < dilation < float("inf")):
            raise CommandError(f"--dilation must be a positive number of lab seconds per wall second, "
                               f"got {dilation:g}")
        if dilation is not None and lab.kind != "sim":
            raise CommandError("--dilation applies to a simulated lab (--lab sim:SCENARIO.yaml) only")

        if options["config"] is not None:
            text, config = read_start_config(options["config"])
            check_start_config(config, model=model, wanted=wanted, option=f"--config {options['config']}")
            origin = f"--config {options['config']}"
        else:
            config = best_known_start(lab, model, wanted)
            text = yaml.safe_dump(config, sort_keys=False)
            origin = (f"the firm's best-known configuration for {model} on {lab.nodes} nodes with "
                      f"{config['engine']['name']} {config['engine']['version']}")

        out = options["out"] or default_out(lab.name)
        start = out / "start-config.yaml"
        day_out = out / "day"
        try:
            day_out.mkdir(parents=True, exist_ok=True)
            start.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"--out {out}: cannot write there ({exc.strerror})") from exc
        self.stdout.write(f"calibrating {model} on {lab.name} from {origin}")
        argv = ["--config", str(start), "--lab", lab.spec, "--out", str(day_out),
                "--stages", ",".join(CALIBRATE_STAGES), "--seed", str(options["seed"])]
        if dilation is not None:
            argv += ["--dilation", f"{dilation:g}"]
        if options["time_limit_s"] is not None:
            argv += ["--time-limit-s", f"{options['time_limit_s']:g}"]
        try:
            call_command("diagnose", *argv, stdout=self.stdout, stderr=self.stderr,
                         verbosity=options["verbosity"])
        except CommandError as exc:
            raise CommandError(f"the calibration day did not complete, so no baseline was written: "
                               f"{exc}") from exc

        job = day_job(day_out / "findings.json")
        try:
            baseline = baseline_from_job(job, lab=lab.name)
            path = save_baseline(lab.baseline_dir, baseline)
        except BaselineError as exc:
            raise CommandError(f"job {job.pk}: {exc}; no baseline written") from exc
        except OSError as exc:
            raise CommandError(f"cannot write the baseline under {lab.baseline_dir} "
                               f"({exc.strerror})") from exc
        self.stdout.write(f"wrote {path}")
        # Read back: what the file says, with the version save_baseline gave it.
        for line in baseline_lines(load_baseline(path)):
            self.stdout.write(line)


# -- the lab ------------------------------------------------------------------------------------

class LabSpec:
    """The lab named by --lab: how diagnose is told it, its name, node count, baseline
    folder and, where the lab's own description says, the engine it runs."""

    def __init__(self, *, kind: str, spec: str, name: str, nodes: int, baseline_dir: Path,
                 engine: dict[str, str] | None, inventory: Path | None) -> None:
        self.kind = kind
        self.spec = spec
        self.name = name
        self.nodes = nodes
        self.baseline_dir = baseline_dir
        self.engine = engine
        self.inventory = inventory


def parse_lab(spec: str) -> LabSpec:
    kind, _, target = spec.partition(":")
    if kind == "sim" and target:
        return _sim_lab(Path(target))
    if kind == "inventory" and target:
        return _real_lab(Path(target))
    if spec and ":" not in spec and Path(spec).is_file():
        return _real_lab(Path(spec))
    raise CommandError(f"--lab must be sim:SCENARIO.yaml (a simulated lab) or inventory:FILE (a real "
                       f"lab's inventory), got {spec!r}")


def _sim_lab(path: Path) -> LabSpec:
    """A simulated lab. Its scenario file declares the engine its nodes run and how many
    there are, as a real lab's nodes would report them (nothing of its `truth:` is read);
    the simulator itself is started by the diagnose command, the only part of the platform
    that may."""
    where = f"--lab sim:{path}"
    try:
        if path.stat().st_size > SCENARIO_MAX_BYTES:
            raise CommandError(f"{where}: far too large for a scenario file")
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CommandError(f"{where}: cannot read the scenario ({exc.strerror})") from exc
    except (yaml.YAMLError, UnicodeDecodeError, ValueError) as exc:
        raise CommandError(f"{where}: not a readable YAML scenario ({exc})") from exc
    if not isinstance(data, dict):
        raise CommandError(f"{where}: a scenario file is a mapping (schema: labsim.scenario/1)")
    engine = data.get("engine")
    cluster = data.get("cluster")
    nodes = cluster.get("nodes") if isinstance(cluster, dict) else None
    name = data.get("name")
    if not (isinstance(engine, dict) and engine.get("name") in ENGINES
            and isinstance(engine.get("version"), str)):
        raise CommandError(f"{where}: engine: the scenario must name its engine and version, e.g. "
                           "{name: vllm, version: \"0.34.0\"}")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise CommandError(f"{where}: cluster.nodes: the scenario must give its node count")
    if not isinstance(name, str) or not name:
        raise CommandError(f"{where}: name: the scenario must be named")
    return LabSpec(kind="sim", spec=f"sim:{path}", name=name, nodes=nodes,
                   baseline_dir=baseline_dir_for(None, path.resolve()),
                   engine={"name": engine["name"], "version": engine["version"]}, inventory=None)


def _real_lab(path: Path) -> LabSpec:
    try:
        inventory = load_inventory(path)
    except (InventoryError, OSError) as exc:
        raise CommandError(f"--lab inventory:{path}: {exc}") from exc
    return LabSpec(kind="inventory", spec=f"inventory:{path}", name=inventory.name,
                   nodes=len(inventory.nodes), baseline_dir=baseline_dir_for(path.resolve(), None),
                   engine=None, inventory=path)


def lab_engines(lab: LabSpec) -> dict[str, str]:
    """The engines a real lab's nodes report installed (name -> version), where every node
    that answers agrees."""
    assert lab.inventory is not None
    try:
        with LabSession.open(lab.inventory) as session:
            facts = session.facts(tolerate=True)
    except (LabError, InventoryError, OSError) as exc:
        raise CommandError(f"--lab {lab.spec}: cannot read the nodes' engines ({exc}); "
                           "name one with --engine NAME==VERSION") from exc
    found: dict[str, str] = {}
    for name in ENGINES:
        versions = {(f.get("engines") or {}).get(name) for f in facts.values() if isinstance(f, dict)}
        if len(versions) == 1 and None not in versions:
            found[name] = str(versions.pop())
    return found


# -- the starting configuration --------------------------------------------------------------

def parse_engine(value: str | None) -> dict[str, str | None] | None:
    if value is None:
        return None
    name, sep, version = value.partition("==")
    name = name.strip()
    if name not in ENGINES or (sep and not version.strip()):
        raise CommandError(f"--engine must be NAME or NAME==VERSION with NAME one of {', '.join(ENGINES)}, "
                           f"e.g. vllm==0.34.0; got {value!r}")
    return {"name": name, "version": version.strip() or None}


def read_start_config(path: Path) -> tuple[str, dict[str, Any]]:
    where = f"--config {path}"
    try:
        if path.stat().st_size > CONFIG_MAX_BYTES:
            raise CommandError(f"{where}: far too large for a configuration")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"{where}: cannot read ({exc.strerror})") from exc
    except UnicodeDecodeError:
        raise CommandError(f"{where}: not UTF-8 text") from None
    from diagnostic.jobs.management.commands.diagnose import looks_like_yaml

    try:
        data = read_config_text(text) if looks_like_yaml(text) else {"launch_command": text}
        # The fields and the release's flags; the lab's catalog admits it when the day starts.
        return text, renormalize(data)
    except ConfigError as exc:
        raise CommandError(f"{where}: {exc}") from exc


def check_start_config(config: dict[str, Any], *, model: str, wanted: dict[str, str | None] | None,
                       option: str) -> None:
    if config["model"]["id"].casefold() != model.casefold():
        raise CommandError(f"{option}: model.id is {config['model']['id']}, but --model is {model}")
    if wanted is not None:
        engine = config["engine"]
        if wanted["name"] != engine["name"] or (wanted["version"] and wanted["version"] != engine["version"]):
            said = f"{wanted['name']}" + (f"=={wanted['version']}" if wanted["version"] else "")
            raise CommandError(f"{option}: runs {engine['name']} {engine['version']}, but --engine is {said}")


def best_known_start(lab: LabSpec, model: str, wanted: dict[str, str | None] | None) -> dict[str, Any]:
    """The firm's best-known configuration for `model` on the lab's node count, on the
    engine the lab runs (or --engine) with its version."""
    if wanted is not None and wanted["version"]:
        engine = {"name": str(wanted["name"]), "version": str(wanted["version"])}
    elif lab.engine is not None:
        if wanted is not None and wanted["name"] != lab.engine["name"]:
            raise CommandError(f"--engine {wanted['name']}: the lab runs {lab.engine['name']} "
                               f"{lab.engine['version']}; give its version too (--engine NAME==VERSION)")
        engine = dict(lab.engine)
    else:
        installed = lab_engines(lab)
        if wanted is not None:
            if wanted["name"] not in installed:
                raise CommandError(f"--engine {wanted['name']}: the lab's nodes do not all report it "
                                   f"installed; give its version (--engine {wanted['name']}==VERSION)")
            engine = {"name": str(wanted["name"]), "version": installed[str(wanted["name"])]}
        elif len(installed) == 1:
            name, version = next(iter(installed.items()))
            engine = {"name": name, "version": version}
        else:
            have = ", ".join(f"{n} {v}" for n, v in installed.items()) or "no engine the agent can see"
            raise CommandError(f"the lab's nodes report {have}; choose one with --engine NAME==VERSION")
    try:
        config = best_known(model, lab.nodes, engine["name"])
    except BaselineError as exc:
        raise CommandError(f"the firm's best-known configurations cannot be read: {exc}") from exc
    if config is None:
        known = sorted(f"{e.nodes} nodes with {e.engine}" for e in best_known_entries()
                       if e.model.casefold() == model.casefold())
        what = f"it has one for {model} on {'; '.join(known)}" if known else f"it has none for {model}"
        raise CommandError(f"--model {model}: the firm has no best-known configuration for {lab.nodes} nodes "
                           f"with {engine['name']} ({what}); give a starting one with --config FILE")
    config["engine"] = {"name": engine["name"], "version": engine["version"]}
    try:
        return renormalize(config)
    except ConfigError as exc:
        raise CommandError(f"the best-known configuration does not run on {engine['name']} "
                           f"{engine['version']}: {exc}; give one that does with --config FILE") from exc


def default_out(lab_name: str) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", lab_name).strip("-.") or "lab"
    return Path(settings.OUT_DIR) / "calibrate" / f"{slug}-{stamp}"


# -- the day's results -----------------------------------------------------------------------

def day_job(findings: Path) -> DiagnosticJob:
    """The calibration day's job, by the id its findings.json names; CommandError unless
    it ran every stage."""
    try:
        job_id = json.loads(findings.read_text())["job"]["id"]
        job = DiagnosticJob.objects.get(pk=job_id)
    except (OSError, ValueError, KeyError, TypeError, DiagnosticJob.DoesNotExist) as exc:
        raise CommandError(f"the calibration day left no job to read ({findings}: {exc})") from exc
    if job.status != DiagnosticJob.Status.SUCCEEDED:
        raise CommandError(f"job {job.pk} {job.status}: {job.status_message or 'see its stages'}; "
                           "a baseline needs the whole day, so none was written")
    return job


def _result(job: DiagnosticJob, stage: str) -> dict[str, Any]:
    row = job.stage_runs.filter(name=stage, status=StageRun.Status.SUCCEEDED).first()
    if row is None:
        raise BaselineError(stage, "the stage did not succeed in this job")
    return row.result if isinstance(row.result, dict) else {}


def customer_cold_starts(job: DiagnosticJob) -> list[float]:
    """The starting configuration's true cold starts, as the triage (or reproduce) took them."""
    triage = job.stage_runs.filter(name="triage", status=StageRun.Status.SUCCEEDED).first()
    triage_result = triage.result if triage is not None and isinstance(triage.result, dict) else None
    samples = triage_section.ColdStartSection(triage_result).baseline_samples()
    return samples or triage_section.customer_cold_starts(None, _result(job, "reproduce"))


def baseline_from_job(job: DiagnosticJob, *, lab: str) -> Baseline:
    """The baseline a calibration day measured: its tuned configuration (the starting one
    when the day proved no change), that configuration's rates as the measure stage
    measured them, its true cold starts, and the fingerprint of the nodes the preflight saw."""
    measure = _result(job, "measure")
    sections = measure.get("sections") or {}
    section = sections.get("measurement") or {}
    if measure.get("tuned_measured"):
        measured = section.get("tuned") or {}
        cold = [float(v) for v in (sections.get("cold_start") or {}).get("after_samples_s") or []]
        tuned = tuned_section(job)
        config = tuned["config"] if tuned else job.config.normalized
    else:
        # Nothing proved: the starting configuration is the tuned one, measured as such.
        measured = {w: section[w] for w in job.config.normalized["workloads"] if w in section}
        cold = customer_cold_starts(job)
        config = job.config.normalized
    rates: dict[str, dict[str, Any]] = {}
    for workload in config["workloads"]:
        entry = measured.get(workload)
        if not isinstance(entry, dict) or entry.get("ci95") is None:
            raise BaselineError(f"rates.{workload}", "the measure stage gave no interval for this workload")
        samples = (entry.get("decode") or {}).get("samples")
        if samples is None:
            samples = [r["decode_tps"] for r in entry.get("runs") or []
                       if isinstance(r, dict) and r.get("decode_tps") is not None]
        rates[workload] = {"n": int(entry["n"]), "mean_tps": float(entry["mean_tps"]),
                           "ci95": [float(v) for v in entry["ci95"]],
                           "samples": [float(v) for v in samples]}
    if not cold:
        raise BaselineError("cold_start", "the day took no true cold start of the configuration")
    preflight = _result(job, "preflight")
    nodes = preflight.get("nodes") or {}
    if not nodes:
        raise BaselineError("nodes_fingerprint", "the preflight kept no facts of the lab's nodes")
    lab_s = sum(s.lab_seconds or 0.0 for s in job.stage_runs.all())
    return Baseline(
        lab=lab,
        model=config["model"]["id"],
        nodes=int(config["cluster"]["nodes"]),
        engine=Engine(config["engine"]["name"], config["engine"]["version"]),
        version=1,
        made_at=now_moment() if job.finished_at is None else moment_text(job.finished_at),
        source="calibrate",
        nodes_fingerprint=node_fingerprint(nodes),
        config=config,
        rates=rates,
        cold_start={"n": len(cold), "mean_s": round(sum(cold) / len(cold), 3), "samples": cold},
        job=str(job.pk),
        lab_time_s=round(lab_s, 1),
    )


def baseline_lines(baseline: Baseline) -> list[str]:
    """The figures a consultant checks after a calibration."""
    lines = [f"  baseline v{baseline.version}: {baseline.model} on {baseline.nodes} nodes, "
             f"{baseline.engine.words()}, made {baseline.made_at}"]
    for workload, rate in baseline.rates.items():
        lo, hi = rate["ci95"]
        lines.append(f"  {workload:<6} {rate['mean_tps']:.2f} tok/s [{lo:.2f}, {hi:.2f}] (n = {rate['n']})")
    samples = ", ".join(f"{v:.1f}" for v in baseline.cold_start["samples"])
    lines.append(f"  cold start {baseline.cold_start['mean_s']:.1f} lab s (n = {baseline.cold_start['n']}: "
                 f"{samples})")
    if baseline.lab_time_s is not None:
        lines.append(f"  the day took {baseline.lab_time_s:.0f} lab s (job {baseline.job})")
    return lines
