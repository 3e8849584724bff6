"""The lab page: every lab's nodes as the last health poll saw them (refreshable on
demand), and the lab calendar of booked, closed and free days."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from diagnostic.bookings.models import Booking, Lab, LabDay
from diagnostic.jobs.models import LabHealth, NodeHealth
from diagnostic.portal.job_views import lab_duration
from diagnostic.staff.access import staff_required
from diagnostic.staff.labhealth import poll_all_labs
from diagnostic.staff.serving import jobs_serving

CALENDAR_DAYS = 42
# The lab page re-reads the stored health this often; the poll itself is beat's (a minute).
LAB_POLL_MS = 5000


def gib(kib_or_bytes: int | None, *, per_gib: int) -> str:
    return "not reported" if kib_or_bytes is None else f"{kib_or_bytes / per_gib:.1f} GiB"


def node_row(h: NodeHealth, now: dt.datetime) -> dict[str, Any]:
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
    return {
        "h": h,
        "state": "reachable" if h.reachable else "unreachable",
        "engine": engine,
        "spec": h.spec_sha256[:12] if h.spec_sha256 else "",
        "temperature": f"{h.gpu_temperature_c:.0f} °C" if h.gpu_temperature_c is not None else "not reported",
        "gpu_memory": gpu_memory,
        "disk_free": gib(h.disk_free_bytes, per_gib=1 << 30),
        "page_cache": gib(h.page_cache_kib, per_gib=1 << 20),
        "telemetry_age": (f"{lab_duration((now - h.last_telemetry_at).total_seconds())} ago"
                          if h.last_telemetry_at else "none yet"),
        "checked_age": lab_duration((now - h.checked_at).total_seconds()),
    }


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


def _labs(now: dt.datetime) -> list[dict[str, Any]]:
    labs = []
    for lab in Lab.objects.order_by("name"):
        health = LabHealth.objects.filter(lab=lab).first()
        nodes = [node_row(h, now) for h in NodeHealth.objects.filter(lab=lab).order_by("node")]
        # Which job's stage launched the engine a node runs, from the jobs' own records.
        served = jobs_serving(lab, [n["h"].spec_sha256 for n in nodes])
        for n in nodes:
            n["served"] = served.get(n["h"].spec_sha256)
        labs.append({
            "lab": lab,
            "health": health,
            "checked_age": lab_duration((now - health.checked_at).total_seconds()) if health else "",
            "nodes": nodes,
            "down": sum(1 for n in nodes if not n["h"].reachable),
            "calendar": calendar(lab, timezone.localdate()),
        })
    return labs


@staff_required
def lab_page(request: HttpRequest) -> HttpResponse:
    return render(request, "staff/lab.html", {
        "labs": _labs(timezone.now()), "interval_s": settings.STAFF_LAB_HEALTH_INTERVAL_S,
        "poll_ms": LAB_POLL_MS,
    })


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
    polled = poll_all_labs()
    down = [h.lab.name for h in polled if h.error]
    messages.success(request, f"Polled {len(polled)} lab(s) just now" +
                     (f"; not reachable: {', '.join(down)}" if down else "") + ".")
    return redirect("staff:lab")
