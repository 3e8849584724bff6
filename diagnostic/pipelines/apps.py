"""Django app for the pipelines, so that `manage.py measure` is found."""

from django.apps import AppConfig


class PipelinesConfig(AppConfig):
    name = "diagnostic.pipelines"
    label = "pipelines"
    verbose_name = "Pipelines"
