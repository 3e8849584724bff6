"""docker-compose.yml holds no secret and opens nothing to the network: read with PyYAML
(no Docker engine runs here), its stack publishes the web app on loopback only, takes
the Django key and the database password from the environment with no fallback, keeps
cookies HTTPS-only, and the settings it gives the app pass `check --deploy`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
SECRETS = ("SECRET_KEY", "POSTGRES_PASSWORD")
# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?message}, ${NAME?message}
INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Z_][A-Z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def interpolate(text: str, env: dict[str, str]) -> str:
    """The value as compose would see it with `env` as .env: a required variable that is
    missing is an error, as it is for compose."""
    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"] or "", match["arg"] or ""
        value = env.get(name)
        if op.endswith("?") and not value:
            raise LookupError(f"{name}: {arg}")
        if op.endswith("-") and not value:
            return arg
        return value or ""

    return INTERPOLATION.sub(one, text)


def app_environment(compose: dict[str, Any], service: str) -> dict[str, str]:
    return {k: str(v) for k, v in compose["services"][service]["environment"].items()}


def test_it_runs_the_whole_platform(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", "redis", "migrate", "web", "labsim", "worker", "beat"}


def test_only_the_web_app_is_published_and_only_on_loopback(compose: dict[str, Any]) -> None:
    published = {name: svc.get("ports", []) for name, svc in compose["services"].items() if svc.get("ports")}
    assert set(published) == {"web"}
    for port in published["web"]:
        text = interpolate(str(port), {})
        assert text.startswith("127.0.0.1:"), f"web publishes {port!r} beyond this host"
        assert text == "127.0.0.1:8000:8000"
        assert interpolate(str(port), {"WEB_PORT": "9000"}) == "127.0.0.1:9000:8000"


def test_secrets_come_from_the_environment_with_no_fallback(compose: dict[str, Any]) -> None:
    text = COMPOSE_FILE.read_text()
    for match in INTERPOLATION.finditer(text):
        if match["name"] in SECRETS:
            assert match["op"] == ":?", f"{match[0]} must be required, with no default"
    postgres = compose["services"]["postgres"]["environment"]
    for service in ("web", "worker", "beat", "migrate", "labsim"):
        env = app_environment(compose, service)
        assert env["SECRET_KEY"].startswith("${SECRET_KEY:?")
        assert "${POSTGRES_PASSWORD:?" in env["DATABASE_URL"]
    assert postgres["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    # Each missing secret stops compose, naming it and pointing at the header.
    for name in SECRETS:
        given = {n: "s3cret-value" for n in SECRETS if n != name}
        with pytest.raises(LookupError, match=rf"{name}: set {name} in \.env \(see the comment at the top\)"):
            interpolate(app_environment(compose, "web")["SECRET_KEY"] + app_environment(
                compose, "web")["DATABASE_URL"], given)
    # The header says how to make them.
    header = text.split("\nx-app-env", 1)[0]
    assert "secrets.token_urlsafe" in header
    assert all(f"{name}=" in header for name in SECRETS)


def test_no_literal_password_or_key_is_written_anywhere(compose: dict[str, Any]) -> None:
    def required(value: str) -> bool:
        match = INTERPOLATION.fullmatch(value)
        return match is not None and match["op"] == ":?"

    seen_urls: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}")
                if re.search(r"PASSWORD|SECRET|_KEY$", str(key)) and isinstance(value, str):
                    assert required(value), f"{path}.{key} is not a required variable: {value!r}"
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")
        elif isinstance(node, str):
            # Each required variable stands as one word, so a URL around it stays one.
            marked = INTERPOLATION.sub(
                lambda m: f"REQUIRED-{m['name']}" if m["op"] == ":?" else m[0].replace(" ", "_"), node)
            for url in re.findall(r"[a-z]+://[^\s\"']+", marked):
                userinfo = url.split("://", 1)[1].rsplit("@", 1)[0] if "@" in url else ""
                seen_urls.append(url)
                if ":" in userinfo:
                    password = userinfo.split(":", 1)[1]
                    assert re.fullmatch(r"REQUIRED-[A-Z_0-9]+", password), (
                        f"{path} has a password in a URL: {url}")

    walk(compose, "compose")
    assert any(u.startswith("postgres://diagnostic:REQUIRED-POSTGRES_PASSWORD@postgres") for u in seen_urls)


def test_the_app_runs_as_production_with_https_only_cookies(compose: dict[str, Any]) -> None:
    for service in ("web", "worker", "beat", "migrate", "labsim"):
        env = app_environment(compose, service)
        assert env["DEBUG"] == "false"
        for name in ("SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_SSL_REDIRECT",
                     "SECURE_HSTS_SECONDS"):
            # Either the settings' default (on with DEBUG off) or said to be on; never
            # something a .env could turn off.
            assert name not in env or env[name] == "true", f"{service} sets {name}={env[name]}"


def test_the_settings_compose_gives_pass_check_deploy(compose: dict[str, Any], tmp_path: Path) -> None:
    dot_env = {"SECRET_KEY": "Zt8-qL3v_Xw9NcR2yB7mKdH5sJ1gA4uE6fV0oPiT-lQ8rWz_YxCnMeBhGaSdFjKoU",
               "POSTGRES_PASSWORD": "Hq2_Vn8-Lw4xTz7KbRm1", "DEFAULT_FROM_EMAIL": "diagnostic@lab-firm.net",
               "EMAIL_URL": "smtp+tls://diagnostic:Mq7_Ws2-Pz@mail.lab-firm.net:587"}
    env = {k: interpolate(v, dot_env) for k, v in app_environment(compose, "web").items()}
    assert env["DATABASE_URL"] == "postgres://diagnostic:Hq2_Vn8-Lw4xTz7KbRm1@postgres:5432/diagnostic"
    # DJANGO_ALLOW_ASYNC_UNSAFE: set for the browser tier in this process; never in a deployment.
    dropped = ("DEBUG", "DIAG_DB", "DJANGO_ALLOW_ASYNC_UNSAFE")
    base = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith(
        ("SECURE_", "SESSION_", "CSRF_", "DATABASE_", "CELERY_", "EMAIL_"))}
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO, env={**base, **env, "DIAG_OUT_DIR": str(tmp_path / "out")},
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_the_sender_address_is_required_and_a_localhost_one_fails_check_deploy(
        compose: dict[str, Any], tmp_path: Path) -> None:
    """Customers' mail comes from an address the deployment names: compose stops without
    one, and `check --deploy` refuses the development default."""
    for service in ("web", "worker", "beat"):
        with pytest.raises(LookupError, match=r"DEFAULT_FROM_EMAIL: set DEFAULT_FROM_EMAIL in \.env"):
            interpolate(app_environment(compose, service)["DEFAULT_FROM_EMAIL"], {})
    assert "DEFAULT_FROM_EMAIL=" in COMPOSE_FILE.read_text().split("\nx-app-env", 1)[0]
    dropped = ("DEBUG", "DIAG_DB", "DJANGO_ALLOW_ASYNC_UNSAFE", "DATABASE_URL")
    base = {k: v for k, v in os.environ.items() if k not in dropped}
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=REPO, env={**base, "DEBUG": "0",
                       "SECRET_KEY": "Zt8-qL3v_Xw9NcR2yB7mKdH5sJ1gA4uE6fV0oPiT-lQ8rWz_YxCnMeBhGaSdFjKoU",
                       "DEFAULT_FROM_EMAIL": "diagnostic@localhost", "DIAG_OUT_DIR": str(tmp_path / "out"),
                       "EMAIL_URL": "smtp://mail.lab-firm.net:25"},
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode != 0
    assert "diagnostic.E001" in done.stderr and "DEFAULT_FROM_EMAIL: 'diagnostic@localhost'" in done.stderr


def test_the_mail_server_is_required_and_behind_the_proxy_logins_count_per_client(
        compose: dict[str, Any]) -> None:
    """Issue 36: compose started with no mail server (its email went to files), and every
    client behind the TLS proxy shared the proxy's address for the login lockouts. Now
    EMAIL_URL is required, the app is told of its one proxy (AXES_IPWARE_PROXY_COUNT=1),
    the header tells the proxy to set X-Forwarded-For, and the throttles share Redis."""
    header = COMPOSE_FILE.read_text().split("\nx-app-env", 1)[0]
    assert "EMAIL_URL=" in header
    assert "X-Forwarded-For" in header and "AXES_IPWARE_PROXY_COUNT=1" in header
    assert "otp_enrol_link" in header
    for service in ("web", "worker", "beat", "migrate", "labsim"):
        env = app_environment(compose, service)
        with pytest.raises(LookupError, match=r"EMAIL_URL: set EMAIL_URL in \.env"):
            interpolate(env["EMAIL_URL"], {})
        assert env["AXES_IPWARE_PROXY_COUNT"] == "1"
        assert env["CACHE_URL"].startswith("redis://redis:6379/")
        assert env["CACHE_URL"] != env["CELERY_BROKER_URL"]
        # The second factor is left to the settings' default (on with DEBUG off).
        assert "STAFF_REQUIRE_2FA" not in env
