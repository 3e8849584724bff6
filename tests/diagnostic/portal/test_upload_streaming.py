"""Issue 36, part 7: "uploads are written to disk at any size before the 64 KiB check."

The attack: a configuration "file" of several MiB posted to the booking's configuration
page. Django's own handlers wrote it whole to a temporary file before the view's check;
now the upload handler keeps at most the limit and a byte, in memory, and drops the rest as
it arrives. The customer is told the file's size and the limit beside the field (400, not a
500), and a configuration already confirmed stays as it was."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files import temp
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.files.uploadhandler import MemoryFileUploadHandler, TemporaryFileUploadHandler

from diagnostic.bookings.models import Booking
from diagnostic.jobs.models import DiagnosticJob
from diagnostic.portal.submission import YAML_MAX_BYTES
from diagnostic.portal.uploads import KEPT_BYTES, BoundedUploadHandler
from tests.diagnostic.conftest import Cast

pytestmark = pytest.mark.django_db

BIG = 3 * 1024 * 1024  # past Django's 2.5 MB in-memory limit: its handlers put this on disk
COMMAND = (
    "vllm serve /models/kimi-k2 --served-model-name moonshotai/Kimi-K2-Instruct-0905 "
    "--tensor-parallel-size 8 --enable-expert-parallel"
)


@pytest.fixture
def temp_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every temporary file an upload handler opens, by name."""
    opened: list[str] = []
    real = temp.NamedTemporaryFile

    def spy(*args: Any, **kwargs: Any) -> Any:
        handle = real(*args, **kwargs)
        opened.append(handle.name)
        return handle

    monkeypatch.setattr(temp, "NamedTemporaryFile", spy)
    return opened


def url(booking: Booking) -> str:
    return f"/portal/bookings/{booking.uuid}/config/"


def upload(cast: Cast, booking: Booking, size: int, action: str = "preview") -> Any:
    big = SimpleUploadedFile("c.yaml", b"#" * size, content_type="application/yaml")
    return cast.client("alice").post(url(booking), {"source": "yaml", "yaml_file": big, "action": action})


def test_djangos_own_handlers_would_write_the_upload_to_disk(
        cast: Cast, booking: Booking, settings: Any, temp_files: list[str]) -> None:
    """The attack as found, with Django's default handlers put back."""
    settings.FILE_UPLOAD_HANDLERS = [f"{MemoryFileUploadHandler.__module__}.MemoryFileUploadHandler",
                                     f"{TemporaryFileUploadHandler.__module__}.TemporaryFileUploadHandler"]
    assert upload(cast, booking, BIG).status_code == 400
    assert temp_files, "the default handlers no longer write big uploads to disk"


def test_an_oversized_upload_is_refused_while_it_arrives_and_never_reaches_disk(
        cast: Cast, booking: Booking, temp_files: list[str]) -> None:
    response = upload(cast, booking, BIG)
    page = response.content.decode()
    assert response.status_code == 400
    assert "file: is 3 MiB (3,145,728 bytes); the limit is 64 KiB (65,536 bytes)" in page
    assert 'id="yaml-error"' in page  # beside the file's field
    assert temp_files == []


def test_a_file_at_the_limit_still_arrives_whole(cast: Cast, booking: Booking, temp_files: list[str]) -> None:
    text = b"schema: diagnostic.config/1\nparallel: {tp: 0}\n"
    response = cast.client("alice").post(url(booking), {
        "source": "yaml", "action": "preview",
        "yaml_file": SimpleUploadedFile("c.yaml", text + b"#" * (YAML_MAX_BYTES - len(text)))})
    page = response.content.decode()
    assert "the limit is" not in page and "parallel.tp:" in page.split('id="yaml-error"')[1]
    assert temp_files == []


def test_what_was_confirmed_before_is_kept(
        cast: Cast, booking: Booking, started: list[DiagnosticJob], temp_files: list[str]) -> None:
    confirmed = cast.client("alice").post(url(booking), {"source": "command", "command": COMMAND,
                                                          "action": "confirm"})
    assert confirmed.status_code == 302
    job = DiagnosticJob.objects.get(booking=booking)
    before = (job.pk, job.config_id, job.config.raw_text)
    refused = upload(cast, booking, BIG, action="confirm")
    assert refused.status_code == 400 and "the limit is 64 KiB" in refused.content.decode()
    job = DiagnosticJob.objects.get(booking=booking)
    assert (job.pk, job.config_id, job.config.raw_text) == before
    assert temp_files == []


def test_the_handler_keeps_the_limit_and_a_byte_and_counts_the_rest() -> None:
    handler = BoundedUploadHandler()
    handler.new_file("yaml_file", "c.yaml", "application/yaml", None)
    chunk = b"x" * (64 * 1024)
    sent = 0
    for start in range(0, BIG, len(chunk)):
        assert handler.receive_data_chunk(chunk, start) is None
        sent += len(chunk)
    uploaded = handler.file_complete(sent)
    assert uploaded.size == BIG and uploaded.field_name == "yaml_file"
    assert len(uploaded.read()) == KEPT_BYTES == YAML_MAX_BYTES + 1


def test_a_request_of_many_files_is_refused(cast: Cast, booking: Booking, temp_files: list[str]) -> None:
    files = [SimpleUploadedFile(f"c{n}.yaml", b"#" * YAML_MAX_BYTES) for n in range(20)]
    response = cast.client("alice").post(url(booking), {"source": "yaml", "yaml_file": files,
                                                         "action": "preview"})
    assert response.status_code == 400
    assert temp_files == []
