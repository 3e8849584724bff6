"""No page answers 500 to the fuzz (issue 29, item 5): every URL pattern of the portal, the
staff dashboard and the accounts pages, resolved from the URLconf with its path arguments
filled with real objects of the cast, is asked as each role (anonymous, a customer who owns
the objects, a customer who does not, staff) with GET query parameters and POST form
fields that carry NUL and the other C0 controls, invalid UTF-8 percent-escapes (%ff, %00,
an encoded lone surrogate, an overlong NUL), very long strings and the real values the
views expect. Every answer is below 500; a control character in a path, a query string or
a form field the view does not check itself is a 400 that names it.

The parameters are every form field the templates name and every parameter the views read
(found in their source), so a new one is fuzzed without editing this file; a new URL
pattern needs a real value for any new path argument (World.args, in the `world`
fixture), and the sweep fails until it has one. Side effects that would leave the process
(running a stage, rendering a PDF, polling the lab over SSH) are stubbed; the views' own
handling of the input is not. Bounded: a sweep of a few hundred requests and two runs of
400 generated ones, each stopped at half of BUDGET_S, well under a minute.
"""

from __future__ import annotations

import datetime as dt
import importlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_from_bytes

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnostic.bookings.models import Lab, LabDay, book_lab_day
from diagnostic.controlchars import OWN_CHECKS
from diagnostic.jobs.models import DiagnosticJob, Finding
from diagnostic.portal.config_views import KEPT_INPUTS
from diagnostic.staff.apps import STAFF_GROUP
from reports.models import override_money_back
from tests.diagnostic.conftest import Cast, logged_in
from tests.diagnostic.portal.conftest import finished_job

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]
NAMESPACES = ("portal", "staff", "accounts")
ROLES = ("anonymous", "alice", "bob", "staff")
# The whole generated run stops asking after this long (each example then passes at once),
# so a slow shared machine makes the run shorter, not the suite longer.
BUDGET_S = 24.0


# -- the URLs ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Route:
    name: str
    pattern: URLPattern
    route: str  # the full route, "portal/bookings/<uuid:booking_id>/"

    @property
    def args(self) -> dict[str, Any]:
        return dict(self.pattern.pattern.converters)  # type: ignore[attr-defined]

    def view_checks(self) -> frozenset[str]:
        return frozenset(getattr(self.pattern.callback, OWN_CHECKS, frozenset()))


def routes() -> list[Route]:
    """Every URL pattern of the project outside the admin (Django's own), by name."""
    found: list[Route] = []

    def walk(patterns: list[Any], prefix: str, namespace: str) -> None:
        for item in patterns:
            route = prefix + str(item.pattern)
            if isinstance(item, URLResolver):
                if item.namespace == "admin":
                    continue
                walk(item.url_patterns, route, item.namespace or namespace)
            elif isinstance(item, URLPattern):
                name = f"{namespace}:{item.name}" if namespace else str(item.name or route)
                found.append(Route(name, item, route))

    walk(get_resolver().url_patterns, "", "")
    return found


ROUTES = routes()


def fill(route: Route, values: dict[str, str]) -> str:
    """The route's path with `values` (already percent-encoded) for its arguments."""
    path = route.route
    for name in route.args:
        path = re.sub(rf"<(?:\w+:)?{name}>", values[name], path)
    return "/" + path


# -- the parameters ----------------------------------------------------------------------------
def read_by(module: str) -> set[str]:
    """The parameters a view module reads (request.GET/POST.get("name"), and names read in a
    loop or a comprehension: `request.GET.get(k ...) for k in ("state", "lab", ...)`)."""
    source = Path(importlib.import_module(module).__file__ or "").read_text()
    names = set(re.findall(r'request\.(?:GET|POST)\.get\(\s*"([^"]+)"', source))
    loops = (r'for \w+ in \(([^)]*)\)[^\n]*request\.(?:GET|POST)',
             r'request\.(?:GET|POST)\.get\(\w+[^\n]*for \w+ in \(([^)]*)\)')
    for loop in loops:
        for group in re.findall(loop, source):
            names.update(re.findall(r'"([^"]+)"', group))
    for template in re.findall(r'render\(\s*request,\s*"([^"]+)"', source):  # the form fields it shows
        path = REPO / "templates" / template
        if path.exists():
            names.update(re.findall(r'name="([A-Za-z_][\w-]*)"', path.read_text()))
    return names - {"viewport"}


