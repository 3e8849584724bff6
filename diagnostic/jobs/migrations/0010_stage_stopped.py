"""A stage that stopped the job ends "stopped", no longer "succeeded" with the reason in its
result (diagnostic/lifecycle.py). Stored rows move to match, and so does each stored findings
document's list of stages (findings.schema.json gained the value); both move back on reversal."""

from typing import Any

from django.db import migrations, models

STOPPED_JOB = "stopped_job"  # the key the stopping stage's result carries its reason under


def _move(apps: Any, rows: Any, before: str, after: str) -> None:
    DiagnosticJob = apps.get_model("jobs", "DiagnosticJob")
    moved = list(rows.values_list("job_id", "name"))
    rows.update(status=after)
    names: dict[Any, set[str]] = {}
    for job_id, name in moved:
        names.setdefault(job_id, set()).add(name)
    for job in DiagnosticJob.objects.filter(pk__in=names):
        stages = ((job.findings or {}).get("job") or {}).get("stages") or []
        for entry in stages:
            if entry.get("name") in names[job.pk] and entry.get("status") == before:
                entry["status"] = after
        job.save(update_fields=["findings"])


def forwards(apps: Any, schema_editor: Any) -> None:
    StageRun = apps.get_model("jobs", "StageRun")
    _move(apps, StageRun.objects.filter(status="succeeded", result__has_key=STOPPED_JOB), "succeeded", "stopped")


def backwards(apps: Any, schema_editor: Any) -> None:
    StageRun = apps.get_model("jobs", "StageRun")
    _move(apps, StageRun.objects.filter(status="stopped"), "stopped", "succeeded")


class Migration(migrations.Migration):
    dependencies = [("jobs", "0009_node_engine_owner")]

    operations = [
        migrations.AlterField(
            model_name="stagerun",
            name="status",
            field=models.CharField(
                choices=[("pending", "pending"), ("running", "running"), ("succeeded", "succeeded"),
                         ("stopped", "stopped the job"), ("failed", "failed"),
                         ("quarantined", "quarantined"), ("cancelled", "cancelled")],
                default="pending", max_length=12,
            ),
        ),
        migrations.RunPython(forwards, backwards),
    ]
