"""The gate on the tiers that need outside things: PostgreSQL and Redis (`services`), Debian's
sshd (`ssh`), Chromium (`browser`).

Without REQUIRE_SERVICES a test of those tiers skips, saying what it lacks. With
REQUIRE_SERVICES set to 1, true or yes (CI sets it), nothing of them may skip: the run is
refused at collection when the services tier is selected but DATABASE_URL is not
PostgreSQL or CELERY_BROKER_URL is not Redis, and a test of a gated tier that would skip
fails instead, with its reason. A `services` test that uses the database runs on
PostgreSQL or not at all: the exactly-once claims it checks rest on PostgreSQL's locking,
which SQLite would only imitate.

The sshd the ssh tier uses is `sshd_binary()`: SSHD_PATH when it is set (only that path,
which must be an executable file), else `sshd` on PATH, else Debian's /usr/sbin/sshd. The
gate's own tests (tests/diagnostic/jobs/test_require_services.py) set it to a stand-in or
to a path that does not exist, so they pass with and without openssh-server installed.

Skipped tests report their reasons in the summary at the end of every run (`-ra` in
pyproject's addopts).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

GATED_MARKERS = ("services", "ssh", "browser")
TRUE_WORDS = frozenset({"1", "true", "yes"})


def services_required() -> bool:
    """REQUIRE_SERVICES is on (1, true or yes, any case)."""
    return os.environ.get("REQUIRE_SERVICES", "").strip().lower() in TRUE_WORDS


def service_missing(reason: str) -> None:
    """Skip for `reason`, or fail when REQUIRE_SERVICES is on."""
    if services_required():
        pytest.fail(f"REQUIRE_SERVICES is on but {reason}", pytrace=False)
    pytest.skip(reason)


def sshd_binary() -> str | None:
    """The sshd executable the ssh tier runs, or None when there is none (see the docstring above)."""
    named = os.environ.get("SSHD_PATH", "").strip()
    candidates = [named] if named else [shutil.which("sshd"), "/usr/sbin/sshd"]
    return next((path for path in candidates
                 if path and Path(path).is_file() and os.access(path, os.X_OK)), None)


def gated_marker(item: pytest.Item) -> str | None:
    return next((name for name in GATED_MARKERS if item.get_closest_marker(name)), None)


def _collection_problems(items: list[pytest.Item]) -> list[str]:
    tiers = {gated_marker(item) for item in items} - {None}
    problems = []
    if "services" in tiers:
        if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
            problems.append("DATABASE_URL is not a PostgreSQL URL "
                            "(e.g. postgres://postgres@127.0.0.1:5432/diagnostic)")
        if not os.environ.get("CELERY_BROKER_URL", "").startswith(("redis://", "rediss://")):
            problems.append("CELERY_BROKER_URL is not a Redis URL (e.g. redis://127.0.0.1:6379/0)")
    if "ssh" in tiers and sshd_binary() is None:
        named = os.environ.get("SSHD_PATH", "").strip()
        problems.append(f"SSHD_PATH={named} is not an executable file" if named
                        else "sshd (Debian's openssh-server) is not installed")
    return problems


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not services_required():
        return
    problems = _collection_problems(items)
    if problems:
        raise pytest.UsageError(
            "REQUIRE_SERVICES is on and the selected tests need services that are not configured: "
            + "; ".join(problems)
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not (report.skipped and services_required()) or hasattr(report, "wasxfail"):
        return
    marker = gated_marker(item)
    if marker is None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"REQUIRE_SERVICES is on, so this {marker} test may not skip; it would have: {reason}"


@pytest.fixture(autouse=True)
def _services_run_on_postgresql(request: pytest.FixtureRequest) -> None:
    """A `services` test that touches the database needs PostgreSQL under it."""
    if request.node.get_closest_marker("services") is None:
        return
    if request.node.get_closest_marker("django_db") is None:
        return
    from django.db import connection

    if connection.vendor != "postgresql":
        service_missing(
            f"this services test needs PostgreSQL, and the tests run on {connection.vendor}: "
            "set DATABASE_URL=postgres://postgres@127.0.0.1:5432/diagnostic"
        )
