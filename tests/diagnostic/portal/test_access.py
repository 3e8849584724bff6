"""Every portal URL tried by the whole cast: anonymous visitors are sent to log in, a
customer of another organisation and staff get 404 (the object's existence is not
confirmed), the owner gets the page."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.conf import settings

from tests.diagnostic.conftest import Cast
from tests.diagnostic.portal.conftest import Owned

pytestmark = pytest.mark.django_db

URLS: dict[str, Callable[[Owned], str]] = {
    "bookings": lambda o: "/portal/",
    "book": lambda o: "/portal/book/",
    "booking": lambda o: f"/portal/bookings/{o.booking.uuid}/",
    "booking-config": lambda o: f"/portal/bookings/{o.booking.uuid}/config/",
    "job": lambda o: f"/portal/jobs/{o.job.pk}/",
    "job-stages": lambda o: f"/portal/jobs/{o.job.pk}/stages/",
    "report": lambda o: f"/portal/jobs/{o.job.pk}/report.pdf",
    "tuned-config": lambda o: f"/portal/jobs/{o.job.pk}/tuned-config.yaml",
}
# Pages of no one object: any customer sees their own organisation's version.
LISTS = {"bookings", "book"}
# The config page of a booking whose job exists sends the owner on to the job.
OWNER_STATUS = {"booking-config": 302}


@pytest.mark.parametrize("name", sorted(URLS))
@pytest.mark.parametrize("who", ["anonymous", "bob", "staff", "alice"])
def test_each_portal_url_answers_each_member_of_the_cast(
    cast: Cast, alices: Owned, name: str, who: str
) -> None:
    url = URLS[name](alices)
    response = cast.client(who).get(url)
    if who == "anonymous":
        assert response.status_code == 302
        assert response["Location"].startswith(settings.LOGIN_URL)
    elif who == "staff":
        assert response.status_code == 404
    elif who == "bob":
        assert response.status_code == (200 if name in LISTS else 404)
    else:
        assert response.status_code == OWNER_STATUS.get(name, 200)


def test_the_config_page_is_open_to_the_owner_until_a_job_exists(cast: Cast, alices: Owned) -> None:
    alices.job.status = "cancelled"
    alices.job.save()
    assert cast.client("alice").get(URLS["booking-config"](alices)).status_code == 200


def test_another_organisations_booking_is_not_in_the_list(cast: Cast, alices: Owned) -> None:
    page = cast.client("bob").get("/portal/").content.decode()
    assert str(alices.booking.uuid) not in page
    assert str(alices.booking.uuid) in cast.client("alice").get("/portal/").content.decode()


def test_healthz_stays(cast: Cast) -> None:
    assert cast.anonymous.get("/healthz").status_code == 200
