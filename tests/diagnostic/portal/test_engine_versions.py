"""Engine versions at intake (issue 27, item 7; LAB_MODEL.md section 9): a configuration
names a release the platform models (vLLM 0.29.0 or 0.34.0, SGLang 0.5.12 or 0.5.23), and
another version is refused at intake with the list, whichever way it is handed over: the
portal's structured form (beside its version input), a YAML file, a YAML file carrying a
pasted launch command, and `manage.py diagnose --config`. Nothing of a refused submission
is stored. A pasted command names no version: it is read as the engine's default release."""

from __future__ import annotations

import html
import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import CommandError, call_command

from diagnostic.bookings.models import Booking, ClusterConfiguration
from diagnostic.jobs.models import DiagnosticJob
from lab.engines import modelled_versions
from tests.diagnostic.conftest import REFERENCE_CONFIG, REFERENCE_SCENARIO, Cast

pytestmark = pytest.mark.django_db

REFERENCE_YAML = REFERENCE_CONFIG.read_text()
REFERENCE_VERSION = 'engine: {name: vllm, version: "0.34.0"}'
assert REFERENCE_YAML.count(REFERENCE_VERSION) == 1


def refusal(engine: str, version: str) -> str:
    """What intake says of `version` (HTML-unescaped), with the modelled list."""
    return (f"engine.version: {version!r} is not a {engine} version the platform models; "
            f"use one of {', '.join(modelled_versions(engine))}")


def test_the_modelled_versions_are_the_released_ones() -> None:
    assert modelled_versions("vllm") == ("0.29.0", "0.34.0")
    assert modelled_versions("sglang") == ("0.5.12", "0.5.23")


def url(booking: Booking) -> str:
    return f"/portal/bookings/{booking.uuid}/config/"


def page_of(response: Any) -> str:
    return html.unescape(response.content.decode())


def previewed_engine(response: Any) -> dict[str, Any]:
    """The engine of the normalized configuration the preview shows."""
    shown = page_of(response).split('id="normalized">')[1].split("</pre>")[0]
    engine = yaml.safe_load(shown)["engine"]
    assert isinstance(engine, dict)
    return engine


@pytest.mark.parametrize("action", ["preview", "confirm"])
@pytest.mark.parametrize(("engine", "version"), [("vllm", "0.29.1"), ("vllm", "0.25.1"),
                                                 ("sglang", "0.5.6"), ("vllm", "latest")])
def test_the_structured_form_refuses_another_version_beside_its_input(
    cast: Cast, booking: Booking, started: list[DiagnosticJob], engine: str, version: str, action: str
) -> None:
    form = {"source": "form", "action": action, "engine__name": engine, "engine__version": version,
            "model__id": "moonshotai/Kimi-K2-Instruct-0905", "model__path": "/models/kimi-k2",
            "parallel__tp": "8", "cluster__nodes": "8"}
    response = cast.client("alice").post(url(booking), form)
    assert response.status_code == 400
    page = page_of(response)
    assert refusal(engine, version) in page
    # Beside the version's input: its field block holds the message.
    block = page.split('id="f-engine__version"')[1].split('<div class="field')[0]
    assert refusal(engine, version) in block
    assert not ClusterConfiguration.objects.exists() and not started


def test_the_structured_form_takes_a_modelled_version(cast: Cast, booking: Booking) -> None:
    form = {"source": "form", "action": "preview", "engine__name": "vllm", "engine__version": "0.29.0",
            "model__id": "moonshotai/Kimi-K2-Instruct-0905", "model__path": "/models/kimi-k2",
            "parallel__tp": "8", "cluster__nodes": "8"}
    response = cast.client("alice").post(url(booking), form)
    assert response.status_code == 200, page_of(response)[:2000]
    assert previewed_engine(response) == {"name": "vllm", "version": "0.29.0"}


@pytest.mark.parametrize("action", ["preview", "confirm"])
@pytest.mark.parametrize("version", ["0.29.1", "0.33.0"])
def test_a_yaml_file_naming_another_version_is_refused_with_the_list(
    cast: Cast, booking: Booking, started: list[DiagnosticJob], version: str, action: str
) -> None:
    text = REFERENCE_YAML.replace(REFERENCE_VERSION, f'engine: {{name: vllm, version: "{version}"}}')
    response = cast.client("alice").post(url(booking), {"source": "yaml", "yaml_text": text,
                                                        "action": action})
    assert response.status_code == 400
    page = page_of(response)
    assert refusal("vllm", version) in page and 'id="yaml-error"' in page
    assert not ClusterConfiguration.objects.exists() and not started


def test_a_pasted_command_in_a_yaml_file_is_held_to_the_version_beside_it(
    cast: Cast, booking: Booking, started: list[DiagnosticJob]
) -> None:
    command = "python3 -m sglang.launch_server --model-path /models/kimi-k2 --tp 8"
    text = ('schema: diagnostic.config/1\nengine: {name: sglang, version: "0.5.6"}\n'
            f'launch_command: "{command}"\n')
    response = cast.client("alice").post(url(booking), {"source": "yaml", "yaml_text": text,
                                                        "action": "confirm"})
    assert response.status_code == 400
    assert refusal("sglang", "0.5.6") in page_of(response)
    assert not ClusterConfiguration.objects.exists() and not started
    # The same command beside a modelled release is read by that release.
    fine = text.replace('"0.5.6"', '"0.5.12"')
    ok = cast.client("alice").post(url(booking), {"source": "yaml", "yaml_text": fine, "action": "preview"})
    assert ok.status_code == 200, page_of(ok)[:2000]
    assert previewed_engine(ok) == {"name": "sglang", "version": "0.5.12"}


def test_a_pasted_command_is_read_as_the_default_release(cast: Cast, booking: Booking) -> None:
    command = ("vllm serve /models/kimi-k2 --served-model-name moonshotai/Kimi-K2-Instruct-0905 "
               "--tensor-parallel-size 8 --trust-remote-code")
    response = cast.client("alice").post(url(booking), {"source": "command", "command": command,
                                                        "action": "preview"})
    assert response.status_code == 200, page_of(response)[:2000]
    assert previewed_engine(response) == {"name": "vllm", "version": "0.34.0"}
    # What 0.34.0 refuses is refused in its own words (argparse's), beside the command.
    refused = cast.client("alice").post(url(booking), {"source": "command", "action": "preview",
                                                       "command": command + " --swap-space 16"})
    assert refused.status_code == 400
    page = page_of(refused)
    assert 'id="command-error"' in page and "unrecognized arguments: --swap-space" in page


def test_manage_py_diagnose_refuses_another_version_with_the_list(tmp_path: Path) -> None:
    config = tmp_path / "old.yaml"
    config.write_text(REFERENCE_YAML.replace(REFERENCE_VERSION, 'engine: {name: vllm, version: "0.29.1"}'))
    with pytest.raises(CommandError) as refused:
        call_command("diagnose", "--config", str(config), "--lab", f"sim:{REFERENCE_SCENARIO}",
                     "--out", str(tmp_path / "out"), stdout=io.StringIO())
    assert refusal("vllm", "0.29.1") in str(refused.value)
    assert not ClusterConfiguration.objects.exists() and not DiagnosticJob.objects.exists()