def parameter_names() -> list[str]:
    """Every form field a template names and every parameter a view reads."""
    names: set[str] = set(KEPT_INPUTS) | {"action", "csrfmiddlewaretoken", "yaml_file", "next"}
    for folder in ("portal", "staff", "accounts", "registration"):
        for template in (REPO / "templates" / folder).rglob("*.html"):
            names.update(re.findall(r'name="([A-Za-z_][\w-]*)"', template.read_text()))
    for module in {route.pattern.callback.__module__ for route in ROUTES}:
        names |= read_by(module)
    names.discard("viewport")  # a <meta> tag
    return sorted(names)


PARAMETERS = parameter_names()
# Per URL, the parameters its view's module reads (and the fields a view checks itself):
# the generated requests favour them, so that their values reach the views' queries.
READ = {route.name: sorted(read_by(route.pattern.callback.__module__) | route.view_checks()) or PARAMETERS
        for route in ROUTES}


def test_the_fuzz_knows_the_parameters_and_the_urls() -> None:
    for name in ("q", "state", "since", "format", "stage", "day", "title", "narrative", "reason", "eligible",
                 "version", "lab_day", "source", "command", "yaml_text", "model__id", "env", "token", "next"):
        assert name in PARAMETERS, name
    assert {"q", "state", "lab", "customer", "date", "format", "since"} <= set(READ["staff:jobs"])
    assert {"command", "yaml_text", "model__id", "source", "action"} <= set(READ["portal:booking-config"])
    assert {"lab_day"} <= set(READ["portal:book"])
    names = {route.name for route in ROUTES}
    assert {"portal:booking-config", "staff:stage-log", "staff:finding-edit", "accounts:login"} <= names
    assert len([n for n in names if n.startswith(("portal:", "staff:"))]) >= 26


# -- the world the requests are made in --------------------------------------------------------------
@dataclass
class World:
    clients: dict[str, Client]
    args: dict[str, list[str]]  # path argument -> real values
    real: dict[str, list[str]]  # parameter -> real values
    job: DiagnosticJob


@pytest.fixture
def world(cast: Cast, lab: Lab, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch) -> World:
    settings.OUT_DIR = tmp_path / "out"
    settings.OUT_DIR.mkdir()
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.AXES_ENABLED = False  # lockouts would only make later answers 403s
    # What would leave the request: a stage run in a thread, a PDF render, an SSH poll.
    monkeypatch.setattr("diagnostic.portal.config_views.start_job", lambda job: False)
    monkeypatch.setattr("diagnostic.staff.actions.start_job", lambda job: False)
    monkeypatch.setattr("diagnostic.staff.lab_views.poll_all_labs", lambda: [])
    from diagnostic.staff.tasks import render_report_version

    monkeypatch.setattr(render_report_version, "delay", lambda *a, **k: None)

    today = timezone.localdate()
    days = [LabDay.objects.create(lab=lab, date=today + dt.timedelta(days=n)) for n in range(5, 21)]
    reported = finished_job(book_lab_day(lab_day=days[3], customer=cast.alice), settings.OUT_DIR)
    open_booking = book_lab_day(lab_day=days[0], customer=cast.alice)
    book_lab_day(lab_day=days[1], customer=cast.bob)
    job = reported.job
    stage = job.stage_runs.get(name="reproduce")
    finding = Finding.objects.create(job=job, stage=stage, code="load.weights_io",
                                     title="Weights load slowly", evidence={"summary": "180 MB/s."},
                                     change={}, impact=None)
    staff = User.objects.create_user(username="consultant", is_staff=True)
    staff.groups.add(Group.objects.get(name=STAFF_GROUP))
    override = override_money_back(job_id=str(job.pk), eligible=True, by=staff,
                                   reason="Lab cooling failed for two hours mid-day.")
    clients = {**cast.clients, "staff": logged_in(staff)}
    args = {
        "booking_id": [str(open_booking.uuid), str(reported.booking.uuid)],
        "job_id": [str(job.pk)],
        "stage": ["preflight", "reproduce", "report"],
        "action": ["cancel", "retry", "resume", "move", "rerun-report"],
        "finding_id": [str(finding.pk)],
        "override_id": [str(override.pk)],
        "token": ["not-a-token"],
        "uidb64": ["MQ"],
        "version": [reported.version.version],
    }
    real = {
        "lab_day": [str(d.pk) for d in days[4:8]], "day": [str(days[9].pk), days[9].date.isoformat()],
        "source": ["yaml", "form", "command"], "action": ["preview", "confirm", "edit"],
        "stage": ["preflight", "reproduce", "report"], "version": [reported.version.version, "1"],
        "from": [reported.version.version], "to": [reported.version.version], "eligible": ["yes", "no"],
        "reason": ["The lab's cooling failed for two hours mid-day."], "format": ["json"],
        "since": ["0", "5"], "state": ["succeeded", "running", "held"], "replaces": [str(job.pk)],
        "q": ["acme"], "date": [today.isoformat()], "lab": [lab.name],
        "yaml_text": [(REPO / "examples" / "configs" / "kimi-k2-8spark-outofbox.yaml").read_text()],
        "command": ["vllm serve /models/kimi-k2 --tensor-parallel-size 8"], "next": ["/portal/"],
    }
    return World(clients=clients, args=args, real=real, job=job)


