"""Reading settings from the environment, failing loudly on values that make no sense.

Each helper names the variable and the value it could not use, so a typo in a
deployment's environment stops the process at start-up instead of turning into a
silently different setting. URL helpers turn `DATABASE_URL` and `EMAIL_URL` into the
dictionaries Django expects.

SECRET_KEY is checked here too (`secret_key_problem`). The web app signs sessions and
tokens with it, so every process refuses to load the settings with DEBUG off and a missing
or weak key, unless manage.py said first that its command serves no web page
(`run_without_secret_key`): `diagnose`, `measure`, `invite`, `migrate` sign nothing, and
run with an empty key, which Django refuses to sign with if anything tries.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})

# Django's deployment check (security.W009) wants 50 characters, 5 of them distinct, and not
# the key startproject generates; refusing such a key means `check --deploy` never has to be
# the one to notice.
SECRET_KEY_MIN_LENGTH = 50
SECRET_KEY_MIN_DISTINCT = 5
DJANGO_GENERATED_KEY_PREFIX = "django-insecure-"

POSTGRES_SCHEMES = frozenset({"postgres", "postgresql", "pgsql"})
SQLITE_SCHEMES = frozenset({"sqlite"})


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    env = os.environ if environ is None else environ
    value = env.get(name)
    # An empty value is how compose files and shells spell "not set".
    return None if value is None or value.strip() == "" else value.strip()


def envstr(name: str, default: str, *, environ: Mapping[str, str] | None = None) -> str:
    """The variable's text, or `default` when it is unset or empty."""
    value = _raw(name, environ)
    return default if value is None else value


def envbool(name: str, default: bool, *, environ: Mapping[str, str] | None = None) -> bool:
    """A yes/no variable; anything other than true/false/1/0/yes/no/on/off is an error."""
    value = _raw(name, environ)
    if value is None:
        return default
    word = value.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ImproperlyConfigured(
        f"{name}={value!r} is not a boolean; use one of "
        f"{', '.join(sorted(TRUE_WORDS))} or {', '.join(sorted(FALSE_WORDS))}"
    )


def envint(
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """An integer variable, optionally bounded; text that is not an integer is an error."""
    value = _raw(name, environ)
    if value is None:
        return default
    try:
        number = int(value, 10)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below the minimum {minimum}")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name}={number} is above the maximum {maximum}")
    return number


def envlist(name: str, default: list[str], *, environ: Mapping[str, str] | None = None) -> list[str]:
    """A comma-separated list; blank items are dropped."""
    value = _raw(name, environ)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def secret_key_problem(key: str) -> str | None:
    """What makes `key` unfit to sign a deployment's sessions ("is not set", ...), or None."""
    if not key:
        return "is not set"
    if key.startswith(DJANGO_GENERATED_KEY_PREFIX):
        return "is Django's generated development key"
    if len(key) < SECRET_KEY_MIN_LENGTH or len(set(key)) < SECRET_KEY_MIN_DISTINCT:
        return f"has {len(key)} characters, {len(set(key))} of them distinct"
    return None


def secret_key_message(problem: str, needed_by: str = "the web app signs sessions and tokens with it") -> str:
    """One line: what is wrong with SECRET_KEY, who needs it, and what to set."""
    return (
        f"SECRET_KEY {problem}: {needed_by}, so with DEBUG off it must be a random string of at least "
        f"{SECRET_KEY_MIN_LENGTH} characters "
        "(python3 -c 'import secrets; print(secrets.token_urlsafe(50))'), or set DEBUG=1 for development"
    )


_keyless_command: str | None = None


def run_without_secret_key(command: str) -> None:
    """Let this process load the settings without a usable SECRET_KEY, for `command`.

    manage.py calls it, before the settings load, for a command that serves no web page.
    The settings then set an empty key (and SECRET_KEY_PROBLEM says why): Django refuses
    to sign anything with it, and diagnostic.wsgi refuses to serve.
    """
    global _keyless_command
    _keyless_command = command


