"""The Celery application: diagnostic jobs run on workers fed by Redis.

Configuration lives in Django settings under the CELERY_ prefix (see settings.py); with
no CELERY_BROKER_URL the app runs tasks eagerly in the calling process.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "diagnostic.settings")

app = Celery("diagnostic")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
