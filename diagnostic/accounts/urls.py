"""Account URLs under /accounts/: Django's login, logout and password reset with our
templates and email login form (the reset throttled per address and per account), and the
invitation link."""

from __future__ import annotations

from django.contrib.auth import views as auth
from django.urls import path, reverse_lazy

from diagnostic.accounts.views import (
    EmailAuthenticationForm,
    ThrottledPasswordResetView,
    accept_invite,
    landing,
)

app_name = "accounts"

urlpatterns = [
    path(
        "login/",
        # Without a `next` link, staff land on the dashboard and customers on the portal.
        auth.LoginView.as_view(authentication_form=EmailAuthenticationForm, redirect_authenticated_user=True,
                               next_page=reverse_lazy("accounts:landing")),
        name="login",
    ),
    path("logout/", auth.LogoutView.as_view(), name="logout"),
    path(
        "password-reset/",
        ThrottledPasswordResetView.as_view(success_url=reverse_lazy("accounts:password_reset_done")),
        name="password_reset",
    ),
    path("password-reset/sent/", auth.PasswordResetDoneView.as_view(), name="password_reset_done"),
    path(
        "reset/<uidb64>/<token>/",
        auth.PasswordResetConfirmView.as_view(success_url=reverse_lazy("accounts:password_reset_complete")),
        name="password_reset_confirm",
    ),
    path("reset/done/", auth.PasswordResetCompleteView.as_view(), name="password_reset_complete"),
    path("invite/<str:token>/", accept_invite, name="accept-invite"),
    path("home/", landing, name="landing"),
]
