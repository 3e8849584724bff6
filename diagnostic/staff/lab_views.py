"""The lab page: every lab's nodes as the last health poll saw them (refreshable on
demand), when that poll ran and whether it completed, which job holds the lab and which
job each engine belongs to, the lab's baselines (lab.baseline: its best configuration per
model, node count and engine version, with what it delivered, how old it is and whether it
is stale), and the lab calendar of booked, closed and free days.

The page says only what the stored records show: the poll's cadence is Celery beat's, so
without a broker (embedded mode) it says nothing polls on its own, and with one it says
when the next poll is due, or that beat has not polled within two intervals."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from diagnostic.bookings.models import Booking, Lab, LabDay
from diagnostic.jobs.models import DiagnosticJob, LabHealth, NodeHealth, StageRun
from diagnostic.portal.job_views import lab_duration
from diagnostic.staff.access import staff_required
from diagnostic.staff.engine_owners import Served, jobs_serving
from diagnostic.staff.labhealth import INCOMPLETE, is_incomplete, lab_holder, poll_all_labs
from lab.baseline import (
    Baseline,
    age_words,
    baseline_dir_of,
    engine_version_of,
    node_fingerprint,
    read_baselines,
    staleness,
    superseded_by,
)

CALENDAR_DAYS = 42
# The lab page re-reads the stored health this often; the poll itself is beat's (a minute).
LAB_POLL_MS = 5000
# When this web server began serving (its first import of this module): with no poll on
# record, how long beat has had to send its first.
SERVER_STARTED = time.time()


def gib(kib_or_bytes: int | None, *, per_gib: int) -> str:
    return "not reported" if kib_or_bytes is None else f"{kib_or_bytes / per_gib:.1f} GiB"


def ago(moment: dt.datetime, now: dt.datetime) -> str:
    return lab_duration(max(0.0, (now - moment).total_seconds()))


def job_using_lab(lab: Lab, now: dt.datetime) -> dict[str, Any] | None:
    """The job holding the lab's lease now: its running stage and its latest stage that
    succeeded (the newest proof the lab worked for it)."""
    job = lab_holder(lab, now)
    if job is None:
        return None
    stages = list(StageRun.objects.filter(job=job).order_by("order"))
    running = next((s for s in stages if s.status == StageRun.Status.RUNNING), None)
    succeeded = [(s.finished_at, s) for s in stages
                 if s.status == StageRun.Status.SUCCEEDED and s.finished_at is not None]
    at, latest = max(succeeded, key=lambda pair: pair[0]) if succeeded else (None, None)
    return {
        "job": job,
        "running": running,
        "latest": latest,
        "latest_age": ago(at, now) if at else "",
        "activity_at": at,
    }


def _owner_job_id(owner: Any) -> str | None:
    if not isinstance(owner, dict):
        return None
    try:
        return str(uuid.UUID(str(owner.get("job") or "")))
    except ValueError:
        return None


def engine_job(h: NodeHealth, owners: dict[str, DiagnosticJob], served: dict[str, Served]) -> dict[str, Any]:
    """Whose engine a node runs: the job its launch spec names as owner when this platform
    has that job; else the recent job whose configuration renders to its spec hash; else
    nobody here, which is the lab's business (someone started it by hand, or another
    platform did)."""
    owner = h.engine_owner
    owned = owners.get(_owner_job_id(owner) or "")
    matched = served.get(h.spec_sha256)
    if owned is not None:
        if matched is not None and matched.job.pk == owned.pk:
            return {"job": owned, "stage": matched.stage, "what": matched.what}
        return {"job": owned, "stage": "", "what": "its launch spec names this job"}
    if matched is not None:
        return {"job": matched.job, "stage": matched.stage, "what": matched.what}
    if isinstance(owner, dict) and owner:
        named = ", ".join(f"{k} {v}" for k, v in sorted(owner.items()))
        why = f"its launch spec names {named}, which this platform does not have"
    else:
        why = "its launch spec names no owner and no recent job's configuration has its hash"
    return {"job": None, "why": why}


def node_row(h: NodeHealth, now: dt.datetime, *, health: LabHealth | None = None,
             using: dict[str, Any] | None = None) -> dict[str, Any]:
    if h.engine_running is None:
        engine = "unknown"
    elif h.engine_running:
        engine = "running"
    else:
        engine = "stopped" if h.engine_exit_code is None else f"exited ({h.engine_exit_code})"
    if h.gpu_memory_total_mib is not None:
        gpu_memory = f"{h.gpu_memory_total_mib / 1024:.0f} GiB"
    elif h.mem_total_kib is not None:
        # GB10 shares one memory between CPU and GPU; nvidia-smi reports no GPU total.
        gpu_memory = (f"unified: {gib(h.mem_available_kib, per_gib=1 << 20)} free "
                      f"of {gib(h.mem_total_kib, per_gib=1 << 20)}")
    else:
        gpu_memory = "not reported"
    state = "reachable" if h.reachable else "unreachable"
    activity = using["activity_at"] if using else None
    if not h.reachable and activity is not None and h.checked_at < activity:
        # The job holding the lab has had a stage succeed since this node was found down:
        # the record is older than the job's own evidence, so it is not shown as down.
        state = "stale"
    return {
        "h": h,
        "state": state,
        "engine": engine,
        "spec": h.spec_sha256[:12] if h.spec_sha256 else "",
        "temperature": f"{h.gpu_temperature_c:.0f} °C" if h.gpu_temperature_c is not None else "not reported",
        "gpu_memory": gpu_memory,
        "disk_free": gib(h.disk_free_bytes, per_gib=1 << 30),
        "page_cache": gib(h.page_cache_kib, per_gib=1 << 20),
        "telemetry_age": f"{ago(h.last_telemetry_at, now)} ago" if h.last_telemetry_at else "none yet",
        "checked_age": ago(h.checked_at, now),
        "seen_age": ago(h.last_seen_at, now) if h.last_seen_at else "",
        # The latest poll did not reach this node (it did not complete): its last known state.
        "not_reached": health is not None and h.checked_at < health.checked_at,
    }


def poll_summary(health: LabHealth | None, nodes: list[dict[str, Any]], now: dt.datetime) -> dict[str, Any]:
    """The last poll's time and result, and what to expect of the next, in plain words."""
    interval = int(settings.STAFF_LAB_HEALTH_INTERVAL_S)
    beat = not settings.CELERY_TASK_ALWAYS_EAGER
    out: dict[str, Any] = {"interval": interval, "overdue": False, "next_due": None}
    if not beat:
        out["cadence"] = ("Embedded mode (no CELERY_BROKER_URL): Celery beat does not run, so nothing "
                          "polls the lab on its own; it is polled when someone presses “Poll the lab now”.")
    if health is None:
        out.update(state="none", badge="pending", words="no poll yet",
                   result="No poll has run since the platform started.")
        if beat:
            up = max(0.0, time.time() - SERVER_STARTED)
            if up > 2 * interval:
                out["overdue"] = True
                out["cadence"] = (f"Celery beat should poll every {interval} s, but none has arrived in the "
                                  f"{lab_duration(up)} this server has been up: is beat running? "
                                  "Poll the lab now to see the nodes.")
            else:
                out["cadence"] = (f"Celery beat sends its first poll within {interval} s of starting, then "
                                  f"one every {interval} s; poll the lab now to see the nodes at once.")
        return out
    age_s = max(0.0, (now - health.checked_at).total_seconds())
    out["age"] = lab_duration(age_s)
    if beat:
        if age_s > 2 * interval:
            out["overdue"] = True
            out["cadence"] = (f"Celery beat has not polled within two intervals ({2 * interval} s; it should "
                              f"poll every {interval} s): the last poll is {lab_duration(age_s)} old. "
                              "Is beat running? The states below are as old as their ages say.")
        else:
            out["next_due"] = health.checked_at + dt.timedelta(seconds=interval)
            out["cadence"] = f"Celery beat polls every {interval} s."
    down = sum(1 for n in nodes if n["state"] == "unreachable")
    stale = sum(1 for n in nodes if n["state"] == "stale")
    out["down"], out["stale"] = down, stale
    if health.error and is_incomplete(health.error):
        out.update(state="incomplete", badge="incomplete", words="poll did not complete", result=health.error)
    elif health.error:
        out.update(state="unreachable", badge="failed", words="unreachable",
                   result=f"The lab could not be reached: {health.error}")
    elif down:
        out.update(state="down", badge="failed", words=f"{down} node{'s' if down != 1 else ''} down",
                   result=f"Completed in {health.poll_seconds:.1f} s.")
    elif stale:
        out.update(state="stale", badge="stale", words=f"{stale} node{'s' if stale != 1 else ''} stale",
                   result=f"Completed in {health.poll_seconds:.1f} s.")
    else:
        out.update(state="ok", badge="succeeded", words="all nodes answer",
                   result=f"Completed in {health.poll_seconds:.1f} s: every node answered.")
    return out


