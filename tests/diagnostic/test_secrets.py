"""Issue 29, item 6: a customer's API key and any other secret of their configuration is
stored nowhere, shown nowhere but as `••••` and its last four characters, and the engine
the lab starts still authenticates, with the platform's own key for the job, which the
measurement client sends as `Authorization: Bearer`.

Each test is the attack (a configuration carrying the secret, the way a customer hands it
over) and what the platform does with it: the rows it stores, the portal's preview, the
tuned files, the measurement client, and a whole day on the simulated lab read back from
every place it writes (findings.json, the PDF through pypdf, the email and its attachment,
the stage logs and results, the staff pages and the admin).
"""

from __future__ import annotations

import copy
import datetime as dt
import email
import email.policy
import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.utils import timezone
from pypdf import PdfReader

from diagnostic.bookings.configs import form_text, normalize_submission, submit_configuration
from diagnostic.bookings.models import ClusterConfiguration, LabDay, book_lab_day
from diagnostic.jobs.models import DiagnosticJob
from diagnostic.jobs.stage_context import StageContext
from diagnostic.jobs.tuning import command_text, config_diff, config_yaml
from diagnostic.pipelines.changes import apply_changes, change
from diagnostic.pipelines.client import EndpointError
from diagnostic.pipelines.measure.protocol import measure_endpoint
from diagnostic.portal.deliverables import tuned_configuration_yaml
from diagnostic.staff.apps import STAFF_GROUP
from lab.clock import LabClock
from lab.config import SECRET_MASK
from lab.engines import parse_command
from lab.sim.http import ServingEngine
from lab.sim.tokenizer import default_cache_dir, ensure_tokenizer
from reports.sections.appendices import tuned_configuration_appendix
from tests.diagnostic.conftest import REFERENCE_CONFIG, REFERENCE_SCENARIO, Cast, logged_in
from tests.diagnostic.doubles import fast_scenario
from tests.diagnostic.jobs.test_tuned_day import replace_stage
from tests.lab.sim.test_http import CONFIG, LabScenario

KEY = "sk-live-4f9c2b7e11d04a6e8c3b5a9d7e1f0c2b"
ENV_KEY = "sk-env-0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e"
URL_TOKEN = "ghp0123456789abcdefABCDEF0123456789ab"
SECRETS = (KEY, ENV_KEY, URL_TOKEN)
MASKED_KEY = SECRET_MASK + KEY[-4:]
MASKED_ENV_KEY = SECRET_MASK + ENV_KEY[-4:]
# The platform's own engine keys (lab.session.engine_key): shown nowhere either.
ENGINE_KEY = re.compile(r"diag-[0-9a-f]{40}")

REFERENCE_YAML = REFERENCE_CONFIG.read_text()
# The reference configuration's own extra arguments (Kimi K2's tokenizer is its own code),
# which the attacks below extend.
REFERENCE_EXTRA = 'extra_args: ["--trust-remote-code"]'
assert REFERENCE_YAML.count(REFERENCE_EXTRA) == 1 and REFERENCE_YAML.count("env: {}") == 1
# The reference configuration with an API key given both ways and a token in a URL (in a
# comment: no variable the lab permits takes a URL, lab/env_policy.yaml).
SECRET_YAML = (REFERENCE_YAML
               .replace("env: {}", f'env: {{VLLM_API_KEY: "{ENV_KEY}"}}  '
                                   f'# as on https://ci:{URL_TOKEN}@mirror.example/x')
               .replace(REFERENCE_EXTRA,
                        f"extra_args: [--trust-remote-code, --api-key, {KEY}]  # the production key"))
SECRET_COMMAND = (f"VLLM_API_KEY={ENV_KEY} vllm serve /models/kimi-k2 \\\n"
                  "  --served-model-name moonshotai/Kimi-K2-Instruct-0905 --tensor-parallel-size 8 \\\n"
                  f"  --api-key {KEY}   # the production key\n")


def holds_a_secret(text: str) -> list[str]:
    """Which secrets of this test (and any engine key of the platform) `text` holds."""
    found = [s for s in SECRETS if s in text]
    found += ENGINE_KEY.findall(text)
    # A secret's characters beyond its last four are not shown in any form either.
    found += [s for s in SECRETS if s[:-4][-16:] in text]
    return found


# -- intake: what is stored ---------------------------------------------------------------
SUBMISSIONS = {
    "yaml": SECRET_YAML,
    "command": SECRET_COMMAND,
    "yaml launch_command": ("schema: diagnostic.config/1\n"
                            f"launch_command: {json.dumps(SECRET_COMMAND)}\n"),
    "form": form_text({"model": {"id": "moonshotai/Kimi-K2-Instruct-0905", "path": "/models/kimi-k2"},
                       "parallel": {"tp": 8}, "env": {"VLLM_API_KEY": ENV_KEY}}),
}


