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
# A broker that drops its connections (a Redis restart) must not stop the stage a worker
# is running: the stage's lease lives in the database, and the next step is published
# once the broker answers again (or the reaper enqueues it). Said outright because
# Celery's default is due to change.
app.conf.worker_cancel_long_running_tasks_on_connection_loss = False
app.autodiscover_tasks()