def calendar(lab: Lab, today: dt.date) -> list[dict[str, Any]]:
    days = {d.date: d for d in LabDay.objects.filter(lab=lab, date__gte=today,
                                                     date__lt=today + dt.timedelta(days=CALENDAR_DAYS))}
    booked = {
        b.lab_day.date: b for b in Booking.objects.filter(lab_day__lab=lab, lab_day__date__in=list(days))
        .exclude(status=Booking.Status.CANCELLED).select_related("lab_day", "organisation")
    }
    out = []
    for date in sorted(days):
        if date in booked:
            out.append({"date": date, "state": "booked", "who": booked[date].organisation.name})
        elif days[date].closed:
            out.append({"date": date, "state": "closed", "who": ""})
        else:
            out.append({"date": date, "state": "free", "who": ""})
    return out


def lab_baseline_dir(lab: Lab) -> Path:
    """Where `lab` keeps its baselines (lab.baseline.baseline_dir_for): beside its
    inventory, or for a simulated lab beside its scenario file."""
    return baseline_dir_of(lab.inventory, root=settings.BASE_DIR)


def latest_facts(lab: Lab) -> StageRun | None:
    """The newest preflight on `lab` that kept its nodes' facts: what the lab is now, as
    far as the stored records show (the health poll keeps too little of them)."""
    rows = (StageRun.objects.filter(job__lab=lab, name="preflight", status__in=StageRun.WITH_RESULT,
                                    finished_at__isnull=False)
            .order_by("-finished_at").only("job_id", "finished_at", "result"))
    for row in rows[:5]:
        if isinstance(row.result, dict) and isinstance(row.result.get("nodes"), dict) and row.result["nodes"]:
            return row
    return None


