"""Every staff URL as the whole cast: anonymous visitors go to the login page (302), a
customer gets 404 (the dashboard confirms nothing to customers, neither the page nor the
job; the portal answers staff the same way), staff without the `staff` group may look but
not change what a customer receives (edit findings, render a version, the job actions),
nor approve or decide a refund (403, and no button); the group's members may do all of it.
Every URL and the admin's, walked by pattern, with a second factor required:
tests/diagnostic/staff/test_access_door.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from diagnostic.celery import app
from diagnostic.jobs.models import DiagnosticJob, FindingEdit, ReportVersion
from reports.models import override_money_back
from tests.diagnostic.conftest import Cast

pytestmark = pytest.mark.django_db

LOOKING = [
    "/staff/",
    "/staff/?state=succeeded&q=acme",
    "/staff/jobs/rows/",
    "/staff/jobs/{job}/",
    "/staff/jobs/{job}/timeline/",
    "/staff/jobs/{job}/log/preflight/",
    "/staff/jobs/{job}/log/preflight/?format=json&since=0",
    "/staff/lab/",
    "/staff/lab/sections/",
    "/staff/reports/{job}/",
    "/staff/reports/{job}/render/status/",
]
# The confirmation pages of what changes what the customer receives: the group's.
CONFIRMING = [
    "/staff/jobs/{job}/cancel/",
    "/staff/jobs/{job}/rerun-report/",
    "/staff/jobs/{job}/retry/?stage=reproduce",
    "/staff/jobs/{job}/resume/",
    "/staff/jobs/{job}/move/",
]
# Running the day and writing the report: the `staff` group's.
RUNNING_THE_DAY = ["/staff/jobs/{job}/cancel/", "/staff/jobs/{job}/retry/", "/staff/jobs/{job}/rerun-report/",
                   "/staff/reports/{job}/render/", "/staff/reports/{job}/findings/{finding}/"]
ACTING = ["/staff/reports/{job}/approve/", "/staff/reports/{job}/money-back/",
          "/staff/reports/{job}/money-back/{override}/revert/"]


def urls(paths: list[str], job: DiagnosticJob, override: int = 0) -> list[str]:
    finding = job.finding_set.order_by("id").values_list("pk", flat=True).first()
    return [p.format(job=job.pk, override=override, finding=finding) for p in paths]


def test_every_staff_url_as_the_cast(cast: Cast, finished: DiagnosticJob, approver_client: Client) -> None:
    DiagnosticJob.objects.filter(pk=finished.pk).update(status=DiagnosticJob.Status.HELD)  # resume, move
    for url in urls(LOOKING + CONFIRMING, finished):
        anonymous = cast.anonymous.get(url)
        assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/"), url
        for customer in ("alice", "bob"):
            assert cast.client(customer).get(url).status_code == 404, (customer, url)
        looking = url in urls(LOOKING, finished)
        assert cast.client("staff").get(url).status_code == (200 if looking else 403), url
        assert approver_client.get(url).status_code == 200, url


def test_running_the_day_is_the_groups(cast: Cast, finished: DiagnosticJob, sim_state_dir: Any,
                                       approver_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(app.conf, "task_always_eager", True)  # the report renders here, not on a broker
    form = {"stage": "reproduce", "title": "Our own words", "narrative": "Said otherwise.", "note": ""}
    for url in urls(RUNNING_THE_DAY, finished):
        anonymous = cast.anonymous.post(url, form)
        assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/"), url
        assert cast.client("alice").post(url, form).status_code == 404, url
        kept = (FindingEdit.objects.count(), ReportVersion.objects.count())
        assert cast.client("staff").post(url, form).status_code == 403, url
        assert (FindingEdit.objects.count(), ReportVersion.objects.count()) == kept, url
        done = approver_client.post(url, form)
        assert done.status_code == 302 and done["Location"].startswith("/staff/"), url


def test_look_only_staff_cannot_edit_findings_or_render(cast: Cast, finished: DiagnosticJob) -> None:
    """The attack: a staff member without the group posts new words for a finding, as the
    member's form would, then asks for a new version. Both refused, nothing kept; the
    review page shows the words without a form and offers no render button."""
    finding = finished.finding_set.get(code="load.weights_io")
    look_only = cast.client("staff")
    edit = look_only.post(f"/staff/reports/{finished.pk}/findings/{finding.pk}/",
                          {"title": "Nothing wrong here", "narrative": "All fine.", "note": "trust us"})
    assert edit.status_code == 403
    assert "Only the <code>staff</code> group may do this" in edit.content.decode()
    render = look_only.post(f"/staff/reports/{finished.pk}/render/")
    assert render.status_code == 403
    assert not FindingEdit.objects.exists() and not ReportVersion.objects.exists()
    finding.refresh_from_db()
    assert finding.title == "Weights load from a slow disk"
    page = look_only.get(f"/staff/reports/{finished.pk}/").content.decode()
    assert "/findings/" not in page and 'id="render-version"' not in page and "Save the words" not in page
    assert 'id="look-only"' in page and "The weights were read at 180 MB/s." in page


def test_acting_needs_the_staff_group(cast: Cast, finished: DiagnosticJob, approver: Any) -> None:
    row = override_money_back(job_id=str(finished.pk), eligible=True,
                              reason="Lab cooling failed for two hours mid-day.", by=approver)
    for url in urls(ACTING, finished, row.pk):
        assert cast.anonymous.post(url).status_code == 302, url
        assert cast.client("alice").post(url).status_code == 404, url
        assert cast.client("staff").post(url, {"version": "x", "eligible": "no", "reason": "r" * 30}
                                          ).status_code == 403, url
    # The page tells a staff member without the group that they cannot act, and offers no button.
    page = cast.client("staff").get(f"/staff/reports/{finished.pk}/").content.decode()
    assert "Approving needs the" in page and "Record the override" not in page


def test_a_job_id_that_does_not_exist_is_404_for_staff(cast: Cast, db: None) -> None:
    missing = "00000000-0000-0000-0000-000000000000"
    for path in ("/staff/jobs/{}/", "/staff/reports/{}/", "/staff/jobs/{}/log/preflight/"):
        assert cast.client("staff").get(path.format(missing)).status_code == 404


def test_two_factor_when_required(cast: Cast, settings: Any, db: None) -> None:
    from django_otp.oath import totp
    from django_otp.plugins.otp_totp.models import TOTPDevice

    from diagnostic.staff.enrolment import issue

    settings.STAFF_REQUIRE_2FA = True
    client = cast.client("staff")
    first = client.get("/staff/")
    assert first.status_code == 302 and first["Location"].startswith("/staff/2fa/")
    # No authenticator and no link: the page says to ask for one, and offers no secret.
    ask = client.get("/staff/2fa/?next=/staff/lab/")
    assert ask.status_code == 200 and b"Ask for an enrolment link" in ask.content
    assert not TOTPDevice.objects.filter(user=cast.staff).exists()
    _, url = issue(user=cast.staff)
    link = url.removeprefix(settings.SITE_URL.rstrip("/"))
    enrol = client.get(f"{link}?next=/staff/lab/")
    assert enrol.status_code == 200 and b"Set up your authenticator" in enrol.content
    device = TOTPDevice.objects.get(user=cast.staff)
    assert client.post(link, {"token": "000000", "next": "/staff/lab/"}).status_code == 400
    device.refresh_from_db()
    device.throttling_failure_count = 0
    device.throttling_failure_timestamp = None
    device.save()
    code = totp(device.bin_key, step=device.step, t0=device.t0, digits=device.digits)
    verified = client.post(link, {"token": f"{code:06d}", "next": "/staff/lab/"})
    assert verified.status_code == 302 and verified["Location"] == "/staff/lab/"
    assert client.get("/staff/").status_code == 200
    # Customers are not offered a device.
    assert cast.client("alice").get("/staff/").status_code == 404
    assert cast.client("alice").get("/staff/2fa/").status_code == 404
    assert cast.client("alice").get(link).status_code == 404
    assert not TOTPDevice.objects.filter(user=cast.alice).exists()
