"""Who books what: organisations and their customers, the labs and their days, bookings
of a lab day, and the cluster configurations customers submit for diagnosis.

Every customer-owned row carries its organisation (Booking, ClusterConfiguration) or
reaches one through non-null links; `for_organisation` is the one filter every portal
query goes through, and model validation keeps the links agreeing where a database
constraint cannot reach across tables.
"""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction
from django.db.models import Q
from django.dispatch import Signal
from django.utils import timezone

from diagnostic.lifecycle import JobState
from lab.inventory import Inventory

# Sent inside cancel_booking's transaction, before the booking is marked cancelled, with
# `booking`, `reason` and `now`: the jobs app cancels the diagnostics still waiting for the
# day (diagnostic.jobs.models.cancel_waiting_jobs). Bookings are below jobs and do not
# import them.
booking_cancelling = Signal()

SIM_PREFIX = "sim:"


class Organisation(models.Model):
    """A customer's company; bookings and configurations belong to it."""

    name = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def house(cls) -> Organisation:
        """The firm's own organisation: owner of configurations and jobs run without a
        booking (the demo, a consultant's `diagnose`). No customer is a member of it."""
        house, _ = cls.objects.get_or_create(name=settings.DIAG_HOUSE_ORGANISATION)
        return house


class OrganisationScoped(models.QuerySet):
    """Rows of one organisation: every portal query of customer data starts here."""

    def for_organisation(self, organisation: Organisation | None) -> OrganisationScoped:
        if organisation is None:
            return self.none()
        return self.filter(organisation=organisation)


def organisation_of(user: Any) -> Organisation | None:
    """The organisation a signed-in user belongs to, or None (staff, anonymous, loners)."""
    if not getattr(user, "is_authenticated", False):
        return None
    if not Customer.user.field.remote_field.is_cached(user):
        # One query for both rows (every portal request asks), kept on the user the way
        # the ORM keeps `user.customer`; a user without one is asked again next time.
        customer = Customer.objects.select_related("organisation").filter(user_id=user.pk).first()
        if customer is None:
            return None
        user.customer = customer
    try:
        return user.customer.organisation
    except Customer.DoesNotExist:
        return None


class Customer(models.Model):
    """A portal user (a Django auth user) and the one organisation they belong to."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="customer"
    )
    organisation = models.ForeignKey(
        Organisation, on_delete=models.PROTECT, related_name="customers"
    )

    class Meta:
        ordering = ("organisation__name", "user__username")

    def __str__(self) -> str:
        return f"{self.user} ({self.organisation})"


class Lab(models.Model):
    """A lab a diagnostic runs on: real nodes behind an inventory file, or a simulated lab.

    `inventory` is either the path of a `lab.inventory/1` file or `sim:SCENARIO`, a
    scenario file served by `python -m lab sim serve` with its state under
    DIAG_SIM_STATE_DIR/<lab name without "sim:">.
    """

    name = models.CharField(max_length=100, unique=True)
    inventory = models.CharField(
        max_length=500, help_text="path to a lab.inventory/1 file, or sim:SCENARIO-FILE"
    )
    description = models.TextField(blank=True)
    # Who hears at once when a lab fault holds a day (DIAG_LAB_CONTACT_EMAIL when blank).
    contact_email = models.EmailField(blank=True)

    class Meta:
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name

    @property
    def is_simulated(self) -> bool:
        return self.inventory.startswith(SIM_PREFIX)

    def clean(self) -> None:
        if self.is_simulated and not self.inventory[len(SIM_PREFIX) :].strip():
            raise ValidationError({"inventory": "sim: must be followed by a scenario file path"})
        if not self.inventory.strip():
            raise ValidationError({"inventory": "give an inventory file path or sim:SCENARIO-FILE"})

    @property
    def sim_state_dir(self) -> Path:
        """Where a simulated lab of this name keeps its inventory, keys and state."""
        slug = self.name[len(SIM_PREFIX) :] if self.name.startswith(SIM_PREFIX) else self.name
        return Path(settings.DIAG_SIM_STATE_DIR) / slug

    def inventory_path(self) -> Path:
        """The inventory file a lab session opens for this lab."""
        if self.is_simulated:
            return self.sim_state_dir / "inventory.yaml"
        return Path(self.inventory)

    def node_count(self) -> int | None:
        """How many nodes the lab has, from what is known of it without reaching it: its
        mirrored nodes (the diagnose command and the lab-health poll keep them), else its
        inventory file; None when neither says."""
        mirrored = self.nodes.count()
        if mirrored:
            return mirrored
        path = self.inventory_path()
        if path.is_file():
            from lab.inventory import InventoryError, load_inventory

            try:
                return len(load_inventory(path).nodes)
            except (InventoryError, OSError):
                return None
        return None

    def sync_nodes(self, inventory: Inventory) -> None:
        """Mirror the inventory's nodes as LabNode rows (for the staff dashboard)."""
        names = [node.name for node in inventory.nodes]
        for node in inventory.nodes:
            LabNode.objects.update_or_create(
                lab=self, name=node.name, defaults={"role": node.role, "host": node.host}
            )
        self.nodes.exclude(name__in=names).delete()


