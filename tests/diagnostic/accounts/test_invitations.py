"""Invitations create accounts, never take one over. Each attack as it was found or could
be tried: `manage.py invite` for an address that already has an account (the superuser,
staff, another organisation's customer, a member, a deactivated account; by username or
by email, whatever the case) is refused and makes nothing; an invitation whose address
got an account afterwards (or one written straight into the database) is refused at the
link, which then sets no password, signs nobody in and joins nothing. An existing account
of no organisation joins only by its owner's explicit, logged act, signed in as it."""

from __future__ import annotations

import re
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import SESSION_KEY
from django.contrib.auth.models import User
from django.core import mail
from django.core.management import CommandError, call_command
from django.test import Client

from diagnostic.accounts.models import Invitation
from diagnostic.bookings.models import Customer, Organisation
from tests.diagnostic.conftest import Cast, logged_in

pytestmark = pytest.mark.django_db
PASSWORD = "a long enough passphrase 42"
NEW_PASSWORD = "the attacker's passphrase 77"


@pytest.fixture(autouse=True)
def fast_and_local(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # only for speed


def invite(email: str, org: str = "Acme Inference") -> tuple[str, str]:
    """The command's link (stdout) and what it said (stderr)."""
    out, err = StringIO(), StringIO()
    call_command("invite", email, "--org", org, stdout=out, stderr=err)
    return re.sub(r"^https?://[^/]+", "", out.getvalue().strip()), err.getvalue()


def untouched(user: User) -> tuple[object, ...]:
    user.refresh_from_db()
    return (user.password, user.is_active, user.is_staff, user.is_superuser, user.email,
            Customer.objects.filter(user=user).values_list("organisation_id", flat=True).first())


@pytest.mark.parametrize("address", ["root@lab.example", "ROOT@Lab.Example", " root@lab.example "])
def test_inviting_the_superusers_address_is_refused(cast: Cast, address: str) -> None:
    """The attack as found: `manage.py invite root@lab.example --org "Acme Inference"`."""
    root = User.objects.create_superuser("root@lab.example", "root@lab.example", PASSWORD)
    before = untouched(root)
    with pytest.raises(CommandError, match="already has a staff account; an invitation only creates new"):
        invite(address)
    assert not Invitation.objects.exists() and mail.outbox == []
    assert untouched(root) == before


@pytest.mark.parametrize("who", ["superuser named root", "staff", "other organisation", "member",
                                 "deactivated"])
def test_an_address_with_an_account_is_refused_by_username_or_email(cast: Cast, who: str) -> None:
    address = "dana@example.com"
    if who == "superuser named root":  # the address is only the account's email
        user = User.objects.create_superuser("root", "Dana@Example.com", PASSWORD)
        said = "staff account"
    elif who == "staff":
        user = User.objects.create_user("DANA@example.com", password=PASSWORD, is_staff=True)
        said = "staff account"
    elif who == "other organisation":
        user = User.objects.create_user("dana", "dana@EXAMPLE.com", PASSWORD)
        Customer.objects.create(user=user, organisation=cast.organisation_b)
        said = "already has an account in Globex Serving; a user has one organisation"
    elif who == "member":
        user = User.objects.create_user(address, address, PASSWORD)
        Customer.objects.create(user=user, organisation=cast.organisation_a)
        said = "already has an account in Acme Inference; its owner signs in"
    else:
        user = User.objects.create_user(address, address, PASSWORD, is_active=False)
        said = "deactivated account"
    before = untouched(user)
    with pytest.raises(CommandError, match=re.escape(said)):
        invite(address)
    # A new organisation named in a refused invitation is not left behind either.
    with pytest.raises(CommandError, match=re.escape("not invited")):
        invite(address, org="Brand New Org")
    assert not Organisation.objects.filter(name="Brand New Org").exists()
    assert not Invitation.objects.exists() and mail.outbox == []
    assert untouched(user) == before


def test_an_account_made_after_the_invitation_is_refused_at_the_link(cast: Cast) -> None:
    """The invitation was fine when made; the address got a staff account since. Its link
    sets no password, signs nobody in, attaches no customer row."""
    link, _ = invite("erin@example.com")
    erin = User.objects.create_user("erin", "Erin@Example.com", PASSWORD, is_staff=True)
    before = untouched(erin)
    visitor = Client()
    page = visitor.get(link)
    assert page.status_code == 409 and "an invitation only creates new accounts" in page.content.decode()
    posted = visitor.post(link, {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD})
    assert posted.status_code == 409 and 'id="invite-refused"' in posted.content.decode()
    assert SESSION_KEY not in visitor.session
    assert untouched(erin) == before and not erin.check_password(NEW_PASSWORD)
    assert Invitation.objects.get().used_at is None
    assert not User.objects.filter(username="erin@example.com").exists()


@pytest.mark.parametrize("kind", ["superuser", "other organisation's customer"])
def test_an_invitation_written_past_the_check_is_refused_at_the_link(
        cast: Cast, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    """The found takeover, however the invitation came to exist (issued directly, an old
    row): accepting it no longer resets the password, logs the browser in as the account
    or attaches a customer row in the invitation's organisation."""
    if kind == "superuser":
        victim = User.objects.create_superuser("root@lab.example", "root@lab.example", PASSWORD)
    else:
        victim = User.objects.create_user("root@lab.example", "root@lab.example", PASSWORD)
        Customer.objects.create(user=victim, organisation=cast.organisation_b)
    before = untouched(victim)
    _, token = Invitation.issue(email="Root@Lab.Example", organisation=cast.organisation_a)
    visitor = Client()
    answer = visitor.post(f"/accounts/invite/{token}/",
                          {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD})
    assert answer.status_code == 409
    assert "cannot set a password" in answer.content.decode()
    assert SESSION_KEY not in visitor.session and visitor.get("/portal/").status_code == 302
    assert untouched(victim) == before and not victim.check_password(NEW_PASSWORD)
    assert not Customer.objects.filter(user=victim, organisation=cast.organisation_a).exists()
    assert any(r.name == "diagnostic.accounts.invitations" and r.getMessage() == "invitation link refused"
               for r in caplog.records)
    # Signed in as the victim makes no difference: a superuser is never joined to a customer.
    if kind == "superuser":
        owner = logged_in(victim)
        assert owner.post(f"/accounts/invite/{token}/").status_code == 409
        assert untouched(victim) == before


def test_an_existing_account_of_no_organisation_joins_only_by_its_owner(
        cast: Cast, caplog: pytest.LogCaptureFixture) -> None:
    """An active account that is nobody's customer and not staff may be invited; the link
    asks its owner to sign in with the account's own password and confirm. Anyone else,
    anonymous or signed in as another account, changes nothing."""
    frank = User.objects.create_user("frank@example.com", "frank@example.com", PASSWORD)
    before = untouched(frank)
    link, said = invite("Frank@Example.com")
    assert "already has an account of no organisation" in said and "sets no password" in said
    assert "sign in with its password and confirm joining" in mail.outbox[0].body
    # Anonymous: no password form; a password posted anyway sets nothing.
    visitor = Client()
    opened = visitor.get(link)
    assert opened.status_code == 302
    assert opened["Location"].startswith("/accounts/login/?next=/accounts/invite/")
    posted = visitor.post(link, {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD})
    assert posted.status_code == 302 and SESSION_KEY not in visitor.session
    # Signed in as someone else.
    other = cast.client("alice")
    assert other.get(link).status_code == 409 and other.post(link).status_code == 409
    assert untouched(frank) == before and Invitation.objects.get().used_at is None
    # The owner signs in with their own password, sees what they join, and confirms.
    owner = Client()
    signed = owner.post("/accounts/login/",
                        {"username": "frank@example.com", "password": PASSWORD, "next": link})
    assert signed.status_code == 302 and signed["Location"] == link
    page = owner.get(link)
    assert page.status_code == 200 and 'id="join-organisation"' in page.content.decode()
    assert "Acme Inference" in page.content.decode() and "password1" not in page.content.decode()
    assert untouched(frank) == before  # looking joins nothing
    joined = owner.post(link)
    assert joined.status_code == 302 and joined["Location"] == "/portal/"
    frank.refresh_from_db()
    assert frank.customer.organisation == cast.organisation_a and frank.password == before[0]
    invitation = Invitation.objects.get()
    assert invitation.used_by == frank and invitation.joined_existing and invitation.used_at is not None
    (record,) = [r for r in caplog.records if r.getMessage() == "existing account joined an organisation"]
    assert record.user == frank.pk and record.organisation == "Acme Inference"  # type: ignore[attr-defined]
    assert owner.post(link).status_code == 410  # once


def test_a_new_address_still_gets_its_account(cast: Cast) -> None:
    link, _ = invite("gina@example.com")
    visitor = Client()
    made = visitor.post(link, {"password1": PASSWORD, "password2": PASSWORD})
    assert made.status_code == 302 and made["Location"] == "/portal/"
    gina = User.objects.get(username="gina@example.com")
    assert gina.customer.organisation == cast.organisation_a and not gina.is_staff
    invitation = Invitation.objects.get()
    assert invitation.used_by == gina and not invitation.joined_existing


def test_a_wrong_password_is_told_in_the_fields_words(client: Any, db: None) -> None:
    page = client.post("/accounts/login/", {"username": "nobody@example.com", "password": "nope"})
    text = page.content.decode()
    assert "That email and password do not match an account" in text
    assert "correct username" not in text
