"""Issue 36, part 6: "Second factor enrolled by password alone. With STAFF_REQUIRE_2FA on, a
superuser's password alone shows the enrolment secret; the setting is off by default and
`check --deploy` does not mention it."

The attacks, each with its refusal: a password alone (staff, group member, superuser)
asking /staff/2fa/ for a secret; a used, an expired and another account's link; a link
opened without signing in; issuing a link for oneself, or without the group. A valid link,
opened by its own account, enrols once."""

from __future__ import annotations

import datetime as dt
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice

from diagnostic import checks
from diagnostic.staff.enrolment import issue
from diagnostic.staff.models import EnrolmentLink
from tests.diagnostic.conftest import Cast, logged_in

pytestmark = pytest.mark.django_db

PASSWORD = "a long enough passphrase 42"


@pytest.fixture(autouse=True)
def second_factor_required(settings: Any) -> None:
    settings.STAFF_REQUIRE_2FA = True


@pytest.fixture
def root(db: None) -> User:
    return User.objects.create_superuser("root@lab.example", "root@lab.example", PASSWORD)


def path_of(url: str, settings: Any) -> str:
    return url.removeprefix(settings.SITE_URL.rstrip("/"))


def current_code(device: TOTPDevice) -> str:
    return f"{totp(device.bin_key, step=device.step, t0=device.t0, digits=device.digits):06d}"


def secret_shown(response: Any) -> bool:
    return b"otp-secret" in response.content or b"otpauth://" in response.content


def enrol(client: Client, link: str, *, then: str = "/staff/") -> Any:
    """Open the link and answer with the current code of the device it offered."""
    page = client.get(link)
    assert page.status_code == 200 and secret_shown(page)
    device = TOTPDevice.objects.filter(confirmed=False).order_by("-pk").first()
    assert device is not None
    return client.post(link, {"token": current_code(device), "next": then})


def test_a_password_alone_never_shows_a_secret(cast: Cast, approver: User, root: User) -> None:
    for user in (cast.staff, approver, root):
        client = logged_in(user)
        assert client.get("/staff/")["Location"].startswith("/staff/2fa/")
        for answer in (client.get("/staff/2fa/?next=/admin/"),
                       client.post("/staff/2fa/", {"token": "123456", "next": "/admin/"})):
            assert answer.status_code in (200, 400)
            assert not secret_shown(answer), user.username
            assert b"Ask for an enrolment link" in answer.content
        assert client.get("/admin/").status_code == 302
    assert not TOTPDevice.objects.exists()


def test_a_valid_link_enrols_its_own_account_once(cast: Cast, settings: Any) -> None:
    _, url = issue(user=cast.staff)
    link = path_of(url, settings)
    client = cast.client("staff")
    done = enrol(client, link, then="/staff/lab/")
    assert done.status_code == 302 and done["Location"] == "/staff/lab/"
    assert client.get("/staff/lab/").status_code == 200
    assert TOTPDevice.objects.filter(user=cast.staff, confirmed=True).count() == 1
    # Once: the same link, again, shows nothing and confirms nothing.
    again = logged_in(cast.staff)
    for answer in (again.get(link), again.post(link, {"token": "123456"})):
        assert answer.status_code == 410 and not secret_shown(answer)
        assert b"expired or was already used" in answer.content
    assert TOTPDevice.objects.filter(user=cast.staff).count() == 1


def test_an_expired_link_is_refused(cast: Cast, settings: Any) -> None:
    link_row, url = issue(user=cast.staff)
    EnrolmentLink.objects.filter(pk=link_row.pk).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    answer = cast.client("staff").get(path_of(url, settings))
    assert answer.status_code == 410 and not secret_shown(answer)
    assert not TOTPDevice.objects.exists()


def test_the_link_expires_after_a_day(cast: Cast) -> None:
    link_row, _ = issue(user=cast.staff)
    valid_for = link_row.expires_at - link_row.created_at
    assert dt.timedelta(hours=23, minutes=59) < valid_for <= dt.timedelta(hours=24)


def test_another_accounts_link_is_refused(cast: Cast, approver: User, root: User, settings: Any) -> None:
    """The link is bound to the account it was issued for: a colleague's password, or a
    superuser's, opening it sees no secret and enrols nothing."""
    _, url = issue(user=approver)
    link = path_of(url, settings)
    for user in (cast.staff, root):
        client = logged_in(user)
        for answer in (client.get(link), client.post(link, {"token": "123456"})):
            assert answer.status_code == 403 and not secret_shown(answer)
            assert b"issued for another account" in answer.content
    assert not TOTPDevice.objects.exists()
    # Still good for its own account.
    assert enrol(logged_in(approver), link).status_code == 302


def test_a_link_needs_its_account_signed_in(cast: Cast, settings: Any) -> None:
    _, url = issue(user=cast.staff)
    link = path_of(url, settings)
    anonymous = cast.anonymous.get(link)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/?next=")
    assert cast.client("alice").get(link).status_code == 404  # a customer: no such page
    assert not TOTPDevice.objects.exists()