@pytest.mark.parametrize("kind", list(SUBMISSIONS))
def test_a_submitted_secret_is_not_stored(kind: str, db: None) -> None:
    source = kind.split()[0]
    text = SUBMISSIONS[kind]
    assert any(s in text for s in SECRETS)  # the attack: the key in the submission
    config = submit_configuration(raw_text=text, source=source, label=kind)
    stored = ClusterConfiguration.objects.get(pk=config.pk)
    assert holds_a_secret(stored.raw_text) == []
    assert holds_a_secret(json.dumps(stored.normalized)) == []
    env = stored.normalized["env"]
    assert env["VLLM_API_KEY"] == MASKED_ENV_KEY
    if source != "form":
        args = stored.normalized["extra_args"]
        assert args[args.index("--api-key") + 1] == MASKED_KEY
        assert MASKED_KEY in stored.raw_text
    # What is kept still says the same configuration: the text normalizes to the row's.
    assert normalize_submission(stored.raw_text, source) == stored.normalized


def test_the_kept_text_keeps_the_customers_own_wording(db: None) -> None:
    config = submit_configuration(raw_text=SECRET_YAML, source="yaml")
    # The key is replaced where it stood; the comments and the layout are the customer's.
    assert config.raw_text == SECRET_YAML.replace(KEY, MASKED_KEY).replace(ENV_KEY, MASKED_ENV_KEY) \
        .replace(URL_TOKEN, SECRET_MASK + URL_TOKEN[-4:])
    assert "# the production key" in config.raw_text


def test_a_key_written_escaped_is_not_kept_either(db: None) -> None:
    # YAML's "\x34" is "4": the key is not in the text as such, and still may not stay.
    escaped = KEY.replace("4", "\\x34", 1)
    text = REFERENCE_YAML.replace(REFERENCE_EXTRA,
                                  f'extra_args: [--trust-remote-code, --api-key, "{escaped}"]')
    config = submit_configuration(raw_text=text, source="yaml")
    assert holds_a_secret(config.raw_text) == [] and escaped not in config.raw_text
    assert config.normalized["extra_args"] == ["--trust-remote-code", "--api-key", MASKED_KEY]
    assert normalize_submission(config.raw_text, "yaml") == config.normalized


# -- the portal ---------------------------------------------------------------------------
@pytest.fixture
def booking(cast: Cast, lab: Any) -> Any:
    day = LabDay.objects.create(lab=lab, date=timezone.localdate() + dt.timedelta(days=10))
    return book_lab_day(lab_day=day, customer=cast.alice)


def preview(cast: Cast, booking: Any, data: dict[str, str]) -> str:
    url = f"/portal/bookings/{booking.uuid}/config/"
    response = cast.client("alice").post(url, {**data, "action": "preview"})
    assert response.status_code == 200, response.content.decode()[:2000]
    return str(response.content.decode())


@pytest.mark.parametrize("data", [{"source": "command", "command": SECRET_COMMAND},
                                  {"source": "yaml", "yaml_text": SECRET_YAML}], ids=["command", "yaml"])
def test_the_preview_shows_the_mask_only(cast: Cast, booking: Any, data: dict[str, str]) -> None:
    page = preview(cast, booking, data)
    shown = {part: page.split(f'id="{part}">')[1].split("</pre>")[0]
             for part in ("normalized", "launch-command")}
    for part, text in shown.items():
        assert holds_a_secret(text) == [], part
        # The YAML shows "••••" as YAML escapes it (portal/submission.py's normalized_yaml
        # dumps without allow_unicode): the mask either way, never a character more.
        text = text.replace("\\u2022", "•")
        assert MASKED_KEY in text and MASKED_ENV_KEY in text, part


def test_the_preview_page_holds_no_secret_anywhere(cast: Cast, booking: Any) -> None:
    page = preview(cast, booking, {"source": "command", "command": SECRET_COMMAND})
    assert holds_a_secret(page) == []


