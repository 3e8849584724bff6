"""Admin for jobs, stage runs, findings, measurements, lab leases and the dashboard's
records (finding edits, lab health), the latter read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from diagnostic.jobs.models import (
    DiagnosticJob,
    Finding,
    FindingEdit,
    LabHealth,
    LabLease,
    Measurement,
    NodeHealth,
    ReportVersion,
    StageRun,
)


class StageRunInline(admin.TabularInline):
    model = StageRun
    extra = 0
    fields = (
        "order", "name", "status", "attempts", "progress_percent", "progress_message",
        "lease_owner", "lease_expires_at",
    )
    readonly_fields = fields
    can_delete = False


@admin.register(DiagnosticJob)
class DiagnosticJobAdmin(admin.ModelAdmin):
    list_display = ("id", "lab", "status", "created_at", "finished_at")
    list_filter = ("status", "lab")
    list_select_related = ("lab",)
    readonly_fields = ("id", "created_at", "started_at", "finished_at")
    inlines = (StageRunInline,)


@admin.register(StageRun)
class StageRunAdmin(admin.ModelAdmin):
    list_display = ("job", "order", "name", "status", "attempts", "lease_owner", "lease_expires_at")
    list_filter = ("status", "name")
    search_fields = ("job__id",)


@admin.register(Finding)
class FindingAdmin(admin.ModelAdmin):
    list_display = ("code", "title", "job", "blocking")
    list_filter = ("code", "blocking")
    search_fields = ("code", "title")


@admin.register(Measurement)
class MeasurementAdmin(admin.ModelAdmin):
    list_display = ("job", "workload", "configuration", "n", "mean_tps", "ci95_low", "ci95_high")
    list_filter = ("workload",)


@admin.register(LabLease)
class LabLeaseAdmin(admin.ModelAdmin):
    list_display = ("lab", "job", "owner", "expires_at")


@admin.register(ReportVersion)
class ReportVersionAdmin(admin.ModelAdmin):
    list_display = ("job", "digest", "pages", "created_at", "approved_at", "approved_by")
    list_filter = ("approved_at",)
    readonly_fields = ("job", "digest", "pdf_path", "pages", "created_at")


class ReadOnlyAdmin(admin.ModelAdmin):
    """Records the dashboard keeps (edits, health polls): shown, never changed here."""

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(FindingEdit)
class FindingEditAdmin(ReadOnlyAdmin):
    list_display = ("finding", "field", "edited_by", "edited_at")
    list_filter = ("field",)


@admin.register(LabHealth)
class LabHealthAdmin(ReadOnlyAdmin):
    list_display = ("lab", "checked_at", "error")


@admin.register(NodeHealth)
class NodeHealthAdmin(ReadOnlyAdmin):
    list_display = ("lab", "node", "reachable", "engine_running", "checked_at", "last_telemetry_at")
    list_filter = ("reachable", "lab")