def test_a_wrong_code_keeps_the_link_and_a_new_link_retires_the_old(cast: Cast, settings: Any) -> None:
    _, first = issue(user=cast.staff)
    client = cast.client("staff")
    assert client.get(path_of(first, settings)).status_code == 200
    wrong = client.post(path_of(first, settings), {"token": "000000"})
    assert wrong.status_code == 400 and b"not right" in wrong.content
    _, second = issue(user=cast.staff)
    assert client.get(path_of(first, settings)).status_code == 410
    assert enrol(client, path_of(second, settings)).status_code == 302


def test_enrolling_again_replaces_the_lost_authenticator(cast: Cast, settings: Any) -> None:
    lost = TOTPDevice.objects.create(user=cast.staff, name="authenticator", confirmed=True)
    _, url = issue(user=cast.staff)
    assert enrol(cast.client("staff"), path_of(url, settings)).status_code == 302
    assert not TOTPDevice.objects.filter(pk=lost.pk).exists()
    assert TOTPDevice.objects.filter(user=cast.staff, confirmed=True).count() == 1


# -- issuing -------------------------------------------------------------------------------------------
def verified(user: User) -> Client:
    """A client signed in as `user` and through the second factor."""
    client = logged_in(user)
    device = TOTPDevice.objects.create(user=user, name="authenticator", confirmed=True)
    answer = client.post("/staff/2fa/", {"token": current_code(device), "next": "/staff/"})
    assert answer.status_code == 302
    return client


def test_a_member_of_the_staff_group_issues_a_colleagues_link(
        cast: Cast, approver: User, settings: Any) -> None:
    issuer = verified(approver)
    page = issuer.get("/staff/2fa/links/")
    assert page.status_code == 200
    issued = issuer.post("/staff/2fa/links/", {"account": "STAFF"})  # username, any case
    assert issued.status_code == 200
    text = issued.content.decode()
    link_row = EnrolmentLink.objects.get(user=cast.staff)
    assert link_row.issued_by == approver
    start = text.index('id="otp-link">') + len('id="otp-link">')
    url = text[start:text.index("</code>", start)]
    assert url.startswith(settings.SITE_URL.rstrip("/") + "/staff/2fa/enrol/")
    assert enrol(cast.client("staff"), path_of(url, settings)).status_code == 302


def test_issuing_needs_the_group_the_second_factor_and_another_account(
        cast: Cast, approver: User, settings: Any) -> None:
    # Without the group (look-only staff, through the door): 403, nothing issued.
    look_only = verified(cast.staff)
    assert look_only.post("/staff/2fa/links/", {"account": "consultant"}).status_code == 403
    # A group member without the second factor: sent to it, nothing issued.
    unverified = logged_in(approver).post("/staff/2fa/links/", {"account": "staff"})
    assert unverified.status_code == 302 and unverified["Location"].startswith("/staff/2fa/")
    assert not EnrolmentLink.objects.exists()
    # Through the door, with the group: not for oneself, not for a customer or nobody.
    issuer = verified(approver)
    for account, reason in (("consultant", "cannot issue an enrolment link for itself"),
                            ("alice", "is not an active staff account"),
                            ("nobody@lab.example", "there is no account")):
        answer = issuer.post("/staff/2fa/links/", {"account": account})
        assert answer.status_code == 400 and reason in answer.content.decode(), account
    assert not EnrolmentLink.objects.exists()


def test_the_command_prints_a_link_for_a_staff_account(cast: Cast, settings: Any) -> None:
    cast.staff.email = "staff@lab.example"
    cast.staff.save(update_fields=["email"])
    out = StringIO()
    call_command("otp_enrol_link", "Staff@Lab.example", stdout=out, stderr=StringIO())
    url = out.getvalue().strip()
    assert url.startswith(settings.SITE_URL.rstrip("/") + "/staff/2fa/enrol/")
    assert EnrolmentLink.objects.get().issued_by is None
    assert enrol(cast.client("staff"), path_of(url, settings)).status_code == 302
    with pytest.raises(CommandError, match="is not an active staff account"):
        call_command("otp_enrol_link", "alice", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(CommandError, match="there is no account"):
        call_command("otp_enrol_link", "nobody@lab.example", stdout=StringIO(), stderr=StringIO())


# -- the deployment check ------------------------------------------------------------------------------
def test_check_deploy_warns_when_the_second_factor_is_off(settings: Any) -> None:
    settings.STAFF_REQUIRE_2FA = False
    [warning] = checks.check_second_factor()
    assert warning.id == "diagnostic.W001" and "STAFF_REQUIRE_2FA is off" in warning.msg
    settings.STAFF_REQUIRE_2FA = True
    assert checks.check_second_factor() == []
