"""Settings helpers: every environment value is parsed strictly and a bad one stops
start-up with the variable's name."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from diagnostic.envconfig import database_from_url, email_from_url, envbool, envint, envlist, envstr

BASE = Path("/srv/diag")


@pytest.mark.parametrize("text", ["1", "true", "True", "YES", "on"])
def test_envbool_reads_true_words(text: str) -> None:
    assert envbool("DEBUG", False, environ={"DEBUG": text}) is True


@pytest.mark.parametrize("text", ["0", "false", "False", "no", "OFF"])
def test_envbool_reads_false_words(text: str) -> None:
    assert envbool("DEBUG", True, environ={"DEBUG": text}) is False


@pytest.mark.parametrize("text", ["maybe", "ture", "2", "enabled"])
def test_envbool_raises_on_text_that_is_not_a_boolean(text: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=rf"DEBUG='{text}' is not a boolean"):
        envbool("DEBUG", True, environ={"DEBUG": text})


def test_envbool_uses_the_default_when_unset_or_empty() -> None:
    assert envbool("DEBUG", True, environ={}) is True
    assert envbool("DEBUG", False, environ={"DEBUG": "  "}) is False


def test_envint_raises_on_text_that_is_not_an_integer() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"DIAG_STAGE_LEASE_S='2m' is not an integer"):
        envint("DIAG_STAGE_LEASE_S", 120, environ={"DIAG_STAGE_LEASE_S": "2m"})


def test_envint_enforces_its_bounds() -> None:
    with pytest.raises(ImproperlyConfigured, match="below the minimum 1"):
        envint("N", 3, minimum=1, environ={"N": "0"})
    with pytest.raises(ImproperlyConfigured, match="above the maximum 65535"):
        envint("PORT", 25, maximum=65535, environ={"PORT": "70000"})
    assert envint("N", 3, minimum=1, environ={"N": "7"}) == 7


def test_envlist_and_envstr_trim_and_default() -> None:
    assert envlist("HOSTS", ["a"], environ={"HOSTS": " x.example, ,y.example "}) == ["x.example", "y.example"]
    assert envlist("HOSTS", ["a"], environ={}) == ["a"]
    assert envstr("NAME", "dflt", environ={"NAME": ""}) == "dflt"


def test_postgres_url_becomes_a_psycopg_database() -> None:
    url = "postgres://diag:s%40cret@db.internal:6543/diagnostic?sslmode=require"
    db = database_from_url(url, base_dir=BASE)
    assert db == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "diagnostic",
        "USER": "diag",
        "PASSWORD": "s@cret",
        "HOST": "db.internal",
        "PORT": "6543",
        "OPTIONS": {"sslmode": "require"},
    }


def test_postgres_url_without_password_or_port_uses_defaults() -> None:
    db = database_from_url("postgresql://postgres@127.0.0.1/diagnostic", base_dir=BASE)
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"]) == ("postgres", "", "127.0.0.1", "")


def test_postgres_url_without_database_name_is_refused_without_leaking_the_password() -> None:
    with pytest.raises(ImproperlyConfigured, match="names no database") as caught:
        database_from_url("postgres://diag:hunter2@db:5432/", base_dir=BASE)
    assert "hunter2" not in str(caught.value)


def test_sqlite_urls_resolve_relative_and_absolute_paths() -> None:
    assert database_from_url("sqlite:///out/x.db", base_dir=BASE)["NAME"] == "/srv/diag/out/x.db"
    assert database_from_url("sqlite:////var/lib/diag.db", base_dir=BASE)["NAME"] == "/var/lib/diag.db"
    assert database_from_url("sqlite://:memory:", base_dir=BASE)["NAME"] == ":memory:"


def test_unsupported_database_scheme_lists_the_accepted_ones() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"unsupported scheme 'mysql'; accepted: .*postgres://"):
        database_from_url("mysql://root@localhost/diag", base_dir=BASE)


def test_smtp_url_becomes_email_settings() -> None:
    email = email_from_url("smtp+tls://reports%40firm.example:app%20pw@smtp.firm.example:2525")
    assert email == {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": "smtp.firm.example",
        "EMAIL_PORT": 2525,
        "EMAIL_HOST_USER": "reports@firm.example",
        "EMAIL_HOST_PASSWORD": "app pw",
        "EMAIL_USE_TLS": True,
        "EMAIL_USE_SSL": False,
    }


def test_smtp_url_default_ports_follow_the_scheme() -> None:
    assert email_from_url("smtp://mail")["EMAIL_PORT"] == 25
    assert email_from_url("smtps://mail")["EMAIL_PORT"] == 465
    assert email_from_url("smtps://mail")["EMAIL_USE_SSL"] is True


def test_email_url_with_another_scheme_is_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"EMAIL_URL=.*unsupported scheme 'imap'"):
        email_from_url("imap://user:pw@mail")
