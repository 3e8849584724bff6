"""Every configuration gets an owner: its booking's organisation, or the house
organisation for configurations submitted without a booking; every booking a public id.
Lab days can be closed. The columns become required in 0004: PostgreSQL refuses to alter
a table in the transaction that just updated its foreign keys."""

import uuid

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def fill_owners(apps, schema_editor):  # type: ignore[no-untyped-def]
    Organisation = apps.get_model("bookings", "Organisation")
    Configuration = apps.get_model("bookings", "ClusterConfiguration")
    for config in Configuration.objects.filter(organisation__isnull=True).select_related("booking"):
        if config.booking_id is not None:
            config.organisation_id = config.booking.organisation_id
        else:
            house, _ = Organisation.objects.get_or_create(name=settings.DIAG_HOUSE_ORGANISATION)
            config.organisation_id = house.pk
        config.save(update_fields=["organisation"])


def fill_uuids(apps, schema_editor):  # type: ignore[no-untyped-def]
    Booking = apps.get_model("bookings", "Booking")
    for booking in Booking.objects.filter(uuid__isnull=True):
        booking.uuid = uuid.uuid4()
        booking.save(update_fields=["uuid"])


class Migration(migrations.Migration):
    dependencies = (("bookings", "0001_initial"),)

    operations = (
        migrations.AddField(
            model_name="clusterconfiguration",
            name="organisation",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="configurations",
                to="bookings.organisation",
            ),
        ),
        migrations.RunPython(fill_owners, migrations.RunPython.noop),
        migrations.AddField(
            model_name="booking",
            name="uuid",
            field=models.UUIDField(null=True, editable=False),
        ),
        migrations.RunPython(fill_uuids, migrations.RunPython.noop),
        migrations.AddField(
            model_name="labday",
            name="closed",
            field=models.BooleanField(default=False),
        ),
    )
