"""The settings module as a deployment sees it: loaded in a fresh interpreter with a
given environment, it either configures every outside system or refuses to start.

Nothing set means production: DEBUG off, and no start without a real SECRET_KEY. Only a
process that says DEBUG=1 gets the development conveniences."""

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
    "import json, diagnostic.settings as s, django.conf.global_settings as g; print(json.dumps({"
    "'eager': s.CELERY_TASK_ALWAYS_EAGER, 'broker': s.CELERY_BROKER_URL, "
    "'db': s.DATABASES['default']['ENGINE'], 'db_name': str(s.DATABASES['default']['NAME']), "
    "'email': s.EMAIL_BACKEND, 'email_host': s.EMAIL_HOST, 'debug': s.DEBUG, "
    "'secure': [getattr(s, n, getattr(g, n)) for n in ('SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', "
    "'SECURE_SSL_REDIRECT', 'SECURE_HSTS_SECONDS', 'SECURE_HSTS_INCLUDE_SUBDOMAINS')]}))"
)
# A key as the docker-compose header makes one (secrets.token_urlsafe(50)), fixed here.
PRODUCTION_KEY = "kQ3v-9zJ_pX7wLr2NcT8bY5mHdG1sAeF4uV6oKiZ0qWjRtEyUxCnBlMgPhSaDfIo"

CLEARED = ("DATABASE_URL", "CELERY_BROKER_URL", "EMAIL_URL", "EMAIL_HOST", "SECRET_KEY", "DEBUG", "DIAG_DB",
           "ALLOWED_HOSTS", "SITE_URL", "STAFF_REQUIRE_2FA", "CACHE_URL", "AXES_IPWARE_PROXY_COUNT")


def load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in CLEARED}
    base["DIAG_OUT_DIR"] = str(tmp_path / "out")
    return subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env={**base, **env},
        capture_output=True, text=True, timeout=60, check=False,
    )


def test_a_development_checkout_uses_sqlite_eager_celery_and_file_email(tmp_path: Path) -> None:
    done = load_settings(tmp_path, DEBUG="1")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["eager"] is True
    assert seen["db"] == "django.db.backends.sqlite3"
    assert seen["db_name"] == str(tmp_path / "out" / "db.sqlite3")
    assert seen["email"] == "django.core.mail.backends.filebased.EmailBackend"


def test_outside_systems_are_switched_on_by_one_variable_each(tmp_path: Path) -> None:
    done = load_settings(
        tmp_path,
        DEBUG="1",
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
    done = load_settings(tmp_path, DEBUG="1", DIAG_DB=str(tmp_path / "elsewhere" / "d.sqlite3"))
    assert json.loads(done.stdout)["db_name"] == str(tmp_path / "elsewhere" / "d.sqlite3")


def test_an_empty_environment_is_production_and_refuses_to_start_without_a_key(tmp_path: Path) -> None:
    done = load_settings(tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "SECRET_KEY is not set" in last
    assert "at least 50 characters" in last and "DEBUG=1" in last


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        (PRODUCTION_KEY[:49], "has 49 characters, "),
        ("x" * 50, "has 50 characters, 1 of them distinct"),
        ("abcd" * 20, "has 80 characters, 4 of them distinct"),
        ("django-insecure-" + PRODUCTION_KEY, "is Django's generated development key"),
    ],
)
def test_a_weak_secret_key_is_refused_when_debug_is_off(tmp_path: Path, key: str, problem: str) -> None:
    for debug in ({}, {"DEBUG": "0"}):
        done = load_settings(tmp_path, SECRET_KEY=key, **debug)
        assert done.returncode != 0
        assert f"SECRET_KEY {problem}" in done.stderr.strip().splitlines()[-1]


def test_a_real_key_starts_production_with_https_only_cookies_and_hsts(tmp_path: Path) -> None:
    done = load_settings(tmp_path, SECRET_KEY=PRODUCTION_KEY, EMAIL_URL="smtp://mail.lab-firm.net:25")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["debug"] is False
    assert seen["secure"] == [True, True, True, 31536000, True]


def test_debug_on_needs_no_key_and_drops_the_https_only_settings(tmp_path: Path) -> None:
    done = load_settings(tmp_path, DEBUG="1")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["debug"] is True
    assert seen["secure"] == [False, False, False, 0, False]


SECURITY_PROBE = (
    "import json, diagnostic.settings as s; print(json.dumps({"
    "'email': s.EMAIL_BACKEND, '2fa': s.STAFF_REQUIRE_2FA, 'cache': s.CACHES['default']['BACKEND'], "
    "'proxies': s.AXES_IPWARE_PROXY_COUNT, 'uploads': s.FILE_UPLOAD_HANDLERS}))"
)


def security_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in CLEARED}
    base["DIAG_OUT_DIR"] = str(tmp_path / "out")
    return subprocess.run(
        [sys.executable, "-c", SECURITY_PROBE], cwd=REPO, env={**base, **env},
        capture_output=True, text=True, timeout=60, check=False,
    )


