"""The shared cast for access tests: two customers of different organisations, a staff
member and an anonymous visitor, each client logged in as who it says."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user
from django.urls import reverse

from diagnostic.bookings.models import Customer
from tests.diagnostic.conftest import Cast

pytestmark = pytest.mark.django_db


def test_alice_and_bob_are_customers_of_different_organisations(cast: Cast) -> None:
    assert cast.alice.customer.organisation == cast.organisation_a
    assert cast.bob.customer.organisation == cast.organisation_b
    assert cast.organisation_a != cast.organisation_b
    assert not cast.alice.is_staff and not cast.bob.is_staff


def test_staff_is_staff_and_no_customer(cast: Cast) -> None:
    assert cast.staff.is_staff
    assert not Customer.objects.filter(user=cast.staff).exists()


def test_each_client_is_logged_in_as_its_person(cast: Cast) -> None:
    for name, user in (("alice", cast.alice), ("bob", cast.bob), ("staff", cast.staff)):
        assert get_user(cast.client(name)) == user
    assert get_user(cast.anonymous).is_anonymous


def test_only_staff_gets_into_the_admin(cast: Cast) -> None:
    index = reverse("admin:index")
    codes = {name: cast.client(name).get(index).status_code for name in cast.clients}
    # Customers get 404 at the admin as at /staff/: one door, the same answers.
    assert codes == {"alice": 404, "bob": 404, "staff": 200, "anonymous": 302}
