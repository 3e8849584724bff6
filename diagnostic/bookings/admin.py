"""Admin for organisations, customers, labs, lab days, bookings and configurations."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin

from diagnostic.bookings.configs import normalize_submission
from diagnostic.bookings.models import (
    Booking,
    ClusterConfiguration,
    Customer,
    Lab,
    LabDay,
    LabNode,
    Organisation,
)


@admin.register(Organisation)
class OrganisationAdmin(admin.ModelAdmin):
    list_display = ("name", "created_at")
    search_fields = ("name",)


@admin.register(Customer)
class CustomerAdmin(admin.ModelAdmin):
    list_display = ("user", "organisation")
    list_select_related = ("user", "organisation")
    search_fields = ("user__username", "user__email", "organisation__name")


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
    list_display = ("date", "lab")
    list_filter = ("lab",)
    date_hierarchy = "date"


@admin.register(Booking)
class BookingAdmin(admin.ModelAdmin):
    list_display = ("lab_day", "organisation", "customer", "status", "created_at")
    list_filter = ("status", "lab_day__lab")
    list_select_related = ("lab_day__lab", "organisation", "customer")
    search_fields = ("organisation__name", "customer__username")


class ClusterConfigurationForm(forms.ModelForm):
    """Staff may enter a configuration here; it is normalized exactly as a submission is."""

    class Meta:
        model = ClusterConfiguration
        fields = ("label", "booking", "submitted_by", "source", "raw_text")

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        raw, source = cleaned.get("raw_text"), cleaned.get("source")
        if raw and source:
            self.instance.normalized = normalize_submission(raw, source)
        return cleaned


@admin.register(ClusterConfiguration)
class ClusterConfigurationAdmin(admin.ModelAdmin):
    form = ClusterConfigurationForm
    list_display = ("__str__", "source", "booking", "created_at")
    list_filter = ("source",)
    readonly_fields = ("normalized", "created_at")
