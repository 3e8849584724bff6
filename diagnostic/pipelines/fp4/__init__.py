"""FP4 correctness (METHODOLOGY.md "FP4 correctness"): catch fluent garbage from a
mis-dispatched NVFP4 kernel and pick the fastest backend that is correct.

`run_fp4(session, config, ...)` is the stage's entry point (pipeline.py). Its parts:
`dispatch` (the table of known backend outcomes, dispatch_table.yaml), `canaries` (prompts
checked by code, canaries.yaml) with `sandbox` (generated code run in a subprocess) and
`passrate` (Wilson intervals, the healthy / degraded / garbage classes), `likelihood`
(prompt perplexity of a reference passage), `probe` (one NVFP4 GEMM against a numpy
reference), `backends` (which backend runs, which the engine accepts, how a choice is
expressed) and `api` (the two requests the checks make).
"""

from diagnostic.pipelines.fp4.pipeline import FINDING, run_fp4

__all__ = ["FINDING", "run_fp4"]
