"""Inviting a customer and accepting the invitation.

Accepting claims the invitation with a conditional UPDATE, so a link opened twice at
once still creates one account.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from diagnostic.accounts.models import Invitation, token_digest
from diagnostic.bookings.models import Customer, Organisation


class InvitationUnusable(Exception):
    """The link is unknown, expired or already used."""


class AlreadyMember(Exception):
    """The address already has an account in another organisation."""


def invitation_link(token: str) -> str:
    return settings.SITE_URL.rstrip("/") + reverse("accounts:accept-invite", args=[token])


def invite(*, email: str, organisation: Organisation, created_by: Any = None) -> tuple[Invitation, str]:
    """Issue an invitation, email its link, and return both (the command prints the link)."""
    existing = Customer.objects.filter(user__username__iexact=email.strip()).select_related("organisation")
    for customer in existing:
        if customer.organisation_id != organisation.pk:
            raise AlreadyMember(
                f"{email} already belongs to {customer.organisation}; a user has one organisation"
            )
    invitation, token = Invitation.issue(email=email, organisation=organisation, created_by=created_by)
    link = invitation_link(token)
    send_mail(
        subject=f"Your {organisation.name} account for the lab diagnostic portal",
        message=(
            f"You have been invited to book lab days and follow diagnostics for {organisation.name}.\n\n"
            f"Set your password here (the link works once, until "
            f"{invitation.expires_at:%Y-%m-%d %H:%M} UTC):\n\n{link}\n"
        ),
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[invitation.email],
    )
    return invitation, link


def find_usable(token: str) -> Invitation:
    invitation = (
        Invitation.objects.filter(token_hash=token_digest(token)).select_related("organisation").first()
    )
    if invitation is None or not invitation.is_usable:
        raise InvitationUnusable("this invitation link has expired or was already used; ask us for a new one")
    return invitation


def accept(*, token: str, password: str) -> User:
    """Use the invitation once: create (or reactivate) the user in its organisation."""
    with transaction.atomic():
        invitation = find_usable(token)
        now = timezone.now()
        claimed = Invitation.objects.filter(
            pk=invitation.pk, used_at__isnull=True, expires_at__gt=now
        ).update(used_at=now)
        if claimed != 1:
            raise InvitationUnusable(
                "this invitation link has expired or was already used; ask us for a new one"
            )
        user, _ = User.objects.get_or_create(username=invitation.email, defaults={"email": invitation.email})
        user.email = invitation.email
        user.is_active = True
        user.set_password(password)
        user.save()
        Customer.objects.get_or_create(user=user, defaults={"organisation": invitation.organisation})
    return user