def _rate_words(rate: dict[str, Any]) -> str:
    lo, hi = rate["ci95"]
    return f"{rate['mean_tps']:.1f} tok/s [{lo:.1f}, {hi:.1f}], n = {rate['n']}"


def baseline_row(b: Baseline, every: list[Baseline], now: dt.datetime, *,
                 facts: dict[str, Any] | None) -> dict[str, Any]:
    """One baseline as the page shows it: its figures, its age, and whether it still says
    what the lab delivers (stale, and why) as far as the latest facts tell."""
    newer = superseded_by(b, every)
    if facts is None:
        stale, state = None, "unchecked"
    else:
        stale = staleness(b, version=engine_version_of(facts, b.engine.name),
                          fingerprint=node_fingerprint(facts))
        state = "stale" if stale else ("superseded" if newer else "current")
    return {
        "b": b,
        "engine": b.engine.words(),
        "rates": [(w, _rate_words(r)) for w, r in b.rates.items()],
        "cold_start": (f"{lab_duration(b.cold_start_s)} (n = {b.cold_start['n']}: "
                       f"{', '.join(f'{v:.0f}' for v in b.cold_start['samples'])} s)"),
        "age": age_words(b.age(now)),
        "stale": stale,
        "state": state,
        "superseded_by": newer,
        "file": b.path.name if b.path else "",
        "folder": b.path.parent.name if b.path else "",
    }


