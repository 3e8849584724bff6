"""Staff dashboard URLs under /staff/ (outside checks use the first five; see DESIGN.md)."""

from __future__ import annotations

from django.urls import path

from diagnostic.staff import job_views, lab_views, otp_views, review_views

app_name = "staff"

urlpatterns = [
    path("", job_views.job_list, name="jobs"),
    path("jobs/<uuid:job_id>/", job_views.job_detail, name="job"),
    path("jobs/<uuid:job_id>/log/<str:stage>/", job_views.stage_log, name="stage-log"),
    path("lab/", lab_views.lab_page, name="lab"),
    path("reports/<uuid:job_id>/", review_views.report_review, name="report"),
    # What the pages above poll and post to.
    path("jobs/rows/", job_views.job_list_rows, name="job-rows"),
    path("jobs/<uuid:job_id>/timeline/", job_views.job_timeline, name="job-timeline"),
    path("jobs/<uuid:job_id>/<str:action>/", job_views.job_action, name="job-action"),
    path("lab/refresh/", lab_views.lab_refresh, name="lab-refresh"),
    path("lab/sections/", lab_views.lab_sections, name="lab-sections"),
    path("reports/<uuid:job_id>/findings/<int:finding_id>/", review_views.finding_edit, name="finding-edit"),
    path("reports/<uuid:job_id>/render/", review_views.render_new_version, name="render"),
    path("reports/<uuid:job_id>/render/status/", review_views.render_status, name="render-status"),
    path("reports/<uuid:job_id>/approve/", review_views.approve_version, name="approve"),
    path("reports/<uuid:job_id>/approve/<str:version>/", review_views.approve_confirm,
         name="approve-confirm"),
    path("reports/<uuid:job_id>/versions/<str:version>/page-1.png", review_views.version_page,
         name="version-page"),
    path("reports/<uuid:job_id>/versions/<str:version>/report.pdf", review_views.version_pdf,
         name="version-pdf"),
    path("reports/<uuid:job_id>/money-back/", review_views.money_back_override, name="money-back"),
    path("reports/<uuid:job_id>/money-back/<int:override_id>/revert/", review_views.money_back_revert,
         name="money-back-revert"),
    path("2fa/", otp_views.otp_verify, name="otp"),
    # Enrolling an authenticator: a colleague's one-time link, and where the group issues them.
    path("2fa/enrol/<str:token>/", otp_views.otp_enrol, name="otp-enrol"),
    path("2fa/links/", otp_views.otp_links, name="otp-links"),
]
