"""Booking states in the words the portal shows customers (values unchanged)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = (("bookings", "0002_ownership"),)

    operations = (
        migrations.AlterField(
            model_name="booking",
            name="status",
            field=models.CharField(
                choices=[
                    ("requested", "booked"),
                    ("confirmed", "configuration received"),
                    ("completed", "completed"),
                    ("cancelled", "cancelled"),
                ],
                default="requested",
                max_length=12,
            ),
        ),
    )
