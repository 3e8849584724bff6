"""REQUIRE_SERVICES (tests/conftest.py): with it on, a services, ssh or browser test that
would skip fails instead, and a run selecting the services tier without PostgreSQL and
Redis configured is refused at collection; it accepts 1, true and yes.

Each case runs pytest in a child on a small test file beside a copy of the gate."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

GATE = Path(__file__).resolve().parents[2] / "conftest.py"
SKIPPING = """
import pytest

pytestmark = pytest.mark.{marker}

def test_needs_something():
    pytest.skip("the thing is not installed")

def test_plain():
    pass
"""


@pytest.fixture
def gated(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makeconftest(GATE.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    services\n    ssh\n    browser\n")
    for name in ("REQUIRE_SERVICES", "DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"):
        monkeypatch.delenv(name, raising=False)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:django", "-p", "no:cacheprovider", "-rfs", *args)


@pytest.mark.parametrize(("marker", "value"), [("ssh", "1"), ("browser", "true"), ("ssh", "YES")])
def test_a_gated_test_that_would_skip_fails_when_services_are_required(
    gated: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, marker: str, value: str
) -> None:
    gated.makepyfile(test_gated=SKIPPING.format(marker=marker))
    monkeypatch.setenv("REQUIRE_SERVICES", value)
    result = run(gated)
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([f"*REQUIRE_SERVICES is on, so this {marker} test may not skip*"
                                 "the thing is not installed*"])


@pytest.mark.parametrize("value", ["", "no"])
def test_without_the_requirement_a_gated_test_skips(
    gated: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    gated.makepyfile(test_gated=SKIPPING.format(marker="ssh"))
    monkeypatch.setenv("REQUIRE_SERVICES", value)
    run(gated).assert_outcomes(skipped=1, passed=1)


def test_selecting_the_services_tier_without_its_services_is_refused_at_collection(
    gated: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    gated.makepyfile(test_gated=SKIPPING.format(marker="services"))
    monkeypatch.setenv("REQUIRE_SERVICES", "true")
    monkeypatch.setenv("DATABASE_URL", "sqlite:///tmp/x.db")
    result = run(gated)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*REQUIRE_SERVICES is on*DATABASE_URL is not a PostgreSQL URL*"
                                 "CELERY_BROKER_URL is not a Redis URL*"])
    # Deselecting the tier lets the rest run.
    run(gated, "-m", "not services").assert_outcomes()
