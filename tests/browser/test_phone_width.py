"""Every customer page at phone width (390 × 844, as an iPhone 14 shows it): nothing is
wider than the screen, the header's "Log out" is on screen, and each calendar "Book"
button stays inside its day's cell."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from diagnostic.bookings.models import SIM_PREFIX, Customer, Lab, LabDay, Organisation, book_lab_day
from diagnostic.staff.demo import SCENARIO
from tests.diagnostic.portal.conftest import finished_job

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH, HEIGHT = 390, 844
PASSWORD = "phone width 390 px"

# The page's widest box (the document's scroll width) and the header's right edge.
MEASURE = """() => ({
  scroll: document.documentElement.scrollWidth,
  header: Math.max(...[...document.querySelectorAll('header.top *')]
    .map(e => e.getBoundingClientRect().right)),
})"""
# Calendar buttons whose box leaves their cell's box.
SPILLS = """() => [...document.querySelectorAll('table.calendar td button')].filter(b => {
  const c = b.closest('td').getBoundingClientRect(), r = b.getBoundingClientRect();
  return r.left < c.left - 0.5 || r.right > c.right + 0.5;
}).map(b => b.closest('td').innerText.trim())"""


def test_the_customer_pages_fit_a_phone(browser: Any, live_server: Any, portal_settings: Any,
                                        screenshot: Any) -> None:
    organisation = Organisation.objects.create(name="Acme Inference Laboratories International")
    user = User.objects.create_user(username="alice.longname@acme-inference.example",
                                    email="alice.longname@acme-inference.example", password=PASSWORD)
    Customer.objects.create(user=user, organisation=organisation)
    lab = Lab.objects.create(name="sim:phone-lab", inventory=f"{SIM_PREFIX}{SCENARIO}")
    today = timezone.localdate()
    days = [LabDay.objects.create(lab=lab, date=today + dt.timedelta(days=n)) for n in range(0, 30)]
    owned = finished_job(book_lab_day(lab_day=days[9], customer=user), portal_settings.OUT_DIR)
    upcoming = book_lab_day(lab_day=days[12], customer=user)

    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT}, is_mobile=True,
                                  device_scale_factor=1)
    page = context.new_page()
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", user.email)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/portal/")

    pages = {
        "bookings": "/portal/",
        "book": "/portal/book/",
        "booking-finished": f"/portal/bookings/{owned.booking.uuid}/",
        "booking-upcoming": f"/portal/bookings/{upcoming.uuid}/",
        "config": f"/portal/bookings/{upcoming.uuid}/config/",
        "book-summary": f"/portal/book/summary/?lab_day={days[15].pk}",
        "cancel-summary": f"/portal/bookings/{upcoming.uuid}/cancel/",
        "job": f"/portal/jobs/{owned.job.pk}/",
    }
    for name, path in pages.items():
        page.goto(f"{live_server.url}{path}")
        if name == "config":
            page.click("#by-form summary")  # the structured form, open, at phone width
        screenshot(page, f"phone-{name}")
        seen = page.evaluate(MEASURE)
        assert seen["scroll"] <= WIDTH, f"{path} is {seen['scroll']} px wide at {WIDTH}"
        assert seen["header"] <= WIDTH, f"{path}: the header reaches {seen['header']} px"
        assert page.locator("header button:has-text('Log out')").is_visible()
        if name == "book":
            assert page.locator("table.calendar td button").count() > 0
            assert page.evaluate(SPILLS) == []
    context.close()
