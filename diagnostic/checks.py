"""Deployment checks of our own, run by `manage.py check --deploy` beside Django's.

A report, an invitation and a held-day notice go out from DEFAULT_FROM_EMAIL; the
development default (an address at localhost) cannot be answered and is refused by most
receiving servers, so a deployment must say which address its mail comes from.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, register

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
