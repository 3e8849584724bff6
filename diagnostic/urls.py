"""The project's URL map: admin, health check, customer accounts, the portal and the
staff dashboard.

The admin served here is the staff door's (diagnostic.staff.access.StaffAdminSite): the
same login, lockouts and second factor as /staff/, never a password form of its own."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from diagnostic.health import healthz
from diagnostic.staff.access import StaffAdminSite

admin_site = StaffAdminSite.serving(admin.site)

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="portal:bookings", permanent=False)),
    path("admin/", admin_site.urls),
    path("healthz", healthz, name="healthz"),
    path("accounts/", include("diagnostic.accounts.urls")),
    path("portal/", include("diagnostic.portal.urls")),
    path("staff/", include("diagnostic.staff.urls")),
]
