"""The lab calendar a customer books from: each lab day ahead with its state (available,
booked, closed), as plain data the template lays out by week."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.utils import timezone

from diagnostic.bookings.models import (
    Booking,
    LabDay,
    Organisation,
    calendar_end,
    first_bookable_date,
)


@dataclass(frozen=True)
class CalendarDay:
    date: dt.date
    # The lab day's id (None: the lab has no day that date); rows, not model instances, as
    # the calendar reads up to 63 of them a request.
    lab_day_id: int | None
    # "available", "booked", "yours", "closed", "soon" (inside the cutoff), "past" (before
    # today), "none" (no lab day)
    state: str

    @property
    def bookable(self) -> bool:
        return self.state == "available"

    # The cell's words, made here rather than by the template's date filter: the calendar
    # draws up to 63 cells a request, and it is one of the two pages that take load.
    @property
    def label(self) -> str:
        return f"{self.date.day} {MONTHS[self.date.month - 1]}"

    @property
    def iso(self) -> str:
        return self.date.isoformat()

    @property
    def words(self) -> str:
        return STATE_WORDS.get(self.state, "")


STATE_WORDS = {"yours": "yours", "booked": "booked", "closed": "closed", "soon": "too soon", "past": "past"}
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def lab_calendar(organisation: Organisation, *, start: dt.date | None = None) -> list[list[CalendarDay]]:
    """Weeks (Monday first) from `start`'s week over PORTAL_CALENDAR_DAYS days."""
    first = start or first_bookable_date()
    today = timezone.localdate()
    monday = first - dt.timedelta(days=first.weekday())
    # The same end the bookings domain refuses days beyond (booking_window).
    end = calendar_end(first)
    lab_days = {
        date: (pk, closed)
        for pk, date, closed in LabDay.objects.filter(date__gte=monday, date__lt=end).values_list(
            "pk", "date", "closed"
        )
    }
    active = dict(
        Booking.objects.filter(lab_day__date__gte=monday, lab_day__date__lt=end)
        .exclude(status=Booking.Status.CANCELLED)
        .values_list("lab_day__date", "organisation_id")
    )
    weeks: list[list[CalendarDay]] = []
    date = monday
    while date < end:
        lab_day_id, closed = lab_days.get(date, (None, False))
        if lab_day_id is None:
            state = "none"
        elif date in active:
            state = "yours" if active[date] == organisation.pk else "booked"
        elif date < today:
            state = "past"  # the days before today in the calendar's first week
        elif closed:
            state = "closed"
        elif date < first:
            state = "soon"  # inside the change cutoff: too late to book online
        else:
            state = "available"
        if date.weekday() == 0:
            weeks.append([])
        weeks[-1].append(CalendarDay(date, lab_day_id, state))
        date += dt.timedelta(days=1)
    # Weeks after the last lab day would only be empty squares.
    while weeks and all(day.state == "none" for day in weeks[-1]):
        weeks.pop()
    return weeks


