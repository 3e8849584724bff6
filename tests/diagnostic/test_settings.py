"""The settings module as a deployment sees it: loaded in a fresh interpreter with a
given environment, it either configures every outside system or refuses to start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from diagnostic.celery import app

REPO = Path(__file__).resolve().parents[2]
PROBE = (
    "import json, diagnostic.settings as s; print(json.dumps({"
    "'eager': s.CELERY_TASK_ALWAYS_EAGER, 'broker': s.CELERY_BROKER_URL, "
    "'db': s.DATABASES['default']['ENGINE'], 'db_name': str(s.DATABASES['default']['NAME']), "
    "'email': s.EMAIL_BACKEND, 'email_host': s.EMAIL_HOST, 'debug': s.DEBUG}))"
)
CLEARED = ("DATABASE_URL", "CELERY_BROKER_URL", "EMAIL_URL", "EMAIL_HOST", "SECRET_KEY", "DEBUG", "DIAG_DB")


def load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in CLEARED}
    base["DIAG_OUT_DIR"] = str(tmp_path / "out")
    return subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env={**base, **env},
        capture_output=True, text=True, timeout=60, check=False,
    )


def test_a_bare_checkout_uses_sqlite_eager_celery_and_file_email(tmp_path: Path) -> None:
    done = load_settings(tmp_path)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["eager"] is True
    assert seen["db"] == "django.db.backends.sqlite3"
    assert seen["db_name"] == str(tmp_path / "out" / "db.sqlite3")
    assert seen["email"] == "django.core.mail.backends.filebased.EmailBackend"


def test_outside_systems_are_switched_on_by_one_variable_each(tmp_path: Path) -> None:
    done = load_settings(
        tmp_path,
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/diagnostic",
        CELERY_BROKER_URL="redis://127.0.0.1:6379/0",
        EMAIL_URL="smtp+tls://u:p@mail.example:587",
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert (seen["eager"], seen["broker"]) == (False, "redis://127.0.0.1:6379/0")
    assert seen["db"] == "django.db.backends.postgresql"
    assert seen["email"] == "django.core.mail.backends.smtp.EmailBackend"
    assert seen["email_host"] == "mail.example"


def test_diag_db_moves_the_sqlite_file(tmp_path: Path) -> None:
    done = load_settings(tmp_path, DIAG_DB=str(tmp_path / "elsewhere" / "d.sqlite3"))
    assert json.loads(done.stdout)["db_name"] == str(tmp_path / "elsewhere" / "d.sqlite3")


def test_it_refuses_to_start_without_secret_key_when_debug_is_off(tmp_path: Path) -> None:
    done = load_settings(tmp_path, DEBUG="false")
    assert done.returncode != 0
    assert "SECRET_KEY is not set" in done.stderr


def test_it_starts_with_debug_off_when_secret_key_is_given(tmp_path: Path) -> None:
    done = load_settings(tmp_path, DEBUG="false", SECRET_KEY="x" * 50)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["debug"] is False


def test_it_refuses_a_debug_value_that_is_not_a_boolean(tmp_path: Path) -> None:
    done = load_settings(tmp_path, DEBUG="yes please")
    assert done.returncode != 0
    assert "DEBUG='yes please' is not a boolean" in done.stderr


def test_it_refuses_a_visibility_timeout_shorter_than_the_stage_time_limit(tmp_path: Path) -> None:
    done = load_settings(tmp_path, DIAG_VISIBILITY_TIMEOUT_S="3600", DIAG_STAGE_TIME_LIMIT_S="5400")
    assert done.returncode != 0
    assert "DIAG_VISIBILITY_TIMEOUT_S=3600 must exceed the stage time limit" in done.stderr


def test_celery_redelivers_lost_work_and_takes_one_task_at_a_time() -> None:
    conf = app.conf
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.accept_content == ["json"]
    assert conf.task_serializer == "json"
    assert conf.result_serializer == "json"


def test_visibility_timeout_exceeds_every_time_limit_and_retry_countdown() -> None:
    from diagnostic.jobs.orchestration import retry_countdown

    visibility = app.conf.broker_transport_options["visibility_timeout"]
    longest_countdown = max(retry_countdown(a) for a in range(1, 30))
    assert visibility > app.conf.task_time_limit
    assert visibility > app.conf.task_soft_time_limit
    assert visibility > longest_countdown
    assert visibility > settings.DIAG_LAB_BUSY_RETRY_S
    assert app.conf.task_soft_time_limit < app.conf.task_time_limit


def test_beat_runs_the_lease_reaper() -> None:
    entry = app.conf.beat_schedule["reap-expired-leases"]
    assert entry["task"] == "diagnostic.jobs.tasks.reap_expired_leases"
    assert entry["schedule"] < settings.DIAG_STAGE_LEASE_S * 10


@pytest.mark.parametrize(
    "name", ["diagnostic.jobs.tasks.run_diagnostic", "diagnostic.jobs.tasks.reap_expired_leases"]
)
def test_tasks_are_registered_under_their_stable_names(name: str) -> None:
    import diagnostic.jobs.tasks  # noqa: F401 - registers the tasks

    assert name in app.tasks
