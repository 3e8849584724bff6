"""The diagnostic's pipelines: plain Python over a lab session or an endpoint, with no
Django and nothing of diagnostic.jobs (their stage adapters live in diagnostic.jobs.stages).

One subpackage per pipeline (`measure`, the delivered-throughput measurement of
METHODOLOGY.md, and in time `triage`, `fp4`, `specdec`); beside them what several
pipelines share: `client` (the streaming OpenAI-compatible client), `stats` (intervals,
outliers, Welch's test), `tokens` (re-tokenizing what was received) and `workloads` (the
versioned prompt sets). The app itself exists for `manage.py measure`.
"""
