"""Review without surprises: a refused edit or decision answers with the same page, the
consultant's typed words kept and the problem next to the field that caused it."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from diagnostic.jobs.models import DiagnosticJob, FindingEdit
from reports.models import MoneyBackOverride

pytestmark = pytest.mark.django_db


def test_an_emptied_title_is_refused_beside_the_title_with_the_typed_words_kept(
        finished: DiagnosticJob, approver_client: Client) -> None:
    finding = finished.finding_set.get(code="load.weights_io")
    answer = approver_client.post(f"/staff/reports/{finished.pk}/findings/{finding.pk}/", {
        "title": "   ", "narrative": "Our own opening paragraph, typed with care.", "note": "A note."})
    assert answer.status_code == 400
    page = answer.content.decode()
    error = re.search(rf'<p class="field-error error-text" id="title-{finding.pk}-error">([^<]*)</p>', page)
    assert error is not None and "a finding needs a title" in error[1]
    # The error sits right after the title's input, not at the top of the page.
    assert page.index(f'id="title-{finding.pk}"') < error.start() < page.index(f'id="narrative-{finding.pk}"')
    assert "Our own opening paragraph, typed with care." in page and ">A note.</textarea>" in page
    assert 'aria-invalid="true"' in page
    assert not FindingEdit.objects.exists()


def test_a_short_override_reason_is_refused_beside_it_with_the_choice_and_words_kept(
        finished: DiagnosticJob, approver_client: Client) -> None:
    answer = approver_client.post(f"/staff/reports/{finished.pk}/money-back/",
                                  {"eligible": "no", "reason": "too short"})
    assert answer.status_code == 400
    page = answer.content.decode()
    assert re.search(r'id="override-reason-error">write at least 20 characters', page)
    assert ">too short</textarea>" in page
    assert re.search(r'value="no" checked', page)
    assert "render a new version (under Versions)" in page
    answer = approver_client.post(f"/staff/reports/{finished.pk}/money-back/", {"reason": "x" * 30})
    assert answer.status_code == 400
    assert 'id="override-eligible-error">choose free of charge or charged' in answer.content.decode()
    assert not MoneyBackOverride.objects.exists()