def keyless_command() -> str | None:
    """The command `run_without_secret_key` named in this process, or None."""
    return _keyless_command


def database_from_url(url: str, *, base_dir: Path, name: str = "DATABASE_URL") -> dict[str, Any]:
    """Django's DATABASES["default"] for a postgres:// or sqlite:// URL.

    postgres://user:password@host:port/dbname?sslmode=require uses psycopg 3; query
    parameters become connection options. sqlite:///relative.db resolves against
    `base_dir`, sqlite:////absolute/path.db is taken as it is, sqlite://:memory: is an
    in-memory database.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in POSTGRES_SCHEMES:
        dbname = unquote(parts.path.lstrip("/"))
        if not dbname or "/" in dbname:
            raise ImproperlyConfigured(
                f"{name}={_redact(url)!r} names no database; expected "
                "postgres://user:password@host:5432/dbname"
            )
        try:
            port = parts.port
        except ValueError:
            raise ImproperlyConfigured(f"{name}={_redact(url)!r} has a port that is not a number") from None
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        config: dict[str, Any] = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": dbname,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(port) if port else "",
        }
        if options:
            config["OPTIONS"] = options
        return config
    if scheme in SQLITE_SCHEMES:
        if parts.netloc == ":memory:" or parts.path in ("/:memory:", ":memory:"):
            return {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
        if parts.netloc:
            raise ImproperlyConfigured(
                f"{name}={url!r}: a sqlite URL has no host; use sqlite:///relative/path.db "
                "or sqlite:////absolute/path.db"
            )
        # sqlite:///x.db has path "/x.db": the first slash separates, the rest is the path.
        raw_path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not raw_path:
            raise ImproperlyConfigured(f"{name}={url!r} names no database file")
        path = Path(unquote(raw_path))
        return sqlite_database(path if path.is_absolute() else base_dir / path)
    accepted = ", ".join(f"{s}://" for s in sorted(POSTGRES_SCHEMES | SQLITE_SCHEMES))
    raise ImproperlyConfigured(
        f"{name}={_redact(url)!r}: unsupported scheme {parts.scheme!r}; accepted: {accepted}"
    )


def sqlite_database(path: Path) -> dict[str, Any]:
    """The embedded SQLite database at `path`."""
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        # Heartbeat threads and the web process write while a stage runs: wait for the
        # lock rather than failing at once with "database is locked".
        "OPTIONS": {"timeout": 30},
    }


def email_from_url(url: str, *, name: str = "EMAIL_URL") -> dict[str, Any]:
    """Django EMAIL_* settings for smtp://, smtp+tls:// (STARTTLS) or smtps:// (TLS on connect)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    schemes = {"smtp": (False, False, 25), "smtp+tls": (True, False, 587), "smtps": (False, True, 465)}
    if scheme not in schemes:
        raise ImproperlyConfigured(
            f"{name}={_redact(url)!r}: unsupported scheme {parts.scheme!r}; "
            "accepted: smtp://, smtp+tls://, smtps://"
        )
    if not parts.hostname:
        raise ImproperlyConfigured(f"{name}={_redact(url)!r} names no host; expected smtp://user:pass@host:port")
    use_tls, use_ssl, default_port = schemes[scheme]
    try:
        port = parts.port or default_port
    except ValueError:
        raise ImproperlyConfigured(f"{name}={_redact(url)!r} has a port that is not a number") from None
    return {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": parts.hostname,
        "EMAIL_PORT": port,
        "EMAIL_HOST_USER": unquote(parts.username or ""),
        "EMAIL_HOST_PASSWORD": unquote(parts.password or ""),
        "EMAIL_USE_TLS": use_tls,
        "EMAIL_USE_SSL": use_ssl,
    }


def _redact(url: str) -> str:
    """The URL with its password replaced, for error messages that end up in logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
