"""The one place portal views load customer data: every object comes through a helper
scoped to the requester's organisation, so another organisation's object is a 404 (its
existence is not confirmed), and staff use the dashboard instead of the portal."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.db.models import QuerySet
from django.http import Http404, HttpRequest
from django.http.response import HttpResponseBase

from diagnostic.bookings.models import Booking, Organisation, organisation_of
from diagnostic.jobs.models import DiagnosticJob

View = Callable[..., HttpResponseBase]


def customer_required(view: View) -> View:
    """Anonymous visitors go to the login page; signed-in users outside any organisation
    (staff among them) get a 404: the portal has nothing of theirs."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if organisation_of(request.user) is None:
            raise Http404("the portal is for customers; staff use the dashboard")
        return view(request, *args, **kwargs)

    return wrapper


def requester_organisation(request: HttpRequest) -> Organisation:
    organisation = organisation_of(request.user)  # cached on the user by the first call
    if organisation is None:
        raise Http404("no organisation")
    return organisation


def bookings_for_customer(request: HttpRequest) -> QuerySet[Booking]:
    return Booking.objects.for_organisation(requester_organisation(request)).select_related("lab_day__lab")


def jobs_for_customer(request: HttpRequest) -> QuerySet[DiagnosticJob]:
    return DiagnosticJob.objects.for_organisation(requester_organisation(request))


def get_booking_for_customer(request: HttpRequest, booking_id: Any) -> Booking:
    try:
        return bookings_for_customer(request).get(uuid=booking_id)
    except (Booking.DoesNotExist, ValueError):
        raise Http404("no such booking") from None


def get_job_for_customer(request: HttpRequest, job_id: Any) -> DiagnosticJob:
    # The job page is polled every few seconds by every open browser: it needs the job's
    # state and its booking, not the findings document (hundreds of kB once it ended) nor
    # the configuration, which the one view that uses it loads then.
    try:
        return (
            jobs_for_customer(request)
            .select_related("booking__lab_day__lab")
            .defer("findings")
            .get(pk=job_id)
        )
    except (DiagnosticJob.DoesNotExist, ValueError):
        raise Http404("no such job") from None
