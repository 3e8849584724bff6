"""A liveness check for load balancers and docker-compose: the process answers and the
database accepts a query.

Anyone may call it, so a failure says only which part is down; the database's own words
(host names, user names, versions) go to the log for the operator.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse

log = logging.getLogger(__name__)


def healthz(request: HttpRequest) -> JsonResponse:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        log.error("health check: the database refused a query", extra={"error": str(exc)})
        return JsonResponse({"ok": False, "database": "unavailable"}, status=503)
    return JsonResponse({"ok": True})
