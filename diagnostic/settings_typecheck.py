"""The settings mypy's Django plugin loads: diagnostic.settings as a development process
(DEBUG=1) sees it.

The plugin imports the settings to learn the apps and models, and diagnostic.settings
refuses to start with DEBUG off and no real SECRET_KEY; type checking needs neither a
deployment's key nor its environment.
"""

from __future__ import annotations

import os

os.environ.setdefault("DEBUG", "1")

from diagnostic.settings import *  # noqa: F403
