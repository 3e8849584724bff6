"""`python manage.py invite EMAIL --org NAME`: invite a customer; prints the one-time link
(also emailed). The organisation is created when it does not exist yet.

An invitation creates an account, never takes one over: an address that already has one
(staff, a superuser, anyone's customer, deactivated; by username or email, whatever the
case) is refused, and nothing is created. An active account of no organisation is invited
to join: its owner signs in with its own password and confirms on the link's page."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import validate_email
from django.db import transaction

from diagnostic.accounts.invitations import AccountExists, accounts_for, invite
from diagnostic.bookings.models import Organisation


class Command(BaseCommand):
    help = "Invite EMAIL to the portal as a member of --org; prints the one-time sign-up link."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("email")
        parser.add_argument("--org", required=True, help="organisation name (created if new)")

    def handle(self, *args: Any, **options: Any) -> None:
        email = options["email"].strip()
        try:
            validate_email(email)
        except ValidationError:
            raise CommandError(f"{email!r} is not an email address") from None
        name = options["org"].strip()
        if not name:
            raise CommandError("--org: give the organisation's name")
        organisation = Organisation.objects.filter(name=name).first()
        created = organisation is None
        with transaction.atomic():  # a refused invitation leaves no new organisation behind
            if organisation is None:
                organisation = Organisation.objects.create(name=name)
            try:
                invitation, link = invite(email=email, organisation=organisation)
            except AccountExists as exc:
                raise CommandError(f"not invited: {exc}") from exc
        if created:
            self.stderr.write(f"created organisation {organisation.name}")
        if accounts_for(invitation.email):
            self.stderr.write(
                f"{invitation.email} already has an account of no organisation: the link asks its owner "
                "to sign in with it and confirm joining; it sets no password"
            )
        self.stderr.write(
            f"invitation for {invitation.email} valid until {invitation.expires_at:%Y-%m-%d %H:%M} UTC"
        )
        self.stdout.write(link)
