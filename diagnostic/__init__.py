"""The Django project package: settings, URLs and the Celery app."""
