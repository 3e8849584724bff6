"""The environment a test run's Django starts in: a development process (DEBUG=1), as
`make demo` is, unless the caller chose otherwise.

diagnostic.settings refuses to start with DEBUG off and no real SECRET_KEY, and
pytest-django imports it before any conftest.py is read, so this is loaded as a plugin
(`-p tests.environment` in pyproject's addopts), which pytest imports first. Processes the
tests start (workers, `manage.py`, the simulated lab) inherit the same environment; tests of
the production settings pass DEBUG=0 and a key to their own child process.
"""

from __future__ import annotations

import os

os.environ.setdefault("DEBUG", "1")

# Under pytest-xdist each worker has its own test database (pytest-django suffixes its name)
# and, here, its own Celery queue on the shared Redis: a worker process one test starts must
# never take a job another test process enqueued for a database it cannot see.
_xdist_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _xdist_worker:
    os.environ["DIAG_QUEUE"] = f"{os.environ.get('DIAG_QUEUE', 'diagnostic')}-{_xdist_worker}"
