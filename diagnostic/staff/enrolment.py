"""Enrolling a staff account's authenticator (the second factor, STAFF_REQUIRE_2FA) takes
more than its password: a one-time link issued for that account.

- Issued by another member of the staff group (signed in with their own second factor, at
  /staff/2fa/links/) or by `manage.py otp_enrol_link EMAIL`, which whoever runs the
  deployment uses for the first account. Never by the account for itself.
- Bound to the account it was issued for: it works only opened signed in as that account
  (its password), and shows the new authenticator's secret to that account alone.
- Used once: the first right code from the new authenticator confirms it, replaces the
  account's earlier devices and uses the link (a conditional UPDATE, so two tabs cannot
  both use it). A new link for the account retires its unused earlier ones.
- Expires after STAFF_OTP_ENROL_LINK_HOURS (24 h).

The link is shown to whoever issued it (or printed), never emailed: whoever holds an
account's mailbox can already reset its password, and must not get its second factor too.
Only the SHA-256 of the token is stored, as for invitations.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone
from django_otp.plugins.otp_totp.models import TOTPDevice

from diagnostic.accounts.models import token_digest
from diagnostic.staff.access import in_staff_group
from diagnostic.staff.models import EnrolmentLink

log = logging.getLogger(__name__)

UNUSABLE = ("This enrolment link has expired or was already used. Ask a member of the staff group for a "
            "new one.")
OTHER_ACCOUNT = ("This enrolment link was issued for another account. Log out, then sign in as the account "
                 "it was issued for; or ask for a link for your own account.")


class EnrolmentRefused(Exception):
    """A link cannot be issued or used; str() says why, in words for the page."""


def link_url(token: str) -> str:
    return settings.SITE_URL.rstrip("/") + reverse("staff:otp-enrol", args=[token])


def staff_account(address: str) -> User:
    """The one active staff account `address` names (by username or email, any case)."""
    address = address.strip()
    if not address:
        raise EnrolmentRefused("name the staff account: its email address or username")
    found = list(User.objects.filter(Q(username__iexact=address) | Q(email__iexact=address)).order_by("pk"))
    if not found:
        raise EnrolmentRefused(f"there is no account {address}")
    if len(found) > 1:
        raise EnrolmentRefused(f"{address} names {len(found)} accounts (by username and by email); use the "
                               "username")
    user = found[0]
    if not (user.is_active and user.is_staff):
        raise EnrolmentRefused(f"{address} is not an active staff account; only staff accounts have an "
                               "authenticator here")
    return user


def issue(*, user: User, issued_by: Any = None) -> tuple[EnrolmentLink, str]:
    """A new link for `user` and its URL (shown once). `issued_by` None: the command."""
    if not (user.is_active and user.is_staff):
        raise EnrolmentRefused(f"{user.get_username()} is not an active staff account")
    if issued_by is not None:
        if not in_staff_group(issued_by):
            raise EnrolmentRefused("issuing enrolment links needs the staff group")
        if issued_by.pk == user.pk:
            raise EnrolmentRefused("an account cannot issue an enrolment link for itself; ask another member "
                                   "of the staff group")
    token = secrets.token_urlsafe(32)
    now = timezone.now()
    with transaction.atomic():
        # Earlier unused links of the account stop working.
        EnrolmentLink.objects.filter(user=user, used_at__isnull=True).update(used_at=now)
        link = EnrolmentLink.objects.create(
            user=user, token_hash=token_digest(token), issued_by=issued_by, created_at=now,
            expires_at=now + dt.timedelta(hours=settings.STAFF_OTP_ENROL_LINK_HOURS),
        )
    log.info("authenticator enrolment link issued", extra={
        "link": link.pk, "user": user.pk, "issued_by": getattr(issued_by, "pk", None)})
    return link, link_url(token)


def usable_link(token: str, user: Any) -> EnrolmentLink:
    """The link `token` names, usable by the signed-in `user`; EnrolmentRefused otherwise."""
    link = EnrolmentLink.objects.filter(token_hash=token_digest(token)).select_related("device").first()
    if link is None or not link.is_usable:
        raise EnrolmentRefused(UNUSABLE)
    if link.user_id != user.pk:
        log.warning("authenticator enrolment link opened by another account",
                    extra={"link": link.pk, "user": user.pk})
        raise EnrolmentRefused(OTHER_ACCOUNT)
    return link


def offered_device(link: EnrolmentLink) -> TOTPDevice:
    """The unconfirmed device whose secret the link's page shows (made on first opening)."""
    device = link.device
    if device is None or device.user_id != link.user_id or device.confirmed:
        device = TOTPDevice.objects.create(user_id=link.user_id, name="authenticator", confirmed=False)
        EnrolmentLink.objects.filter(pk=link.pk).update(device=device)
        link.device = device
    return device


def confirm(link: EnrolmentLink, device: TOTPDevice) -> None:
    """The right code was given: use the link (once), and make `device` the account's only one."""
    now = timezone.now()
    with transaction.atomic():
        claimed = EnrolmentLink.objects.filter(
            pk=link.pk, used_at__isnull=True, expires_at__gt=now, device=device
        ).update(used_at=now)
        if claimed != 1:
            raise EnrolmentRefused(UNUSABLE)
        TOTPDevice.objects.filter(user_id=link.user_id).exclude(pk=device.pk).delete()
        device.confirmed = True
        device.save(update_fields=["confirmed"])
    log.info("authenticator enrolled", extra={"link": link.pk, "user": link.user_id, "device": device.pk})
