"""Demo data for looking at the portal: two customer organisations and a staff member,
each customer with a booking, the configuration they submitted and a finished
diagnostic run on the simulated lab, its report approved.

The simulated lab is reached as any lab is, through its inventory: it runs as a child
process (`python -m lab sim serve`), not imported.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.utils import timezone

from diagnostic.bookings.configs import submit_configuration
from diagnostic.bookings.models import SIM_PREFIX, Booking, Customer, Lab, LabDay, Organisation, book_lab_day
from diagnostic.jobs.labaccess import open_lab_session
from diagnostic.jobs.models import DiagnosticJob
from diagnostic.jobs.orchestration import create_job, run_until_done
from diagnostic.staff.apps import STAFF_GROUP, ensure_staff_group

REPO = Path(settings.BASE_DIR)
SCENARIO = REPO / "lab" / "scenarios" / "reference-kimi-k2-8spark.yaml"
CONFIG = REPO / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"
LAB_NAME = "sim:reference-kimi-k2-8spark"
START_TIMEOUT_S = 180.0
# The calendar has this many days ahead open for booking.
DAYS_AHEAD = 60


@dataclass(frozen=True)
class Person:
    email: str
    organisation: str | None  # None: staff
    day_offset: int = 0  # the demo booking's lab day, relative to today
    lab: str = ""  # the Lab its demo day is on (by name)


# The portal's calendar shows one lab (the demo lab). A report is on time until the end of
# the first business day after its lab day (reports.moneyback.report_deadline), so only
# yesterday's and today's days are sure to be on time whatever the weekday the demo is
# seeded on. Alice's seeded day is yesterday on the demo lab; Bob's is yesterday on a second
# simulated lab that opens no other day. Today on the demo lab stays free for a visitor to
# book and watch a run (`manage.py serve_lab` serves the lab; README "Looking at the portal").
SECOND_LAB_NAME = "sim:second-kimi-k2-8spark"
CAST = (
    Person("alice@acme.example", "Acme Inference", -1, LAB_NAME),
    Person("bob@globex.example", "Globex Serving", -1, SECOND_LAB_NAME),
    Person("staff@lab.example", None),
)


class SimLabNotStarted(RuntimeError):
    pass


@contextmanager
def serving_sim_lab(lab: Lab, *, timeout_s: float = START_TIMEOUT_S) -> Iterator[Path]:
    """Run `python -m lab sim serve` for `lab` until the block ends; yields its inventory."""
    scenario = lab.inventory.removeprefix(SIM_PREFIX)
    state_dir = lab.sim_state_dir
    inventory = lab.inventory_path()
    inventory.unlink(missing_ok=True)  # a stale file from an earlier run is not a running lab
    process = subprocess.Popen(
        [sys.executable, "-m", "lab", "sim", "serve", "--scenario", scenario, "--state-dir", str(state_dir)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ready = threading.Event()
    output: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            if line.startswith("labsim:") and "inventory at" in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not ready.wait(timeout_s) or process.poll() is not None:
            raise SimLabNotStarted(f"the simulated lab did not start: {''.join(output)[-2000:]}")
        yield inventory
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def demo_lab(name: str = LAB_NAME, offsets: range | tuple[int, ...] = range(-7, DAYS_AHEAD)) -> Lab:
    """The simulated Lab `name` with a LabDay at each offset (days from today)."""
    lab, _ = Lab.objects.get_or_create(name=name, defaults={"inventory": f"{SIM_PREFIX}{SCENARIO}"})
    today = timezone.localdate()
    for offset in offsets:
        LabDay.objects.get_or_create(lab=lab, date=today + dt.timedelta(days=offset))
    return lab


def _lab_of(person: Person) -> Lab:
    if person.lab == LAB_NAME:
        return demo_lab()
    return demo_lab(person.lab, (person.day_offset,))


def _user(person: Person, password: str) -> User:
    user, _ = User.objects.get_or_create(username=person.email, defaults={"email": person.email})
    user.email = person.email
    user.is_staff = person.organisation is None
    user.set_password(password)
    user.save()
    if user.is_staff:
        # The dashboard's acting permissions (approve and send, refunds) come with the group.
        ensure_staff_group()
        user.groups.add(Group.objects.get(name=STAFF_GROUP))
    if person.organisation is not None:
        organisation, _ = Organisation.objects.get_or_create(name=person.organisation)
        Customer.objects.get_or_create(user=user, defaults={"organisation": organisation})
    return user


def _finished_booking(user: User, lab: Lab, offset: int) -> Booking | None:
    """The customer's demo booking if it already has a finished job with a report."""
    day = LabDay.objects.get(lab=lab, date=timezone.localdate() + dt.timedelta(days=offset))
    booking = Booking.objects.filter(lab_day=day, customer=user).exclude(status="cancelled").first()
    if booking is not None and booking.jobs.filter(report_versions__isnull=False).exists():
        return booking
    return None


def _diagnose(booking: Booking, user: User) -> DiagnosticJob:
    config = submit_configuration(
        raw_text=CONFIG.read_text(), source="yaml", booking=booking, submitted_by=user, label=CONFIG.name
    )
    job = create_job(config=config, lab=booking.lab_day.lab, booking=booking, created_by=user)
    return run_until_done(str(job.pk), open_lab_session)


def seed(password: str, *, log: Any = None) -> list[dict[str, Any]]:
    """Create (or bring up to date) the demo cast and their finished diagnostics."""
    demo_lab()
    users = {p.email: _user(p, password) for p in CAST}
    staff = users[CAST[-1].email]
    todo: dict[str, tuple[Lab, list[tuple[User, Booking]]]] = {}
    for person in CAST:
        if person.organisation is None:
            continue
        user = users[person.email]
        lab = _lab_of(person)
        if _finished_booking(user, lab, person.day_offset) is None:
            day = LabDay.objects.get(
                lab=lab, date=timezone.localdate() + dt.timedelta(days=person.day_offset)
            )
            Booking.objects.filter(lab_day=day).exclude(status="cancelled").update(status="cancelled")
            todo.setdefault(lab.name, (lab, []))[1].append((user, book_lab_day(lab_day=day, customer=user)))
    for lab, runs in todo.values():
        with serving_sim_lab(lab):
            for user, booking in runs:
                if log:
                    log(f"running the diagnostic of {booking} on the simulated lab {lab.name}")
                job = _diagnose(booking, user)
                if log:
                    log(f"  job {job.pk}: {job.status}")
                Booking.objects.filter(pk=booking.pk).update(status=Booking.Status.COMPLETED)
    out = []
    for person in CAST:
        user = users[person.email]
        bookings = list(
            Booking.objects.filter(customer=user).exclude(status="cancelled").order_by("created_at")
        )
        jobs = list(DiagnosticJob.objects.filter(booking__in=bookings).order_by("created_at"))
        for job in jobs:
            for version in job.report_versions.filter(approved_at__isnull=True):
                version.approve(by=staff)
        out.append(
            {
                "email": person.email,
                "password": password,
                "organisation": person.organisation,
                "staff": person.organisation is None,
                "bookings": [str(b.uuid) for b in bookings],
                "jobs": [str(j.pk) for j in jobs],
            }
        )
    return out
