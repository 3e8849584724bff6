"""Every job gets its configuration's organisation (and its configuration's booking, so
the two links agree); report versions carry the staff approval the portal waits for.
0003 fills it in and 0004 makes it required, each in its own transaction: PostgreSQL
will not alter or index a table in the transaction that just updated its foreign keys."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = (
        ("bookings", "0002_ownership"),
        ("jobs", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    )

    operations = (
        migrations.AddField(
            model_name="diagnosticjob",
            name="organisation",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="jobs",
                to="bookings.organisation",
            ),
        ),
        migrations.CreateModel(
            name="ReportVersion",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("digest", models.CharField(max_length=64)),
                ("pdf_path", models.CharField(max_length=500)),
                ("pages", models.PositiveIntegerField(default=0)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("approved_at", models.DateTimeField(blank=True, null=True)),
                (
                    "approved_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "job",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="report_versions",
                        to="jobs.diagnosticjob",
                    ),
                ),
            ],
            options={
                "ordering": ("job", "created_at", "id"),
                "constraints": [
                    models.UniqueConstraint(fields=("job", "digest"), name="report_version_once_per_digest"),
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(("approved_at__isnull", True), ("approved_by__isnull", True)),
                            ("approved_at__isnull", False),
                            _connector="OR",
                        ),
                        name="report_version_approver_only_when_approved",
                    ),
                ],
            },
        ),
    )
