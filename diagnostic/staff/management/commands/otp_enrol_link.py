"""`python manage.py otp_enrol_link EMAIL`: a one-time link for a staff account to enrol its
authenticator (STAFF_REQUIRE_2FA), printed for whoever runs the deployment to hand over;
the way in for the first staff account, which has no colleague to issue one yet.

The link works once, until it expires (STAFF_OTP_ENROL_LINK_HOURS, 24 h), opened signed in
as that account; it retires the account's unused earlier links. It is not emailed
(diagnostic.staff.enrolment says why)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from diagnostic.staff.enrolment import EnrolmentRefused, issue, staff_account


class Command(BaseCommand):
    help = "Print a one-time link for the staff account EMAIL (or username) to enrol its authenticator."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("email", help="the staff account's email address or username")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            user = staff_account(options["email"])
            link, url = issue(user=user)
        except EnrolmentRefused as exc:
            raise CommandError(f"no link issued: {exc}") from exc
        self.stderr.write(f"enrolment link for {user.get_username()}, valid once until "
                          f"{link.expires_at:%Y-%m-%d %H:%M} UTC, opened signed in as that account")
        self.stdout.write(url)
