"""Control characters, attack by attack (issue 29, item 5): NUL in extra_args passed the
preview and made the confirmation a 500 (PostgreSQL's DataError); a newline in an
extra_args value reached the engine's argv; NUL in a staff query string, a stage-log
name, a retried stage's name or a finding's title was a 500. Each is now refused, saying
which field and what is accepted, and nothing of it is stored."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth.models import Group, User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import DataError
from django.test import Client

from diagnostic.bookings.models import Booking, ClusterConfiguration, Lab
from diagnostic.jobs.models import DiagnosticJob, FindingEdit, StageRun
from diagnostic.staff.apps import STAFF_GROUP
from tests.diagnostic.conftest import REFERENCE_CONFIG, Cast, logged_in
from tests.diagnostic.staff.conftest import make_finished_job

pytestmark = pytest.mark.django_db

# The reference configuration without its extra arguments, which each attack writes: its own
# `--trust-remote-code` (Kimi K2's tokenizer is its own code) and then the attack's.
REFERENCE_EXTRA = '["--trust-remote-code"]'
BASE = REFERENCE_CONFIG.read_text().replace(f"extra_args: {REFERENCE_EXTRA}\n", "")
assert "extra_args" not in BASE


def config_url(booking: Booking) -> str:
    return f"/portal/bookings/{booking.uuid}/config/"


def post_yaml(cast: Cast, booking: Booking, text: str, action: str) -> Any:
    return cast.client("alice").post(
        config_url(booking), {"source": "yaml", "yaml_text": text, "action": action}
    )


# -- the portal's configuration page ----------------------------------------------------------
@pytest.mark.parametrize("action", ["preview", "confirm"])
def test_nul_in_extra_args_is_refused_at_preview_and_at_confirm(
    cast: Cast, booking: Booking, started: list[DiagnosticJob], action: str
) -> None:
    # YAML's "\0" escape puts a NUL in the value; the text itself is printable.
    attack = BASE + 'extra_args: ["--trust-remote-code", "--tokenizer-mode", "slow\\0"]\n'
    response = post_yaml(cast, booking, attack, action)
    assert response.status_code == 400
    page = response.content.decode()
    assert "extra_args[2]" in page and "U+0000, NUL" in page and "printable text on one line" in page
    assert 'class="field-error"' in page or 'class="error"' in page
    assert not ClusterConfiguration.objects.exists() and not DiagnosticJob.objects.exists()


def test_a_newline_in_an_extra_args_value_never_reaches_the_argv(
    cast: Cast, booking: Booking, started: list[DiagnosticJob]
) -> None:
    attack = BASE + 'extra_args: ["--trust-remote-code", "--tokenizer-mode=slow\\n--max-num-seqs=512"]\n'
    response = post_yaml(cast, booking, attack, "confirm")
    assert response.status_code == 400
    assert "extra_args[1]" in (page := response.content.decode()) and "U+000A, a newline" in page
    assert "the value of &#x27;--tokenizer-mode&#x27;" in page
    assert not DiagnosticJob.objects.exists()


def test_a_quoted_newline_in_a_pasted_command_is_refused_beside_the_command(
    cast: Cast, booking: Booking
) -> None:
    attack = 'vllm serve /models/kimi-k2 --tokenizer-mode "slow\n--trust-remote-code"'
    response = cast.client("alice").post(config_url(booking), {"source": "command", "command": attack})
    assert response.status_code == 400
    page = response.content.decode()
    assert 'id="command-error"' in page and "U+000A, a newline" in page and "--tokenizer-mode" in page
    # Line continuations, on the other hand, are what a pasted command is made of.
    fine = "vllm serve /models/kimi-k2 \\\n\t--served-model-name moonshotai/Kimi-K2-Instruct-0905"
    ok = cast.client("alice").post(config_url(booking), {"source": "command", "command": fine})
    assert ok.status_code == 200 and 'id="launch-command"' in ok.content.decode()


@pytest.mark.parametrize("text, said", [
    ("vllm serve /models/kimi-k2 --tokenizer-mode slow\x00",
     "line 1, column 49 holds a control character (U+0000, NUL)"),
    ("NCCL_DEBUG=INFO\x1b[2J vllm serve /models/kimi-k2",
     "line 1, column 16 holds a control character (U+001B, escape)"),
])
def test_nul_and_escapes_in_a_pasted_command_are_refused_with_their_place(
    cast: Cast, booking: Booking, text: str, said: str
) -> None:
    response = cast.client("alice").post(config_url(booking), {"source": "command", "command": text})
    assert response.status_code == 400
    page = response.content.decode()
    assert 'id="command-error"' in page and said in page and "launch_command:" in page


def test_control_characters_in_env_and_names_are_refused_at_their_field(cast: Cast, booking: Booking) -> None:
    for line, field in (('env: {NCCL_DEBUG: "INFO\\r\\nLD_PRELOAD=/tmp/x.so"}', "env.NCCL_DEBUG"),
                        ('env: {"NCCL_DEBUG\\n": "INFO"}', "is not a valid environment variable name")):
        response = post_yaml(cast, booking, BASE.replace("env: {}\n", line + "\n"), "preview")
        assert response.status_code == 400 and field in response.content.decode(), line
    form = {"source": "form", "action": "preview", "model__id": "moonshotai/Kimi-K2\tInstruct",
            "parallel__tp": "1", "cluster__nodes": "1"}
    response = cast.client("alice").post(config_url(booking), form)
    assert response.status_code == 400
    page = response.content.decode()
    assert 'id="model__id-error"' in page or "model.id" in page
    assert "U+0009, a tab" in page


def test_an_uploaded_file_with_a_nul_is_refused_and_not_shown_back(cast: Cast, booking: Booking) -> None:
    upload = SimpleUploadedFile("config.yaml", (BASE + "# \x00 hidden\n").encode())
    response = cast.client("alice").post(
        config_url(booking), {"source": "yaml", "yaml_file": upload, "action": "preview"}
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "file: line" in page and "U+0000, NUL" in page
    assert "\x00" not in page


def test_the_confirmation_never_answers_500_even_when_the_database_refuses(
    cast: Cast, booking: Booking, started: list[DiagnosticJob], monkeypatch: Any
) -> None:
    first = post_yaml(cast, booking, BASE, "confirm")
    assert first.status_code == 302
    waiting = DiagnosticJob.objects.get()

    def refuses(**_: Any) -> None:
        raise DataError("invalid byte sequence for encoding \"UTF8\": 0x00")

    monkeypatch.setattr("diagnostic.portal.config_views.submit_configuration", refuses)
    again = {"source": "yaml", "yaml_text": BASE, "action": "confirm", "replaces": str(waiting.pk)}
    response = cast.client("alice").post(config_url(booking), again)
    assert response.status_code == 400
    assert "cannot store" in response.content.decode()
    # Nothing of the refused confirmation stays: the job it would have replaced still waits.
    waiting.refresh_from_db()
    assert waiting.status == "queued" and not waiting.cancel_requested
    assert DiagnosticJob.objects.count() == 1


def test_other_fields_of_the_configuration_page_are_refused_at_the_door(cast: Cast, booking: Booking) -> None:
    response = cast.client("alice").post(config_url(booking), {"source": "yaml\x00", "yaml_text": BASE})
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/plain")
    assert "The form field 'source' holds a control character (U+0000, NUL)" in response.content.decode()


# -- the door: paths and query strings ------------------------------------------------------
def test_a_nul_in_a_path_or_query_string_is_a_400_naming_it(cast: Cast, alices: Any) -> None:
    response = cast.client("alice").get(f"/portal/jobs/{alices.job.pk}/?version=1%00")
    assert response.status_code == 400
    assert "query parameter 'version'" in response.content.decode()
    # No such URL at all: still a 400 naming the path, not a 404 (issue 36).
    for path in ("/portal/bookings/%00/", "/portal/%00/", "/no/such/%00/page", "/staff/%00/"):
        answer = cast.client("alice").get(path)
        assert answer.status_code == 400, path
        assert "The address (URL path) holds a control character (U+0000, NUL)" in answer.content.decode()
    named = cast.client("alice").get("/portal/?a%01b=1")
    assert named.status_code == 400 and "A parameter name, 'a\\x01b'," in named.content.decode()


def test_invalid_utf8_in_a_query_string_is_not_a_crash(cast: Cast, alices: Any) -> None:
    for query in ("version=%ff", "version=%ed%a0%80", "version=%c0%80", "%ff=%fe"):
        response = cast.client("alice").get(f"/portal/jobs/{alices.job.pk}/?{query}")
        assert response.status_code < 500, query


# -- the staff dashboard ----------------------------------------------------------------------
@pytest.fixture
def staff_client(db: None) -> Client:
    user = User.objects.create_user(username="consultant", is_staff=True)
    user.groups.add(Group.objects.get(name=STAFF_GROUP))
    return logged_in(user)


@pytest.fixture
def finished(cast: Cast, lab: Lab, tmp_path: Any, settings: Any) -> DiagnosticJob:
    import datetime as dt

    from django.utils import timezone

    settings.OUT_DIR = tmp_path / "out"
    return make_finished_job(cast, lab, lab_day=timezone.localdate() - dt.timedelta(days=1))


def test_a_nul_in_a_staff_query_string_is_a_400_naming_it(
    staff_client: Client, finished: DiagnosticJob
) -> None:
    for url, name in (("/staff/?q=acme%00", "q"), ("/staff/jobs/rows/?state=%00", "state"),
                      (f"/staff/jobs/{finished.pk}/log/preflight/?format=json&since=1%00", "since"),
                      (f"/staff/reports/{finished.pk}/?from=%00", "from")):
        response = staff_client.get(url)
        assert response.status_code == 400, url
        said = response.content.decode()
        assert f"query parameter '{name}' holds a control character (U+0000, NUL)" in said


def test_a_nul_in_a_stage_log_name_is_a_400(staff_client: Client, finished: DiagnosticJob) -> None:
    response = staff_client.get(f"/staff/jobs/{finished.pk}/log/pre%00flight/")
    assert response.status_code == 400
    assert "The address (URL path) holds a control character (U+0000, NUL)" in response.content.decode()


def test_a_nul_in_a_retried_stage_name_is_a_400_and_nothing_moves(
    staff_client: Client, finished: DiagnosticJob
) -> None:
    StageRun.objects.filter(job=finished, name="reproduce").update(status=StageRun.Status.FAILED)
    response = staff_client.post(f"/staff/jobs/{finished.pk}/retry/", {"stage": "reproduce\x00"})
    assert response.status_code == 400 and "form field 'stage'" in response.content.decode()
    assert staff_client.get(f"/staff/jobs/{finished.pk}/retry/?stage=reproduce%00").status_code == 400
    finished.refresh_from_db()
    assert finished.status == DiagnosticJob.Status.SUCCEEDED


def test_finding_titles_take_one_line_and_narratives_take_lines(
    staff_client: Client, finished: DiagnosticJob
) -> None:
    finding = finished.finding_set.order_by("id").first()
    assert finding is not None
    url = f"/staff/reports/{finished.pk}/findings/{finding.pk}/"
    for title in ("Slow disk\x00", "Slow disk\nsecond line", "Slow \x1b[8mdisk"):
        response = staff_client.post(url, {"title": title, "narrative": "", "note": ""})
        assert response.status_code == 400, repr(title)
        assert "form field 'title'" in response.content.decode()
    assert not FindingEdit.objects.exists()
    nul_in_narrative = staff_client.post(url, {"title": finding.title, "narrative": "one\x00two", "note": ""})
    assert nul_in_narrative.status_code == 400
    narrative = "First line.\r\n\r\nSecond\tparagraph."
    lines = staff_client.post(url, {"title": finding.title, "narrative": narrative, "note": ""})
    assert lines.status_code == 302
    assert FindingEdit.objects.filter(field="narrative").exists()


def test_the_admin_takes_lines_in_its_text_areas_but_no_nul(lab: Lab) -> None:
    admin = User.objects.create_superuser("root", "root@lab.example", None)
    client = logged_in(admin)
    url = f"/admin/bookings/lab/{lab.pk}/change/"
    form = {"name": lab.name, "inventory": lab.inventory, "contact_email": "",
            # The nodes' inline formset, empty.
            "nodes-TOTAL_FORMS": "0", "nodes-INITIAL_FORMS": "0", "nodes-MIN_NUM_FORMS": "0",
            "nodes-MAX_NUM_FORMS": "1000"}
    assert client.post(url, {**form, "description": "Two\r\nlines"}).status_code == 302
    lab.refresh_from_db()
    assert lab.description == "Two\r\nlines"
    refused = client.post(url, {**form, "description": "NUL\x00"})
    assert refused.status_code == 400 and "form field 'description'" in refused.content.decode()


# -- issue 36: the Unicode line separators are line breaks ------------------------------------------
LINE_BREAKS = (("\u2028", "U+2028, a line separator"), ("\u2029", "U+2029, a paragraph separator"))


def test_a_line_separator_in_a_query_is_a_400_naming_it(
    staff_client: Client, cast: Cast, finished: DiagnosticJob
) -> None:
    """The attack: U+2028 passed in ?q= (the jobs' search) where a newline is refused."""
    for char, name in LINE_BREAKS:
        for client, url in ((staff_client, "/staff/?q=acme{}x"), (cast.client("alice"), "/portal/?q=a{}b")):
            response = client.get(url.format(quote(char)))
            assert response.status_code == 400, (url, name)
            said = response.content.decode()
            assert f"query parameter 'q' holds a control character ({name})" in said
            assert "Only printable text on one line is accepted there" in said
    path = staff_client.get(f"/staff/jobs/{finished.pk}/log/pre{quote(chr(0x2028))}flight/")
    assert path.status_code == 400 and "The address (URL path)" in path.content.decode()


def test_a_finding_title_takes_no_line_separator_and_a_narrative_takes_it_as_a_line(
    staff_client: Client, finished: DiagnosticJob
) -> None:
    """The attack: U+2028 passed in a finding's title (one line in the report's headings)."""
    finding = finished.finding_set.order_by("id").first()
    assert finding is not None
    url = f"/staff/reports/{finished.pk}/findings/{finding.pk}/"
    for char, name in LINE_BREAKS:
        title = f"Slow disk{char}second line"
        response = staff_client.post(url, {"title": title, "narrative": "", "note": ""})
        assert response.status_code == 400
        assert f"form field 'title' holds a control character ({name})" in response.content.decode()
    assert not FindingEdit.objects.exists()
    lines = staff_client.post(url, {"title": finding.title, "narrative": "First line.\u2028Second line.",
                                    "note": ""})
    assert lines.status_code == 302
    assert FindingEdit.objects.filter(field="narrative").exists()


def test_a_single_line_portal_field_takes_no_line_separator(cast: Cast, booking: Booking) -> None:
    # The configuration page checks its fields itself, beside the field, the input kept.
    from tests.diagnostic.portal.test_config_views import FORM

    response = cast.client("alice").post(config_url(booking), {
        "source": "form", **FORM, "model__path": "/models/kimi\u2029-k2", "action": "preview"})
    assert response.status_code == 400
    assert "U+2029, a paragraph separator" in response.content.decode().split('id="f-model__path"')[1]
    # Elsewhere the door refuses it, naming the field.
    response = cast.client("alice").post(f"/portal/bookings/{booking.uuid}/cancel/", {"reason": "x",
                                                                                       "confirm\u2028": "1"})
    assert response.status_code == 400
    assert "A parameter name, 'confirm\\u2028'," in response.content.decode()
