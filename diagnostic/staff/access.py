"""One door for staff. The dashboard (/staff/) and the Django admin (/admin/) let in
active staff accounts only, signed in through the site's login (/accounts/login/, with
django-axes' lockouts) and, with STAFF_REQUIRE_2FA on, holding a TOTP code verified in
this session (django-otp; /staff/2fa/ asks for it, or enrols a first device). The admin's
own password form is no second door: it sends everyone to that same login and code
(StaffAdminSite).

Looking is open to every staff member. Changing what a customer receives is the `staff`
group's (and superusers'): editing findings, rendering a version, and the job actions
(cancel, retry, re-run or move a held day, write the report again); approving a report and
deciding a refund need the group's two permissions. Staff without the group look only:
the pages offer them no such button, and the requests are refused with 403.

A customer who opens a staff or admin URL gets a 404, as the portal answers staff: the
dashboard neither confirms that a job or report exists nor that the page does, whatever
the id.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import update_wrapper, wraps
from typing import Any, TypeVar, cast
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import ObjectDoesNotExist
from django.http import Http404, HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.utils.http import url_has_allowed_host_and_scheme

from diagnostic.staff.apps import STAFF_GROUP

View = Callable[..., HttpResponseBase]
AdminView = TypeVar("AdminView", bound=Callable[..., HttpResponseBase])

APPROVE = "jobs.approve_report"
REFUND = "jobs.decide_refund"
# What staff without the group are told when they try to change what a customer receives.
GROUP_WORK = ("Editing findings, rendering report versions and the job actions (cancel, retry, re-run or "
              "move a held day, write the report again)")


def is_verified(request: HttpRequest) -> bool:
    verified = getattr(request.user, "is_verified", None)
    return bool(verified()) if callable(verified) else False


def through_door(request: HttpRequest) -> bool:
    """An active staff account, signed in, with its second factor when one is required."""
    user = request.user
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return False
    return not settings.STAFF_REQUIRE_2FA or is_verified(request)


def turned_away(request: HttpRequest, target: str | None = None) -> HttpResponse:
    """The answer to a request that is not through the door: the login page, the second
    factor's page (then `target`, by default the page asked for), or 404 for anyone signed
    in who is not staff."""
    target = target or request.get_full_path()
    user = request.user
    if not user.is_authenticated:
        return redirect_to_login(target)
    if not (user.is_active and user.is_staff):
        raise Http404("no such page")
    return redirect(f"{reverse('staff:otp')}?{urlencode({REDIRECT_FIELD_NAME: target})}")


def staff_required(view: View) -> View:
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not through_door(request):
            return turned_away(request)
        return view(request, *args, **kwargs)

    return wrapper


def in_staff_group(user: Any) -> bool:
    """A member of the `staff` group, or a superuser (asked once per request)."""
    if not (user.is_active and user.is_staff):
        return False
    if user.is_superuser:
        return True
    known = getattr(user, "_in_staff_group", None)
    if known is None:
        known = user.groups.filter(name=STAFF_GROUP).exists()
        user._in_staff_group = known
    return bool(known)


def refused(request: HttpRequest, what: str) -> HttpResponse:
    """403, saying what needs the group (a page, not Django's bare refusal)."""
    response: HttpResponse = render(request, "staff/forbidden.html", {"what": what}, status=403)
    return response


def staff_group_required(view: View) -> View:
    """A staff view that changes what a customer receives: 403 for staff without the group."""

    @staff_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not in_staff_group(request.user):
            return refused(request, GROUP_WORK)
        return view(request, *args, **kwargs)

    return wrapper


def staff_may(permission: str) -> Callable[[View], View]:
    """A staff view that acts: 403 for staff without `permission`."""

    def decorate(view: View) -> View:
        @staff_required
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not request.user.has_perm(permission):
                what = "Approving a report" if permission == APPROVE else "Deciding a refund"
                return refused(request, what)
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


def abilities(request: HttpRequest) -> dict[str, bool]:
    return {"may_approve": request.user.has_perm(APPROVE), "may_refund": request.user.has_perm(REFUND),
            "may_act": in_staff_group(request.user)}


class StaffAdminSite(admin.AdminSite):
    """The Django admin behind the staff door. Every admin view answers a request that is
    not through the door as the dashboard does (login page, second factor, 404), and the
    admin's login form is no second door: it checks no password, it sends to the site's
    login (or to the second factor) and back."""

    def has_permission(self, request: HttpRequest) -> bool:
        return through_door(request)

    def admin_view(self, view: AdminView, cacheable: bool = False) -> AdminView:
        inner = super().admin_view(view, cacheable)

        def door(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not through_door(request):
                response = turned_away(request)
                add_never_cache_headers(response)
                return response
            try:
                return inner(request, *args, **kwargs)
            except ObjectDoesNotExist:
                # django-otp's device config and QR views look a device up with .get(): a
                # device that is not there is a 404, not a 500.
                raise Http404("no such object") from None

        return cast(AdminView, update_wrapper(door, inner))

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        target = request.GET.get(REDIRECT_FIELD_NAME, "")
        if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                               require_https=request.is_secure()):
            target = reverse("admin:index", current_app=self.name)
        response = redirect(target) if through_door(request) else turned_away(request, target)
        add_never_cache_headers(response)
        return response

    @classmethod
    def serving(cls, site: admin.AdminSite) -> StaffAdminSite:
        """A door site with every model `site` has registered (the admin modules register on
        Django's default site; only this one is served, at /admin/)."""
        door = cls(name=site.name)
        for model, model_admin in site._registry.items():
            door.register(model, type(model_admin))
        door._actions = dict(site._actions)
        door._global_actions = dict(site._global_actions)
        return door
