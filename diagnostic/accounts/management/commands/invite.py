"""`python manage.py invite EMAIL --org NAME`: invite a customer; prints the one-time link
(also emailed). The organisation is created when it does not exist yet."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import validate_email

from diagnostic.accounts.invitations import AlreadyMember, invite
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
        organisation, created = Organisation.objects.get_or_create(name=name)
        try:
            invitation, link = invite(email=email, organisation=organisation)
        except AlreadyMember as exc:
            raise CommandError(str(exc)) from exc
        if created:
            self.stderr.write(f"created organisation {organisation.name}")
        self.stderr.write(
            f"invitation for {invitation.email} valid until {invitation.expires_at:%Y-%m-%d %H:%M} UTC"
        )
        self.stdout.write(link)
