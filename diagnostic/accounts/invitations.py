"""Inviting a customer and accepting the invitation.

An invitation creates an account; it never takes one over. An address that already has
an account (compared case-insensitively on username and email) is refused when the
invitation is made and again when its link is used: a staff account, a superuser, a
customer of any organisation, a deactivated account. The one exception is an active
account that is neither staff nor anyone's customer: its invitation is to *join*, and
joining is its owner's explicit act, signed in with the account's own password and
confirmed on the link's page, and logged. No link ever sets an existing account's
password or signs anyone in as it.

Accepting claims the invitation with a conditional UPDATE, so a link opened twice at
once still creates one account.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from diagnostic.accounts.models import Invitation, token_digest
from diagnostic.bookings.models import Customer, Organisation

log = logging.getLogger(__name__)

UNUSABLE = "this invitation link has expired or was already used; ask us for a new one"


class InvitationUnusable(Exception):
    """The link is unknown, expired or already used."""


class AccountExists(Exception):
    """The address already has an account an invitation may not create, change or join.

    str() is the reason in full (for the person issuing the invitation and the log);
    `public` is what the link's page says to whoever opened it."""

    public = ("This address already has an account here, so this invitation cannot set a password "
              "for it: an invitation only creates new accounts. Sign in with that account's own "
              "password (or reset it by email), and ask us if it should join an organisation.")


def invitation_link(token: str) -> str:
    return settings.SITE_URL.rstrip("/") + reverse("accounts:accept-invite", args=[token])


def accounts_for(email: str) -> list[User]:
    """Every account the address names: by username or by email, whatever the case."""
    address = email.strip()
    return list(
        User.objects.filter(Q(username__iexact=address) | Q(email__iexact=address))
        .select_related("customer__organisation")
        .order_by("pk")
    )


def organisation_of(user: User) -> Organisation | None:
    customer: Customer | None = getattr(user, "customer", None)
    return customer.organisation if customer is not None else None


def joinable_account(email: str, organisation: Organisation) -> User | None:
    """The account an invitation to `email` would have its owner join, None when there is
    no account; AccountExists when the address has an account no invitation may touch."""
    accounts = accounts_for(email)
    for user in accounts:
        if user.is_staff or user.is_superuser:
            raise AccountExists(
                f"{email} already has a staff account; an invitation only creates new customer "
                "accounts, it never opens, changes or joins a staff account"
            )
        member_of = organisation_of(user)
        if member_of is not None and member_of.pk != organisation.pk:
            raise AccountExists(
                f"{email} already has an account in {member_of}; a user has one organisation, and an "
                "invitation never takes over an account"
            )
        if member_of is not None:
            raise AccountExists(
                f"{email} already has an account in {member_of}; its owner signs in with their own "
                "password (or resets it by email), no invitation needed"
            )
        if not user.is_active:
            raise AccountExists(
                f"{email} has a deactivated account; an invitation does not reactivate it (the admin does)"
            )
    if len(accounts) > 1:
        raise AccountExists(
            f"{email} names {len(accounts)} accounts (by username and by email); an invitation "
            "cannot tell which, so it is not issued"
        )
    return accounts[0] if accounts else None


def invite(*, email: str, organisation: Organisation, created_by: Any = None) -> tuple[Invitation, str]:
    """Issue an invitation, email its link, and return both (the command prints the link).

    AccountExists when the address already has an account an invitation may not touch."""
    try:
        existing = joinable_account(email, organisation)
    except AccountExists as exc:
        log.warning("invitation refused", extra={"email": email.strip(), "organisation": organisation.name,
                                                 "reason": str(exc)})
        raise
    invitation, token = Invitation.issue(email=email, organisation=organisation, created_by=created_by)
    link = invitation_link(token)
    if existing is None:
        step = "Set your password here"
    else:
        step = ("You already have an account with this address: sign in with its password and confirm "
                "joining here")
    send_mail(
        subject=f"Your {organisation.name} account for the lab diagnostic portal",
        message=(
            f"You have been invited to book lab days and follow diagnostics for {organisation.name}.\n\n"
            f"{step} (the link works once, until "
            f"{invitation.expires_at:%Y-%m-%d %H:%M} UTC):\n\n{link}\n"
        ),
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[invitation.email],
    )
    log.info("invitation issued", extra={"invitation": invitation.pk, "email": invitation.email,
                                         "organisation": organisation.name,
                                         "existing_account": existing is not None})
    return invitation, link


