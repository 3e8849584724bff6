"""`python manage.py seed_demo --json [--password P]`: the demo cast (two customers of two
organisations, one staff member) with finished, approved diagnostics; prints the logins."""

from __future__ import annotations

import json
import secrets
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from diagnostic.jobs.models import DiagnosticJob
from diagnostic.staff.demo import SimLabNotStarted, seed


class Command(BaseCommand):
    help = "Create the demo organisations, users, bookings and finished diagnostics; print the logins."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the users as one JSON document")
        parser.add_argument(
            "--password", default="", help="password for every demo user (random if not given)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        password = options["password"] or secrets.token_urlsafe(12)
        try:
            users = seed(password, log=self.stderr.write)
        except SimLabNotStarted as exc:
            raise CommandError(str(exc)) from exc
        unfinished = DiagnosticJob.objects.filter(pk__in=[j for u in users for j in u["jobs"]]).exclude(
            status=DiagnosticJob.Status.SUCCEEDED
        )
        for job in unfinished:
            self.stderr.write(f"warning: demo job {job.pk} ended {job.status}: {job.status_message}")
        if options["json"]:
            self.stdout.write(json.dumps({"users": users}, indent=2))
            return
        for user in users:
            role = "staff" if user["staff"] else user["organisation"]
            self.stdout.write(f"{user['email']:<24} {user['password']}  ({role})")
