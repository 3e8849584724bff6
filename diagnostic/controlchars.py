"""Control characters stop at the door: a request whose URL path, query string or form
names or values hold NUL or another control character is answered 400, with a plain
page naming the parameter and the character, before a view, a query or a log line sees
it. A NUL reaching PostgreSQL is a DataError (a 500), a newline reaching an argv or a log
splits it, an escape reaching a terminal or a page hides what follows.

Refused: the C0 controls (U+0000-U+001F), DEL and the C1 controls (U+007F-U+009F), and
the Unicode line and paragraph separators (U+2028, U+2029), which count as line breaks:
Python's str.splitlines, YAML and JavaScript all break lines there. Tab, newline, carriage
return and those two separators are refused too, except in the form fields that are
multi-line text (MULTILINE_FIELDS: a YAML file, a pasted command and its continuation
lines, the env box, staff narratives, notes and reasons) and in the admin's forms (Django
validates those itself, and its text areas take lines). The configuration layer checks
each value again (lab.config refuses control characters inside any single value), for
what does not come through a form: an uploaded file, the CLI, the admin.

A view that refuses control characters in some of its form fields itself, beside the
field and with the input kept (the portal's configuration page), names them with
`checks_control_characters`; the middleware leaves those fields to it, and still checks
the path, the query string and the view's other fields.

The path and the query string are looked at first, before the URL is resolved, so a path
that names no page is refused (400) as one that does (`/portal/%00/` is a 400, not a 404);
a form once the URL is resolved, so the admin is told apart.

Invalid UTF-8 in a query string or a form (%ff) is decoded by Django as U+FFFD and is
left to the views, which refuse it as any other wrong value.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

from lab.config import control_name

log = logging.getLogger(__name__)
View = TypeVar("View", bound=Callable[..., Any])
OWN_CHECKS = "control_characters_checked_by_view"


# Form fields whose value is multi-line text: tab, newline and carriage return pass there.
MULTILINE_FIELDS = frozenset({
    "command",    # portal: a pasted launch command with its continuation lines
    "yaml_text",  # portal: a diagnostic.config/1 file pasted in
    "env",        # portal: the structured form's NAME=value lines
    "narrative",  # staff: a finding's narrative
    "note",       # staff: a consultant's note on a finding
    "reason",     # staff: why a money-back decision was overridden or reverted
})
ANY_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# In multi-line text: every control but tab and the line breaks (newline, carriage return,
# the line and paragraph separators).
CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def checks_control_characters(*fields: str) -> Callable[[View], View]:
    """Mark a view as refusing control characters in these form fields itself (a message
    beside the field, the input kept): the middleware leaves them to it. Apply it
    outermost, so no other decorator hides the mark."""

    def mark(view: View) -> View:
        setattr(view, OWN_CHECKS, frozenset(fields))
        return view

    return mark


def _shown(text: str, limit: int = 60) -> str:
    """A parameter name for the page and the log: quoted, its control characters escaped."""
    quoted = repr(text)
    return quoted if len(quoted) <= limit else quoted[: limit - 1] + "…"


class Refusal:
    """Where a control character was found: the part of the request, the parameter, the
    character and its position in the value."""

    def __init__(self, where: str, name: str, char: str, position: int, *, multiline: bool) -> None:
        self.where, self.name, self.char, self.position = where, name, char, position
        self.multiline = multiline

    def message(self) -> str:
        if self.where == "path":
            subject = "The address (URL path)"
        elif self.where == "name":
            subject = f"A parameter name, {_shown(self.name)},"
        else:
            kind = "query parameter" if self.where == "query" else "form field"
            subject = f"The {kind} {_shown(self.name)}"
        accepted = (
            "Only printable text, with lines and tabs, is accepted there"
            if self.multiline
            else "Only printable text on one line is accepted there (no tab or newline either)"
        )
        return (
            f"{subject} holds a control character ({control_name(self.char)}) at character "
            f"{self.position + 1}. {accepted}: remove the character and send it again."
        )


def _first(pattern: re.Pattern[str], text: str) -> tuple[str, int] | None:
    found = pattern.search(text)
    return None if found is None else (found.group(), found.start())


def _scan(where: str, items: Iterable[tuple[str, list[Any]]], *, lines_in: Callable[[str], bool]
          ) -> Refusal | None:
    for name, values in items:
        hit = _first(ANY_CONTROL, name)
        if hit is not None:
            return Refusal("name", name, hit[0], hit[1], multiline=False)
        multiline = lines_in(name)
        pattern = CONTROL_BUT_LINES if multiline else ANY_CONTROL
        for value in values:
            if not isinstance(value, str):
                continue
            hit = _first(pattern, value)
            if hit is not None:
                return Refusal(where, name, hit[0], hit[1], multiline=multiline)
    return None


def find_in_address(request: HttpRequest) -> Refusal | None:
    """The first control character of the request's path or query string, or None."""
    hit = _first(ANY_CONTROL, request.path_info)
    if hit is not None:
        return Refusal("path", "", hit[0], hit[1], multiline=False)
    return _scan("query", request.GET.lists(), lines_in=lambda name: False)


def find_in_form(request: HttpRequest, *, admin: bool = False,
                 view_checks: frozenset[str] = frozenset()) -> Refusal | None:
    """The first control character of the request's form (names and values), or None.
    `admin`: tab and the line breaks pass in every form field. `view_checks`: form fields
    the view checks itself (their names are still looked at)."""
    if request.method not in ("POST", "PUT", "PATCH", "DELETE"):
        return None
    fields = ((name, [] if name in view_checks else values) for name, values in request.POST.lists())
    refusal = _scan("form", fields, lines_in=lambda name: admin or name in MULTILINE_FIELDS)
    if refusal is not None:
        return refusal
    return _scan("form", ((name, []) for name in request.FILES), lines_in=lambda name: False)


def refused(refusal: Refusal) -> HttpResponse:
    log.info("control character refused where=%s name=%s char=%s",
             refusal.where, _shown(refusal.name), control_name(refusal.char))
    body = f"Bad request\n\n{refusal.message()}\n"
    return HttpResponseBadRequest(body, content_type="text/plain; charset=utf-8")


class ControlCharacterMiddleware:
    """Answers 400 (plain text, naming the parameter) before the view when the request's
    path, query string or form holds a control character (see the module's docstring).
    The path and the query string are looked at as the request comes in, whether or not
    the URL names a page; the form in process_view, where the URL is resolved, so the
    admin is told apart."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refusal = find_in_address(request)
        if refusal is not None:
            return refused(refusal)
        return self.get_response(request)

    def process_view(self, request: HttpRequest, view: Any, args: Any, kwargs: Any) -> HttpResponse | None:
        match = request.resolver_match
        admin = match is not None and "admin" in match.app_names
        refusal = find_in_form(request, admin=admin, view_checks=getattr(view, OWN_CHECKS, frozenset()))
        return None if refusal is None else refused(refusal)
