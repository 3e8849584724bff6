"""Money-back decisions and report emails link to the platform's job (REPORTS_JOB_MODEL),
and so to its organisation; the link is filled from each existing row's `job_id` where
the platform holds that job. A row naming no job the platform holds keeps only its id."""

import uuid

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def link_existing_rows(apps, schema_editor):  # type: ignore[no-untyped-def]
    Job = apps.get_model(settings.REPORTS_JOB_MODEL)
    for name in ("MoneyBackOverride", "ReportEmail"):
        model = apps.get_model("reports", name)
        ids = set(model.objects.filter(job_record__isnull=True).values_list("job_id", flat=True))
        keys = {}
        for job_id in ids:
            try:
                keys[job_id] = uuid.UUID(job_id)
            except (ValueError, TypeError, AttributeError):
                continue  # not a platform job's key: the row keeps only its id
        held = {str(pk) for pk in Job.objects.filter(pk__in=keys.values()).values_list("pk", flat=True)}
        for job_id, key in keys.items():
            if str(key) in held and str(key) == job_id:
                model.objects.filter(job_id=job_id, job_record__isnull=True).update(job_record=key)


class Migration(migrations.Migration):
    dependencies = (
        migrations.swappable_dependency(settings.REPORTS_JOB_MODEL),
        ("reports", "0002_override_reverts"),
    )

    operations = (
        migrations.AddField(
            model_name="moneybackoverride",
            name="job_record",
            field=models.ForeignKey(
                blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name="+",
                to=settings.REPORTS_JOB_MODEL,
                help_text="the platform's job this row is about (its organisation owns the row)",
            ),
        ),
        migrations.AddField(
            model_name="reportemail",
            name="job_record",
            field=models.ForeignKey(
                blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name="+",
                to=settings.REPORTS_JOB_MODEL,
                help_text="the platform's job this row is about (its organisation owns the row)",
            ),
        ),
        migrations.AlterField(
            model_name="reportemail",
            name="job_id",
            field=models.CharField(db_index=True, max_length=64),
        ),
        migrations.RunPython(link_existing_rows, migrations.RunPython.noop),
    )
