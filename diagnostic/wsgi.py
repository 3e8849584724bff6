"""The WSGI entry point for gunicorn (`gunicorn diagnostic.wsgi`) and runserver.

The settings refuse to load with DEBUG off and no real SECRET_KEY. A process that loaded
them without one (a manage.py command that serves no web page) is refused here too: the
web app signs sessions and tokens with the key.
"""

from __future__ import annotations

import os

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.wsgi import get_wsgi_application

from diagnostic.envconfig import secret_key_message

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "diagnostic.settings")

if settings.SECRET_KEY_PROBLEM:
    raise ImproperlyConfigured(secret_key_message(settings.SECRET_KEY_PROBLEM))

application = get_wsgi_application()
