"""When a job was handed to the workers. Jobs for a booking now wait for their lab day;
before this, every job was published at its creation, so each existing job counts as
released then, except a queued one whose lab day is still ahead: that one waits, and the
lab-day start releases it on the day."""

from django.db import migrations, models
from django.utils import timezone


def fill_released_at(apps, schema_editor):  # type: ignore[no-untyped-def]
    Job = apps.get_model("jobs", "DiagnosticJob")
    today = timezone.localdate()
    waiting = Job.objects.filter(status="queued", booking__lab_day__date__gt=today)
    Job.objects.exclude(pk__in=waiting.values("pk")).update(released_at=models.F("created_at"))


class Migration(migrations.Migration):
    dependencies = (("jobs", "0006_staff_dashboard"), ("bookings", "0004_ownership_required"))

    operations = (
        migrations.AddField(
            model_name="diagnosticjob",
            name="released_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(fill_released_at, migrations.RunPython.noop),
    )
