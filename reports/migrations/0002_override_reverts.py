"""A money-back decision can be reverted by a later row that names it."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('reports', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='moneybackoverride',
            name='reverts',
            field=models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='reverted_by', to='reports.moneybackoverride'),
        ),
    ]
