"""Admin for organisations, customers, labs, lab days, bookings and configurations.

Bookings and configurations are read-only here: they are made and changed only through
the rules the portal applies (one booking per lab day, the change cutoff, membership of
the organisation, validation of the configuration), so the admin offers those rules'
own functions as actions instead of free edits. A customer's organisation and a booked
lab day's date are fixed once set, since bookings hang on them.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from diagnostic.bookings.models import (
    Booking,
    BookingRefused,
    ClusterConfiguration,
    Customer,
    Lab,
    LabDay,
    LabNode,
    Organisation,
    cancel_booking,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows that change only through their domain functions: viewable, not editable."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Organisation)
class OrganisationAdmin(admin.ModelAdmin):
    list_display = ("name", "created_at")
    search_fields = ("name",)


@admin.register(Customer)
class CustomerAdmin(admin.ModelAdmin):
    list_display = ("user", "organisation")
    list_select_related = ("user", "organisation")
    search_fields = ("user__username", "user__email", "organisation__name")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # The customer's bookings belong to this organisation; moving them would leave
        # bookings whose customer is not a member. Invite them anew into the other one.
        return ("user", "organisation") if obj is not None else ()


class LabNodeInline(admin.TabularInline):
    model = LabNode
    extra = 0


@admin.register(Lab)
class LabAdmin(admin.ModelAdmin):
    list_display = ("name", "inventory")
    search_fields = ("name",)
    inlines = (LabNodeInline,)


@admin.register(LabNode)
class LabNodeAdmin(admin.ModelAdmin):
    list_display = ("name", "lab", "role", "host")
    list_filter = ("lab", "role")


@admin.register(LabDay)
class LabDayAdmin(admin.ModelAdmin):
    list_display = ("date", "lab", "closed")
    list_filter = ("lab", "closed")
    date_hierarchy = "date"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # A booked day's date and lab are the customer's: moving it is a reschedule.
        if obj is not None and obj.bookings.exclude(status=Booking.Status.CANCELLED).exists():
            return ("lab", "date")
        return ()


@admin.register(Booking)
class BookingAdmin(ReadOnlyAdmin):
    """Bookings are made in the portal (book_lab_day); the one change offered here is the
    customer's own: cancelling, before the cutoff and before the diagnostic starts."""

    list_display = ("lab_day", "organisation", "customer", "status", "created_at")
    list_filter = ("status", "lab_day__lab")
    list_select_related = ("lab_day__lab", "organisation", "customer")
    search_fields = ("organisation__name", "customer__username")
    actions = ("cancel_selected",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field.name for field in Booking._meta.fields]

    @admin.action(description="Cancel the selected bookings (the portal's rules apply)")
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Booking]) -> None:
        for booking in queryset.select_related("lab_day__lab"):
            try:
                cancel_booking(booking=booking)
            except BookingRefused as exc:
                self.message_user(request, f"{booking}: {exc}", messages.ERROR)
            else:
                self.message_user(request, f"{booking}: cancelled", messages.SUCCESS)


@admin.register(ClusterConfiguration)
class ClusterConfigurationAdmin(ReadOnlyAdmin):
    """Configurations come in through the portal or `diagnose`, both validated by
    submit_configuration; a job reproduces one exactly, so none is edited afterwards."""

    list_display = ("__str__", "organisation", "source", "booking", "created_at")
    list_filter = ("source",)
    list_select_related = ("organisation", "booking__lab_day__lab")
