"""Portal URLs under /portal/ (outside checks use these paths; see DESIGN.md)."""

from __future__ import annotations

from django.urls import path

from diagnostic.portal import booking_views, config_views, job_views

app_name = "portal"

urlpatterns = [
    path("", booking_views.bookings, name="bookings"),
    path("book/", booking_views.book, name="book"),
    path("book/summary/", booking_views.book_summary, name="book-summary"),
    path("bookings/<uuid:booking_id>/", booking_views.booking_detail, name="booking"),
    path("bookings/<uuid:booking_id>/cancel/", booking_views.booking_cancel, name="booking-cancel"),
    path(
        "bookings/<uuid:booking_id>/reschedule/", booking_views.booking_reschedule, name="booking-reschedule"
    ),
    path("bookings/<uuid:booking_id>/config/", config_views.booking_config, name="booking-config"),
    path("jobs/<uuid:job_id>/", job_views.job_detail, name="job"),
    path("jobs/<uuid:job_id>/stages/", job_views.job_stages, name="job-stages"),
    path("jobs/<uuid:job_id>/report.pdf", job_views.job_report, name="job-report"),
    path("jobs/<uuid:job_id>/tuned-config.yaml", job_views.job_tuned_config, name="job-tuned-config"),
    path("jobs/<uuid:job_id>/tuned-command.txt", job_views.job_tuned_command, name="job-tuned-command"),
    path("jobs/<uuid:job_id>/tuned.diff", job_views.job_tuned_diff, name="job-tuned-diff"),
]