def real_path(route: Route, world: World, index: int = 0) -> str:
    missing = [name for name in route.args if name not in world.args]
    assert not missing, (f"{route.name}: give the fuzz a real value for path argument(s) {missing} "
                         "(World.args, in the world fixture)")
    return fill(route, {name: quote(world.args[name][index % len(world.args[name])], safe="")
                        for name in route.args})


def ask(client: Client, method: str, path: str, query: list[tuple[str, str]],
        form: list[tuple[str, str]] | None = None) -> Any:
    """One request: `query` as its query string, `form` as an urlencoded body (POST); names
    and values already percent-encoded."""
    encoded = "&".join(f"{name}={value}" for name, value in query)
    url = f"{path}?{encoded}" if encoded else path
    if method == "GET":
        return client.get(url)
    body = "&".join(f"{name}={value}" for name, value in form or [])
    return client.generic("POST", url, body.encode("ascii"), content_type="application/x-www-form-urlencoded")


def no_500(response: Any, what: str) -> None:
    assert response.status_code < 500, f"{response.status_code} for {what}"


# -- the sweep: every URL, every role, a control character in every parameter --------------------
CONTROL_VALUES = ("%00", "a%00b", "%01", "%1B%5B2J", "%7F", "%C2%85", "x%0Ay")


def test_a_control_character_in_any_parameter_of_any_url_is_a_400_never_a_500(world: World) -> None:
    asked = 0
    for route in ROUTES:
        path = real_path(route, world)
        for index, role in enumerate(ROLES):
            client = world.clients[role]
            value = CONTROL_VALUES[(asked + index) % len(CONTROL_VALUES)]
            query = [(name, value) for name in PARAMETERS]
            response = ask(client, "GET", path, query)
            asked += 1
            no_500(response, f"GET {path} as {role}")
            assert response.status_code == 400, f"GET {path} as {role}: {response.status_code}"
            assert "query parameter" in response.content.decode()
            own = route.view_checks()
            form = [(name, value) for name in PARAMETERS]
            response = ask(client, "POST", path, [], form)
            asked += 1
            no_500(response, f"POST {path} as {role}")
            assert response.status_code == 400, f"POST {path} as {role}: {response.status_code}"
            # Only the fields the view checks itself: the view's own refusal (or its access rules).
            if own:
                response = ask(client, "POST", path, [], [(name, value) for name in sorted(own)])
                asked += 1
                no_500(response, f"POST {path} (its own fields) as {role}")
    assert asked >= len(ROUTES) * len(ROLES) * 2


# Values without a control character, each alone in a parameter: invalid UTF-8, a lone
# surrogate's bytes, a number no column holds, a long string, a date that is not one.
ODD_VALUES = ("%FF", "%ED%A0%80", "9" * 30, "-1", "A" * 5000, "2025-02-30", "%25", "..%2F..%2F")


