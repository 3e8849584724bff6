"""The lab page shows each of the lab's baselines (lab.baseline) from the lab's baseline
folder: model, nodes, engine and version, its version number and source, the rates with
their intervals, the cold start, when it was made and how long ago, and whether it is
stale and why, judged against the lab's nodes as the latest preflight on the lab saw them."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from diagnostic.bookings.models import Lab
from diagnostic.jobs.models import StageRun
from diagnostic.staff.lab_views import lab_baseline_dir
from lab.baseline import baseline_dir_for, save_baseline
from tests.diagnostic.conftest import REFERENCE_SCENARIO, Cast
from tests.diagnostic.staff.conftest import make_finished_job
from tests.diagnostic.staff.test_lab_health import section
from tests.lab.test_baseline import lab_facts, make

pytestmark = pytest.mark.django_db


@pytest.fixture
def own_lab(tmp_path: Path) -> Lab:
    """A simulated lab whose scenario file (and so its baseline folder) is the test's own."""
    scenario = tmp_path / "scenarios" / "own-lab.yaml"
    scenario.parent.mkdir()
    shutil.copy(REFERENCE_SCENARIO, scenario)
    return Lab.objects.create(name="sim:own-lab", inventory=f"sim:{scenario}")


def rows(page: str) -> dict[str, str]:
    """Each baseline row of a lab's section by its file (folder/vN.yaml)."""
    out = {}
    for chunk in page.split('data-baseline="')[1:]:
        name, _, rest = chunk.partition('"')
        out[name] = rest.split("</tr>", 1)[0]
    return out


def test_the_page_shows_each_baseline_fresh_or_stale_and_why(cast: Cast, own_lab: Lab,
                                                             tmp_path: Path) -> None:
    folder = lab_baseline_dir(own_lab)
    assert folder == baseline_dir_for(None, tmp_path / "scenarios" / "own-lab.yaml")
    now = timezone.now()
    made = (now - dt.timedelta(days=3)).astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = save_baseline(folder, make("0.29.0", made_at="2026-10-01T09:00:00Z", code=24.0))
    save_baseline(folder, make(made_at="2026-11-01T09:00:00Z", code=26.5))
    current = save_baseline(folder, make(made_at=made, code=27.1))
    (current.parent / "v9.yaml").write_text("schema: lab.baseline/1\n")

    # No job has read the lab's nodes yet: nothing is called stale or current on a guess.
    page = cast.client("staff").get("/staff/lab/").content.decode()
    text = section(page, own_lab)
    assert "<h3>Baselines</h3>" in text
    assert "no preflight on this lab has read its nodes yet" in text
    assert text.count('class="badge pending">not checked') == 3
    assert "Cannot be read:" in text and "v9.yaml: lab: is missing" in text

    # A preflight on the lab saw its nodes: vLLM 0.34.0 and the baselines' own hardware.
    job = make_finished_job(cast, own_lab, lab_day=timezone.localdate())
    StageRun.objects.filter(job=job, name="preflight").update(result={"nodes": lab_facts()}, finished_at=now)
    page = cast.client("staff").get("/staff/lab/").content.decode()
    text = section(page, own_lab)
    assert f"preflight of job <a href=\"/staff/jobs/{job.pk}/\">{str(job.pk)[:8]}</a>" in text
    shown = rows(text)
    key = current.parent.name
    assert set(shown) == {f"{old.parent.name}/v1.yaml", f"{key}/v1.yaml", f"{key}/v2.yaml"}

    fresh = shown[f"{key}/v2.yaml"]
    assert "moonshotai/Kimi-K2-Instruct-0905" in fresh and "<td>8</td>" in fresh
    assert "vLLM 0.34.0" in fresh and "<td>v2</td>" in fresh and "calibrate" in fresh
    assert "code: 27.1 tok/s [26.6, 27.6], n = 15" in fresh
    assert "prose: 23.9 tok/s [23.4, 24.4], n = 15" in fresh
    assert "2 min 28 s (n = 2: 148, 148 s)" in fresh
    assert made in fresh and "3 days ago" in fresh
    assert 'class="badge succeeded">current' in fresh and "stale" not in fresh

    superseded = shown[f"{key}/v1.yaml"]
    assert 'class="badge pending">superseded' in superseded and "by v2" in superseded

    stale = shown[f"{old.parent.name}/v1.yaml"]
    assert "vLLM 0.29.0" in stale and 'class="badge stale">stale' in stale
    assert "made on vLLM 0.29.0, the lab runs vLLM 0.34.0" in stale

    # The nodes change (another GPU): every baseline is stale, and says so.
    other = lab_facts(gpu="NVIDIA GB200")
    StageRun.objects.filter(job=job, name="preflight").update(result={"nodes": other})
    fragment = cast.client("staff").get("/staff/lab/sections/").content.decode()
    shown = rows(section(fragment, own_lab))
    assert all('class="badge stale">stale' in r for r in shown.values())
    assert "the lab&#x27;s nodes changed since 2026-11-01" in shown[f"{key}/v1.yaml"]


def test_a_lab_without_baselines_says_what_happens_instead(cast: Cast, own_lab: Lab, settings: Any) -> None:
    page = cast.client("staff").get("/staff/lab/").content.decode()
    text = section(page, own_lab)
    assert "No baseline yet" in text and "measures the firm's best-known configuration" in text
    assert 'class="list baselines"' not in text
