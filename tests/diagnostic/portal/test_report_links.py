"""Money-back decisions and report emails are linked to the platform's job (and so to its
organisation), filled from their `job_id` on save and, for rows older than the link, by
the migration; callers that pass `job_id` keep working, and a row whose job the platform
does not hold keeps only its id."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from diagnostic.jobs.models import DiagnosticJob
from reports.models import MoneyBackOverride, ReportEmail, override_money_back, overrides_for, revert_override
from tests.diagnostic.portal.conftest import Owned

REASON = "The lab lost power for two hours in the afternoon."


@pytest.fixture
def staff(db: None) -> User:
    return User.objects.create_user("dana", first_name="Dana", last_name="Reyes", is_staff=True)


@pytest.mark.django_db
def test_a_decision_and_its_revert_are_linked_to_the_job_and_its_organisation(
    alices: Owned, staff: User
) -> None:
    job = alices.job
    decision = override_money_back(job_id=str(job.pk), eligible=True, reason=REASON, by=staff)
    assert decision.job_record_id == job.pk
    assert decision.job_record.organisation == alices.booking.organisation
    undone = revert_override(override=decision, reason="The power loss came after the last run.", by=staff)
    assert undone.job_record_id == job.pk
    assert overrides_for(str(job.pk)) == []
    mine = MoneyBackOverride.objects.filter(job_record__organisation=alices.booking.organisation)
    assert set(mine) == {decision, undone}


@pytest.mark.django_db
def test_an_email_claim_is_linked_to_the_job(alices: Owned) -> None:
    claim = ReportEmail.claim(
        job_id=str(alices.job.pk), report_digest=alices.version.digest, recipients=["a@x"]
    )
    assert claim is not None and claim.job_record_id == alices.job.pk


@pytest.mark.django_db
def test_a_job_the_platform_does_not_hold_keeps_only_its_id(staff: User) -> None:
    loose = override_money_back(job_id="job-1", eligible=False, reason=REASON, by=staff)
    gone = override_money_back(job_id=str(uuid.uuid4()), eligible=False, reason=REASON, by=staff)
    assert (loose.job_record_id, gone.job_record_id) == (None, None)
    assert ReportEmail.claim(job_id="job-1", report_digest="d" * 64, recipients=["a@x"]).job_record_id is None


@pytest.mark.django_db
def test_the_link_cannot_name_another_job(alices: Owned, staff: User) -> None:
    other = DiagnosticJob.objects.create(config=alices.job.config, lab=alices.job.lab)
    with pytest.raises(ValidationError, match="must be the job"):
        MoneyBackOverride.objects.create(
            job_id=str(alices.job.pk), job_record=other, eligible=True, reason=REASON, decided_by=staff
        )


@pytest.mark.django_db
def test_a_job_with_an_audit_trail_cannot_be_deleted(alices: Owned, staff: User) -> None:
    override_money_back(job_id=str(alices.job.pk), eligible=True, reason=REASON, by=staff)
    with pytest.raises(IntegrityError), transaction.atomic():
        # PROTECT: the ORM refuses (ProtectedError is an IntegrityError).
        DiagnosticJob.objects.filter(pk=alices.job.pk).delete()


def _migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_the_migration_links_rows_that_existed_before_it(make_job: Any) -> None:
    job = make_job(["report"])
    staff = User.objects.create_user("erin", is_staff=True)
    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()
    old = _migrate([("reports", "0002_override_reverts")])
    Override = old.get_model("reports", "MoneyBackOverride")
    Email = old.get_model("reports", "ReportEmail")
    known = Override.objects.create(job_id=str(job.pk), eligible=True, reason=REASON, decided_by_id=staff.pk)
    foreign = Override.objects.create(job_id="job-1", eligible=True, reason=REASON, decided_by_id=staff.pk)
    mail = Email.objects.create(job_id=str(job.pk), report_digest="e" * 64, recipients="a@x")

    new = _migrate(leaves)
    Override = new.get_model("reports", "MoneyBackOverride")
    Email = new.get_model("reports", "ReportEmail")
    assert Override.objects.get(pk=known.pk).job_record_id == job.pk
    assert Override.objects.get(pk=foreign.pk).job_record_id is None
    assert Email.objects.get(pk=mail.pk).job_record_id == job.pk