def test_each_parameter_of_each_url_alone_is_never_a_500(world: World) -> None:
    """Every parameter a URL's view reads, one at a time, as the user the page is for: with a
    control character (a 400 at the door, or the view's own refusal for the fields it
    checks itself) and with odd values that are not control characters."""
    asked = 0
    for route in ROUTES:
        path = real_path(route, world)
        role = OWNER.get(route.name.partition(":")[0], "anonymous")
        client = world.clients[role]
        own = route.view_checks()
        for index, name in enumerate(READ[route.name]):
            for method in ("GET", "POST"):
                in_query = method == "GET"
                pair = [(name, "a%00b")]
                response = ask(client, method, path, pair if in_query else [], [] if in_query else pair)
                no_500(response, f"{method} {path} as {role} with {name}=a\\x00b")
                if in_query or name not in own:
                    assert response.status_code == 400, f"{method} {path} {name}: {response.status_code}"
                odd = [(name, ODD_VALUES[(index + asked) % len(ODD_VALUES)])]
                response = ask(client, method, path, odd if in_query else [], [] if in_query else odd)
                no_500(response, f"{method} {path} as {role} with {odd[0][0]}={odd[0][1][:20]}")
                asked += 2
    assert asked > 4 * len(ROUTES)


def test_a_control_character_or_invalid_utf8_in_a_path_argument_is_never_a_500(world: World) -> None:
    for route in ROUTES:
        for name, converter in route.args.items():
            if type(converter).__name__ != "StringConverter":
                continue
            for nasty in ("%00", "a%0Ab", "%FF", "%ED%A0%80", "x" * 3000):
                values = {n: quote(world.args[n][0], safe="") for n in route.args}
                path = fill(route, {**values, name: nasty})
                for role in ("anonymous", "alice", "staff"):
                    response = world.clients[role].get(path)
                    no_500(response, f"GET {path[:120]} as {role}")
                    if "%00" in nasty or "%0A" in nasty:
                        assert response.status_code == 400, path


# -- the generated requests -------------------------------------------------------------------------
def pct(raw: bytes) -> str:
    return quote_from_bytes(raw, safe="")


def utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate as the (invalid) bytes it would be


# Values without a control character reach the views: invalid UTF-8 (Django reads it as
# U+FFFD), any printable text, numbers too large for a column, very long strings.
PRINTABLE = st.characters(exclude_categories=("Cc", "Cs"))
CLEAN = st.one_of(
    st.sampled_from([b"\xff", b"\xfe\xff", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"%", b"&", b"=",
                     b"+", b"'\"<>", b"\\", b"\xe2\x80\xa8", b"\xef\xbb\xbf", b"../../etc/passwd", b"%00",
                     b"*", b"?"]),
    st.text(alphabet=PRINTABLE, max_size=40).map(lambda t: t.encode()),
    st.sampled_from([b"9" * 30, b"9" * 5000, b"-1", b"0", b"1e309", b"nan", b"-0", b"0x10", b"A" * 100_000,
                     b"\xff" * 20_000, "é".encode() * 30_000]),
)
# Values with one: NUL, the other C0 controls, DEL, C1, and an overlong NUL.
CONTROL = st.one_of(
    st.sampled_from([b"\x00", b"a\x00b", b"\r\n", b"\t", b"\x1b[2J", b"\x7f", b"\xc2\x85", b"\xc0\x80"]),
    st.binary(max_size=40),
    st.text(alphabet=st.characters(max_codepoint=0x9F), max_size=20).map(utf8),
)
# Who asks: each role, and more often the one the page is for (the owner of the portal's
# objects, staff on the dashboard), so that most requests reach the view's own code.
OWNER = {"portal": "alice", "staff": "staff", "accounts": "anonymous"}
# A value that surely holds a control character refused wherever it is put (a tab or a
# line break may stand in multi-line text; the sweep sends those to every parameter).
REFUSED_EVERYWHERE = [bytes([c]) for c in range(32) if chr(c) not in "\t\n\r"] + [b"\x7f", b"\xc2\x9b"]
CONTROL_SURE = st.tuples(
    st.binary(max_size=10),
    st.sampled_from([b"\x00"] * len(REFUSED_EVERYWHERE) + REFUSED_EVERYWHERE),  # NUL half the time
    st.binary(max_size=10),
).map(lambda parts: b"".join(parts))


