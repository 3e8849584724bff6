#!/usr/bin/env python
"""Django's command-line entry point: migrate, runserver, diagnose, measure, invite.

A command that serves no web page signs nothing, so it runs without SECRET_KEY even with
DEBUG off (diagnostic.envconfig.run_without_secret_key); runserver, testserver and
`check --deploy` still need a real key. A setting a command needs and does not have, or
cannot use, ends it with one line on stderr naming the setting, and exit status 1; so
does a database whose tables were never created (`migrate` creates them). `--traceback`
shows the whole traceback instead.
"""

from __future__ import annotations

import os
import re
import sys

# Commands that serve the web app (and so sign its sessions) or judge its deployment.
WEB_COMMANDS = frozenset({"runserver", "testserver"})
HELP_FLAGS = frozenset({"-h", "--help"})
# SQLite's and PostgreSQL's words for a table that does not exist.
MISSING_TABLE = re.compile(r'no such table: (\S+)|relation "([^"]+)" does not exist')


def needs_secret_key(argv: list[str]) -> bool:
    """Whether the command in `argv` serves web pages or checks a deployment."""
    if len(argv) < 2 or HELP_FLAGS & set(argv[2:]):
        return False
    command, options = argv[1], argv[2:]
    return command in WEB_COMMANDS or (command == "check" and "--deploy" in options)


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "diagnostic.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line
    from django.db import DatabaseError, connection

    from diagnostic.envconfig import run_without_secret_key, secret_key_message

    command = argv[1] if len(argv) > 1 else "help"
    if not needs_secret_key(argv):
        run_without_secret_key(command)
    try:
        execute_from_command_line(argv)
    except ImproperlyConfigured as exc:
        if "--traceback" in argv:
            raise
        message = str(exc)
        problem = getattr(settings, "SECRET_KEY_PROBLEM", None) if settings.configured else None
        if problem and "SECRET_KEY" in message:
            # Django's own words for an empty key name no remedy.
            message = secret_key_message(problem, f"`manage.py {command}` signs with it")
        sys.stderr.write(f"manage.py {command}: {message}\n")
        return 1
    except DatabaseError as exc:
        missing = MISSING_TABLE.search(str(exc))
        if missing is None or "--traceback" in argv:
            raise
        sys.stderr.write(
            f"manage.py {command}: the database {connection.settings_dict['NAME']} has no table "
            f"{missing.group(1) or missing.group(2)}: create the tables with `python manage.py migrate`\n"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
