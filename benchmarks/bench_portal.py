"""Latency of the portal's two busiest pages under load: the job page (customers leave
it open; it polls) and the booking calendar, with 50 concurrent clients.

Runs the production stack on loopback: gunicorn serving the WSGI app with DEBUG off
(whitenoise, CSP, collected static files) on PostgreSQL, in a database of its own that
it creates and fills (two organisations, a lab calendar with bookings, a finished job
with seven stages and an approved report). The clients are one async httpx pool, each
with the customer's session. Prints p50/p95/p99 per page; the target is p95 < 150 ms.

    .venv/bin/python benchmarks/bench_portal.py [--clients 50] [--seconds 20] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/diagnostic_bench_portal"
PASSWORD = "bench passphrase " + "9" * 8
TARGET_P95_MS = 150.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def production_env(database_url: str, static_root: Path, out_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="diagnostic.settings", DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50),
        DEFAULT_FROM_EMAIL="diagnostic@bench-firm.net",
        ALLOWED_HOSTS="127.0.0.1", DATABASE_URL=database_url, DB_CONN_MAX_AGE="60",
        STATIC_ROOT=str(static_root), DIAG_OUT_DIR=str(out_dir), LOG_LEVEL="WARNING",
        # Plain HTTP on loopback: no TLS proxy in front, so no redirect and no Secure cookies.
        SECURE_SSL_REDIRECT="0", SESSION_COOKIE_SECURE="0", CSRF_COOKIE_SECURE="0", SECURE_HSTS_SECONDS="0",
    )
    env.pop("CELERY_BROKER_URL", None)
    return env


def create_database(url: str) -> None:
    import psycopg

    base, _, name = url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def seed(env: dict[str, str]) -> dict[str, str]:
    """Migrate and fill the bench database; returns the job id and the customer's email."""
    os.environ.update(env)
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.utils import timezone

    from diagnostic.bookings.configs import submit_configuration
    from diagnostic.bookings.models import Customer, Lab, LabDay, Organisation, book_lab_day
    from diagnostic.jobs.models import DiagnosticJob, ReportVersion, StageRun
    from diagnostic.jobs.orchestration import create_job

    call_command("migrate", verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)
    lab = Lab.objects.create(name="sim:bench", inventory="sim:lab/scenarios/reference-kimi-k2-8spark.yaml")
    today = timezone.localdate()
    days = [LabDay.objects.create(lab=lab, date=today + dt.timedelta(days=n)) for n in range(-30, 60)]
    people = []
    for name, email in (("Acme Inference", "alice@acme.example"), ("Globex Serving", "bob@globex.example")):
        user = User.objects.create_user(email, email, PASSWORD)
        Customer.objects.create(user=user, organisation=Organisation.objects.create(name=name))
        people.append(user)
    for index, day in enumerate(days[::3]):
        book_lab_day(lab_day=day, customer=people[index % 2])
    booking = people[0].bookings.order_by("lab_day__date").first()
    assert booking is not None
    text = (ROOT / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml").read_text()
    config = submit_configuration(raw_text=text, source="yaml", booking=booking, submitted_by=people[0])
    job = create_job(config=config, lab=lab, booking=booking)
    for stage in job.stage_runs.all():
        StageRun.objects.filter(pk=stage.pk).update(
            status="succeeded", lab_seconds=100.0 + stage.order, progress_percent=100,
            progress_message=f"{stage.name}: finished with its findings recorded")
    DiagnosticJob.objects.filter(pk=job.pk).update(status="succeeded")
    ReportVersion.objects.create(job=job, digest="b" * 64, pdf_path="/nonexistent.pdf", pages=12).approve()
    return {"job": str(job.pk), "email": people[0].email}


def start_gunicorn(env: dict[str, str], port: int, workers: int, threads: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "gunicorn", "diagnostic.wsgi:application", "--bind", f"127.0.0.1:{port}",
               "--workers", str(workers), "--threads", str(threads), "--worker-class", "gthread",
               "--log-level", "warning", "--backlog", "512",
               # Above the clients' pause, so an idle keep-alive connection is still open.
               "--keep-alive", "10"]
    return subprocess.Popen(command, cwd=ROOT, env=env)


async def login(base: str, email: str) -> dict[str, str]:
    import httpx

    async with httpx.AsyncClient(base_url=base, follow_redirects=False) as client:
        page = await client.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token is not None, page.text[:500]
        answer = await client.post("/accounts/login/", data={
            "csrfmiddlewaretoken": token.group(1), "username": email, "password": PASSWORD})
        assert answer.status_code == 302, (answer.status_code, answer.text[:500])
        return dict(client.cookies)


async def wait_until_up(base: str, timeout_s: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=base) as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get("/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.3)
    raise SystemExit(f"gunicorn did not answer at {base} within {timeout_s:g} s")


async def load(base: str, cookies: dict[str, str], urls: dict[str, str], clients: int,
               seconds: float, think_s: float) -> tuple[dict[str, list[float]], int]:
    import httpx

    timings: dict[str, list[float]] = {name: [] for name in urls}
    failures = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, cookies=cookies, limits=limits, timeout=30) as client:
        stop_at = time.monotonic() + seconds

        async def one_client(index: int) -> None:
            nonlocal failures
            names = list(urls)
            turn = index
            if think_s:
                await asyncio.sleep(think_s * index / clients)
            while time.monotonic() < stop_at:
                name = names[turn % len(names)]
                turn += 1
                started = time.perf_counter()
                try:
                    answer = await client.get(urls[name])
                except httpx.TransportError:
                    failures += 1
                    continue
                elapsed = (time.perf_counter() - started) * 1000
                if answer.status_code != 200:
                    failures += 1
                else:
                    timings[name].append(elapsed)
                if think_s:
                    await asyncio.sleep(think_s)

        await asyncio.gather(*(one_client(i) for i in range(clients)))
    return timings, failures


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--think-ms", type=float, default=3000.0,
                        help="pause between a client's requests (the job poll interval); 0: closed loop")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=8, help="threads per gunicorn worker")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_PORTAL_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()

    # The machine's own load before this run adds to it (the 1-minute average): on a shared
    # machine the tail follows it, so the figures are printed beside it.
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-portal-"))
    env = production_env(args.database_url, work / "static", work / "out")
    create_database(args.database_url)
    seeded = seed(env)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_gunicorn(env, port, args.workers, args.threads)
    try:
        asyncio.run(wait_until_up(base))
        cookies = asyncio.run(login(base, seeded["email"]))
        urls = {"job page": f"/portal/jobs/{seeded['job']}/", "booking calendar": "/portal/book/"}
        think_s = args.think_ms / 1000
        asyncio.run(load(base, cookies, urls, args.clients, args.warmup, 0.0))
        timings, failures = asyncio.run(load(base, cookies, urls, args.clients, args.seconds, think_s))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    figures: dict[str, Any] = {"clients": args.clients, "seconds": args.seconds, "think_ms": args.think_ms,
                               "load_average_before": load_before,
                               "load_average_after": os.getloadavg()[0], "workers": args.workers,
                               "threads": args.threads, "failures": failures, "pages": {}}
    pacing = f"{args.think_ms:g} ms between a client's requests" if args.think_ms else "closed loop"
    print(f"portal under {args.clients} concurrent clients for {args.seconds:g} s, {pacing} "
          f"(gunicorn {args.workers}x{args.threads} gthread, PostgreSQL, DEBUG off; "
          f"machine load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after)")
    ok = failures == 0
    for name, values in timings.items():
        p50, p95, p99 = (percentile(values, q) for q in (50, 95, 99))
        rate = len(values) / args.seconds
        figures["pages"][name] = {"requests": len(values), "per_s": round(rate, 1), "p50_ms": round(p50, 1),
                                  "p95_ms": round(p95, 1), "p99_ms": round(p99, 1),
                                  "mean_ms": round(statistics.fmean(values), 1) if values else None}
        verdict = "ok" if p95 < TARGET_P95_MS else f"ABOVE the {TARGET_P95_MS:g} ms target"
        ok = ok and p95 < TARGET_P95_MS
        print(f"  {name:<17} {len(values):6d} requests {rate:7.1f}/s  p50 {p50:6.1f} ms  "
              f"p95 {p95:6.1f} ms  p99 {p99:6.1f} ms  ({verdict})")
    if failures:
        print(f"  {failures} answers were not 200")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
