"""The report depends on findings.json only: nothing in reports/ imports the diagnostic
platform (its pipelines, jobs or settings) or the lab simulator. diagnostic/jobs/report_versions.py
calls the report, never the other way round; a rule that decides lives in the pipeline
that decides and reaches the report written into findings."""

from __future__ import annotations

import ast
from pathlib import Path

REPORTS = Path(__file__).resolve().parents[2] / "reports"


def _forbidden(module: str) -> bool:
    """The platform, all of it; of the lab, its simulator (the scenario's truth)."""
    return any(module == root or module.startswith(root + ".") for root in ("diagnostic", "lab.sim"))


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name | ast.Attribute)
            and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def test_the_scan_reaches_into_the_sections_package() -> None:
    modules = {p.relative_to(REPORTS).as_posix() for p in REPORTS.rglob("*.py")}
    assert {"content.py", "sections/findings.py", "sections/fp4.py", "sections/throughput.py"} <= modules
    imported = {m for _, m in _imported_modules(REPORTS / "content.py")}
    assert {"reports.sections.findings", "reports.sections.fp4"} <= imported


def test_the_scan_catches_an_import_of_the_platform(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import diagnostic.settings\nfrom diagnostic.pipelines.claim import CAUSES\n"
        "from importlib import import_module\nimport_module('lab.sim')\n"
    )
    modules = [m for _, m in _imported_modules(sample)]
    assert modules == ["diagnostic.settings", "diagnostic.pipelines.claim", "importlib", "lab.sim"]
    forbidden = [m for m in modules if _forbidden(m)]
    assert forbidden == ["diagnostic.settings", "diagnostic.pipelines.claim", "lab.sim"]
    assert not _forbidden("diagnosticians") and not _forbidden("lab.simple")


def test_reports_imports_nothing_of_the_diagnostic_platform_or_the_lab() -> None:
    offending = [
        f"{path.relative_to(REPORTS.parent)}:{line} imports {module}"
        for path in sorted(REPORTS.rglob("*.py"))
        for line, module in _imported_modules(path)
        if _forbidden(module)
    ]
    assert offending == []
