"""Admin for jobs, stage runs, findings, measurements, lab leases, report versions and the
dashboard's records (finding edits, lab health): every one of them read-only.

A job's status, its stages' results and its findings are what the report and the money-back
decision are made of; they change only through the paths that keep a record (the
orchestrator, the staff dashboard's kept edits and approvals), never by a form here.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from diagnostic.jobs.models import (
    DiagnosticJob,
    Finding,
    FindingEdit,
    JobEvent,
    LabHealth,
    LabLease,
    Measurement,
    NodeHealth,
    ReportVersion,
    StageRun,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shown to staff, never added, changed or deleted here (a POST is refused with 403)."""

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


class StageRunInline(admin.TabularInline):
    model = StageRun
    extra = 0
    fields = (
        "order", "name", "status", "attempts", "progress_percent", "progress_message",
        "lease_owner", "lease_expires_at",
    )
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(DiagnosticJob)
class DiagnosticJobAdmin(ReadOnlyAdmin):
    list_display = ("id", "lab", "status", "created_at", "finished_at")
    list_filter = ("status", "lab")
    list_select_related = ("lab",)
    inlines = (StageRunInline,)


@admin.register(StageRun)
class StageRunAdmin(ReadOnlyAdmin):
    list_display = ("job", "order", "name", "status", "attempts", "lease_owner", "lease_expires_at")
    list_filter = ("status", "name")
    search_fields = ("job__id",)


@admin.register(Finding)
class FindingAdmin(ReadOnlyAdmin):
    list_display = ("code", "title", "job", "blocking")
    list_filter = ("code", "blocking")
    search_fields = ("code", "title")


@admin.register(Measurement)
class MeasurementAdmin(ReadOnlyAdmin):
    list_display = ("job", "workload", "configuration", "n", "mean_tps", "ci95_low", "ci95_high")
    list_filter = ("workload",)


@admin.register(LabLease)
class LabLeaseAdmin(ReadOnlyAdmin):
    list_display = ("lab", "job", "owner", "expires_at")


@admin.register(ReportVersion)
class ReportVersionAdmin(ReadOnlyAdmin):
    list_display = ("job", "digest", "pages", "created_at", "approved_at", "approved_by")
    list_filter = ("approved_at",)


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


@admin.register(JobEvent)
class JobEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "job", "kind", "message")
    list_filter = ("kind",)
