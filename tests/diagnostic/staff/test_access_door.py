"""One door for staff: every URL under /staff/ and /admin/, found by walking the URL
patterns (a new URL is walked without being listed here; a new staff URL must say who
may use it), as the whole cast: anonymous visitors (the site's login page), customers
(404), a staff member without the `staff` group (looks, 403 on what changes what a
customer receives), a member of the group and a superuser; then, with STAFF_REQUIRE_2FA,
the same staff and the superuser without a verified TOTP device (the second factor's
page, for the admin too). The admin's own login form checks no password: it sends to the
site's login, with its lockouts."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, URLResolver
from django.urls.resolvers import RegexPattern
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice
from pypdf import PdfWriter

from diagnostic.jobs.models import DiagnosticJob, ReportVersion
from diagnostic.staff import urls as staff_urls
from diagnostic.staff.job_views import ACTIONS
from diagnostic.urls import admin_site
from reports.models import MoneyBackOverride, override_money_back
from tests.diagnostic.conftest import Cast, logged_in

pytestmark = pytest.mark.django_db

PASSWORD = "a long enough passphrase 42"
# Who may use each staff URL, by name. A URL added to diagnostic/staff/urls.py fails
# test_every_staff_url_says_who_may_use_it until it is placed here.
LOOK = {"jobs", "job", "stage-log", "lab", "report", "job-rows", "job-timeline", "lab-sections",
        "version-page", "version-pdf", "render-status"}
ANY_STAFF_POST = {"lab-refresh"}  # asks the lab for a health poll now: every staff member
GROUP = {"job-action", "finding-edit", "render", "otp-links"}  # changes what a customer receives, or who
# may enrol an authenticator
PERMISSION = {"approve", "approve-confirm", "money-back", "money-back-revert"}  # the group's permissions
DOOR = {"otp"}  # the second factor's own page
ENROL = {"otp-enrol"}  # a one-time enrolment link: its own account, signed in (a made-up one: 410)
POST_ONLY = ANY_STAFF_POST | {"finding-edit", "render"} | (PERMISSION - {"approve-confirm"})


def concrete(route: str, values: dict[str, str]) -> str:
    """A route with each parameter filled in (`<uuid:job_id>` with values["job_id"], else a
    sample of its converter's kind)."""
    samples = {"int": "1", "path": "1", "str": "1", "uuid": "00000000-0000-0000-0000-000000000000"}
    return re.sub(r"<(?:(\w+):)?(\w+)>",
                  lambda m: values.get(m.group(2), samples[m.group(1) or "str"]), route)


def walk(patterns: list[Any], prefix: str, values: dict[str, str]) -> Iterator[tuple[str, str]]:
    """(url name, path) of every pattern, includes followed."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from walk(pattern.url_patterns, prefix + concrete(str(pattern.pattern), values), values)
            continue
        assert isinstance(pattern, URLPattern)
        route = str(pattern.pattern)
        if isinstance(pattern.pattern, RegexPattern):  # the admin's app index and its catch-all
            route = f"{values['app_label']}/" if "app_label" in route else "no/such/page/"
        yield pattern.name or "", prefix + concrete(route, values)


def kept_version(job: DiagnosticJob) -> ReportVersion:
    """A kept version of one blank page (a real PDF: its page preview is drawn from it)."""
    version = job.report_versions.first()
    if version is not None:
        return version
    pdf = Path(settings.OUT_DIR) / "jobs" / str(job.pk) / "blank" / "report.pdf"
    pdf.parent.mkdir(parents=True, exist_ok=True)
    writer = PdfWriter()
    writer.add_blank_page(width=595, height=842)
    with pdf.open("wb") as handle:
        writer.write(handle)
    return ReportVersion.objects.create(job=job, digest="cd" * 32, pdf_path=str(pdf), pages=1)


def staff_urls_of(job: DiagnosticJob, override: MoneyBackOverride) -> list[tuple[str, str]]:
    finding = job.finding_set.order_by("id").first()
    assert finding is not None
    values = {"job_id": str(job.pk), "stage": "preflight", "finding_id": str(finding.pk),
              "override_id": str(override.pk), "action": "ACTION", "version": kept_version(job).version}
    found = []
    for name, path in walk(staff_urls.urlpatterns, "/staff/", values):
        if name == "job-action":
            found += [(name, path.replace("ACTION", action)) for action in ACTIONS]
        else:
            found.append((name, path))
    return found


def admin_urls() -> list[str]:
    paths = [path for _, path in walk(admin_site.get_urls(), "/admin/", {"app_label": "bookings"})]
    assert "/admin/" in paths and "/admin/login/" in paths and "/admin/auth/user/1/change/" in paths
    assert "/admin/otp_totp/totpdevice/add/" in paths  # the superuser's way to a device of their own
    assert len(paths) > 100
    return paths


@pytest.fixture
def override(finished: DiagnosticJob, approver: User) -> MoneyBackOverride:
    return override_money_back(job_id=str(finished.pk), eligible=True,
                               reason="Lab cooling failed for two hours mid-day.", by=approver)


@pytest.fixture
def root(db: None) -> User:
    return User.objects.create_superuser("root@lab.example", "root@lab.example", PASSWORD)


def to_login(response: Any) -> bool:
    return response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=")


def to_second_factor(response: Any) -> bool:
    return response.status_code == 302 and response["Location"].startswith("/staff/2fa/?next=")


def test_every_staff_url_says_who_may_use_it() -> None:
    named = {p.name for p in staff_urls.urlpatterns if isinstance(p, URLPattern)}
    assert named == LOOK | ANY_STAFF_POST | GROUP | PERMISSION | DOOR | ENROL
    assert not any(isinstance(p, URLResolver) for p in staff_urls.urlpatterns)


def test_every_staff_and_admin_url_as_the_cast(cast: Cast, finished: DiagnosticJob, override: Any,
                                               approver_client: Client, root: User) -> None:
    staff = staff_urls_of(finished, override)
    admin = admin_urls()
    superuser = logged_in(root)
    for name, path in staff + [("admin", p) for p in admin]:
        for method in ("get", "post"):
            anonymous = getattr(cast.anonymous, method)(path)
            assert to_login(anonymous), (method, path, anonymous.status_code)
            for customer in ("alice", "bob"):
                answer = getattr(cast.client(customer), method)(path)
                assert answer.status_code == 404, (customer, method, path)
        if name == "admin":
            for who, client in (("look-only", cast.client("staff")), ("group", approver_client),
                                ("superuser", superuser)):
                answer = client.get(path)
                # Let in: whatever the admin answers then is its own (its permissions, a
                # missing object); an error would raise here.
                assert not (to_login(answer) or to_second_factor(answer)), (who, path)
            continue
        look_only = cast.client("staff").get(path).status_code
        member = approver_client.get(path).status_code
        if name in LOOK | DOOR:
            assert (look_only, member) == (200, 200), path
        elif name in ANY_STAFF_POST:
            assert (look_only, member) == (405, 405), path
        elif name in ENROL:
            assert (look_only, member) == (410, 410), path
        elif name in GROUP | PERMISSION:
            assert (look_only, member) == (403, 405 if name in POST_ONLY else 200), path
    assert superuser.get("/admin/").status_code == 200
    assert superuser.get("/admin/auth/user/").status_code == 200
    assert cast.client("staff").get("/admin/").status_code == 200  # the admin's own permissions apply inside


def test_with_2fa_no_staff_or_admin_url_without_a_verified_device(
        cast: Cast, finished: DiagnosticJob, override: Any, approver: User, root: User,
        settings: Any) -> None:
    """The attack: a superuser (and staff, with the group or without) signed in with a
    password alone walks every staff and admin URL, GET and POST, including adding a TOTP
    device of their own in the admin and changing a user. Every one answers with the
    second factor's page, and nothing changes."""
    settings.STAFF_REQUIRE_2FA = True
    staff = [path for _, path in staff_urls_of(finished, override)]
    paths = staff + admin_urls()
    users = User.objects.order_by("pk").values_list("username", "is_staff", "is_superuser", "password")
    users_before = list(users)
    for user in (cast.staff, approver, root):
        client = logged_in(user)
        for path in paths:
            for method in ("get", "post"):
                data = {"user": root.pk, "name": "mine", "confirmed": "on", "username": "root@lab.example",
                        "is_superuser": "on", "is_staff": "on"} if method == "post" else None
                answer = getattr(client, method)(path, data)
                if path == "/staff/2fa/":
                    assert answer.status_code in (200, 400), (user.username, method, path)
                    assert b"otp-secret" not in answer.content
                    continue
                if path.startswith("/staff/2fa/enrol/"):  # a link nobody issued
                    assert answer.status_code == 410, (user.username, method, path)
                    continue
                assert to_second_factor(answer), (user.username, method, path, answer.status_code)
        # A password alone neither enrols nor is offered a device.
        assert not TOTPDevice.objects.exists()
    assert list(users.all()) == users_before
    # Through the second factor, the same superuser is in.
    client = logged_in(root)
    verify(client, root, "/admin/auth/user/")
    assert client.get("/admin/auth/user/").status_code == 200
    assert client.get("/admin/otp_totp/totpdevice/").status_code == 200
    assert client.get("/staff/").status_code == 200


def verify(client: Client, user: User, then: str) -> None:
    device = TOTPDevice.objects.create(user=user, name="authenticator", confirmed=True)
    code = totp(device.bin_key, step=device.step, t0=device.t0, digits=device.digits)
    answer = client.post("/staff/2fa/", {"token": f"{code:06d}", "next": then})
    assert answer.status_code == 302 and answer["Location"] == then


def test_the_admin_login_form_is_no_second_door(root: User, settings: Any) -> None:
    """The attack: the superuser's password posted to the admin's own login form, with
    STAFF_REQUIRE_2FA on. It signs nobody in: the answer is the site's login page; the site
    login then leads to the second factor, not to the admin."""
    settings.STAFF_REQUIRE_2FA = True
    client = Client()
    form = client.get("/admin/login/?next=/admin/auth/user/")
    assert form.status_code == 302 and form["Location"] == "/accounts/login/?next=/admin/auth/user/"
    posted = client.post("/admin/login/?next=/admin/auth/user/",
                         {"username": "root@lab.example", "password": PASSWORD, "next": "/admin/auth/user/"})
    assert to_login(posted) and SESSION_KEY not in client.session
    assert to_login(client.get("/admin/"))
    # A foreign `next` is not followed.
    foreign = client.get("/admin/login/?next=https://evil.example/")
    assert foreign["Location"] == "/accounts/login/?next=/admin/"
    # The site's login, with the password: then the second factor, for the admin too.
    signed = client.post("/accounts/login/", {"username": "root@lab.example", "password": PASSWORD,
                                              "next": "/admin/auth/user/"})
    assert signed.status_code == 302 and signed["Location"] == "/admin/auth/user/"
    assert to_second_factor(client.get("/admin/auth/user/"))
    assert client.get("/admin/login/")["Location"] == "/staff/2fa/?next=%2Fadmin%2F"
    verify(client, root, "/admin/auth/user/")
    assert client.get("/admin/auth/user/").status_code == 200
    assert client.get("/admin/login/?next=/admin/auth/user/")["Location"] == "/admin/auth/user/"


def test_the_admin_has_the_site_logins_lockout(root: User, settings: Any) -> None:
    """Wrong passwords at the site's login lock the superuser out; the admin offers no way
    around it (its form checks no password), and the right password is refused too."""
    client = Client(REMOTE_ADDR="203.0.113.9")
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post("/accounts/login/", {"username": "root@lab.example", "password": "wrong"})
    assert client.post("/accounts/login/", {"username": "root@lab.example", "password": PASSWORD}
                       ).status_code == 429
    admin_form = client.post("/admin/login/", {"username": "root@lab.example", "password": PASSWORD})
    assert to_login(admin_form) and SESSION_KEY not in client.session
    assert to_login(client.get("/admin/"))
