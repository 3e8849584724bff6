"""Failed logins lock an account *from one address*, and an address that fails against many
accounts, never an account for everyone.

django-axes counts failures per lockout parameter set (AXES_LOCKOUT_PARAMETERS):

- ("username", "ip_address"): AXES_FAILURE_LIMIT failures against one account from one
  client lock that client out of that account. The account's owner, elsewhere, still signs
  in; failures from five addresses lock none of them, nor a sixth.
- "ip_address": AXES_ADDRESS_FAILURE_LIMIT failures from one client, whatever the accounts,
  lock that client out of every account, so one address cannot try a password on many
  accounts. It is larger: people behind one office's address share it.

axes compares every set's count with the one AXES_FAILURE_LIMIT; this handler scales the
address's count so that it reaches that limit exactly at AXES_ADDRESS_FAILURE_LIMIT. A
successful login clears the failures of that account from that address only, so signing in
to an account of one's own does not wipe the count of an address that was guessing others.
The client's address is diagnostic.accounts.clientip's (the real one behind the proxy).
"""

from __future__ import annotations

from typing import Any

from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username, get_failure_limit, get_lockout_parameters
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import QuerySet, Sum
from django.http import HttpRequest

ACCOUNT_AND_ADDRESS = ["username", "ip_address"]
ADDRESS = "ip_address"
LOCKOUT_PARAMETERS: list[str | list[str]] = [ACCOUNT_AND_ADDRESS, ADDRESS]


def address_limit() -> int:
    return int(getattr(settings, "AXES_ADDRESS_FAILURE_LIMIT", 20))


def _failures(attempts: QuerySet[AccessAttempt]) -> int:
    return int(attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0)


class AccountAndAddressHandler(AxesDatabaseHandler):
    def get_failures(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        limit = get_failure_limit(request, credentials)
        counts = []
        for parameters, attempts in zip(get_lockout_parameters(request, credentials),
                                        self.get_user_attempts(request, credentials), strict=True):
            failures = _failures(attempts)
            if parameters == ADDRESS:
                # Reaches `limit` exactly when the address has failed address_limit() times.
                failures = failures * limit // max(1, address_limit())
            counts.append(failures)
        return max(counts, default=0)

    def reset_user_attempts(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        """After a successful login: that account's failures from that address, no more."""
        username = get_client_username(request, credentials)
        deleted, _ = AccessAttempt.objects.filter(
            username=username, ip_address=request.axes_ip_address  # type: ignore[attr-defined]
        ).delete()
        return int(deleted)