@dataclass(frozen=True)
class Request:
    route: Route
    role: str
    method: str
    path: str
    query: list[tuple[str, str]]
    form: list[tuple[str, str]]
    control: tuple[str, str] | None  # (query or form, the parameter) holding a control character

    def send(self, world: World) -> Any:
        return ask(world.clients[self.role], self.method, self.path, self.query, self.form)

    def __str__(self) -> str:
        shown = [(n[:40], v[:40]) for n, v in self.query + self.form]
        return f"{self.method} {self.path} as {self.role} with {shown}"


@dataclass
class Draw:
    """One example's material: a seeded random generator for the requests' shapes (URL,
    role, names) and pools of values drawn by Hypothesis. The shapes are not Hypothesis'
    own choices, which favour the first of each list; the values are, so they shrink."""

    rnd: Any
    clean: list[bytes]
    controls: list[bytes]
    sure: list[bytes]

    def request(self, route: Route, world: World, *, control: bool = False) -> Request:
        """A request to `route` as any role (more often the one the page is for), with up to
        eight parameters (more often those its view reads): real values, clean values, now
        and then a control character. With `control`, one parameter (in the query string
        or the form) surely holds one: Request.control says which."""
        rnd = self.rnd
        owner = OWNER.get(route.name.partition(":")[0], "anonymous")
        role = rnd.choice([*ROLES, owner, owner, owner])
        method = rnd.choice(["GET", "POST"])

        def any_name() -> str:
            return str(rnd.choice(READ[route.name] if rnd.random() < 0.75 else PARAMETERS))

        pairs = []
        for _ in range(rnd.randint(0, 8)):
            name = any_name()
            real = world.real.get(name)
            if real and rnd.random() < 0.5:
                value = pct(utf8(rnd.choice(real)))
            else:  # mostly clean, so that most requests reach the views' own code
                value = pct(rnd.choice(self.controls if rnd.random() < 0.125 else self.clean))
            key = pct(utf8(name)) if rnd.random() < 0.9 else pct(rnd.choice(self.clean)) or "x"
            pairs.append((key, value))
        split = len(pairs) if method == "GET" else rnd.randint(0, len(pairs))
        query, form = pairs[:split], pairs[split:]
        planted = None
        if control:
            name = any_name()
            where = "query" if method == "GET" else rnd.choice(["query", "form"])
            planted = (where, name)
            target = query if where == "query" else form
            target.insert(rnd.randint(0, len(target)), (name, pct(rnd.choice(self.sure))))
        return Request(route, role, method, real_path(route, world, rnd.randint(0, 4)), query, form, planted)


DRAWS = st.builds(
    Draw,
    rnd=st.randoms(use_true_random=True),
    clean=st.lists(CLEAN, min_size=4, max_size=12),
    controls=st.lists(CONTROL, min_size=2, max_size=6),
    sure=st.lists(CONTROL_SURE, min_size=2, max_size=6),
)


@pytest.fixture
def clock() -> Iterator[list[float]]:
    """The end of the generated run's time: each test's examples share it."""
    yield [time.monotonic() + BUDGET_S / 2]


# Each example asks every URL once: 25 examples are some 1,700 requests per test.
FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@FUZZ
@given(draw=DRAWS)
def test_no_page_answers_500_to_the_fuzz(world: World, clock: list[float], draw: Draw) -> None:
    for route in ROUTES:
        if time.monotonic() > clock[0]:
            return  # the time budget is spent: the requests asked so far stand
        for _ in range(2):
            request = draw.request(route, world)
            no_500(request.send(world), str(request))


@FUZZ
@given(draw=DRAWS)
def test_a_control_character_anywhere_is_refused_and_never_a_500(
    world: World, clock: list[float], draw: Draw
) -> None:
    for route in ROUTES:
        if time.monotonic() > clock[0]:
            return
        request = draw.request(route, world, control=True)
        response = request.send(world)
        no_500(response, str(request))
        assert request.control is not None
        where, name = request.control
        if where == "query" or name not in route.view_checks():
            # Refused at the door, whoever asks (the view never runs), naming a parameter.
            assert response.status_code == 400, f"{response.status_code} for {request}"
            assert "holds a control character" in response.content.decode()