class LabNode(models.Model):
    """One node of a lab, mirrored from its inventory for the staff dashboard."""

    class Role(models.TextChoices):
        HEAD = "head", "head"
        WORKER = "worker", "worker"

    lab = models.ForeignKey(Lab, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=100)
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.WORKER)
    host = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ("lab", "name")
        constraints = (
            models.UniqueConstraint(fields=["lab", "name"], name="lab_node_name_unique"),
        )

    def __str__(self) -> str:
        return f"{self.lab.name}/{self.name}"


class LabDay(models.Model):
    """A day on which a lab can be booked."""

    lab = models.ForeignKey(Lab, on_delete=models.PROTECT, related_name="days")
    date = models.DateField()
    # Maintenance, a holiday: shown on the calendar, not bookable.
    closed = models.BooleanField(default=False)

    class Meta:
        ordering = ("date", "lab")
        constraints = (
            models.UniqueConstraint(fields=["lab", "date"], name="lab_day_unique"),
        )

    def __str__(self) -> str:
        return f"{self.lab.name} {self.date.isoformat()}"

    @property
    def starts_at(self) -> dt.datetime:
        """The start of the day in the lab's time (the project's TIME_ZONE)."""
        return timezone.make_aware(dt.datetime.combine(self.date, dt.time.min))


class BookingRefused(ValueError):
    """A booking action that cannot be done; the message says why, for the customer."""


class LabDayTaken(BookingRefused):
    """The lab day already has a booking that is not cancelled."""

    def __init__(self, lab_day: LabDay) -> None:
        super().__init__(f"{lab_day} is already booked; choose another day")
        self.lab_day = lab_day


class NotAMember(BookingRefused):
    """The user does not belong to the organisation the booking would be for."""


class OutsideCalendar(BookingRefused):
    """The day is not one the portal's calendar offers: too soon to book, in the past, or
    further ahead than the calendar reaches."""


class QuotaReached(BookingRefused):
    """The organisation already holds as many upcoming lab days as one may hold at once."""


