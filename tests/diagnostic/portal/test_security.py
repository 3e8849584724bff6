"""Production serving: `check --deploy` is clean with DEBUG=0, and the portal's answers
carry the security headers (CSP without inline scripts, no framing, no sniffing), with
cookies that scripts cannot read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

from tests.diagnostic.conftest import Cast
from tests.diagnostic.portal.conftest import Owned

REPO = Path(__file__).resolve().parents[3]
TEMPLATES = REPO / "templates"


def production_env(tmp_path: Path) -> dict[str, str]:
    # DJANGO_ALLOW_ASYNC_UNSAFE: the browser tier sets it for the test process; a deployment
    # never has it, and check --deploy rightly warns about it.
    dropped = ("DEBUG", "DATABASE_URL", "DIAG_DB", "DJANGO_ALLOW_ASYNC_UNSAFE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(
        DEBUG="0",
        SECRET_KEY="x" * 64 + "-production-probe-key",
        ALLOWED_HOSTS="portal.example.com",
        DEFAULT_FROM_EMAIL="diagnostic@portal-firm.net",
        EMAIL_URL="smtp+tls://diagnostic:mail-pass@mail.portal-firm.net:587",
        CACHE_URL="redis://127.0.0.1:6379/1",
        DIAG_OUT_DIR=str(tmp_path / "out"),
    )
    return env


def test_check_deploy_is_clean_with_debug_off(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO,
        env=production_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_production_cookies_are_secure_httponly_and_samesite(tmp_path: Path) -> None:
    probe = (
        "import json, diagnostic.settings as s; print(json.dumps([s.SESSION_COOKIE_SECURE, "
        "s.SESSION_COOKIE_HTTPONLY, s.SESSION_COOKIE_SAMESITE, s.CSRF_COOKIE_SECURE, s.PORTAL_AUTO_APPROVE]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        env=production_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '[true, true, "Lax", true, false]'


@pytest.mark.django_db
def test_portal_pages_carry_the_security_headers(cast: Cast, alices: Owned) -> None:
    response = cast.client("alice").get(f"/portal/jobs/{alices.job.pk}/")
    csp = response["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "'unsafe-inline'" not in csp
    assert "frame-ancestors 'none'" in csp and "object-src 'none'" in csp
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"


@pytest.mark.django_db
def test_the_session_cookie_is_httponly(db: None) -> None:
    from django.contrib.auth.models import User

    User.objects.create_user("dora@example.com", "dora@example.com", "a long enough passphrase 42")
    client = Client()
    client.post(
        "/accounts/login/", {"username": "dora@example.com", "password": "a long enough passphrase 42"}
    )
    cookie = client.cookies["sessionid"]
    assert cookie["httponly"] and cookie["samesite"] == "Lax"


def test_no_template_has_an_inline_script_or_handler() -> None:
    offenders = []
    pages = [
        p for folder in ("portal", "accounts", "registration") for p in (TEMPLATES / folder).rglob("*.html")
    ]
    assert pages
    for path in pages:
        text = path.read_text()
        if (
            re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text)
            or re.search(r"\son[a-z]+=", text)
            or "style=" in text
        ):
            offenders.append(str(path.relative_to(REPO)))
    assert offenders == []
