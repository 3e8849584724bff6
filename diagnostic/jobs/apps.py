"""Django app registration for jobs; imports every installed app's `stages` module so
that pipeline stages register before a job is planned."""

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class JobsConfig(AppConfig):
    name = "diagnostic.jobs"
    label = "jobs"
    verbose_name = "Diagnostic jobs"

    def ready(self) -> None:
        autodiscover_modules("stages")