class Booking(models.Model):
    """A customer's booking of one lab day. At most one booking that is not cancelled
    exists per day; the database enforces it, so concurrent requests cannot both win."""

    class Status(models.TextChoices):
        # The day is held for the customer; "confirmed" once their configuration is in.
        REQUESTED = "requested", "booked"
        CONFIRMED = "confirmed", "configuration received"
        COMPLETED = "completed", "completed"
        CANCELLED = "cancelled", "cancelled"

    # The booking's name in portal URLs; the integer key stays internal.
    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    lab_day = models.ForeignKey(LabDay, on_delete=models.PROTECT, related_name="bookings")
    customer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="bookings"
    )
    organisation = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="bookings")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.REQUESTED)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OrganisationScoped.as_manager()

    class Meta:
        ordering = ("-created_at",)
        constraints = (
            models.UniqueConstraint(
                fields=["lab_day"],
                condition=~Q(status="cancelled"),
                name="one_active_booking_per_lab_day",
            ),
        )

    def __str__(self) -> str:
        return f"{self.lab_day} for {self.organisation} ({self.status})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.clean()
        super().save(*args, **kwargs)

    def clean(self) -> None:
        # The booking's customer must be a member of its organisation; the two live in
        # different tables, so the database cannot check it.
        if self.customer_id is not None and self.organisation_id is not None:
            member = Customer.objects.filter(user_id=self.customer_id, organisation_id=self.organisation_id)
            if not member.exists():
                raise ValidationError({"customer": "is not a member of the booking's organisation"})

    @property
    def is_active(self) -> bool:
        return self.status != self.Status.CANCELLED

    def change_deadline(self) -> dt.datetime:
        """Until when the customer may cancel or move the booking."""
        return self.lab_day.starts_at - dt.timedelta(hours=settings.BOOKING_CHANGE_CUTOFF_H)

    def can_change(self, now: dt.datetime | None = None) -> bool:
        # A day the lab closed may be left at any time: the closure was ours, not a late change.
        return (
            self.status in (self.Status.REQUESTED, self.Status.CONFIRMED)
            and (self.lab_day.closed or (now or timezone.now()) < self.change_deadline())
            and not started_jobs(self).exists()
        )


def started_jobs(booking: Booking) -> models.QuerySet[Any]:
    """The booking's diagnostics that have begun or ended (not cancelled). A job confirmed
    ahead of the day waits queued, never started, and does not pin the booking: it moves
    with it, or is cancelled with it."""
    return booking.jobs.exclude(status=JobState.CANCELLED).filter(
        ~Q(status=JobState.QUEUED) | Q(started_at__isnull=False))


# -- what a customer may book: the calendar's days, a few at a time ---------------------
def max_open_bookings() -> int:
    """How many upcoming lab days one organisation may hold at once (BOOKING_MAX_OPEN_PER_ORG)."""
    return int(settings.BOOKING_MAX_OPEN_PER_ORG)


def first_bookable_date(now: dt.datetime | None = None) -> dt.date:
    """The earliest date still outside the change cutoff (a booking made later could not
    be cancelled, so the calendar does not offer it); today with BOOKING_SAME_DAY on."""
    moment = timezone.localtime(now or timezone.now())
    if settings.BOOKING_SAME_DAY:
        return moment.date()
    earliest = moment + dt.timedelta(hours=settings.BOOKING_CHANGE_CUTOFF_H)
    day = earliest.date()
    return day if earliest.time() == dt.time.min else day + dt.timedelta(days=1)


def calendar_end(first: dt.date) -> dt.date:
    """The day after the calendar's last: PORTAL_CALENDAR_DAYS from the Monday of `first`'s
    week, rounded up to whole weeks, as the portal lays it out."""
    monday = first - dt.timedelta(days=first.weekday())
    days = int(settings.PORTAL_CALENDAR_DAYS)
    return monday + dt.timedelta(days=days + (7 - days % 7) % 7)


def booking_window(now: dt.datetime | None = None) -> tuple[dt.date, dt.date]:
    """The dates a customer may book or move a booking to: [first, end)."""
    first = first_bookable_date(now)
    return first, calendar_end(first)


def _day_words(date: dt.date) -> str:
    return f"{date:%A} {date.day} {date:%B %Y}"


def check_in_calendar(lab_day: LabDay, now: dt.datetime | None = None) -> None:
    """OutsideCalendar, saying why, unless the calendar offers `lab_day`'s date."""
    first, end = booking_window(now)
    date = lab_day.date
    if date < timezone.localdate(now or timezone.now()):
        raise OutsideCalendar(f"{_day_words(date)} is in the past; choose a day on the calendar.")
    if date < first:
        raise OutsideCalendar(
            f"{_day_words(date)} is too soon to book: a booking can be changed until "
            f"{settings.BOOKING_CHANGE_CUTOFF_H} hours before its day, so the first day you can book "
            f"is {_day_words(first)}."
        )
    if date >= end:
        last = end - dt.timedelta(days=1)
        raise OutsideCalendar(
            f"{_day_words(date)} is further ahead than the booking calendar reaches: lab days can be "
            f"booked up to {_day_words(last)}. Choose a day on the calendar."
        )