def lab_baselines(lab: Lab, now: dt.datetime) -> dict[str, Any]:
    directory = lab_baseline_dir(lab)
    every, problems = read_baselines(directory)
    seen = latest_facts(lab)
    facts = seen.result["nodes"] if seen is not None and isinstance(seen.result, dict) else None
    return {
        "dir": directory,
        "rows": [baseline_row(b, every, now, facts=facts) for b in every],
        "problems": problems,
        "facts_job": seen.job_id if seen is not None else None,
        "facts_at": seen.finished_at if seen is not None else None,
        "facts_age": ago(seen.finished_at, now) if seen is not None and seen.finished_at else "",
    }


def _labs(now: dt.datetime) -> list[dict[str, Any]]:
    labs = []
    for lab in Lab.objects.order_by("name"):
        health = LabHealth.objects.filter(lab=lab).first()
        using = job_using_lab(lab, now)
        rows = list(NodeHealth.objects.filter(lab=lab).order_by("node"))
        nodes = [node_row(h, now, health=health, using=using) for h in rows]
        # Which job's engine each node runs: the owner its launch spec names, else the
        # recent job whose configuration renders to its spec hash.
        served = jobs_serving(lab, [h.spec_sha256 for h in rows])
        ids = {i for i in (_owner_job_id(h.engine_owner) for h in rows) if i}
        owned = DiagnosticJob.objects.filter(pk__in=ids).select_related("organisation")
        owners = {str(j.pk): j for j in owned}
        for n in nodes:
            n["served"] = engine_job(n["h"], owners, served) if n["h"].spec_sha256 else None
        labs.append({
            "lab": lab,
            "health": health,
            "poll": poll_summary(health, nodes, now),
            "using": using,
            "nodes": nodes,
            "baselines": lab_baselines(lab, now),
            "calendar": calendar(lab, timezone.localdate()),
        })
    return labs


@staff_required
def lab_page(request: HttpRequest) -> HttpResponse:
    return render(request, "staff/lab.html", {"labs": _labs(timezone.now()), "poll_ms": LAB_POLL_MS,
                                                 "poll_s": LAB_POLL_MS // 1000})


@staff_required
def lab_sections(request: HttpRequest) -> HttpResponse:
    """The labs' sections alone, which the lab page fetches every LAB_POLL_MS: what the
    latest poll (beat's or someone's refresh) saw shows without a reload."""
    response = render(request, "staff/_lab_sections.html", {"labs": _labs(timezone.now())})
    response["Cache-Control"] = "no-store"
    return response


@staff_required
@require_POST
def lab_refresh(request: HttpRequest) -> HttpResponse:
    try:
        polled = poll_all_labs()
    except DatabaseError as exc:
        messages.error(request, f"{INCOMPLETE}the database could not be read ({exc}).")
        return redirect("staff:lab")
    down = [h.lab.name for h in polled if h.error and not is_incomplete(h.error)]
    incomplete = [h.lab.name for h in polled if is_incomplete(h.error)]
    text = (f"Polled {len(polled)} lab(s) just now"
            + (f"; not reachable: {', '.join(down)}" if down else "")
            + (f"; the poll did not complete for: {', '.join(incomplete)} (see below)" if incomplete else "")
            + ".")
    (messages.warning if down or incomplete else messages.success)(request, text)
    return redirect("staff:lab")
