"""The project's URL map: admin and health check; the portal and staff dashboard mount here."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from diagnostic.health import healthz

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
]
