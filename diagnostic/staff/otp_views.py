"""The second factor for staff (STAFF_REQUIRE_2FA), for the dashboard and the admin alike
(diagnostic.staff.access). Each login asks for the code of the account's authenticator
(/staff/2fa/); django-otp throttles wrong codes per device.

An account without an authenticator is told to ask for an enrolment link, and shown no
secret: a password alone never enrols a device. The link (/staff/2fa/enrol/<token>/,
diagnostic.staff.enrolment) shows the new authenticator's secret to the account it was
issued for, signed in, and the first right code confirms it and uses the link. Members of
the staff group issue links for their colleagues at /staff/2fa/links/.

Customers get 404 here, as on every staff page.
"""

from __future__ import annotations

from base64 import b32encode
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods
from django_otp import login as otp_login
from django_otp.plugins.otp_totp.models import TOTPDevice

from diagnostic.staff import enrolment
from diagnostic.staff.access import staff_group_required

WRONG_CODE = "That code is not right (or too many tries: wait a minute). Use the current 6-digit code."


def _next(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or "/staff/"
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return "/staff/"
    return target


def _code(request: HttpRequest) -> str:
    return "".join(request.POST.get("token", "").split())


def _signed_in_staff(request: HttpRequest) -> HttpResponseBase | None:
    """The login page for anyone not signed in, 404 for anyone who is not staff, else None."""
    user = request.user
    if not user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if not (user.is_active and user.is_staff):
        raise Http404("no such page")
    return None


@never_cache
@require_http_methods(["GET", "POST"])
def otp_verify(request: HttpRequest) -> HttpResponseBase:
    away = _signed_in_staff(request)
    if away is not None:
        return away
    device = TOTPDevice.objects.filter(user=request.user, confirmed=True).first()
    if device is None:
        # No authenticator yet: no secret is offered on a password alone.
        status = 400 if request.method == "POST" else 200
        return render(request, "staff/otp_no_device.html", {"hours": settings.STAFF_OTP_ENROL_LINK_HOURS},
                      status=status)
    error = ""
    if request.method == "POST":
        token = _code(request)
        if token.isdigit() and device.verify_token(token):
            otp_login(request, device)
            return redirect(_next(request))
        error = WRONG_CODE
    context = {"error": error, "next": _next(request)}
    return render(request, "staff/otp.html", context, status=400 if error else 200)


@never_cache
@require_http_methods(["GET", "POST"])
def otp_enrol(request: HttpRequest, token: str) -> HttpResponseBase:
    """The enrolment link: the new authenticator's secret for the account it was issued
    for, signed in; the first right code confirms it and uses the link."""
    away = _signed_in_staff(request)
    if away is not None:
        return away
    try:
        link = enrolment.usable_link(token, request.user)
    except enrolment.EnrolmentRefused as exc:
        status = 403 if str(exc) == enrolment.OTHER_ACCOUNT else 410
        return render(request, "staff/otp_enrol_refused.html", {"reason": str(exc)}, status=status)
    device = enrolment.offered_device(link)
    error = ""
    if request.method == "POST":
        code = _code(request)
        if code.isdigit() and device.verify_token(code):
            try:
                enrolment.confirm(link, device)
            except enrolment.EnrolmentRefused as exc:
                return render(request, "staff/otp_enrol_refused.html", {"reason": str(exc)}, status=410)
            device.refresh_from_db()
            otp_login(request, device)
            return redirect(_next(request))
        error = WRONG_CODE
    context: dict[str, Any] = {
        "error": error, "next": _next(request), "expires_at": link.expires_at,
        "secret": b32encode(device.bin_key).decode("ascii"), "otpauth": device.config_url,
    }
    return render(request, "staff/otp_enrol.html", context, status=400 if error else 200)


@never_cache
@staff_group_required
@require_http_methods(["GET", "POST"])
def otp_links(request: HttpRequest) -> HttpResponse:
    """Issue a colleague's enrolment link (staff group, through the door): shown once here,
    to hand over in person or by a channel other than their email."""
    context: dict[str, Any] = {"account": "", "error": "", "issued": None,
                               "hours": settings.STAFF_OTP_ENROL_LINK_HOURS}
    status = 200
    if request.method == "POST":
        account = request.POST.get("account", "").strip()
        context["account"] = account
        try:
            user = enrolment.staff_account(account)
            link, url = enrolment.issue(user=user, issued_by=request.user)
        except enrolment.EnrolmentRefused as exc:
            context["error"] = str(exc)
            status = 400
        else:
            context["issued"] = {"user": user, "url": url, "expires_at": link.expires_at}
            context["account"] = ""
    return render(request, "staff/otp_links.html", context, status=status)
