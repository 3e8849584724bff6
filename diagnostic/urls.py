"""The project's URL map: admin, health check, customer accounts, the portal and the
staff dashboard."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from diagnostic.health import healthz

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="portal:bookings", permanent=False)),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("accounts/", include("diagnostic.accounts.urls")),
    path("portal/", include("diagnostic.portal.urls")),
    path("staff/", include("diagnostic.staff.urls")),
]
