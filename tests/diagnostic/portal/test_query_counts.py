"""The pages that take load (the polled job page and its fragment, the calendar) make a
fixed number of queries whatever the number of stages, bookings or report versions."""

from __future__ import annotations

from typing import Any

import pytest

from diagnostic.bookings.models import LabDay, book_lab_day
from diagnostic.jobs.models import StageRun
from tests.diagnostic.conftest import Cast
from tests.diagnostic.portal.conftest import Owned

pytestmark = pytest.mark.django_db


def count(cast: Cast, url: str, django_assert_max_num_queries: Any, most: int) -> None:
    client = cast.client("alice")
    client.get(url)  # the session and user are loaded the same way every time
    with django_assert_max_num_queries(most):
        assert client.get(url).status_code == 200


def test_the_job_page_does_not_grow_with_its_stages(
    cast: Cast, alices: Owned, django_assert_max_num_queries: Any
) -> None:
    for n in range(10):
        StageRun.objects.create(job=alices.job, name=f"extra-{n}", order=100 + n)
    count(cast, f"/portal/jobs/{alices.job.pk}/", django_assert_max_num_queries, 5)
    count(cast, f"/portal/jobs/{alices.job.pk}/stages/", django_assert_max_num_queries, 5)


def test_the_calendar_does_not_grow_with_its_bookings(
    cast: Cast, days_ahead: list[LabDay], django_assert_max_num_queries: Any
) -> None:
    for day in days_ahead[::2]:
        book_lab_day(lab_day=day, customer=cast.bob)
    count(cast, "/portal/book/", django_assert_max_num_queries, 4)
