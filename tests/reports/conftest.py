"""Shared setup of the report tests.

`findings` is the reference day of tests/reports/reference_story.py: the findings.json a
real diagnostic run wrote on the simulated reference lab, in the producers' own shapes.
The full report of it is rendered once per session (`reference_report`), because a render
takes seconds, and every test that reads the PDF back shares it.

Until the project's settings list the `reports` app, this conftest adds it before the
test database is created, so that its migration runs.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings

from reports.content import ReportContent, build_report
from reports.moneyback import assess
from reports.render import RenderedReport, render
from tests.conftest import service_missing
from tests.reports.reference_story import reference_findings, reference_findings_28

if "reports" not in settings.INSTALLED_APPS:
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "reports"]
    apps.set_installed_apps(settings.INSTALLED_APPS)

CUSTOMER = "Northwind Robotics"
# The fixture's lab day is Monday 2025-12-01; issuing the report that afternoon is on time.
ISSUED = dt.datetime(2025, 12, 1, 16, 0, tzinfo=dt.UTC)


def require_tool(name: str) -> str:
    """A command-line tool the test needs; missing, it skips (or fails with REQUIRE_SERVICES=1)."""
    path = shutil.which(name)
    if path is None:
        service_missing(f"{name} (Debian's poppler-utils) is not installed")
    return path


def pdf_text(path: Path, *, layout: bool = True) -> str:
    """The PDF's text as pdftotext extracts it."""
    argv = [require_tool("pdftotext"), *(["-layout"] if layout else []), str(path), "-"]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def squash(text: str) -> str:
    """Whitespace folded to single spaces (non-breaking ones included), for phrase search."""
    return " ".join(text.split())


@pytest.fixture
def findings() -> dict[str, Any]:
    return reference_findings()


@dataclass(frozen=True)
class ReferenceReport:
    findings: dict[str, Any]
    report: RenderedReport
    text: str  # pdftotext -layout: table rows stay on one line
    flat: str  # pdftotext in reading order, whitespace folded: phrases stay together


@pytest.fixture(scope="session")
def reference_report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceReport]:
    document = reference_findings()
    out = tmp_path_factory.mktemp("reference-report")
    report = render(document, out, customer=CUSTOMER, as_of=ISSUED)
    yield ReferenceReport(
        document, report, pdf_text(report.pdf_path), squash(pdf_text(report.pdf_path, layout=False))
    )


@pytest.fixture(scope="session")
def reference_report_28(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceReport]:
    """The issue-28 reference day rendered once, as `make demo` renders it."""
    document = reference_findings_28()
    out = tmp_path_factory.mktemp("reference-report-28")
    report = render(document, out, customer=CUSTOMER, as_of=ISSUED)
    yield ReferenceReport(
        document, report, pdf_text(report.pdf_path), squash(pdf_text(report.pdf_path, layout=False))
    )


def report_content(document: dict[str, Any]) -> ReportContent:
    """The report's content model of `document` (no plots), issued on the fixture's lab day."""
    return build_report(
        document,
        customer="Northwind",
        money_back=assess(document, as_of=ISSUED),
        issued=ISSUED.date(),
        with_plots=False,
    )


def minimal_findings(**overrides: Any) -> dict[str, Any]:
    """A small findings document (no plots), for tests that render several reports."""
    document = reference_findings()
    document.update(cold_start=None, speculative=None, measurement=None)
    document["findings"] = [f for f in document["findings"] if f["code"] == "fp4.kernel_dispatch"]
    document.update(overrides)
    return document