def test_a_confirmed_configuration_is_stored_masked_and_offered_back_masked(
    cast: Cast, booking: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("diagnostic.portal.config_views.start_job", lambda job: False)
    client = cast.client("alice")
    url = f"/portal/bookings/{booking.uuid}/config/"
    response = client.post(url, {"source": "command", "command": SECRET_COMMAND, "action": "confirm"})
    assert response.status_code == 302, response.content.decode()[:2000]
    config = ClusterConfiguration.objects.get(booking=booking)
    assert holds_a_secret(config.raw_text + json.dumps(config.normalized)) == []
    # Before the lab day the customer may replace it: the page offers what is kept.
    page = client.get(url).content.decode()
    assert holds_a_secret(page) == [] and MASKED_KEY in page


# -- the tuned configuration ----------------------------------------------------------------
def test_the_tuned_files_keep_the_flag_masked_and_ask_for_the_key_back(db: None) -> None:
    stored = submit_configuration(raw_text=SECRET_YAML, source="yaml").normalized
    changes = [change("serving.moe_backend", "auto", "cutlass", finding="fp4.kernel_dispatch")]
    tuned = apply_changes(stored, changes)
    command, file, diff = command_text(tuned), config_yaml(tuned, changes), config_diff(stored, tuned)
    for text in (command, file, diff):
        assert holds_a_secret(text) == []
    for text in (command, file):
        assert MASKED_KEY in text and MASKED_ENV_KEY in text
        assert "--api-key ••••" in text or "- ••••" in text
        # The flag and the variable (the URL's token sits in a comment, which these drop).
        assert text.count("your own value goes here") == 2
    # The command still launches the same configuration, the mask where the key was: no
    # made-up key.
    assert parse_command(command)["extra_args"] == ["--trust-remote-code", "--api-key", MASKED_KEY]
    assert yaml.safe_load(file)["extra_args"] == ["--trust-remote-code", "--api-key", MASKED_KEY]


def test_the_report_prints_no_key_from_a_document_written_before_masking(db: None) -> None:
    """A findings document from before intake masked keys (its tuned section in clear): the
    report's tuned-configuration appendix still prints only the mask."""
    clear = yaml.safe_load(SECRET_YAML)
    changes = [change("serving.moe_backend", "auto", "cutlass", finding="fp4.kernel_dispatch")]
    findings = {"config": clear, "tuned": {
        "config": {**clear, "serving": {**clear["serving"], "moe_backend": "cutlass"}}, "changes": changes,
        "command": f"VLLM_API_KEY={ENV_KEY} vllm serve /models/kimi-k2 --api-key {KEY}\n",
        "diff": ("-  moe_backend: auto\n+  moe_backend: cutlass\n"
                 f"   extra_args:\n   - --api-key\n   - {KEY}\n")}}
    section = tuned_configuration_appendix(findings, "B", {})
    assert section is not None
    printed = json.dumps([block.__dict__ for block in section.blocks], default=str, ensure_ascii=False)
    assert holds_a_secret(printed) == []
    assert MASKED_KEY in printed and MASKED_ENV_KEY in printed


# -- the measurement client ---------------------------------------------------------------------
@pytest.fixture
def engine_with_a_key() -> Iterator[str]:
    config = copy.deepcopy(CONFIG)
    config["extra_args"] = ["--api-key", KEY]
    server = ServingEngine(scenario=LabScenario(), config=config, backend="cutlass", backend_state="ok",
                           error_rate=0.0, clock=LabClock(500.0, time.time()), log=lambda _: None,
                           tokenizer_path=ensure_tokenizer(default_cache_dir()), host="127.0.0.1", port=0,
                           seed=7)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def test_the_measurement_client_sends_the_key_as_a_bearer_token(engine_with_a_key: str) -> None:
    options: dict[str, Any] = {"workloads": ("code",), "n": 2, "warmup": 0, "max_tokens": 8, "settle_s": 0.0}
    with pytest.raises(EndpointError) as refused:
        measure_endpoint(engine_with_a_key, **options)  # no key: the engine says 401
    assert refused.value.status == 401 and holds_a_secret(str(refused.value)) == []
    result = measure_endpoint(engine_with_a_key, api_key=KEY, **options)
    assert result["code"]["n"] == 2
    assert holds_a_secret(json.dumps(result)) == []


# -- a whole day on the simulated lab ---------------------------------------------------------
def probing_stage(ctx: StageContext) -> dict[str, Any]:
    """Stands in for triage: asks the engine reproduce left serving for its models without
    a key, with the customer's, and with the session's, and proves one change so that the
    day has a tuned configuration to deliver."""
    answers = {}
    with httpx.Client(base_url=ctx.session.endpoint, trust_env=False, timeout=30) as http:
        for name, key in (("none", None), ("customer", KEY), ("session", ctx.session.engine_api_key)):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            answers[name] = http.get("/v1/models", headers=headers).status_code
    changes = [change("serving.moe_backend", "auto", "cutlass", finding="fp4.kernel_dispatch")]
    return {"engine_answers": answers, "config_changes": changes}


def pdf_text(data: bytes) -> str:
    return "\n".join(page.extract_text() or "" for page in PdfReader(io.BytesIO(data)).pages)


@pytest.mark.ssh
@pytest.mark.django_db(transaction=True)
def test_a_day_with_an_api_key_shows_it_nowhere_and_measures_through_it(
    tmp_path: Path, sim_state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replace_stage(monkeypatch, "triage", probing_stage)
    config_file = tmp_path / "with-a-key.yaml"
    config_file.write_text(SECRET_YAML)
    out = tmp_path / "out"
    scenario = fast_scenario(tmp_path, REFERENCE_SCENARIO)
    call_command("diagnose", "--config", str(config_file), "--lab", f"sim:{scenario}", "--out", str(out),
                 "--stages", "preflight,reproduce,triage,measure,report", "--seed", "5", stdout=io.StringIO())
    document = json.loads((out / "findings.json").read_text())
    job = DiagnosticJob.objects.get(pk=document["job"]["id"])
    assert job.status == DiagnosticJob.Status.SUCCEEDED, job.status_message

    # The engine authenticated: no key and the customer's key were refused, the session's
    # let in; and the measure stage measured both configurations through it.
    stages = {s.name: s for s in job.stage_runs.all()}
    probed = stages["triage"].result
    assert isinstance(probed, dict)
    assert probed["engine_answers"] == {"none": 401, "customer": 401, "session": 200}
    assert document["measurement"]["code"]["n"] == 15
    assert document["measurement"]["tuned"]["code"]["n"] == 15

    # Stored: the configuration row.
    assert holds_a_secret(job.config.raw_text + json.dumps(job.config.normalized)) == []
    # findings.json, and the tuned configuration it carries.
    assert holds_a_secret(json.dumps(document, ensure_ascii=False)) == []
    assert document["config"]["extra_args"] == ["--trust-remote-code", "--api-key", MASKED_KEY]
    assert document["tuned"]["config"]["env"]["VLLM_API_KEY"] == MASKED_ENV_KEY
    # The tuned files: the customer's flag, masked, and a note to put the key back.
    for name in ("tuned-command.txt", "tuned-config.yaml", "tuned.diff"):
        text = (out / name).read_text(encoding="utf-8")
        assert holds_a_secret(text) == [], name
    assert MASKED_KEY in (out / "tuned-command.txt").read_text(encoding="utf-8")
    assert "your own value goes here" in (out / "tuned-config.yaml").read_text(encoding="utf-8")
    # The report, read back from the PDF.
    report = pdf_text((out / "report.pdf").read_bytes())
    assert "Launch command" in report and "--api-key" in report
    assert holds_a_secret(report) == []
    # The email: its bodies and the PDF it carries.
    message = email.message_from_bytes((out / "email.eml").read_bytes(), policy=email.policy.default)
    attachments = 0
    for part in message.walk():
        if part.get_content_type() == "application/pdf":
            attachments += 1
            payload = part.get_payload(decode=True)
            assert isinstance(payload, bytes)
            assert holds_a_secret(pdf_text(payload)) == []
        elif part.get_content_maintype() == "text":
            assert holds_a_secret(part.get_content()) == []
    assert attachments == 1
    # Stage logs (as diagnose writes them and as stored) and stage results, reproduce's
    # record of the launch argv and environment included.
    for path in sorted((out / "logs").iterdir()):
        assert holds_a_secret(path.read_text(encoding="utf-8")) == [], path.name
    for stage in stages.values():
        assert holds_a_secret(stage.log + json.dumps(stage.result, ensure_ascii=False)) == [], stage.name
    reproduced = stages["reproduce"].result
    assert isinstance(reproduced, dict)
    launch = reproduced["launch"][0]
    assert launch["argv"][launch["argv"].index("--api-key") + 1] == MASKED_KEY
    assert launch["env"]["VLLM_API_KEY"] == MASKED_ENV_KEY
    # The customer's download of the tuned configuration.
    assert holds_a_secret(tuned_configuration_yaml(job)) == []

    # The staff pages and the admin.
    staff = User.objects.create_user(username="consultant", is_staff=True, is_superuser=True)
    staff.groups.add(Group.objects.get(name=STAFF_GROUP))
    client = logged_in(staff)
    pages = [f"/staff/jobs/{job.pk}/", f"/staff/jobs/{job.pk}/timeline/", f"/staff/reports/{job.pk}/",
             "/staff/lab/", "/staff/", f"/admin/bookings/clusterconfiguration/{job.config.pk}/change/"]
    pages += [f"/staff/jobs/{job.pk}/log/{name}/" for name in stages]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url
        assert holds_a_secret(response.content.decode()) == [], url
