"""The owner and public id filled in by 0002 become required."""

import uuid

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = (("bookings", "0003_booking_status_words"),)

    operations = (
        migrations.AlterField(
            model_name="clusterconfiguration",
            name="organisation",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="configurations",
                to="bookings.organisation",
            ),
        ),
        migrations.AlterField(
            model_name="booking",
            name="uuid",
            field=models.UUIDField(default=uuid.uuid4, unique=True, editable=False),
        ),
    )
