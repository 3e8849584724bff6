"""The staff app; after each migrate it makes sure the `staff` group holds the two
permissions that let a consultant act (approve and send, decide a refund)."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate

STAFF_GROUP = "staff"
ACTING_PERMISSIONS = ("approve_report", "decide_refund")


def ensure_staff_group(**kwargs: Any) -> None:
    from django.contrib.auth.models import Group, Permission

    perms = Permission.objects.filter(content_type__app_label="jobs", codename__in=ACTING_PERMISSIONS)
    if perms.count() != len(ACTING_PERMISSIONS):
        return  # the jobs app's permissions are created by its own post_migrate; next run
    group, _ = Group.objects.get_or_create(name=STAFF_GROUP)
    group.permissions.add(*perms)


class StaffConfig(AppConfig):
    name = "diagnostic.staff"
    label = "staff"
    verbose_name = "Staff dashboard"

    def ready(self) -> None:
        post_migrate.connect(ensure_staff_group, dispatch_uid="diagnostic.staff.ensure_staff_group")
