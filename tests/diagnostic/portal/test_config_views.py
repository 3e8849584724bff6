"""Submitting the configuration three ways: each lands in the same normalized
configuration, errors sit beside the input they concern and name the field or token,
the input is kept, the preview shows the launch command, and confirming creates the job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.files.uploadedfile import SimpleUploadedFile

from diagnostic.bookings.models import Booking, Lab, LabNode
from diagnostic.jobs.models import DiagnosticJob
from tests.diagnostic.conftest import Cast, logged_in, make_customer

pytestmark = pytest.mark.django_db

COMMAND = (
    "NCCL_DEBUG=WARN vllm serve /models/kimi-k2 --served-model-name "
    "moonshotai/Kimi-K2-Instruct-0905 --tensor-parallel-size 8 --enable-expert-parallel "
    "--max-model-len 262144 --kv-cache-dtype fp8 --gpu-memory-utilization 0.85"
)
YAML = """schema: diagnostic.config/1
model: {id: moonshotai/Kimi-K2-Instruct-0905, path: /models/kimi-k2}
parallel: {tp: 8, expert_parallel: true}
serving: {kv_cache_dtype: fp8, gpu_memory_utilization: 0.85}
env: {NCCL_DEBUG: WARN}
"""
FORM = {
    "engine__name": "vllm",
    "engine__version": "0.34.0",
    "model__id": "moonshotai/Kimi-K2-Instruct-0905",
    "model__path": "/models/kimi-k2",
    "model__quantization": "nvfp4",
    "parallel__tp": "8",
    "parallel__expert_parallel": "on",
    "cluster__nodes": "8",
    "serving__max_model_len": "262144",
    "serving__kv_cache_dtype": "fp8",
    "serving__gpu_memory_utilization": "0.85",
    "env": "NCCL_DEBUG=WARN",
}






def url(booking: Booking) -> str:
    return f"/portal/bookings/{booking.uuid}/config/"


def post(cast: Cast, booking: Booking, data: dict[str, Any]) -> Any:
    return cast.client("alice").post(url(booking), data)


def test_the_page_offers_three_ways_with_csrf(cast: Cast, booking: Booking) -> None:
    page = cast.client("alice").get(url(booking)).content.decode()
    assert 'name="command"' in page and 'name="yaml_file"' in page and 'name="parallel__tp"' in page
    assert page.count("csrfmiddlewaretoken") == 4  # three forms and the log-out button


def test_a_command_with_an_unknown_flag_names_the_token_and_keeps_the_text(
    cast: Cast, booking: Booking
) -> None:
    bad = COMMAND + " --tensor-paralel-size 4"
    response = post(cast, booking, {"source": "command", "command": bad, "action": "preview"})
    page = response.content.decode()
    assert response.status_code == 400
    assert "--tensor-paralel-size" in page.split('id="command-error"')[1]
    assert bad in page.replace("&#x27;", "'").replace("&quot;", '"')


def test_the_three_ways_preview_the_same_configuration(cast: Cast, booking: Booking) -> None:
    previews = []
    for data in (
        {"source": "command", "command": COMMAND},
        {"source": "form", **FORM},
        {"source": "yaml", "yaml_text": YAML},
    ):
        response = post(cast, booking, {**data, "action": "preview"})
        assert response.status_code == 200, response.content.decode()[:2000]
        page = response.content.decode()
        previews.append(page.split('id="launch-command">')[1].split("</pre>")[0])
    assert previews[0] == previews[1] == previews[2]
    assert "--tensor-parallel-size 8" in previews[0] and "vllm serve" in previews[0]


def test_a_form_error_sits_at_its_field_and_keeps_the_other_inputs(cast: Cast, booking: Booking) -> None:
    response = post(cast, booking, {"source": "form", **FORM, "parallel__tp": "eight", "action": "preview"})
    page = response.content.decode()
    assert response.status_code == 400
    field = page.split('id="f-parallel__tp"')[1].split("</div>")[0]
    assert "parallel.tp: &#x27;eight&#x27; is not accepted" in field
    assert 'value="moonshotai/Kimi-K2-Instruct-0905"' in page and 'value="eight"' in page


def test_a_yaml_upload_over_64_kib_or_not_utf8_is_refused(cast: Cast, booking: Booking) -> None:
    big = SimpleUploadedFile("c.yaml", b"#" * (64 * 1024 + 1))
    response = post(cast, booking, {"source": "yaml", "yaml_file": big, "action": "preview"})
    assert response.status_code == 400 and "the limit is 64 KiB (65,536 bytes)" in response.content.decode()
    latin = SimpleUploadedFile("c.yaml", "engine: {name: vllm}  # café".encode("latin-1"))
    response = post(cast, booking, {"source": "yaml", "yaml_file": latin, "action": "preview"})
    assert response.status_code == 400 and "not UTF-8" in response.content.decode()


def test_yaml_aliases_are_refused_at_the_file(cast: Cast, booking: Booking) -> None:
    text = "schema: diagnostic.config/1\nengine: &e {name: vllm}\nmodel: *e\n"
    response = post(cast, booking, {"source": "yaml", "yaml_text": text, "action": "preview"})
    assert response.status_code == 400 and "anchors and aliases" in response.content.decode()


def test_an_uploaded_file_is_kept_as_text_beside_its_error(cast: Cast, booking: Booking) -> None:
    upload = SimpleUploadedFile("c.yaml", b"schema: diagnostic.config/1\nparallel: {tp: 0}\n")
    page = post(cast, booking, {"source": "yaml", "yaml_file": upload, "action": "preview"}).content.decode()
    assert "parallel.tp:" in page.split('id="yaml-error"')[1]
    assert "parallel: {tp: 0}" in page


def test_confirming_creates_one_job_for_the_lab_day(
    cast: Cast, booking: Booking, started: list[DiagnosticJob]
) -> None:
    data = {"source": "command", "command": COMMAND, "action": "confirm"}
    response = post(cast, booking, data)
    job = DiagnosticJob.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/portal/jobs/{job.pk}/"
    assert job.booking == booking and job.organisation == cast.organisation_a
    assert job.config.booking == booking and job.created_by == cast.alice
    assert job.lab == booking.lab_day.lab
    assert started == [job]
    booking.refresh_from_db()
    assert booking.status == Booking.Status.CONFIRMED
    # A second confirmation (double click, second tab) goes to the same job.
    again = post(cast, booking, data)
    assert again["Location"] == f"/portal/jobs/{job.pk}/" and DiagnosticJob.objects.count() == 1


def test_edit_from_the_preview_brings_the_input_back(cast: Cast, booking: Booking) -> None:
    page = post(cast, booking, {"source": "command", "command": COMMAND, "action": "edit"}).content.decode()
    assert "--tensor-parallel-size 8" in page and "<textarea" in page


def test_a_cancelled_booking_takes_no_configuration(cast: Cast, booking: Booking) -> None:
    booking.status = Booking.Status.CANCELLED
    booking.save()
    response = post(cast, booking, {"source": "command", "command": COMMAND, "action": "confirm"})
    assert response.status_code == 302 and not DiagnosticJob.objects.exists()


def test_the_page_marks_the_token_where_the_customer_wrote_it(cast: Cast, booking: Booking) -> None:
    bad = (
        "vllm serve /models/kimi-k2 \\\n  --tensor-parallel-size 8 --no-such-flag \\\n  --max-model-len 1024"
    )
    page = post(cast, booking, {"source": "command", "command": bad, "action": "preview"}).content.decode()
    assert (
        '<pre class="code marked" id="command-mark">'
        "  --tensor-parallel-size 8 <mark>--no-such-flag</mark> \\</pre>" in page
    )


def test_the_preview_shows_none_of_the_labs_addresses_or_ports(
    cast: Cast, booking: Booking, tmp_path: Any
) -> None:
    # The lab's inventory names its hosts, data addresses and API port: the preview is the
    # customer's command as they would write it, with stand-ins, never those.
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({
        "schema": "lab.inventory/1", "name": "private", "known_hosts": "/dev/null",
        "catalog": str(Path(__file__).resolve().parents[3] / "lab" / "catalog.yaml"),
        "nodes": [{"name": f"spark-{i:02d}", "host": f"10.77.0.{i}", "port": 22, "api_port": 18123,
                   "data_addr": f"192.168.77.{i}", "role": "head" if i == 1 else "worker"}
                  for i in range(1, 9)]}))
    Lab.objects.filter(pk=booking.lab_day.lab_id).update(inventory=str(inventory))
    response = post(cast, booking, {"source": "command", "command": COMMAND, "action": "preview"})
    shown = response.content.decode().split('id="launch-command">')[1].split("</pre>")[0]
    assert "--tensor-parallel-size 8" in shown
    for private in ("10.77.0.", "192.168.77.", "18123", "spark-0"):
        assert private not in shown, private


@pytest.mark.parametrize(("name", "size", "limit"), [("env", 2 * 1024 * 1024, "16,384"),
                                                     ("model__path", 10_000, "500"),
                                                     ("engine__version", 600, "500")])
def test_an_oversized_form_field_is_refused_beside_it_with_the_limit(
    cast: Cast, booking: Booking, name: str, size: int, limit: str
) -> None:
    value = "A=" + "x" * size if name == "env" else "x" * size
    response = post(cast, booking, {"source": "form", **FORM, name: value, "action": "preview"})
    assert response.status_code == 400
    page = response.content.decode()
    assert f"the limit is {limit}" in page
    assert DiagnosticJob.objects.count() == 0


def test_two_replacements_at_once_answer_the_later_with_replaced_meanwhile(
    cast: Cast, booking: Booking, started: list[DiagnosticJob]
) -> None:
    first = {"source": "command", "command": COMMAND, "action": "confirm"}
    post(cast, booking, first)
    waiting = DiagnosticJob.objects.get()
    # Two colleagues opened the page while `waiting` was queued; both replace it.
    colleague = make_customer("carol", cast.organisation_a)
    mine = {"source": "command", "command": COMMAND.replace("262144", "131072"), "action": "confirm",
            "replaces": str(waiting.pk)}
    theirs = {**mine, "command": COMMAND.replace("262144", "65536")}
    logged_in(colleague).post(url(booking), theirs)
    replaced = DiagnosticJob.objects.exclude(status="cancelled").get()
    assert replaced.config.normalized["serving"]["max_model_len"] == 65536
    answer = post(cast, booking, mine)
    assert answer.status_code == 409
    page = answer.content.decode()
    assert "Replaced meanwhile: carol confirmed another configuration" in page
    assert "131072" in page, "the later one's text is kept to confirm again"
    assert f'name="replaces" value="{replaced.pk}"' in page
    assert DiagnosticJob.objects.exclude(status="cancelled").get() == replaced


@pytest.mark.parametrize("source", ["command", "form"])
def test_a_layout_bigger_than_the_booked_lab_is_refused_at_intake(
    cast: Cast, booking: Booking, started: list[DiagnosticJob], source: str
) -> None:
    # The attack: --tensor-parallel-size 16 on the 8-node lab, previewed and confirmed, so
    # the day could not run and would end free. Refused before anything is stored. (The
    # lab's nodes as the diagnose command and the lab-health poll mirror them.)
    for i in range(1, 9):
        LabNode.objects.create(lab=booking.lab_day.lab, name=f"spark-{i:02d}",
                               role="head" if i == 1 else "worker")
    if source == "command":
        data = {"source": "command", "command": COMMAND.replace("--tensor-parallel-size 8",
                                                                "--tensor-parallel-size 16")}
    else:
        data = {"source": "form", **FORM, "parallel__tp": "16", "cluster__nodes": "16"}
    for action in ("preview", "confirm"):
        response = post(cast, booking, {**data, "action": action})
        assert response.status_code == 400, action
        assert "needs 16 nodes (one rank on each), and this lab has 8" in response.content.decode()
    assert DiagnosticJob.objects.count() == 0 and started == []
