"""Deployment checks of our own, run by `manage.py check --deploy` beside Django's.

A report, an invitation and a held-day notice go out from DEFAULT_FROM_EMAIL; the
development default (an address at localhost) cannot be answered and is refused by most
receiving servers, so a deployment must say which address its mail comes from (E001). It
must send them, too: with DEBUG off, email written to files under out/email is an error
(E002; the settings already refuse to start the web app and Celery that way, except on a
process only this machine can reach). Staff pages without the second factor
(STAFF_REQUIRE_2FA off) are a warning (W001), and so are throttles counted in each
process's own memory, with no shared cache (CACHE_URL unset: W002).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

DEVELOPMENT_SENDER_DOMAINS = ("localhost", "localhost.localdomain", "example.com", "example.org")


def sender_problem(address: str) -> str | None:
    """Why `address` cannot be the sender of customer mail, or None."""
    local, at, domain = address.rpartition("@")
    if not at or not local or not domain:
        return f"{address!r} is not an email address"
    domain = domain.strip().lower().rstrip(">")
    if domain in DEVELOPMENT_SENDER_DOMAINS or "." not in domain:
        return f"{address!r} is a development address that customers cannot answer"
    return None


@register(Tags.security, deploy=True)
def check_sender(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    problem = sender_problem(str(settings.DEFAULT_FROM_EMAIL))
    if problem is None:
        return []
    return [Error(f"DEFAULT_FROM_EMAIL: {problem}",
                  hint="set DEFAULT_FROM_EMAIL to the address reports and invitations come from, "
                       "e.g. DEFAULT_FROM_EMAIL=diagnostic@yourfirm.com",
                  id="diagnostic.E001")]


FILE_EMAIL = "django.core.mail.backends.filebased.EmailBackend"
LOCAL_CACHE = "django.core.cache.backends.locmem.LocMemCache"


@register(Tags.security, deploy=True)
def check_email_is_sent(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if settings.DEBUG or settings.EMAIL_BACKEND != FILE_EMAIL:
        return []
    return [Error(f"EMAIL_URL is not set: password resets, invitations and reports are written to "
                  f"files under {settings.EMAIL_FILE_PATH} instead of reaching anyone",
                  hint="set EMAIL_URL=smtp+tls://user:password@mail.example.com:587 (or EMAIL_HOST and the "
                       "EMAIL_* settings)",
                  id="diagnostic.E002")]


@register(Tags.security, deploy=True)
def check_second_factor(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if settings.STAFF_REQUIRE_2FA:
        return []
    return [Warning("STAFF_REQUIRE_2FA is off: a staff password alone opens the staff dashboard and the "
                    "admin",
                    hint="leave STAFF_REQUIRE_2FA unset (on with DEBUG off) or set STAFF_REQUIRE_2FA=true; "
                         "staff enrol through a one-time link (manage.py otp_enrol_link EMAIL for the first)",
                    id="diagnostic.W001")]


@register(Tags.security, deploy=True)
def check_shared_cache(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    backend = settings.CACHES.get("default", {}).get("BACKEND", "")
    if settings.DEBUG or backend != LOCAL_CACHE:
        return []
    return [Warning("CACHE_URL is not set: the password-reset throttle counts in each process's own memory, "
                    "so every web worker allows its own share",
                    hint="set CACHE_URL=redis://host:6379/1 (compose sets it)", id="diagnostic.W002")]
