"""Issue 36: `check --deploy` says what a deployment lacks: email that goes to files
(diagnostic.E002), staff pages without the second factor (W001), throttles counted per
process for want of a shared cache (W002). The settings already refuse to start the web
app without email; a process only this machine can reach (the portal benchmark's
loopback gunicorn) still starts, and `check --deploy` fails it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from diagnostic import checks

REPO = Path(__file__).resolve().parents[2]
PRODUCTION_KEY = "kQ3v-9zJ_pX7wLr2NcT8bY5mHdG1sAeF4uV6oKiZ0qWjRtEyUxCnBlMgPhSaDfIo"


def test_file_email_with_debug_off_is_an_error(settings: Any) -> None:
    settings.DEBUG = False
    settings.EMAIL_BACKEND = checks.FILE_EMAIL
    [error] = checks.check_email_is_sent()
    assert error.id == "diagnostic.E002" and error.msg.startswith("EMAIL_URL is not set")
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    assert checks.check_email_is_sent() == []
    settings.DEBUG = True
    settings.EMAIL_BACKEND = checks.FILE_EMAIL
    assert checks.check_email_is_sent() == []


def test_a_cache_of_the_process_own_is_a_warning(settings: Any) -> None:
    settings.DEBUG = False
    settings.CACHES = {"default": {"BACKEND": checks.LOCAL_CACHE}}
    [warning] = checks.check_shared_cache()
    assert warning.id == "diagnostic.W002" and "CACHE_URL is not set" in warning.msg
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": "redis://127.0.0.1:6379/1"}}
    assert checks.check_shared_cache() == []


def test_check_deploy_fails_a_loopback_process_whose_email_goes_to_files(tmp_path: Path) -> None:
    dropped = ("DEBUG", "DATABASE_URL", "DIAG_DB", "DJANGO_ALLOW_ASYNC_UNSAFE", "STAFF_REQUIRE_2FA")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith(("EMAIL_", "CACHE_"))}
    env.update(DEBUG="0", SECRET_KEY=PRODUCTION_KEY, ALLOWED_HOSTS="127.0.0.1",
               DEFAULT_FROM_EMAIL="diagnostic@bench-firm.net", DIAG_OUT_DIR=str(tmp_path / "out"))
    done = subprocess.run([sys.executable, "manage.py", "check", "--deploy"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "diagnostic.E002" in done.stderr and "diagnostic.W002" in done.stderr
    assert "diagnostic.W001" not in done.stderr  # the second factor is on with DEBUG off
