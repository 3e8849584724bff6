"""Two customers of two organisations book the same day from two browsers at once: one
gets the booking, the other is told the day was just taken; nobody sees an error page."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from diagnostic.bookings.models import Booking, Customer, Lab, LabDay, Organisation

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "a long enough passphrase 42"


def customer(email: str, organisation: str) -> User:
    user = User.objects.create_user(email, email, PASSWORD)
    Customer.objects.create(user=user, organisation=Organisation.objects.create(name=organisation))
    return user


def logged_in_page(browser: Any, base: str, email: str) -> Any:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", email)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/portal/")
    page.goto(f"{base}/portal/book/")
    return page


def test_two_browsers_booking_the_same_day_at_once(
    browser: Any, live_server: Any, portal_settings: Any, screenshot: Any
) -> None:
    lab = Lab.objects.create(name="sim:race-lab", inventory="sim:unused.yaml")
    day = LabDay.objects.create(lab=lab, date=timezone.localdate() + dt.timedelta(days=10))
    customer("ann@one.example", "One Inference")
    customer("ben@two.example", "Two Serving")
    pages = [logged_in_page(browser, live_server.url, e) for e in ("ann@one.example", "ben@two.example")]
    button = f"button[data-date='{day.date:%Y-%m-%d}']"
    # Both read the day's summary, then both confirm: the confirmations leave before either
    # answer arrives.
    for page in pages:
        page.click(button)
        page.wait_for_selector("#confirm-booking")
    for page in pages:
        page.click("#confirm-booking", no_wait_after=True)
    for page in pages:
        page.wait_for_load_state("load")
        page.wait_for_selector("h1")
    texts = [page.inner_text("main") for page in pages]
    winners = [t for t in texts if "Booked" in t]
    losers = [t for t in texts if "was just taken by another customer" in t]
    assert len(winners) == 1 and len(losers) == 1, texts
    assert Booking.objects.filter(lab_day=day).count() == 1
    for page, text in zip(pages, texts, strict=True):
        screenshot(page, "13-race-winner" if "Booked" in text else "14-race-just-taken")
        page.context.close()
