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