def open_bookings(organisation: Organisation, now: dt.datetime | None = None) -> models.QuerySet[Booking]:
    """The organisation's bookings that hold a lab day still to come (not cancelled, not
    completed): what the BOOKING_MAX_OPEN_PER_ORG quota counts."""
    today = timezone.localdate(now or timezone.now())
    return Booking.objects.filter(
        organisation=organisation,
        status__in=(Booking.Status.REQUESTED, Booking.Status.CONFIRMED),
        lab_day__date__gte=today,
    )


def check_quota(organisation: Organisation, now: dt.datetime | None = None) -> None:
    """QuotaReached, naming the days held, when the organisation holds its most already."""
    limit = max_open_bookings()
    held = list(
        open_bookings(organisation, now).order_by("lab_day__date").values_list("lab_day__date", flat=True)
    )
    if len(held) >= limit:
        days = ", ".join(f"{d:%a} {d.day} {d:%b}" for d in held[:6]) + (", ..." if len(held) > 6 else "")
        raise QuotaReached(
            f"Your organisation already holds {len(held)} upcoming lab {'day' if len(held) == 1 else 'days'} "
            f"({days}), and an organisation may hold at most {limit} at a time. Cancel one of them, "
            "or book again once one has taken place."
        )


def book_lab_day(
    *,
    lab_day: LabDay,
    customer: Any,
    organisation: Organisation | None = None,
    limits: bool = False,
    now: dt.datetime | None = None,
) -> Booking:
    """Book `lab_day` for `customer` (a user) on behalf of `organisation` (theirs when not
    given). Raises NotAMember for a user outside that organisation, BookingRefused for a
    closed day and LabDayTaken when someone else holds it.

    With `limits` (the portal's bookings: what a customer asks for), also the customer's
    rules: OutsideCalendar for a day the calendar does not offer, QuotaReached when the
    organisation already holds BOOKING_MAX_OPEN_PER_ORG upcoming days. The quota is
    counted under a lock on the organisation's row, so concurrent requests of one
    organisation are counted one after the other. Without `limits` (the demo, tests, the
    firm's own tooling) any day may be booked.

    The unique constraint decides between concurrent requests for one day; this only
    translates its verdict into an error a person can act on.
    """
    member_of = organisation_of(customer)
    if organisation is None:
        if member_of is None:
            raise NotAMember(f"user {customer} belongs to no organisation; create a Customer first")
        organisation = member_of
    elif member_of is None or member_of.pk != organisation.pk:
        raise NotAMember(f"user {customer} is not a member of {organisation}")
    if lab_day.closed:
        raise BookingRefused(f"{lab_day} is closed; choose another day")
    if limits:
        check_in_calendar(lab_day, now)
    try:
        with transaction.atomic():
            if limits:
                Organisation.objects.select_for_update().get(pk=organisation.pk)
                check_quota(organisation, now)
            return Booking.objects.create(lab_day=lab_day, customer=customer, organisation=organisation)
    except IntegrityError:
        if Booking.objects.filter(lab_day=lab_day).exclude(status=Booking.Status.CANCELLED).exists():
            raise LabDayTaken(lab_day) from None
        raise


def _check_changeable(booking: Booking, now: dt.datetime | None) -> None:
    if not booking.is_active:
        raise BookingRefused("this booking is already cancelled")
    if booking.status == Booking.Status.COMPLETED:
        raise BookingRefused("this booking is completed")
    if started_jobs(booking).exists():
        raise BookingRefused("the diagnostic for this booking has started; it can no longer be changed")
    deadline = booking.change_deadline()
    if not booking.lab_day.closed and (now or timezone.now()) >= deadline:
        hours = settings.BOOKING_CHANGE_CUTOFF_H
        raise BookingRefused(
            f"bookings can be changed until {hours} h before the lab day "
            f"({deadline:%Y-%m-%d %H:%M} UTC); that time has passed"
        )


