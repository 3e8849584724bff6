"""Django app registration for jobs; loads the stage adapters once the models are ready,
so that a broken adapter fails at start-up rather than at a job's first stage."""

from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "diagnostic.jobs"
    label = "jobs"
    verbose_name = "Diagnostic jobs"

    def ready(self) -> None:
        import diagnostic.checks  # noqa: F401 - registers the deployment checks
        from diagnostic.bookings.models import booking_cancelling
        from diagnostic.jobs.models import booking_cancelling_receiver
        from diagnostic.jobs.registry import load_adapters

        booking_cancelling.connect(booking_cancelling_receiver,
                                   dispatch_uid="diagnostic.jobs.booking_cancelling")
        load_adapters()
