"""Portal views of bookings: the list, the calendar to book from, a booking's page, and
cancelling or moving it. Decisions are the bookings domain's; these only present them."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from diagnostic.bookings.models import (
    Booking,
    BookingRefused,
    LabDay,
    LabDayTaken,
    book_lab_day,
    cancel_booking,
    reschedule_booking,
)
from diagnostic.portal.calendar import CalendarDay, lab_calendar
from diagnostic.portal.scoping import (
    bookings_for_customer,
    customer_required,
    get_booking_for_customer,
    requester_organisation,
)


@customer_required
def bookings(request: HttpRequest) -> HttpResponse:
    rows = bookings_for_customer(request).prefetch_related("jobs").order_by("-lab_day__date")
    return render(request, "portal/bookings.html", {"bookings": rows})


def _chosen_day(request: HttpRequest) -> LabDay | None:
    try:
        return LabDay.objects.select_related("lab").get(pk=int(request.POST.get("lab_day", "")))
    except (ValueError, LabDay.DoesNotExist):
        return None


@customer_required
@require_http_methods(["GET", "POST"])
def book(request: HttpRequest) -> HttpResponse:
    organisation = requester_organisation(request)
    problem = ""
    status = 200
    if request.method == "POST":
        lab_day = _chosen_day(request)
        if lab_day is None:
            problem, status = "That day cannot be booked; choose an available day.", 400
        else:
            try:
                # The customer's rules (the calendar's days, the organisation's quota) are
                # the domain's, which says why it refuses.
                booking = book_lab_day(
                    lab_day=lab_day, customer=request.user, organisation=organisation, limits=True
                )
            except LabDayTaken:
                problem = (
                    f"{lab_day.date:%A %d %B %Y} was just taken by another customer; choose another day."
                )
                status = 409
            except BookingRefused as exc:
                problem, status = str(exc), 400
            else:
                messages.success(
                    request, f"Booked {lab_day.date:%A %d %B %Y}. Next: submit your configuration."
                )
                return redirect("portal:booking", booking_id=booking.uuid)
    context = {
        "weeks": lab_calendar(organisation),
        "problem": problem,
        "cutoff_h": settings.BOOKING_CHANGE_CUTOFF_H,
        "same_day": settings.BOOKING_SAME_DAY,
    }
    return render(request, "portal/book.html", context, status=status)


def _reschedule_choices(booking: Booking) -> list[CalendarDay]:
    organisation = booking.organisation
    return [day for week in lab_calendar(organisation) for day in week if day.bookable]


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
        "deadline": booking.change_deadline(),
        "reschedule_days": _reschedule_choices(booking) if changeable else [],
    }
    return render(request, "portal/booking.html", context)


@customer_required
@require_POST
def booking_cancel(request: HttpRequest, booking_id: str) -> HttpResponse:
    booking = get_booking_for_customer(request, booking_id)
    try:
        cancel_booking(booking=booking)
    except BookingRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Your booking of {booking.lab_day.date:%A %d %B %Y} is cancelled.")
    return redirect("portal:booking", booking_id=booking.uuid)


@customer_required
@require_POST
def booking_reschedule(request: HttpRequest, booking_id: str) -> HttpResponse:
    booking = get_booking_for_customer(request, booking_id)
    lab_day = _chosen_day(request)
    if lab_day is None:
        messages.error(request, "Choose the day to move the booking to.")
        return redirect("portal:booking", booking_id=booking.uuid)
    old: dt.date = booking.lab_day.date
    try:
        reschedule_booking(booking=booking, lab_day=lab_day)
    except LabDayTaken:
        messages.error(request, f"{lab_day.date:%A %d %B %Y} was just taken; choose another day.")
    except BookingRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Moved from {old:%d %B} to {lab_day.date:%A %d %B %Y}.")
    return redirect("portal:booking", booking_id=booking.uuid)
