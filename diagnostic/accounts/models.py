"""An invitation: staff ask a person to join an organisation's portal account (a new
account, or an existing one whose owner signs in to join: diagnostic.accounts.invitations).

Only the SHA-256 of the link's token is stored, so a database copy cannot be turned into
working links; a link works once and until it expires.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

from diagnostic.bookings.models import Organisation


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Invitation(models.Model):
    email = models.EmailField()
    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="invitations")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Who used the link: the account it created, or the existing account whose owner,
    # signed in, joined the organisation with it (joined_existing).
    used_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    joined_existing = models.BooleanField(default=False)

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"invitation of {self.email} to {self.organisation}"

    @classmethod
    def issue(
        cls, *, email: str, organisation: Organisation, created_by: object = None
    ) -> tuple[Invitation, str]:
        """A new invitation and its token (shown once: only its digest is kept)."""
        token = secrets.token_urlsafe(32)
        invitation = cls.objects.create(
            email=email.strip().lower(),
            organisation=organisation,
            token_hash=token_digest(token),
            expires_at=timezone.now() + dt.timedelta(days=settings.INVITE_VALID_DAYS),
            created_by=created_by,
        )
        return invitation, token

    @property
    def is_usable(self) -> bool:
        return self.used_at is None and timezone.now() < self.expires_at