def test_production_refuses_to_start_with_its_email_going_to_files(tmp_path: Path) -> None:
    """Issue 36: with DEBUG off and no EMAIL_URL, reset and invitation links were written
    under out/email, silently. Now the process stops, naming EMAIL_URL."""
    public = {"SECRET_KEY": PRODUCTION_KEY, "ALLOWED_HOSTS": "portal.lab-firm.net",
              "SITE_URL": "https://portal.lab-firm.net"}
    for env in ({"SECRET_KEY": PRODUCTION_KEY}, public):
        done = security_settings(tmp_path, **env)
        assert done.returncode != 0
        last = done.stderr.strip().splitlines()[-1]
        assert "EMAIL_URL is not set (nor EMAIL_HOST)" in last and "DEBUG=1" in last
    assert not (tmp_path / "out" / "email").exists()
    for mail in ({"EMAIL_URL": "smtp+tls://u:p@mail.lab-firm.net:587"}, {"EMAIL_HOST": "mail.lab-firm.net"}):
        done = security_settings(tmp_path, **public, **mail)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["email"] == "django.core.mail.backends.smtp.EmailBackend"
    # Development keeps its files; so does a process only this machine can reach (the
    # portal benchmark: ALLOWED_HOSTS and SITE_URL on loopback), where check --deploy fails.
    development = json.loads(security_settings(tmp_path, DEBUG="1").stdout)
    assert development["email"].endswith("filebased.EmailBackend")
    local = security_settings(tmp_path, SECRET_KEY=PRODUCTION_KEY, ALLOWED_HOSTS="127.0.0.1")
    assert local.returncode == 0, local.stderr
    assert json.loads(local.stdout)["email"].endswith("filebased.EmailBackend")
    refused = security_settings(tmp_path, SECRET_KEY=PRODUCTION_KEY, ALLOWED_HOSTS="127.0.0.1",
                                SITE_URL="https://portal.lab-firm.net")
    assert refused.returncode != 0 and "EMAIL_URL is not set" in refused.stderr


def test_the_second_factor_is_on_unless_debug_is(tmp_path: Path) -> None:
    """Issue 36: STAFF_REQUIRE_2FA was off by default. Now it is on whenever DEBUG is
    off; the environment can still say either explicitly."""
    production = {"SECRET_KEY": PRODUCTION_KEY, "EMAIL_URL": "smtp://mail.lab-firm.net:25"}
    assert json.loads(security_settings(tmp_path, **production).stdout)["2fa"] is True
    assert json.loads(security_settings(tmp_path, DEBUG="1").stdout)["2fa"] is False
    assert json.loads(security_settings(tmp_path, DEBUG="1", STAFF_REQUIRE_2FA="1").stdout)["2fa"] is True
    off = security_settings(tmp_path, **production, STAFF_REQUIRE_2FA="false")
    assert json.loads(off.stdout)["2fa"] is False


def test_the_throttles_cache_and_the_proxy_count_come_from_the_environment(tmp_path: Path) -> None:
    seen = json.loads(security_settings(tmp_path, DEBUG="1").stdout)
    assert seen["cache"] == "django.core.cache.backends.locmem.LocMemCache"
    assert seen["proxies"] == 0
    assert seen["uploads"] == ["diagnostic.portal.uploads.BoundedUploadHandler"]
    seen = json.loads(security_settings(tmp_path, DEBUG="1", CACHE_URL="redis://127.0.0.1:6379/1",
                                        AXES_IPWARE_PROXY_COUNT="1").stdout)
    assert seen["cache"] == "django.core.cache.backends.redis.RedisCache" and seen["proxies"] == 1
    bad = security_settings(tmp_path, DEBUG="1", CACHE_URL="memcached://127.0.0.1:11211")
    assert bad.returncode != 0 and "CACHE_URL has the scheme 'memcached'" in bad.stderr
    bad = security_settings(tmp_path, DEBUG="1", AXES_FAILURE_LIMIT="5", AXES_ADDRESS_FAILURE_LIMIT="3")
    assert bad.returncode != 0
    assert "AXES_ADDRESS_FAILURE_LIMIT=3 must be at least AXES_FAILURE_LIMIT=5" in bad.stderr


def test_it_refuses_a_debug_value_that_is_not_a_boolean(tmp_path: Path) -> None:
    done = load_settings(tmp_path, DEBUG="yes please")
    assert done.returncode != 0
    assert "DEBUG='yes please' is not a boolean" in done.stderr


def test_it_refuses_a_visibility_timeout_shorter_than_the_stage_time_limit(tmp_path: Path) -> None:
    done = load_settings(
        tmp_path, DEBUG="1", DIAG_VISIBILITY_TIMEOUT_S="3600", DIAG_STAGE_TIME_LIMIT_S="5400")
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
