"""Accounts: an invitation link works once and for seven days, sets the password and
signs the customer in; failed logins lock the account from that address (and an address
guessing many accounts) and say until when; password reset goes by email."""

from __future__ import annotations

import datetime as dt
import re
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user
from django.contrib.auth.models import User
from django.core import mail
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from diagnostic.accounts.models import Invitation
from diagnostic.bookings.models import Organisation

pytestmark = pytest.mark.django_db
PASSWORD = "a long enough passphrase 42"


@pytest.fixture(autouse=True)
def memory_mail(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


def invite(email: str = "carol@example.com", org: str = "Initech Labs") -> str:
    out = StringIO()
    call_command("invite", email, "--org", org, stdout=out, stderr=StringIO())
    return out.getvalue().strip()


def path_of(link: str) -> str:
    return re.sub(r"^https?://[^/]+", "", link)


def test_invite_prints_a_link_and_emails_it() -> None:
    link = invite()
    assert "/accounts/invite/" in link
    assert len(mail.outbox) == 1 and link in mail.outbox[0].body
    assert mail.outbox[0].to == ["carol@example.com"]
    assert Organisation.objects.filter(name="Initech Labs").exists()


def test_invite_refuses_a_bad_address() -> None:
    with pytest.raises(CommandError, match="not an email address"):
        invite("not-an-address")


def test_the_link_sets_a_password_signs_in_and_joins_the_organisation() -> None:
    client = Client()
    link = path_of(invite())
    assert "Initech Labs" in client.get(link).content.decode()
    response = client.post(link, {"password1": PASSWORD, "password2": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/portal/"
    user = get_user(client)
    assert user.is_authenticated and user.customer.organisation.name == "Initech Labs"  # type: ignore[union-attr]
    assert User.objects.get(username="carol@example.com").check_password(PASSWORD)


def test_the_link_works_once() -> None:
    link = path_of(invite())
    Client().post(link, {"password1": PASSWORD, "password2": PASSWORD})
    again = Client().post(link, {"password1": "another passphrase 77", "password2": "another passphrase 77"})
    assert again.status_code == 410
    assert "already used" in again.content.decode()
    assert User.objects.get(username="carol@example.com").check_password(PASSWORD)


def test_the_link_expires_after_seven_days() -> None:
    link = path_of(invite())
    Invitation.objects.update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert Client().get(link).status_code == 410


def test_a_weak_or_mismatched_password_is_shown_at_its_field() -> None:
    link = path_of(invite())
    response = Client().post(link, {"password1": "short", "password2": "short"})
    assert response.status_code == 200 and "too short" in response.content.decode()
    response = Client().post(link, {"password1": PASSWORD, "password2": PASSWORD + "x"})
    assert "the two passwords differ" in response.content.decode()
    assert not User.objects.filter(username="carol@example.com").exists()


def test_login_and_logout(settings: Any) -> None:
    link = path_of(invite())
    Client().post(link, {"password1": PASSWORD, "password2": PASSWORD})
    client = Client()
    assert "csrfmiddlewaretoken" in client.get("/accounts/login/").content.decode()
    response = client.post("/accounts/login/", {"username": "carol@example.com", "password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/accounts/home/"
    landing = client.get("/accounts/home/")
    assert landing.status_code == 302 and landing["Location"] == "/portal/"
    assert client.get("/portal/").status_code == 200
    client.post("/accounts/logout/")
    assert client.get("/portal/").status_code == 302


def test_repeated_failures_lock_the_account_from_that_address_and_say_until_when(settings: Any) -> None:
    link = path_of(invite())
    Client().post(link, {"password1": PASSWORD, "password2": PASSWORD})
    client = Client(REMOTE_ADDR="203.0.113.9")
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post("/accounts/login/", {"username": "carol@example.com", "password": "wrong"})
    locked = client.post("/accounts/login/", {"username": "carol@example.com", "password": PASSWORD})
    page = locked.content.decode()
    assert locked.status_code == 429
    assert "locked" in page and "It unlocks at" in page and "UTC" in page
    # The lock is on the account from that address: its owner, elsewhere, still signs in.
    elsewhere = Client(REMOTE_ADDR="198.51.100.7").post(
        "/accounts/login/", {"username": "carol@example.com", "password": PASSWORD}
    )
    assert elsewhere.status_code == 302


def test_password_reset_sends_a_working_link() -> None:
    link = path_of(invite())
    Client().post(link, {"password1": PASSWORD, "password2": PASSWORD})
    mail.outbox.clear()
    client = Client()
    client.post("/accounts/password-reset/", {"email": "carol@example.com"})
    assert len(mail.outbox) == 1
    reset = re.search(r"https?://[^/\s]+(/accounts/reset/\S+)", mail.outbox[0].body)
    assert reset is not None
    form = client.get(reset.group(1), follow=True)
    assert "Set a new password" in form.content.decode()
    done = client.post(
        form.redirect_chain[-1][0],
        {"new_password1": "brand new passphrase 9", "new_password2": "brand new passphrase 9"},
    )
    assert done.status_code == 302
    assert User.objects.get(username="carol@example.com").check_password("brand new passphrase 9")


def test_an_address_guessing_many_accounts_is_locked_too(settings: Any) -> None:
    link = path_of(invite())
    Client().post(link, {"password1": PASSWORD, "password2": PASSWORD})
    guesser = Client(REMOTE_ADDR="203.0.113.50")
    for n in range(settings.AXES_ADDRESS_FAILURE_LIMIT):
        guesser.post("/accounts/login/", {"username": f"someone{n}@example.com", "password": "wrong"})
    # Right account, right password, from the address that was guessing: still refused.
    locked = guesser.post("/accounts/login/", {"username": "carol@example.com", "password": PASSWORD})
    assert locked.status_code == 429
    # The account itself is not locked: from elsewhere it signs in.
    fine = Client(REMOTE_ADDR="198.51.100.8").post(
        "/accounts/login/", {"username": "carol@example.com", "password": PASSWORD}
    )
    assert fine.status_code == 302


def test_staff_land_on_the_dashboard_after_login() -> None:
    User.objects.create_user("consultant@lab.example", "consultant@lab.example", PASSWORD, is_staff=True)
    client = Client()
    client.post("/accounts/login/", {"username": "consultant@lab.example", "password": PASSWORD})
    landing = client.get("/accounts/home/")
    assert landing.status_code == 302 and landing["Location"] == "/staff/"
