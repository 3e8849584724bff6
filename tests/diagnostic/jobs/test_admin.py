"""The admin covers every model of the platform core, and each list page renders."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from diagnostic.jobs.models import DiagnosticJob
from diagnostic.jobs.orchestration import orchestrate
from tests.diagnostic.doubles import no_lab

pytestmark = pytest.mark.django_db
CORE_APPS = ("bookings", "jobs")


def core_models() -> list[type]:
    return [m for label in CORE_APPS for m in apps.get_app_config(label).get_models()]


def test_every_core_model_has_an_admin() -> None:
    missing = [m.__name__ for m in core_models() if not admin.site.is_registered(m)]
    assert missing == []


def test_every_admin_list_and_a_job_page_render_for_staff(make_job: object) -> None:
    job: DiagnosticJob = make_job(["report"])  # type: ignore[operator]
    orchestrate(str(job.pk), no_lab)
    client = Client()
    client.force_login(User.objects.create_superuser("staff", "staff@firm.example", "pw-not-used-1"))
    for model in core_models():
        meta = model._meta  # type: ignore[attr-defined]
        response = client.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))
        assert response.status_code == 200, meta.model_name
    page = client.get(reverse("admin:jobs_diagnosticjob_change", args=[job.pk]))
    assert page.status_code == 200
    assert b"report" in page.content


def test_health_check_answers_when_the_database_does() -> None:
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"ok": True}
