"""What a customer is told they are buying, in one place: the lab in their words, what
happens on the day, the price, the money-back promise and until when a booking can be
changed. The booking summary, its confirmation and the cancel and move pages all say it the
same way (METHODOLOGY.md "Money back" is the promise's source)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from diagnostic.bookings.models import Booking, Lab, LabDay

# No figure is made up here: a deployment states its price in PORTAL_LAB_DAY_PRICE; until
# it does, the pages point to the price the customer's order names.
DEFAULT_PRICE = "as in your order with us"

WHAT_HAPPENS = (
    "Our staff start your engine with your configuration on the lab's nodes and measure what "
    "you see today: the true cold start and the decode rate on code and prose.",
    "The diagnostic then looks for what costs you time: the FP4 kernels and their output, "
    "speculative decoding, and the gap to the lab's best configuration, each proved by "
    "measurement with a 95 % interval.",
    "Your tuned configuration is measured the same way, and you receive the report, the tuned "
    "YAML, the tuned launch command and the changes, after our staff review them.",
)

MONEY_BACK = (
    "Money back: the day is free if no finding shows a measured improvement whose 95 % interval "
    "excludes zero, or if the report is not sent within one business day of the lab day. A fault "
    "of our lab is ours: the day is re-run at no cost, and is free if we cannot re-run it within "
    "five business days."
)


def price() -> str:
    return str(getattr(settings, "PORTAL_LAB_DAY_PRICE", "") or DEFAULT_PRICE)


NODE_WORDS = {"dgx-spark": "NVIDIA DGX Spark", "gb10": "NVIDIA GB10"}


def lab_words(lab: Lab) -> str:
    """The lab as a customer reads it: its description's first line when staff wrote one,
    else its size ("our 8-node DGX Spark lab"); never its internal name or inventory."""
    first = next((line.strip() for line in lab.description.splitlines() if line.strip()), "")
    if first:
        return first
    nodes = lab.node_count()
    size = f"{nodes}-node " if nodes else ""
    kind = "simulated " if lab.is_simulated else ""
    return f"Our {kind}{size}NVIDIA DGX Spark lab"


def day_words(date: dt.date) -> str:
    return f"{date:%A} {date.day} {date:%B %Y}"


def moment_words(moment: dt.datetime) -> str:
    local = timezone.localtime(moment)
    return f"{local:%A} {local.day} {local:%B %Y}, {local:%H:%M} UTC"


@dataclass(frozen=True)
class ChangeWindow:
    """Until when a booking of a day can be cancelled or moved, as a sentence: a deadline
    still ahead, or, for a day booked inside the cutoff (same day, tomorrow), that it cannot be
    changed online; never a deadline in the past shown as if it still held."""

    deadline: dt.datetime
    open: bool
    words: str


def change_window(lab_day: LabDay, *, booking: Booking | None = None,
                  now: dt.datetime | None = None) -> ChangeWindow:
    moment = now or timezone.now()
    deadline = lab_day.starts_at - dt.timedelta(hours=settings.BOOKING_CHANGE_CUTOFF_H)
    hours = settings.BOOKING_CHANGE_CUTOFF_H
    if booking is not None and not booking.is_active:
        return ChangeWindow(deadline, False, "This booking is cancelled.")
    if lab_day.date < timezone.localdate(moment):
        return ChangeWindow(deadline, False, "This lab day is past.")
    if moment < deadline:
        return ChangeWindow(deadline, True, f"You can cancel or move it until {moment_words(deadline)}, "
                                            f"{hours} hours before the day starts.")
    if booking is None:
        return ChangeWindow(deadline, False, f"This day starts in less than {hours} hours: once booked, "
                                             "it cannot be cancelled or moved online.")
    return ChangeWindow(deadline, False, f"It can no longer be cancelled or moved online: changes close "
                                         f"{hours} hours before the day starts. Write to us if you need to.")
