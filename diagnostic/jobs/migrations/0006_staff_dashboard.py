"""The staff dashboard: finding edits, lab and node health, who may approve and refund."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('bookings', '0004_ownership_required'),
        ('jobs', '0005_day_budget'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='LabHealth',
            fields=[
                ('lab', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='health', serialize=False, to='bookings.lab')),
                ('checked_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('error', models.TextField(blank=True)),
                ('poll_seconds', models.FloatField(default=0.0)),
            ],
        ),
        migrations.AlterModelOptions(
            name='reportversion',
            options={'ordering': ('job', 'created_at', 'id'), 'permissions': (('approve_report', 'Can approve a report version and send it to the customer'), ('decide_refund', 'Can override the money-back decision'))},
        ),
        migrations.CreateModel(
            name='FindingEdit',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('field', models.CharField(choices=[('title', 'title'), ('narrative', 'narrative'), ('note', "consultant's note")], max_length=12)),
                ('before', models.TextField(blank=True)),
                ('after', models.TextField(blank=True)),
                ('edited_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('edited_by', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('finding', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='edits', to='jobs.finding')),
            ],
            options={
                'ordering': ('finding', 'edited_at', 'id'),
                'indexes': [models.Index(fields=['finding', 'field'], name='finding_edit_field_idx')],
            },
        ),
        migrations.CreateModel(
            name='NodeHealth',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('node', models.CharField(max_length=100)),
                ('role', models.CharField(blank=True, max_length=10)),
                ('reachable', models.BooleanField(default=False)),
                ('error', models.TextField(blank=True)),
                ('checked_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('last_seen_at', models.DateTimeField(blank=True, null=True)),
                ('engine_running', models.BooleanField(null=True)),
                ('engine_exit_code', models.IntegerField(blank=True, null=True)),
                ('spec_sha256', models.CharField(blank=True, max_length=64)),
                ('gpu_name', models.CharField(blank=True, max_length=200)),
                ('gpu_temperature_c', models.FloatField(blank=True, null=True)),
                ('gpu_memory_total_mib', models.PositiveIntegerField(blank=True, null=True)),
                ('mem_total_kib', models.PositiveBigIntegerField(blank=True, null=True)),
                ('mem_available_kib', models.PositiveBigIntegerField(blank=True, null=True)),
                ('disk_free_bytes', models.PositiveBigIntegerField(blank=True, null=True)),
                ('page_cache_kib', models.PositiveBigIntegerField(blank=True, null=True)),
                ('last_telemetry_lab_t', models.FloatField(blank=True, null=True)),
                ('last_telemetry_at', models.DateTimeField(blank=True, null=True)),
                ('lab', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='node_health', to='bookings.lab')),
            ],
            options={
                'ordering': ('lab', 'node'),
                'constraints': [models.UniqueConstraint(fields=('lab', 'node'), name='node_health_once_per_node')],
            },
        ),
    ]
