"""Who may use the dashboard: staff accounts only (is_staff), through the portal's login
and its lockouts, with a TOTP code first when STAFF_REQUIRE_2FA is on. Looking is open
to every staff member; approving a report and deciding a refund need the `staff` group's
permissions (or a superuser).

A customer who opens a staff URL gets a 404, as the portal answers staff: the dashboard
neither confirms that a job or report exists nor that the page does, whatever the id.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest
from django.http.response import HttpResponseBase
from django.shortcuts import redirect
from django.urls import reverse

View = Callable[..., HttpResponseBase]

APPROVE = "jobs.approve_report"
REFUND = "jobs.decide_refund"


def is_verified(request: HttpRequest) -> bool:
    verified = getattr(request.user, "is_verified", None)
    return bool(verified()) if callable(verified) else False


def staff_required(view: View) -> View:
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        user = request.user
        if not user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not (user.is_active and user.is_staff):
            raise Http404("no such page")
        if settings.STAFF_REQUIRE_2FA and not is_verified(request):
            return redirect(f"{reverse('staff:otp')}?next={request.get_full_path()}")
        return view(request, *args, **kwargs)

    return wrapper


def staff_may(permission: str) -> Callable[[View], View]:
    """A staff view that acts: 403 for staff without `permission`."""

    def decorate(view: View) -> View:
        @staff_required
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not request.user.has_perm(permission):
                raise PermissionDenied(f"needs the {permission} permission (the staff group)")
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


def abilities(request: HttpRequest) -> dict[str, bool]:
    return {"may_approve": request.user.has_perm(APPROVE), "may_refund": request.user.has_perm(REFUND)}
