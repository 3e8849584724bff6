"""The house reads top-down: which package may import which (STYLE.md, "Dependency direction").

`lab` reaches labs and knows nothing of Django or the platform; `reports` presents
findings-shaped data and knows nothing of `diagnostic`; the pipelines and the report never
see the simulator, so a diagnosis cannot be right only because it peeked. Each rule scans
the import statements (top-level and inside functions alike) of every module it covers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules(package: str, *, skip: tuple[str, ...] = (), root: Path = ROOT) -> Iterator[Path]:
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(rel.startswith(s) for s in skip):
            continue
        yield path


def imported_names(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """Every module an import statement in `path` names, with its line (relative imports
    resolved against the module's own package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = path.relative_to(root).with_suffix("").parts[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def _hits(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


RULES = [
    # (modules scanned, skipped paths, forbidden prefixes, why)
    ("lab", (), ("django", "diagnostic", "reports"), "lab reaches labs without Django or the platform"),
    ("lab", ("lab/sim/", "lab/__main__.py"), ("lab.sim",),
     "only the simulator itself and the `python -m lab sim` entry point know the simulator"),
    ("reports", (), ("diagnostic", "lab.sim"), "reports present findings-shaped data only"),
    ("diagnostic/pipelines", ("diagnostic/pipelines/apps.py", "diagnostic/pipelines/management/"),
     ("django", "diagnostic.jobs", "diagnostic.bookings", "diagnostic.portal", "diagnostic.staff",
      "reports", "lab.sim"),
     "pipelines are plain Python over a lab session and learn only from evidence"),
    # Jobs are for bookings: bookings know nothing of them (a cancelled booking says so with
    # a signal, bookings.booking_cancelling, that the jobs app answers).
    ("diagnostic/bookings", (), ("diagnostic.jobs", "diagnostic.portal", "diagnostic.staff"),
     "bookings are below the jobs run for them"),
    # The staff dashboard builds on the portal's job pages (and seeds the demo, customers
    # and consultant both); the customer portal knows nothing of the staff's.
    ("diagnostic/portal", (), ("diagnostic.staff",),
     "the staff dashboard builds on the portal, not the reverse"),
    # The engine process and the node that runs it: the node starts engines, the engine
    # sees its node through a protocol (lab.sim.engine.EngineHost), never the module.
    ("lab/sim", ("lab/sim/node.py", "lab/sim/lab.py", "lab/sim/sshd.py"), ("lab.sim.node",),
     "only the lab and its SSH server hold nodes; the engine does not import its node"),
    # The release tables' extractor is build tooling: the runtime reads only the tables.
    ("lab", (), ("enginetables",), "the running lab reads the release tables, not their extractor"),
    ("diagnostic", (), ("enginetables",), "the platform reads the release tables, not their extractor"),
    ("reports", (), ("enginetables",), "reports read no release tables"),
    # The agent's own package is below the lab's policies (they use its constants); the
    # bytes pushed to nodes, agent and policies together, are lab.agent_push's.
    ("lab/agent", (), ("lab.env_policy", "lab.flag_policy", "lab.agent_push"),
     "the node agent is below the policies written into it"),
    # `diagnose --lab sim:SCENARIO` starts a simulated lab and hands the stages its inventory;
    # nothing else of the platform may reach into the simulator.
    ("diagnostic", ("diagnostic/jobs/management/commands/diagnose.py",), ("lab.sim",),
     "the platform reaches the simulated lab only through its interfaces (SSH, HTTP)"),
]


def _violations(
    package: str, skip: tuple[str, ...], forbidden: tuple[str, ...], root: Path = ROOT
) -> list[str]:
    found = []
    for path in _modules(package, skip=skip, root=root):
        for line, name in imported_names(path, root):
            if any(_hits(name, prefix) for prefix in forbidden):
                found.append(f"{path.relative_to(root)}:{line} imports {name}")
    return sorted(set(found))


@pytest.mark.parametrize(
    ("package", "skip", "forbidden", "why"), RULES, ids=[f"{r[0]}-{r[2][0]}" for r in RULES]
)
def test_imports_run_one_way(
    package: str, skip: tuple[str, ...], forbidden: tuple[str, ...], why: str
) -> None:
    assert _violations(package, skip, forbidden) == [], why


def test_lab_config_is_a_leaf_of_the_engines_layer() -> None:
    found = [name for _, name in imported_names(ROOT / "lab" / "config.py") if _hits(name, "lab.engines")]
    assert found == [], "lab/config.py is the configuration's vocabulary; lab.engines builds on it"


def test_the_scan_sees_imports_inside_functions_and_relative_ones(tmp_path: Path) -> None:
    (tmp_path / "reports" / "sub").mkdir(parents=True)
    module = tmp_path / "reports" / "sub" / "probe.py"
    module.write_text("def f():\n    from diagnostic.pipelines import claim\n    import lab.sim.engine\n"
                      "    from ..x import y\n")
    names = {name for _, name in imported_names(module, tmp_path)}
    assert {"diagnostic.pipelines.claim", "lab.sim.engine", "reports.x.y"} <= names
    assert _violations("reports", (), ("diagnostic", "lab.sim"), tmp_path) == [
        "reports/sub/probe.py:2 imports diagnostic.pipelines",
        "reports/sub/probe.py:2 imports diagnostic.pipelines.claim",
        "reports/sub/probe.py:3 imports lab.sim.engine",
    ]


def status_writes(path: Path, root: Path = ROOT) -> Iterator[str]:
    """Where `path` changes a job's or a stage's status outside diagnostic/lifecycle.py: an
    UPDATE naming `status` (or spreading a dict that might) and an assignment to `.status`.
    A booking's status (its own, smaller lifecycle in bookings/models.py) is not these."""
    source = path.read_text()
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("update", "bulk_update")
                and any(k.arg in ("status", None) for k in node.keywords)):
            receiver = ast.get_source_segment(source, node.func.value) or ""
            if "Booking" not in receiver:
                yield f"{path.relative_to(root)}:{node.lineno} updates the status of {receiver[:60]}"
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for item in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(item, ast.Attribute) and item.attr == "status":
                        yield f"{path.relative_to(root)}:{node.lineno} sets {ast.unparse(item)}"


