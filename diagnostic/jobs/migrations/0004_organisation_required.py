"""The job's organisation, filled in by 0003, becomes required."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = (("jobs", "0003_fill_owners"), ("bookings", "0004_ownership_required"))

    operations = (
        migrations.AlterField(
            model_name="diagnosticjob",
            name="organisation",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="jobs", to="bookings.organisation"
            ),
        ),
    )
