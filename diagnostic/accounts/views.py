"""Account pages beyond Django's own login/logout: accepting an invitation (set a password
for a new account, or, for an existing account, its signed-in owner confirms joining), the
password reset by email with its throttle, and the page a locked-out login gets."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from axes.helpers import get_cool_off, get_failure_limit
from axes.models import AccessAttempt
from django import forms
from django.conf import settings
from django.contrib.auth import login, password_validation
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import redirect_to_login
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from diagnostic.accounts import backends
from diagnostic.accounts.clientip import client_address
from diagnostic.accounts.invitations import (
    AccountExists,
    InvitationUnusable,
    accept,
    check_account,
    find_usable,
    join,
)
from diagnostic.accounts.models import Invitation
from diagnostic.accounts.throttle import allow, retry_after_s

log = logging.getLogger(__name__)


class EmailAuthenticationForm(AuthenticationForm):
    """Django's login form; customers sign in with their email address."""

    username = forms.CharField(
        label="Email", widget=forms.EmailInput(attrs={"autofocus": True, "autocomplete": "email"})
    )
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Django's own message names the model's "username"; the field asks for an email.
        self.error_messages = {
            **self.error_messages,
            "invalid_login": "That email and password do not match an account; check both (the "
                             "password is case-sensitive) or reset the password.",
        }


class SetPasswordForm(forms.Form):
    password1 = forms.CharField(
        label="Password",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text=password_validation.password_validators_help_text_html(),
    )
    password2 = forms.CharField(
        label="Password again",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )

    def __init__(self, *args: Any, email: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.email = email

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        first, second = data.get("password1"), data.get("password2")
        if first and second and first != second:
            self.add_error("password2", "the two passwords differ")
        elif first:
            from django.contrib.auth.models import User

            probe = User(username=self.email, email=self.email)
            try:
                password_validation.validate_password(first, probe)
            except forms.ValidationError as exc:
                self.add_error("password1", exc)
        return data


class ThrottledPasswordResetView(auth_views.PasswordResetView):
    """Django's reset by email, counted per client address and per email address typed in a
    small fixed window (PASSWORD_RESET_WINDOW_S): past either limit the page says to try
    again later (429, Retry-After) and sends nothing. Unknown addresses count as known ones
    do, so neither the answer nor the throttle tells whether an address has an account."""

    def form_valid(self, form: Any) -> HttpResponse:
        window = settings.PASSWORD_RESET_WINDOW_S
        address = client_address(self.request) or "unknown"
        email = str(form.cleaned_data.get("email", "")).strip().lower()
        by_address = allow("reset-address", address, limit=settings.PASSWORD_RESET_LIMIT_PER_ADDRESS,
                           window_s=window)
        if by_address and allow("reset-account", email, limit=settings.PASSWORD_RESET_LIMIT_PER_ACCOUNT,
                                window_s=window):
            response: HttpResponse = super().form_valid(form)
            return response
        wait_s = retry_after_s(window)
        log.warning("password reset throttled", extra={"client": address})
        context = self.get_context_data(form=form, throttled=True, retry_minutes=max(1, -(-wait_s // 60)))
        throttled: HttpResponse = self.render_to_response(context, status=429)
        throttled["Retry-After"] = str(wait_s)
        return throttled


@require_http_methods(["GET", "POST"])
@login_required
def landing(request: HttpRequest) -> HttpResponse:
    """Where a login without a `next` link lands: consultants on the dashboard, customers
    on their bookings (staff have no portal and customers no dashboard)."""
    return redirect("/staff/" if request.user.is_staff else "/portal/")


def _unusable(request: HttpRequest, exc: InvitationUnusable) -> HttpResponse:
    return render(request, "accounts/invite_unusable.html", {"reason": str(exc)}, status=410)


def _refused(request: HttpRequest, reason: str) -> HttpResponse:
    """The invitation may not touch the address's account: said, 409, nothing changed."""
    return render(request, "accounts/invite_refused.html", {"reason": reason}, status=409)


@require_http_methods(["GET", "POST"])
def accept_invite(request: HttpRequest, token: str) -> HttpResponse:
    """A new address sets its password here; an existing account never does (it is not
    taken over): the only one an invitation may join, its owner joins signed in."""
    try:
        invitation = find_usable(token)
        account = check_account(invitation)
    except InvitationUnusable as exc:
        return _unusable(request, exc)
    except AccountExists as exc:
        return _refused(request, exc.public)
    if account is not None:
        return _join_existing(request, token, invitation, account)
    form = SetPasswordForm(request.POST or None, email=invitation.email)
    if request.method == "POST" and form.is_valid():
        try:
            user = accept(token=token, password=form.cleaned_data["password1"])
        except InvitationUnusable as exc:
            return _unusable(request, exc)
        except AccountExists as exc:
            return _refused(request, exc.public)
        login(request, user, backend=backends.PATH)
        return redirect("portal:bookings")
    return render(request, "accounts/accept_invite.html", {"form": form, "invitation": invitation})


def _join_existing(request: HttpRequest, token: str, invitation: Invitation, account: Any) -> HttpResponse:
    """The address has an account that belongs to no organisation: its owner signs in with
    that account's own password, then confirms joining (a POST), which is logged."""
    user = request.user
    if not user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if user.pk != account.pk:
        return _refused(request, (
            f"This invitation is for {invitation.email}, and you are signed in as another account. "
            f"Log out, then sign in as {invitation.email} to join {invitation.organisation.name}."))
    if request.method == "POST":
        try:
            join(token=token, user=user)
        except InvitationUnusable as exc:
            return _unusable(request, exc)
        except AccountExists as exc:
            return _refused(request, exc.public)
        return redirect("portal:bookings")
    return render(request, "accounts/join_invite.html", {"invitation": invitation})


def unlocks_at(request: HttpRequest, username: str) -> dt.datetime | None:
    """When the lockout of this account from this address (or of the address) ends: the
    cool-off after the last failure that counts towards it."""
    cool_off = get_cool_off(request)
    if not cool_off:
        return None
    address = client_address(request)
    from_address = AccessAttempt.objects.filter(ip_address=address)
    pair = from_address.filter(username=username)
    pair_failures = pair.aggregate(total=Sum("failures_since_start"))["total"] or 0
    locking = pair if pair_failures >= get_failure_limit(request, {"username": username}) else from_address
    last = locking.order_by("-attempt_time").values_list("attempt_time", flat=True).first()
    return (last or timezone.now()) + cool_off


def locked_out(
    request: HttpRequest, response: Any = None, credentials: dict[str, Any] | None = None
) -> HttpResponse:
    """django-axes' lockout answer: say the account is locked and until when."""
    username = (credentials or {}).get("username") or request.POST.get("username", "")
    context = {"username": username, "unlocks_at": unlocks_at(request, username)}
    return render(request, "accounts/locked.html", context, status=429)
