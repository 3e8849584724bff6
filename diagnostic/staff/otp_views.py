"""The second factor for staff (STAFF_REQUIRE_2FA), for the dashboard and the admin alike
(diagnostic.staff.access): a consultant without a TOTP device enrols one (the secret shown
once, as a key and an otpauth link for an authenticator app) and confirms it with a code;
afterwards each login asks for a code. django-otp throttles wrong codes per device.
Customers get 404 here, as on every staff page."""

from __future__ import annotations

from base64 import b32encode

from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django_otp import login as otp_login
from django_otp.plugins.otp_totp.models import TOTPDevice


def _next(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or "/staff/"
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return "/staff/"
    return target


def otp_verify(request: HttpRequest) -> HttpResponseBase:
    user = request.user
    if not user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if not (user.is_active and user.is_staff):
        raise Http404("no such page")
    confirmed = TOTPDevice.objects.filter(user=user, confirmed=True).first()
    device = confirmed or TOTPDevice.objects.filter(user=user, confirmed=False).first()
    if device is None:
        device = TOTPDevice.objects.create(user=user, name="authenticator", confirmed=False)
    error = ""
    if request.method == "POST":
        token = "".join(request.POST.get("token", "").split())
        if token.isdigit() and device.verify_token(token):
            if not device.confirmed:
                device.confirmed = True
                device.save(update_fields=["confirmed"])
            otp_login(request, device)
            return redirect(_next(request))
        error = "That code is not right (or too many tries: wait a minute). Use the current 6-digit code."
    context = {"enrolling": not device.confirmed, "error": error, "next": _next(request)}
    if not device.confirmed:
        context["secret"] = b32encode(device.bin_key).decode("ascii")
        context["otpauth"] = device.config_url
    status = 400 if error else 200
    response: HttpResponse = render(request, "staff/otp.html", context, status=status)
    return response
