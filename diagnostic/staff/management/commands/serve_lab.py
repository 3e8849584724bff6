"""`python manage.py serve_lab [--lab NAME]`: serve a simulated lab until interrupted, so
that a job booked on it in the portal (or started by `diagnose --queue`) finds its nodes."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from diagnostic.bookings.models import Lab
from diagnostic.staff.demo import LAB_NAME, SimLabNotStarted, serving_sim_lab


class Command(BaseCommand):
    help = "Serve a simulated lab (a Lab whose inventory is sim:SCENARIO) until Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--lab", default=LAB_NAME,
                            help=f"the Lab's name (default {LAB_NAME}, the demo lab)")
        parser.add_argument("--for-seconds", type=float, default=None,
                            help="stop after this many seconds instead of waiting for Ctrl-C")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["lab"]
        lab = Lab.objects.filter(name=name).first()
        if lab is None:
            known = ", ".join(Lab.objects.values_list("name", flat=True)) or "none (run seed_demo first)"
            raise CommandError(f"--lab {name!r} is not a lab here; labs: {known}")
        if not lab.is_simulated:
            raise CommandError(f"--lab {name!r} is a real lab ({lab.inventory}); only a simulated lab "
                               "(inventory sim:SCENARIO) is served by this command")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            with serving_sim_lab(lab) as inventory:
                self.stdout.write(f"serving {lab.name}: inventory at {inventory}; Ctrl-C stops it")
                self.stdout.flush()
                try:
                    stop.wait(options["for_seconds"])
                except KeyboardInterrupt:
                    pass
        except SimLabNotStarted as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"stopped {lab.name}")
