"""The command-line tools on a fresh machine: `manage.py` run with a bare environment (no
DEBUG, no SECRET_KEY), as the README's "Commands" section prints it.

A command that serves no web page needs no key; a setting a command needs and cannot use
is one line on stderr naming it, with exit status 1, never a traceback. The web's entry
points (runserver, gunicorn through diagnostic.wsgi) and `check --deploy` still refuse to
start without a real key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MANAGE = REPO / "manage.py"
GUNICORN = Path(sys.executable).parent / "gunicorn"
# A key as the docker-compose header makes one (secrets.token_urlsafe(50)), fixed here.
PRODUCTION_KEY = "kQ3v-9zJ_pX7wLr2NcT8bY5mHdG1sAeF4uV6oKiZ0qWjRtEyUxCnBlMgPhSaDfIo"
WEB_REFUSAL = "SECRET_KEY is not set: the web app signs sessions and tokens with it"
KEY_REMEDY = "at least 50 characters (python3 -c 'import secrets; print(secrets.token_urlsafe(50))')"


def bare_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A login shell's worth of environment, nothing of the test run's (no DEBUG, no key);
    DIAG_OUT_DIR only keeps the database and email out of the checkout."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DIAG_OUT_DIR": str(tmp_path / "out"), **extra}


def run(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
        program: tuple[str, ...] = (sys.executable, str(MANAGE))) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*program, *args], cwd=tmp_path, env=bare_env(tmp_path) if env is None else env,
        capture_output=True, text=True, timeout=120, check=False,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The single line a refused command wrote on stderr."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize(("command", "usage"), [
    ("diagnose", "--config CONFIG --lab LAB --out OUT"),
    ("measure", "--endpoint ENDPOINT"),
    ("invite", "--org ORG"),
])
def test_the_commands_answer_help_without_debug_or_a_key(tmp_path: Path, command: str, usage: str) -> None:
    done = run(tmp_path, command, "--help")
    assert done.returncode == 0, done.stderr
    assert usage in " ".join(done.stdout.split())
    assert done.stderr == ""


def test_a_fresh_database_is_one_line_saying_migrate_then_invite_runs_without_a_key(tmp_path: Path) -> None:
    before = run(tmp_path, "invite", "alice@acme.example", "--org", "Acme Inference")
    assert before.returncode == 1
    line = one_line(before)
    assert line.startswith("manage.py invite: the database ")
    assert line.endswith("create the tables with `python manage.py migrate`")

    migrated = run(tmp_path, "migrate", "-v", "0")
    assert migrated.returncode == 0, migrated.stderr

    done = run(tmp_path, "invite", "alice@acme.example", "--org", "Acme Inference")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("http://localhost:8000/accounts/invite/")
    assert "Traceback" not in done.stderr
    assert len(list((tmp_path / "out" / "email").iterdir())) == 1


def test_measure_runs_to_its_own_error_without_a_key(tmp_path: Path) -> None:
    done = run(tmp_path, "measure", "--endpoint", "http://127.0.0.1:9", "--out", str(tmp_path / "m"))
    assert done.returncode == 1
    assert one_line(done).startswith("CommandError: cannot reach http://127.0.0.1:9/")


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("DIAG_STAGE_LEASE_S", "2m", "DIAG_STAGE_LEASE_S='2m' is not an integer"),
    ("DATABASE_URL", "mysql://u:pw@db/x", "DATABASE_URL='mysql://u:***@db/x': unsupported scheme 'mysql'"),
    ("DEBUG", "maybe", "DEBUG='maybe' is not a boolean"),
])
def test_a_setting_a_command_cannot_use_is_one_line_naming_it(
    tmp_path: Path, variable: str, value: str, message: str
) -> None:
    done = run(tmp_path, "diagnose", "--help", env=bare_env(tmp_path, **{variable: value}))
    assert done.returncode == 1
    assert one_line(done).startswith(f"manage.py diagnose: {message}")


def test_a_command_that_signs_says_it_needs_the_key(tmp_path: Path) -> None:
    done = run(tmp_path, "shell", "-c", "from django.core import signing; signing.dumps(1)")
    assert done.returncode == 1
    line = one_line(done)
    assert line.startswith("manage.py shell: SECRET_KEY is not set: `manage.py shell` signs with it")
    assert KEY_REMEDY in line and "DEBUG=1" in line


def test_traceback_still_shows_the_traceback_when_asked(tmp_path: Path) -> None:
    done = run(tmp_path, "diagnose", "--help", "--traceback",
               env=bare_env(tmp_path, DIAG_STAGE_LEASE_S="2m"))
    assert done.returncode == 1
    assert "Traceback" in done.stderr


@pytest.mark.parametrize("args", [("runserver", "--noreload"), ("check", "--deploy"), ("testserver",)])
@pytest.mark.parametrize(("key", "problem"), [
    (None, "is not set"),
    ("short-key", "has 9 characters, "),
    ("django-insecure-" + PRODUCTION_KEY, "is Django's generated development key"),
])
def test_serving_the_web_or_checking_a_deployment_refuses_a_missing_or_weak_key(
    tmp_path: Path, args: tuple[str, ...], key: str | None, problem: str
) -> None:
    env = bare_env(tmp_path) if key is None else bare_env(tmp_path, SECRET_KEY=key)
    done = run(tmp_path, *args, env=env)
    assert done.returncode == 1
    line = one_line(done)
    assert line.startswith(f"manage.py {args[0]}: SECRET_KEY {problem}")
    assert KEY_REMEDY in line


def test_the_web_commands_still_answer_help_without_a_key(tmp_path: Path) -> None:
    done = run(tmp_path, "runserver", "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: manage.py runserver" in done.stdout


def test_gunicorn_refuses_to_load_the_app_without_a_key(tmp_path: Path) -> None:
    done = run(tmp_path, "--chdir", str(REPO), "--check-config", "diagnostic.wsgi", program=(str(GUNICORN),))
    assert done.returncode != 0
    assert WEB_REFUSAL in done.stderr


def test_the_wsgi_app_refuses_a_process_that_loaded_the_settings_without_a_key(tmp_path: Path) -> None:
    # As a keyless manage.py command would, if anything in it imported the web app.
    probe = ("from diagnostic.envconfig import run_without_secret_key; run_without_secret_key('probe'); "
             "import diagnostic.wsgi")
    done = run(tmp_path, "-c", probe, env=bare_env(tmp_path, PYTHONPATH=str(REPO)), program=(sys.executable,))
    assert done.returncode != 0
    assert WEB_REFUSAL in done.stderr.splitlines()[-1]


def test_a_real_key_lets_the_web_app_load(tmp_path: Path) -> None:
    done = run(tmp_path, "--chdir", str(REPO), "--check-config", "diagnostic.wsgi", program=(str(GUNICORN),),
               env=bare_env(tmp_path, SECRET_KEY=PRODUCTION_KEY, EMAIL_URL="smtp://mail.lab-firm.net:25"))
    assert done.returncode == 0, done.stderr


def test_the_web_app_refuses_to_start_where_its_email_would_go_to_files(tmp_path: Path) -> None:
    """Issue 36: production without EMAIL_URL wrote reset and invitation links under
    out/email, silently. The web app now stops, naming EMAIL_URL; the keyless commands
    (invite prints its link) still run."""
    done = run(tmp_path, "--chdir", str(REPO), "--check-config", "diagnostic.wsgi", program=(str(GUNICORN),),
               env=bare_env(tmp_path, SECRET_KEY=PRODUCTION_KEY, ALLOWED_HOSTS="portal.lab-firm.net",
                            SITE_URL="https://portal.lab-firm.net"))
    assert done.returncode != 0
    assert "EMAIL_URL is not set (nor EMAIL_HOST)" in done.stderr
    assert not (tmp_path / "out" / "email").exists()
    served = run(tmp_path, "runserver", "--noreload",
                 env=bare_env(tmp_path, SECRET_KEY=PRODUCTION_KEY, ALLOWED_HOSTS="portal.lab-firm.net"))
    assert served.returncode == 1
    assert one_line(served).startswith("manage.py runserver: EMAIL_URL is not set (nor EMAIL_HOST)")
