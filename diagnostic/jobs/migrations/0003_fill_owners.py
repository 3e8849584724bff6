"""Each existing job takes its configuration's organisation and booking (see 0002)."""

from django.db import migrations


def fill_owners(apps, schema_editor):  # type: ignore[no-untyped-def]
    Job = apps.get_model("jobs", "DiagnosticJob")
    for job in Job.objects.filter(organisation__isnull=True).select_related("config"):
        job.organisation_id = job.config.organisation_id
        job.booking_id = job.config.booking_id
        job.save(update_fields=["organisation", "booking"])


class Migration(migrations.Migration):
    dependencies = (("jobs", "0002_ownership"),)

    operations = (migrations.RunPython(fill_owners, migrations.RunPython.noop),)