# Modules that set a `.status` that is not a job's or a stage's.
OTHER_STATUSES = (
    "diagnostic/bookings/models.py",  # a booking's, cancelled
    "diagnostic/portal/config_views.py",  # a booking's, confirmed by its first configuration
    "diagnostic/pipelines/client.py",  # an HTTP response's
)


def test_only_the_lifecycle_changes_a_job_or_stage_status() -> None:
    found = [hit for path in _modules("diagnostic", skip=("diagnostic/lifecycle.py", *OTHER_STATUSES))
             if "migrations" not in path.parts for hit in status_writes(path)]
    assert found == [], "each status change of a job or stage is a transition of diagnostic/lifecycle.py"


def test_the_status_scan_sees_updates_and_assignments(tmp_path: Path) -> None:
    module = tmp_path / "diagnostic" / "probe.py"
    module.parent.mkdir()
    module.write_text("def f(job, stage, RESET):\n"
                      "    StageRun.objects.filter(pk=1).update(status='failed')\n"
                      "    job.stage_runs.update(**RESET)\n"
                      "    Booking.objects.filter(pk=1).update(status='cancelled')\n"
                      "    stage.status = 'succeeded'\n")
    assert sorted(status_writes(module, tmp_path)) == [
        "diagnostic/probe.py:2 updates the status of StageRun.objects.filter(pk=1)",
        "diagnostic/probe.py:3 updates the status of job.stage_runs",
        "diagnostic/probe.py:5 sets stage.status",
    ]


MAX_FUNCTION_LINES = 100


def long_functions(root: Path = ROOT) -> list[str]:
    """Functions (and methods) longer than MAX_FUNCTION_LINES, docstring included, outside
    the tests and the generated migrations."""
    found = []
    for package in ("diagnostic", "lab", "reports", "enginetables", "benchmarks"):
        for path in _modules(package, root=root):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_a_page_and_a_half() -> None:
    # Split a longer one along its numbered steps (issue 38); ruff holds complexity (C901).
    assert long_functions() == []


def test_the_length_scan_counts_a_long_function(tmp_path: Path) -> None:
    module = tmp_path / "reports" / "probe.py"
    module.parent.mkdir()
    module.write_text("def short():\n    return 1\n\n\ndef long():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    assert long_functions(tmp_path) == [f"reports/probe.py:5 long ({MAX_FUNCTION_LINES + 1} lines)"]
