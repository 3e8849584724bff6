"""Portal views of bookings: the list, the calendar to book from, a booking's page, and
cancelling or moving it. Decisions are the bookings domain's; these only present them."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from diagnostic.bookings.models import (
    Booking,
    BookingRefused,
    LabDay,
    LabDayTaken,
    Organisation,
    book_lab_day,
    cancel_booking,
    check_in_calendar,
    check_quota,
    reschedule_booking,
)
from diagnostic.portal.calendar import CalendarDay, lab_calendar
from diagnostic.portal.offer import MONEY_BACK, WHAT_HAPPENS, change_window, day_words, lab_words, price
from diagnostic.portal.scoping import (
    bookings_for_customer,
    customer_required,
    get_booking_for_customer,
    requester_organisation,
)


def _lab_words_by_lab(rows: list[Booking]) -> dict[int, str]:
    """The lab of each row in customer words, worked out once per lab (not once per row)."""
    labs = {b.lab_day.lab_id: b.lab_day.lab for b in rows}
    return {pk: lab_words(lab) for pk, lab in labs.items()}


@customer_required
def bookings(request: HttpRequest) -> HttpResponse:
    rows = list(bookings_for_customer(request).prefetch_related("jobs").order_by("-lab_day__date"))
    labs = _lab_words_by_lab(rows)
    for row in rows:
        row.lab_words = labs[row.lab_day.lab_id]  # type: ignore[attr-defined]
    return render(request, "portal/bookings.html", {"bookings": rows, "today": timezone.localdate()})


def _chosen_day(request: HttpRequest) -> LabDay | None:
    data = request.POST if request.method == "POST" else request.GET
    try:
        return LabDay.objects.select_related("lab").get(pk=int(data.get("lab_day", "")))
    except (ValueError, LabDay.DoesNotExist):
        return None


NOT_BOOKABLE = "That day cannot be booked; choose an available day."


def _offer(lab_day: LabDay) -> dict[str, Any]:
    """What the summary of a day says: the day, the lab in words, the work, the price, the
    money-back promise and until when the booking could be changed."""
    return {
        "day": lab_day,
        "day_words": day_words(lab_day.date),
        "lab_words": lab_words(lab_day.lab),
        "what_happens": WHAT_HAPPENS,
        "price": price(),
        "money_back": MONEY_BACK,
        "window": change_window(lab_day),
    }


def _availability_problem(lab_day: LabDay, organisation: Organisation) -> tuple[str, int]:
    """Why `lab_day` cannot be booked now, and the status to answer with ("", 200 when it can)."""
    if Booking.objects.filter(lab_day=lab_day).exclude(status=Booking.Status.CANCELLED).exists():
        return f"{day_words(lab_day.date)} was just taken by another customer; choose another day.", 409
    if lab_day.closed:
        return f"{day_words(lab_day.date)}: the lab is closed that day; choose another day.", 400
    try:
        check_in_calendar(lab_day)
        check_quota(organisation)
    except BookingRefused as exc:
        return str(exc), 400
    return "", 200


def _calendar_page(request: HttpRequest, organisation: Organisation, problem: str,
                   status: int) -> HttpResponse:
    context = {
        "weeks": lab_calendar(organisation),
        "problem": problem,
        "cutoff_h": settings.BOOKING_CHANGE_CUTOFF_H,
        "same_day": settings.BOOKING_SAME_DAY,
        "price": price(),
    }
    return render(request, "portal/book.html", context, status=status)


@customer_required
@require_GET
def book_summary(request: HttpRequest) -> HttpResponse:
    """The summary of the day chosen on the calendar, with the button that books it."""
    organisation = requester_organisation(request)
    lab_day = _chosen_day(request)
    if lab_day is None:
        return _calendar_page(request, organisation, NOT_BOOKABLE, 400)
    problem, status = _availability_problem(lab_day, organisation)
    if problem:
        return _calendar_page(request, organisation, problem, status)
    return render(request, "portal/book_confirm.html", _offer(lab_day))


@customer_required
@require_http_methods(["GET", "POST"])
def book(request: HttpRequest) -> HttpResponse:
    organisation = requester_organisation(request)
    if request.method == "GET":
        return _calendar_page(request, organisation, "", 200)
    lab_day = _chosen_day(request)
    if lab_day is None:
        return _calendar_page(request, organisation, NOT_BOOKABLE, 400)
    if request.POST.get("confirmed") != "yes":
        # Booked only from its summary: a day chosen without it is shown its summary first.
        problem, status = _availability_problem(lab_day, organisation)
        if problem:
            return _calendar_page(request, organisation, problem, status)
        return render(request, "portal/book_confirm.html", _offer(lab_day))
    try:
        # The customer's rules (the calendar's days, the organisation's quota) are the
        # domain's, which says why it refuses.
        booking = book_lab_day(lab_day=lab_day, customer=request.user, organisation=organisation, limits=True)
    except LabDayTaken:
        problem = f"{day_words(lab_day.date)} was just taken by another customer; choose another day."
        return _calendar_page(request, organisation, problem, 409)
    except BookingRefused as exc:
        return _calendar_page(request, organisation, str(exc), 400)
    messages.success(request, f"Booked {day_words(lab_day.date)}. Next: submit your configuration.")
    return redirect("portal:booking", booking_id=booking.uuid)


def _reschedule_choices(booking: Booking) -> list[CalendarDay]:
    organisation = booking.organisation
    return [day for week in lab_calendar(organisation) for day in week
            if day.bookable and day.date != booking.lab_day.date]


@customer_required
def booking_detail(request: HttpRequest, booking_id: str) -> HttpResponse:
    booking = get_booking_for_customer(request, booking_id)
    jobs = booking.jobs.order_by("-created_at")
    changeable = booking.can_change()
    context = {
        "booking": booking,
        "jobs": jobs,
        "active_job": next((j for j in jobs if j.status != "cancelled"), None),
        "changeable": changeable,
        "window": change_window(booking.lab_day, booking=booking),
        "reschedule_days": _reschedule_choices(booking) if changeable else [],
        **{k: v for k, v in _offer(booking.lab_day).items() if k not in ("day", "window")},
    }
    return render(request, "portal/booking.html", context)


def _waiting_job(booking: Booking) -> Any:
    return booking.jobs.filter(status="queued", started_at__isnull=True).order_by("-created_at").first()


@customer_required
@require_http_methods(["GET", "POST"])
def booking_cancel(request: HttpRequest, booking_id: str) -> HttpResponse:
    booking = get_booking_for_customer(request, booking_id)
    if request.method == "GET" or request.POST.get("confirmed") != "yes":
        if not booking.can_change():
            messages.error(request, change_window(booking.lab_day, booking=booking).words)
            return redirect("portal:booking", booking_id=booking.uuid)
        context = {"booking": booking, "day_words": day_words(booking.lab_day.date),
                   "lab_words": lab_words(booking.lab_day.lab), "waiting_job": _waiting_job(booking),
                   "window": change_window(booking.lab_day, booking=booking)}
        return render(request, "portal/booking_cancel.html", context)
    try:
        cancel_booking(booking=booking)
    except BookingRefused as exc:
        messages.error(request, _sentence(str(exc)))
    else:
        messages.success(request, f"Your booking of {day_words(booking.lab_day.date)} is cancelled; the day "
                                  "is free for others and nothing is charged for it.")
    return redirect("portal:booking", booking_id=booking.uuid)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


@customer_required
@require_http_methods(["GET", "POST"])
def booking_reschedule(request: HttpRequest, booking_id: str) -> HttpResponse:
    booking = get_booking_for_customer(request, booking_id)
    lab_day = _chosen_day(request)
    if lab_day is None:
        messages.error(request, "Choose the day to move the booking to.")
        return redirect("portal:booking", booking_id=booking.uuid)
    if request.method == "GET" or request.POST.get("confirmed") != "yes":
        if not booking.can_change():
            messages.error(request, change_window(booking.lab_day, booking=booking).words)
            return redirect("portal:booking", booking_id=booking.uuid)
        context = {"booking": booking, "old_words": day_words(booking.lab_day.date),
                   "waiting_job": _waiting_job(booking), **_offer(lab_day)}
        return render(request, "portal/booking_move.html", context)
    old: dt.date = booking.lab_day.date
    try:
        reschedule_booking(booking=booking, lab_day=lab_day)
    except LabDayTaken:
        messages.error(request, f"{day_words(lab_day.date)} was just taken; choose another day.")
    except BookingRefused as exc:
        messages.error(request, _sentence(str(exc)))
    else:
        messages.success(request, f"Moved from {old:%d %B} to {day_words(lab_day.date)}.")
    return redirect("portal:booking", booking_id=booking.uuid)
