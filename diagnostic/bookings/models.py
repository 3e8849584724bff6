"""Who books what: organisations and their customers, the labs and their days, bookings
of a lab day, and the cluster configurations customers submit for diagnosis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction
from django.db.models import Q

from lab.inventory import Inventory

SIM_PREFIX = "sim:"


class Organisation(models.Model):
    """A customer's company; bookings and configurations belong to it."""

    name = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name


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

    class Meta:
        ordering = ("date", "lab")
        constraints = (
            models.UniqueConstraint(fields=["lab", "date"], name="lab_day_unique"),
        )

    def __str__(self) -> str:
        return f"{self.lab.name} {self.date.isoformat()}"


class LabDayTaken(Exception):
    """The lab day already has a booking that is not cancelled."""

    def __init__(self, lab_day: LabDay) -> None:
        super().__init__(f"{lab_day} is already booked; choose another day")
        self.lab_day = lab_day


class Booking(models.Model):
    """A customer's booking of one lab day. At most one booking that is not cancelled
    exists per day; the database enforces it, so concurrent requests cannot both win."""

    class Status(models.TextChoices):
        REQUESTED = "requested", "requested"
        CONFIRMED = "confirmed", "confirmed"
        COMPLETED = "completed", "completed"
        CANCELLED = "cancelled", "cancelled"

    lab_day = models.ForeignKey(LabDay, on_delete=models.PROTECT, related_name="bookings")
    customer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="bookings"
    )
    organisation = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="bookings")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.REQUESTED)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

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


def book_lab_day(*, lab_day: LabDay, customer: Any, organisation: Organisation | None = None) -> Booking:
    """Book `lab_day` for `customer` (a user). Raises LabDayTaken when someone else holds it.

    The unique constraint decides between concurrent requests; this only translates its
    verdict into an error a person can act on.
    """
    if organisation is None:
        try:
            organisation = customer.customer.organisation
        except Customer.DoesNotExist:
            raise ValueError(f"user {customer} belongs to no organisation; create a Customer first") from None
    try:
        with transaction.atomic():
            return Booking.objects.create(lab_day=lab_day, customer=customer, organisation=organisation)
    except IntegrityError:
        if Booking.objects.filter(lab_day=lab_day).exclude(status=Booking.Status.CANCELLED).exists():
            raise LabDayTaken(lab_day) from None
        raise


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

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return self.label or f"configuration {self.pk} ({self.source})"