def cancel_booking(*, booking: Booking, now: dt.datetime | None = None) -> Booking:
    """Cancel before the cutoff; the day becomes free for others at once, and a diagnostic
    confirmed for it, still waiting for the day, is cancelled with it."""
    moment = now or timezone.now()
    with transaction.atomic():
        booking = Booking.objects.select_for_update().get(pk=booking.pk)
        _check_changeable(booking, moment)
        # The diagnostics waiting for the day go with it (jobs' receiver, in this transaction).
        booking_cancelling.send(sender=Booking, booking=booking,
                                reason="the booking was cancelled before its lab day", now=moment)
        if started_jobs(booking).exists():  # the lab day's start won a race with this cancel
            raise BookingRefused("the diagnostic for this booking has started; it can no longer be changed")
        booking.status = Booking.Status.CANCELLED
        booking.save(update_fields=["status", "updated_at"])
    return booking


def reschedule_booking(*, booking: Booking, lab_day: LabDay, now: dt.datetime | None = None) -> Booking:
    """Move a booking to another free day before the cutoff (of the old day); the new day
    must itself be at least the cutoff away, and on the calendar (OutsideCalendar beyond
    it). LabDayTaken when the new day went meanwhile."""
    if lab_day.closed:
        raise BookingRefused(f"{lab_day} is closed; choose another day")
    moment = now or timezone.now()
    if moment >= lab_day.starts_at - dt.timedelta(hours=settings.BOOKING_CHANGE_CUTOFF_H):
        raise BookingRefused(f"{lab_day} is too soon to move to; choose a later day")
    end = calendar_end(first_bookable_date(moment))
    if lab_day.date >= end:
        last = end - dt.timedelta(days=1)
        raise OutsideCalendar(
            f"{_day_words(lab_day.date)} is further ahead than the booking calendar reaches: a booking "
            f"can be moved to a day up to {_day_words(last)}. Choose a day on the calendar."
        )
    try:
        with transaction.atomic():
            locked = Booking.objects.select_for_update().get(pk=booking.pk)
            _check_changeable(locked, moment)
            locked.lab_day = lab_day
            locked.save(update_fields=["lab_day", "updated_at"])
    except IntegrityError:
        raise LabDayTaken(lab_day) from None
    return locked


class ClusterConfiguration(models.Model):
    """A configuration as the customer submitted it, and its normalized form.

    `raw_text` is kept verbatim (YAML, a pasted launch command, or the form's fields as
    JSON); `normalized` is the `diagnostic.config/1` document lab.config produced from it.
    Create rows through diagnostic.bookings.configs.submit_configuration, which validates.
    """

    class Source(models.TextChoices):
        FORM = "form", "form"
        YAML = "yaml", "YAML upload"
        COMMAND = "command", "launch command"

    # The owner. A configuration with a booking belongs to the booking's organisation;
    # one without (the demo, a consultant's run) to the house organisation.
    organisation = models.ForeignKey(
        Organisation, on_delete=models.PROTECT, related_name="configurations"
    )
    booking = models.ForeignKey(
        Booking, null=True, blank=True, on_delete=models.CASCADE, related_name="configurations"
    )
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="configurations",
    )
    label = models.CharField(max_length=200, blank=True)
    source = models.CharField(max_length=10, choices=Source.choices)
    raw_text = models.TextField()
    normalized = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OrganisationScoped.as_manager()

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return self.label or f"configuration {self.pk} ({self.source})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Ownership follows the booking, so a caller cannot file a configuration under
        # another organisation's booking.
        if self.organisation_id is None:
            booking = self.booking
            self.organisation = booking.organisation if booking is not None else Organisation.house()
        self.clean()
        super().save(*args, **kwargs)

    def clean(self) -> None:
        booking = self.booking
        if booking is not None and self.organisation_id is not None:
            if booking.organisation_id != self.organisation_id:
                raise ValidationError({"organisation": "must be the organisation of the booking"})
