"""Account pages beyond Django's own login/logout/reset: accepting an invitation (set a
password for a new account, or, for an existing account, its signed-in owner confirms
joining) and the page a locked-out login gets."""

from __future__ import annotations

import datetime as dt
from typing import Any

from axes.helpers import get_cool_off
from axes.models import AccessAttempt
from django import forms
from django.contrib.auth import login, password_validation
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import redirect_to_login
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from diagnostic.accounts import backends
from diagnostic.accounts.invitations import (
    AccountExists,
    InvitationUnusable,
    accept,
    check_account,
    find_usable,
    join,
)
from diagnostic.accounts.models import Invitation


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
    """When the lockout of this account or address ends: the cool-off after the last failure."""
    cool_off = get_cool_off(request)
    if not cool_off:
        return None
    address = request.META.get("REMOTE_ADDR", "")
    last = (
        AccessAttempt.objects.filter(Q(username=username) | Q(ip_address=address))
        .order_by("-attempt_time")
        .values_list("attempt_time", flat=True)
        .first()
    )
    return (last or timezone.now()) + cool_off


def locked_out(
    request: HttpRequest, response: Any = None, credentials: dict[str, Any] | None = None
) -> HttpResponse:
    """django-axes' lockout answer: say the account is locked and until when."""
    username = (credentials or {}).get("username") or request.POST.get("username", "")
    context = {"username": username, "unlocks_at": unlocks_at(request, username)}
    return render(request, "accounts/locked.html", context, status=429)
