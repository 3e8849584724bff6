"""Diagnostic jobs: stage runs, findings and measurements, and the orchestration that
runs a job's stages on the lab through Celery."""