def find_usable(token: str) -> Invitation:
    invitation = (
        Invitation.objects.filter(token_hash=token_digest(token)).select_related("organisation").first()
    )
    if invitation is None or not invitation.is_usable:
        raise InvitationUnusable(UNUSABLE)
    return invitation


def _refused_at_acceptance(invitation: Invitation, exc: AccountExists) -> AccountExists:
    log.warning("invitation link refused", extra={"invitation": invitation.pk, "email": invitation.email,
                                                  "organisation": invitation.organisation.name,
                                                  "reason": str(exc)})
    return exc


def check_account(invitation: Invitation) -> User | None:
    """At the link: the account its owner would join (None: a new one is made), or
    AccountExists, logged, when the address has an account no invitation may touch."""
    try:
        return joinable_account(invitation.email, invitation.organisation)
    except AccountExists as exc:
        raise _refused_at_acceptance(invitation, exc) from None


def _claim(invitation: Invitation) -> None:
    now = timezone.now()
    claimed = Invitation.objects.filter(
        pk=invitation.pk, used_at__isnull=True, expires_at__gt=now
    ).update(used_at=now)
    if claimed != 1:
        raise InvitationUnusable(UNUSABLE)


def accept(*, token: str, password: str) -> User:
    """Use the invitation once: create the user, with this password, in its organisation.
    Never for an address that has an account (AccountExists): that is `join`."""
    with transaction.atomic():
        invitation = find_usable(token)
        if check_account(invitation) is not None:
            raise _refused_at_acceptance(invitation, AccountExists(
                f"{invitation.email} already has an account; its owner signs in to join, the link sets "
                "no password"))
        _claim(invitation)
        try:
            with transaction.atomic():
                user = User.objects.create_user(username=invitation.email, email=invitation.email,
                                                password=password)
        except IntegrityError:  # made in the meantime: still not ours to take
            raise _refused_at_acceptance(invitation, AccountExists(
                f"{invitation.email} got an account while the invitation was being accepted")) from None
        Customer.objects.create(user=user, organisation=invitation.organisation)
        Invitation.objects.filter(pk=invitation.pk).update(used_by=user)
    log.info("invitation accepted: account created", extra={
        "invitation": invitation.pk, "user": user.pk, "email": user.email,
        "organisation": invitation.organisation.name})
    return user


def join(*, token: str, user: Any) -> Customer:
    """The signed-in owner of an existing account joins the invitation's organisation: an
    explicit act, logged, that changes neither the password nor the session."""
    with transaction.atomic():
        invitation = find_usable(token)
        account = check_account(invitation)
        if account is None or not user.is_authenticated or account.pk != user.pk:
            raise _refused_at_acceptance(invitation, AccountExists(
                f"this invitation is for {invitation.email}; only that account, signed in, can join with it"))
        _claim(invitation)
        try:
            with transaction.atomic():
                customer = Customer.objects.create(user=account, organisation=invitation.organisation)
        except IntegrityError:
            raise _refused_at_acceptance(invitation, AccountExists(
                f"{invitation.email} joined an organisation while the invitation was used")) from None
        Invitation.objects.filter(pk=invitation.pk).update(used_by=account, joined_existing=True)
    log.info("existing account joined an organisation", extra={
        "invitation": invitation.pk, "user": account.pk, "email": invitation.email,
        "organisation": invitation.organisation.name})
    return customer
