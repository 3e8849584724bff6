"""Shared fixtures for the platform core: the cast (organisations, customers, a lab), a
submitted configuration, jobs, and the gates of the services tier.

`cast` is who the web apps' access tests try every view as: alice (a customer of
organisation A), bob (a customer of organisation B), a staff member, and an anonymous
visitor, each with a test client already logged in as them.

Services-tier tests need PostgreSQL (DATABASE_URL) and, some of them, Redis
(CELERY_BROKER_URL). When those are not configured the tests skip and say why; with
REQUIRE_SERVICES on (CI) they fail instead (tests/conftest.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from diagnostic.bookings.configs import submit_configuration
from diagnostic.bookings.models import ClusterConfiguration, Customer, Lab, LabDay, Organisation
from diagnostic.jobs.models import DiagnosticJob
from diagnostic.jobs.orchestration import create_job
from tests.conftest import service_missing

REPO = Path(__file__).resolve().parents[2]
REFERENCE_CONFIG = REPO / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml"
REFERENCE_SCENARIO = REPO / "lab" / "scenarios" / "reference-kimi-k2-8spark.yaml"



@pytest.fixture(autouse=True)
def fresh_throttles() -> Iterator[None]:
    """Each test starts with empty throttle counters (the password-reset throttle counts in
    Django's cache, this process's memory here, which outlives a test's database)."""
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


def _service_missing(reason: str) -> None:
    service_missing(reason)


@pytest.fixture
def postgres() -> None:
    """Skip (or fail under REQUIRE_SERVICES=1) unless the tests run on PostgreSQL."""
    if connection.vendor != "postgresql":
        _service_missing(
            "services tier needs PostgreSQL: set DATABASE_URL=postgres://postgres@127.0.0.1:5432/diagnostic"
        )


@pytest.fixture
def redis_url() -> str:
    """The Redis broker URL, after checking Redis answers."""
    url = os.environ.get("CELERY_BROKER_URL", "")
    if not url.startswith(("redis://", "rediss://")):
        _service_missing("services tier needs Redis: set CELERY_BROKER_URL=redis://127.0.0.1:6379/0")
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        _service_missing(f"Redis at {url} does not answer ({exc})")
    return url


@pytest.fixture
def organisation(db: None) -> Organisation:
    return Organisation.objects.create(name="Acme Inference")


def make_customer(username: str, organisation: Organisation) -> User:
    # No password: hashing one costs a second per user and these users never log in.
    user = User.objects.create_user(username=username)
    Customer.objects.create(user=user, organisation=organisation)
    return user


@pytest.fixture
def customer(organisation: Organisation) -> User:
    return make_customer("alice", organisation)


@pytest.fixture
def other_customer(db: None) -> User:
    return make_customer("bob", Organisation.objects.create(name="Globex Serving"))


@dataclass(frozen=True)
class Cast:
    """The people an access test tries a view as; `clients` holds one logged-in test client
    each (the anonymous one logged in as nobody), by name."""

    organisation_a: Organisation
    organisation_b: Organisation
    alice: User
    bob: User
    staff: User
    clients: dict[str, Client]

    @property
    def anonymous(self) -> Client:
        return self.clients["anonymous"]

    def client(self, name: str) -> Client:
        return self.clients[name]


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)  # no password: see make_customer
    return client


@pytest.fixture
def cast(organisation: Organisation, customer: User, other_customer: User) -> Cast:
    staff = User.objects.create_user(username="staff", is_staff=True)
    return Cast(
        organisation_a=organisation,
        organisation_b=other_customer.customer.organisation,
        alice=customer,
        bob=other_customer,
        staff=staff,
        clients={
            "alice": logged_in(customer),
            "bob": logged_in(other_customer),
            "staff": logged_in(staff),
            "anonymous": Client(),
        },
    )


@pytest.fixture
def lab(db: None) -> Lab:
    return Lab.objects.create(name="sim:test-lab", inventory=f"sim:{REFERENCE_SCENARIO}")


@pytest.fixture
def lab_day(lab: Lab) -> LabDay:
    import datetime

    return LabDay.objects.create(lab=lab, date=datetime.date(2025, 3, 4))


@pytest.fixture
def reference_config(db: None) -> ClusterConfiguration:
    return submit_configuration(raw_text=REFERENCE_CONFIG.read_text(), source="yaml", label="reference")


@pytest.fixture
def make_job(lab: Lab, reference_config: ClusterConfiguration) -> Callable[..., DiagnosticJob]:
    def make(stages: list[str] | None = None, **kwargs: Any) -> DiagnosticJob:
        kwargs.setdefault("config", reference_config)
        kwargs.setdefault("lab", lab)
        return create_job(stages=stages, **kwargs)

    return make


@pytest.fixture
def fast_retries(settings: Any) -> Any:
    """Backoff short enough for tests that wait out retries for real."""
    settings.DIAG_RETRY_BASE_S = 0
    settings.DIAG_RETRY_MAX_S = 0
    return settings


@pytest.fixture
def sim_state_dir(tmp_path: Path, settings: Any) -> Iterator[Path]:
    settings.DIAG_SIM_STATE_DIR = tmp_path / "labsim"
    yield settings.DIAG_SIM_STATE_DIR

