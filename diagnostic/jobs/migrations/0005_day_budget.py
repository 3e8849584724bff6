"""A job's lab-day budget in lab seconds (null: the DIAG_DAY_BUDGET_LAB_S setting)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = (("jobs", "0004_organisation_required"),)

    operations = (
        migrations.AddField(
            model_name="diagnosticjob",
            name="budget_lab_s",
            field=models.FloatField(blank=True, null=True),
        ),
    )
