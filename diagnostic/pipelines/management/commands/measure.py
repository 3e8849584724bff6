"""`manage.py measure`: the measurement protocol against any OpenAI-compatible server.

No lab: lab time is wall time. Writes DIR/measurement.json (the `measurement` section
of findings.json) and DIR/summary.txt (a one-page plain-text table). Without
--tokenizer the server's usage.completion_tokens stands in for delivered tokens, and
both files and the terminal say so in capitals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from diagnostic.pipelines.client import EndpointError
from diagnostic.pipelines.measure.protocol import MeasurementError, measure_endpoint
from diagnostic.pipelines.measure.summary import summary_text
from diagnostic.pipelines.tokens import TokenizerError
from diagnostic.pipelines.workloads import BUILT_IN, WorkloadError


class Command(BaseCommand):
    help = "Measure delivered tokens per second (single stream, n runs, 95 % intervals) at an endpoint."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--endpoint", required=True, help="base URL, e.g. http://127.0.0.1:8000")
        parser.add_argument("--model", help="model name; default: the first of /v1/models")
        parser.add_argument("--tokenizer", help="the model's tokenizer.json or tiktoken.model")
        parser.add_argument("--metrics-url", help="Prometheus /metrics URL of the server, for its claim")
        parser.add_argument("--n", type=int, default=15, help="measured runs per workload (default 15)")
        parser.add_argument("--warmup", type=int, default=2, help="discarded warm-up runs (default 2)")
        parser.add_argument("--max-tokens", type=int, default=512, help="tokens asked per run (default 512)")
        parser.add_argument(
            "--workloads", default=",".join(BUILT_IN), help=f"comma-separated, from {', '.join(BUILT_IN)}"
        )
        parser.add_argument(
            "--api",
            choices=["chat", "completions"],
            default="chat",
            help="/v1/chat/completions (default) or /v1/completions",
        )
        parser.add_argument(
            "--request-timeout", type=float, default=None, help="abandon a run after this many seconds"
        )
        parser.add_argument("--out", required=True, help="output directory")

    def handle(self, *args: Any, **options: Any) -> None:
        out = Path(options["out"])
        workloads = [w.strip() for w in str(options["workloads"]).split(",") if w.strip()]
        progress = None if options["verbosity"] < 2 else (lambda msg: self.stdout.write(msg))
        try:
            result = measure_endpoint(
                options["endpoint"],
                model=options["model"],
                tokenizer_path=options["tokenizer"],
                workloads=workloads,
                n=options["n"],
                warmup=options["warmup"],
                metrics_url=options["metrics_url"],
                max_tokens=options["max_tokens"],
                api=options["api"],
                request_timeout_s=options["request_timeout"],
                progress=progress,
            )
        except (EndpointError, MeasurementError, TokenizerError, WorkloadError) as exc:
            raise CommandError(str(exc)) from exc
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / "measurement.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
            summary = summary_text(result)
            (out / "summary.txt").write_text(summary, encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot write results to {out}: {exc.strerror or exc}") from exc
        for warning in result["warnings"]:
            self.stderr.write(f"WARNING: {warning}")
        self.stdout.write(summary)
        self.stdout.write(f"wrote {out / 'measurement.json'} and {out / 'summary.txt'}")
