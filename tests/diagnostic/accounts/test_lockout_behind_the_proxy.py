"""Issue 36, part 5: "One person locks everyone out behind the proxy. django-ipware is not
installed, so AXES_IPWARE_PROXY_COUNT does nothing; behind the compose TLS proxy all
clients share one address: five bad logins lock out every customer; five failures against
the staff account from five addresses lock staff out; password reset is unthrottled (20
requests, 20 emails)."

Each attack is driven as it arrives behind the compose deployment's proxy: REMOTE_ADDR is
the proxy's, X-Forwarded-For what the proxy appended (the client's address), with
AXES_IPWARE_PROXY_COUNT=1 as compose sets it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client

from diagnostic.accounts.clientip import client_address

pytestmark = pytest.mark.django_db

PASSWORD = "a long enough passphrase 42"
PROXY = "172.18.0.1"  # the TLS proxy on the host, as the web container sees it
CLIENT_A, CLIENT_B = "203.0.113.7", "198.51.100.23"


@pytest.fixture(autouse=True)
def behind_the_compose_proxy(settings: Any) -> None:
    settings.AXES_IPWARE_PROXY_COUNT = 1
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # only for speed


@pytest.fixture
def carol(db: None) -> User:
    return User.objects.create_user("carol@example.com", "carol@example.com", PASSWORD)


@pytest.fixture
def consultant(db: None) -> User:
    return User.objects.create_user("consultant@lab.example", "consultant@lab.example", PASSWORD,
                                    is_staff=True)


def through_proxy(client_ip: str, forwarded: str | None = None) -> Client:
    """A browser at `client_ip` reaching the app through the proxy, which appends the
    address it saw to whatever X-Forwarded-For the browser sent (`forwarded`)."""
    chain = client_ip if forwarded is None else f"{forwarded}, {client_ip}"
    return Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=chain)


def login(client: Client, username: str, password: str) -> int:
    return client.post("/accounts/login/", {"username": username, "password": password}).status_code


def test_the_client_address_is_the_one_the_proxy_appended(settings: Any) -> None:
    class Request:
        def __init__(self, **meta: str) -> None:
            self.META = meta

    assert client_address(Request(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=CLIENT_A)) == CLIENT_A
    # What a client writes itself stands to the left and is not its address.
    forged = f"{CLIENT_B}, {CLIENT_A}"
    assert client_address(Request(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=forged)) == CLIENT_A
    assert client_address(Request(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=f"junk, {CLIENT_A}")) == CLIENT_A
    # Without the proxy's header (the health check, from inside): the peer itself.
    assert client_address(Request(REMOTE_ADDR="127.0.0.1")) == "127.0.0.1"
    # Two proxies: the hop before both.
    settings.AXES_IPWARE_PROXY_COUNT = 2
    two_hops = f"{CLIENT_B}, 10.0.0.5"
    assert client_address(Request(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=two_hops)) == CLIENT_B
    # No proxy: the header, which anyone can write, is ignored.
    settings.AXES_IPWARE_PROXY_COUNT = 0
    assert client_address(Request(REMOTE_ADDR=CLIENT_A, HTTP_X_FORWARDED_FOR=CLIENT_B)) == CLIENT_A


def test_one_clients_failures_lock_that_client_out_not_the_customer(settings: Any, carol: User) -> None:
    attacker = through_proxy(CLIENT_A)
    codes = [login(attacker, "carol@example.com", "wrong") for _ in range(settings.AXES_FAILURE_LIMIT)]
    assert codes == [200] * (settings.AXES_FAILURE_LIMIT - 1) + [429]  # the limit's own failure locks
    # A is locked out of carol's account, even with the right password...
    locked = attacker.post("/accounts/login/", {"username": "carol@example.com", "password": PASSWORD})
    assert locked.status_code == 429 and "It unlocks at" in locked.content.decode()
    # ...and so is A with an X-Forwarded-For of its own making (it is still A to the app).
    assert login(through_proxy(CLIENT_A, forwarded=CLIENT_B), "carol@example.com", PASSWORD) == 429
    # Carol, from B, through the same proxy, signs in.
    assert login(through_proxy(CLIENT_B), "carol@example.com", PASSWORD) == 302
    # A is locked out of carol's account only; other customers log in from A's office.
    User.objects.create_user("dave@example.com", "dave@example.com", PASSWORD)
    assert login(through_proxy(CLIENT_A), "dave@example.com", PASSWORD) == 302


def test_failures_from_five_addresses_do_not_lock_staff_out_from_a_sixth(
        settings: Any, consultant: User) -> None:
    # Five addresses, one failure each (what locked staff out before), then each up to the
    # limit (each is locked out of the account, itself alone).
    guessers = [through_proxy(f"203.0.113.{100 + n}") for n in range(5)]
    for guesser in guessers:
        assert login(guesser, "consultant@lab.example", "wrong") == 200
    assert login(through_proxy("198.51.100.200"), "consultant@lab.example", PASSWORD) == 302
    for guesser in guessers:
        for _ in range(settings.AXES_FAILURE_LIMIT - 1):
            login(guesser, "consultant@lab.example", "wrong")
        assert login(guesser, "consultant@lab.example", PASSWORD) == 429
    assert login(through_proxy("198.51.100.201"), "consultant@lab.example", PASSWORD) == 302


def test_one_address_spraying_many_accounts_is_locked_out_of_all(settings: Any, carol: User) -> None:
    sprayer = through_proxy(CLIENT_A)
    for n in range(settings.AXES_ADDRESS_FAILURE_LIMIT - 1):
        assert login(sprayer, f"someone{n}@example.com", "wrong") == 200
    assert login(sprayer, "last@example.com", "wrong") == 429  # the limit's own failure locks
    assert login(sprayer, "carol@example.com", PASSWORD) == 429
    assert login(through_proxy(CLIENT_B), "carol@example.com", PASSWORD) == 302


def test_signing_in_to_an_own_account_does_not_clear_an_addresss_count(settings: Any, carol: User) -> None:
    sprayer = through_proxy(CLIENT_A)
    for n in range(settings.AXES_ADDRESS_FAILURE_LIMIT - 1):
        login(sprayer, f"someone{n}@example.com", "wrong")
    assert login(sprayer, "carol@example.com", PASSWORD) == 302  # the sprayer's own account
    assert login(through_proxy(CLIENT_A), "another@example.com", "wrong") == 429


def test_without_the_proxy_count_every_client_is_the_proxy(settings: Any, carol: User) -> None:
    """What the attacker found, for the record: with no proxy count, the proxy's address
    is everyone's, and one client's failures lock the customer out everywhere."""
    settings.AXES_IPWARE_PROXY_COUNT = 0
    for _ in range(settings.AXES_FAILURE_LIMIT):
        login(through_proxy(CLIENT_A), "carol@example.com", "wrong")
    assert login(through_proxy(CLIENT_B), "carol@example.com", PASSWORD) == 429


# -- password reset ----------------------------------------------------------------------------------
def reset(client: Client, email: str) -> Any:
    return client.post("/accounts/password-reset/", {"email": email})


def test_twenty_reset_requests_send_at_most_the_throttles_emails(settings: Any, carol: User) -> None:
    attacker = through_proxy(CLIENT_A)
    answers = [reset(attacker, "carol@example.com") for _ in range(20)]
    assert len(mail.outbox) == settings.PASSWORD_RESET_LIMIT_PER_ACCOUNT
    assert [a.status_code for a in answers[: settings.PASSWORD_RESET_LIMIT_PER_ACCOUNT]] == [302] * 3
    throttled = answers[-1]
    assert throttled.status_code == 429 and int(throttled["Retry-After"]) > 0
    assert "try again later" in throttled.content.decode()
    # From another client the account is still throttled: the limit is the account's.
    assert reset(through_proxy(CLIENT_B), "carol@example.com").status_code == 429
    assert len(mail.outbox) == settings.PASSWORD_RESET_LIMIT_PER_ACCOUNT


def test_one_address_asking_for_many_accounts_is_throttled(settings: Any) -> None:
    for n in range(settings.PASSWORD_RESET_LIMIT_PER_ADDRESS):
        User.objects.create_user(f"user{n}@example.com", f"user{n}@example.com", PASSWORD)
    attacker = through_proxy(CLIENT_A)
    codes = [reset(attacker, f"user{n}@example.com").status_code
             for n in range(settings.PASSWORD_RESET_LIMIT_PER_ADDRESS)]
    assert codes == [302] * settings.PASSWORD_RESET_LIMIT_PER_ADDRESS
    assert reset(attacker, "carol@example.com").status_code == 429
    assert len(mail.outbox) == settings.PASSWORD_RESET_LIMIT_PER_ADDRESS
    # Another client behind the same proxy is not held up by A.
    User.objects.create_user("erin@example.com", "erin@example.com", PASSWORD)
    assert reset(through_proxy(CLIENT_B), "erin@example.com").status_code == 302


def test_the_throttle_does_not_tell_whether_an_account_exists(settings: Any, carol: User) -> None:
    def answers(email: str, client_ip: str) -> list[tuple[int, str]]:
        client = through_proxy(client_ip)
        seen = []
        for _ in range(settings.PASSWORD_RESET_LIMIT_PER_ACCOUNT + 2):
            response = reset(client, email)
            text = response.content.decode() if response.status_code != 302 else response["Location"]
            seen.append((response.status_code, re.sub(r"csrfmiddlewaretoken\" value=\"[^\"]+", "", text)))
        return seen

    known = answers("carol@example.com", CLIENT_A)
    unknown = answers("nobody@example.com", CLIENT_B)
    assert [code for code, _ in known] == [code for code, _ in unknown]
    assert [page.replace("carol@example.com", "X") for _, page in known] == [
        page.replace("nobody@example.com", "X") for _, page in unknown]
    assert len(mail.outbox) == settings.PASSWORD_RESET_LIMIT_PER_ACCOUNT  # carol's only
