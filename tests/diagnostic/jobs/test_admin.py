"""The admin covers every model of the platform core, each list page renders, and nothing
of a job (its status, its stages' results, its findings) can be changed through it; the
health check tells anonymous callers nothing of the database's own words."""

from __future__ import annotations

from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import OperationalError, connection
from django.test import Client
from django.urls import reverse

from diagnostic.jobs.models import DiagnosticJob, Finding, StageRun
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


def test_health_check_names_no_internal_detail_when_the_database_is_down(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    detail = ('connection to server at "10.9.8.7", port 5432 failed: '
              'password authentication failed for user "diag"')

    def refuse() -> None:
        raise OperationalError(detail)

    monkeypatch.setattr(connection, "cursor", refuse)
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"ok": False, "database": "unavailable"}
    assert b"10.9.8.7" not in response.content and b"password" not in response.content
    (record,) = [r for r in caplog.records if r.name == "diagnostic.health"]
    assert record.error == detail  # type: ignore[attr-defined]


@pytest.fixture
def superuser_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root-staff", "root@firm.example", "pw-not-used-2"))
    return client


def finished_job_with_a_finding(make_job: Any) -> tuple[DiagnosticJob, StageRun, Finding]:
    job: DiagnosticJob = make_job(["report"])
    orchestrate(str(job.pk), no_lab)
    job.refresh_from_db()
    stage = job.stage_runs.get(name="report")
    finding = Finding.objects.create(
        job=job, stage=stage, code="load.weights_io", title="Weights load at a tenth of the disk's speed",
        evidence={"read_gbps": 0.4},
        change={"serving.load_format": {"from": "auto", "to": "fastsafetensors"}},
    )
    return job, stage, finding


# What a superuser might try to rewrite by hand: each is a form POST the admin would
# otherwise accept, with the record and field it must leave as they were.
TAMPERING = [
    ("diagnosticjob", "job", {"status": "failed", "lab": "", "cancel_requested": "on"}, "status"),
    ("stagerun", "stage", {"status": "failed", "result": '{"forged": true}', "attempts": "9"}, "result"),
    ("finding", "finding", {"code": "lab.engine_crash", "title": "Our fault: money back", "blocking": "on",
                            "evidence": "{}", "change": "{}", "impact": "null"}, "title"),
]


@pytest.mark.parametrize(("model", "which", "form", "field"), TAMPERING)
def test_the_admin_refuses_to_change_results(
    superuser_client: Client, make_job: Any, model: str, which: str, form: dict[str, str], field: str
) -> None:
    job, stage, finding = finished_job_with_a_finding(make_job)
    record = {"job": job, "stage": stage, "finding": finding}[which]
    before = getattr(record, field)
    change_url = reverse(f"admin:jobs_{model}_change", args=[record.pk])
    # Staff may look: the page renders, without a save button.
    page = superuser_client.get(change_url)
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert superuser_client.post(change_url, form).status_code == 403
    assert superuser_client.post(reverse(f"admin:jobs_{model}_delete", args=[record.pk]), {"post": "yes"}
                                 ).status_code == 403
    assert superuser_client.post(reverse(f"admin:jobs_{model}_add"), form).status_code == 403
    # Nor through the list page's bulk delete.
    superuser_client.post(reverse(f"admin:jobs_{model}_changelist"),
                          {"action": "delete_selected", "_selected_action": [record.pk], "post": "yes"})
    record.refresh_from_db()
    assert getattr(record, field) == before


def test_no_jobs_admin_offers_to_add_change_or_delete(superuser_client: Client) -> None:
    request = superuser_client.get(reverse("admin:index")).wsgi_request
    for model in apps.get_app_config("jobs").get_models():
        model_admin = admin.site._registry[model]
        allowed = (model_admin.has_add_permission(request), model_admin.has_change_permission(request),
                   model_admin.has_delete_permission(request))
        assert allowed == (False, False, False), model.__name__
        assert model_admin.has_view_permission(request)
