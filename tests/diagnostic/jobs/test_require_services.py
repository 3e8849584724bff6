"""REQUIRE_SERVICES (tests/conftest.py): with it on, a services, ssh or browser test that
would skip fails instead, and a run selecting the services tier without PostgreSQL and
Redis configured is refused at collection; it accepts 1, true and yes.

Each case runs pytest in a child on a small test file beside a copy of the gate. The child
finds sshd where SSHD_PATH says: a stand-in script, or nothing, so the outcomes do not depend
on whether this machine has openssh-server installed."""

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
    """The gate beside the test files, with a stand-in sshd (tests of its absence point
    SSHD_PATH elsewhere)."""
    pytester.makeconftest(GATE.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    services\n    ssh\n    browser\n")
    for name in ("REQUIRE_SERVICES", "DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"):
        monkeypatch.delenv(name, raising=False)
    stand_in = pytester.path / "bin" / "sshd"
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\nexit 1\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("SSHD_PATH", str(stand_in))
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


def test_selecting_the_ssh_tier_without_sshd_is_refused_at_collection(
    gated: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    gated.makepyfile(test_gated=SKIPPING.format(marker="ssh"))
    monkeypatch.setenv("REQUIRE_SERVICES", "1")
    missing = gated.path / "no-such-sshd"
    monkeypatch.setenv("SSHD_PATH", str(missing))
    result = run(gated)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*REQUIRE_SERVICES is on*SSHD_PATH={missing} is not an executable file*"])
    # Without the requirement the same run goes ahead, and the ssh test skips with its reason.
    monkeypatch.delenv("REQUIRE_SERVICES")
    result = run(gated)
    result.assert_outcomes(skipped=1, passed=1)
    result.stdout.fnmatch_lines(["SKIPPED*the thing is not installed*"])


def test_sshd_binary_takes_sshd_path_alone_when_it_is_set(
    gated: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import sshd_binary

    stand_in = gated.path / "bin" / "sshd"
    assert sshd_binary() == str(stand_in)
    stand_in.chmod(0o644)
    assert sshd_binary() is None, "a file that cannot run is no sshd"
    monkeypatch.setenv("SSHD_PATH", str(gated.path / "bin"))
    assert sshd_binary() is None, "a directory is no sshd"
    # Unset, PATH is searched first (here: only the stand-in's directory).
    stand_in.chmod(0o755)
    monkeypatch.delenv("SSHD_PATH")
    monkeypatch.setenv("PATH", str(stand_in.parent))
    assert sshd_binary() == str(stand_in)
