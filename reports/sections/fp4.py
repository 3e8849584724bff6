"""Section 3.2, FP4 correctness, from `findings.fp4`: what the FP4 check found with the
customer's kernels and with the recommended ones, and every backend through the checks.

The verdicts `verdict` and `verdict_after` (garbage|degraded|correct) are the FP4
pipeline's decisions and print as it wrote them; without `verdict_after` the section
gives the canary pass rate it measured and no verdict. `backends[]` holds the checks per
backend: {backend, dispatch, canary_pass_rate, perplexity, probe_max_rel_error,
decode_tps_code, verdict}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reports import figures as fig
from reports.structure import NOT_RUN, Block, StageSection, as_number, present


def fp4_section(fp4: Any, number: str) -> StageSection:
    title = "FP4 correctness"
    if not present(fp4):
        return StageSection("fp4", number, title, False, [Block("paragraph", NOT_RUN)])
    blocks: list[Block] = []
    rates = fp4.get("canary_pass_rate") or {}
    text = f"With your configuration the FP4 check found the output {fp4.get('verdict', 'unchecked')}"
    if fp4.get("backend_before"):
        text += f"; the engine dispatched the {fp4['backend_before']} backend"
    if as_number(rates.get("before")) is not None:
        total = f" of {fp4['canaries']}" if fp4.get("canaries") else ""
        text += f", and {fig.percent(rates['before'])}{total} canary prompts were answered correctly"
    text += "."
    if fp4.get("backend_after"):
        # The verdict after the change is the FP4 pipeline's; without one, the pass rate alone.
        verdict_after = fp4.get("verdict_after")
        if not verdict_after and as_number(rates.get("after")) is not None:
            total = f" of {fp4['canaries']}" if fp4.get("canaries") else ""
            text += (
                f" With the {fp4['backend_after']} backend, {fig.percent(rates['after'])}{total} canary "
                "prompts were answered correctly"
            )
        else:
            text += f" With the {fp4['backend_after']} backend the output is {verdict_after or 'unchecked'}"
            if as_number(rates.get("after")) is not None:
                text += f" ({fig.percent(rates['after'])} of canaries)"
        text += "."
    blocks.append(Block("paragraph", text))
    backends = [b for b in fp4.get("backends") or [] if isinstance(b, Mapping)]
    if backends:
        rows = []
        for b in backends:
            rows.append(
                [
                    str(b.get("backend", "")),
                    str(b.get("dispatch", "")),
                    fig.percent(float(b["canary_pass_rate"]))
                    if as_number(b.get("canary_pass_rate")) is not None
                    else "",
                    fig.number(float(b["perplexity"])) if as_number(b.get("perplexity")) is not None else "",
                    fig.number(float(b["probe_max_rel_error"]))
                    if as_number(b.get("probe_max_rel_error")) is not None
                    else "",
                    fig.tps(float(b["decode_tps_code"]))
                    if as_number(b.get("decode_tps_code")) is not None
                    else "",
                    str(b.get("verdict", "")),
                ]
            )
        blocks.append(
            Block(
                "table",
                caption="Every backend through all four checks: dispatch table, canaries, prompt "
                "perplexity of a reference passage, and one NVFP4 GEMM against a reference "
                "dequantize-then-multiply.",
                columns=[
                    "Backend",
                    "Dispatch table",
                    "Canaries",
                    "Perplexity",
                    "Probe error",
                    "Code tok/s",
                    "Verdict",
                ],
                numeric=[False, False, True, True, True, True, False],
                rows=rows,
            )
        )
        chosen = next((b for b in backends if b.get("backend") == fp4.get("backend_after")), None)
        if chosen and as_number(chosen.get("decode_tps_code")) is not None:
            costs = []
            for b in backends:
                if (
                    b is chosen
                    or b.get("verdict") != "correct"
                    or as_number(b.get("decode_tps_code")) is None
                ):
                    continue
                loss = 1 - float(b["decode_tps_code"]) / float(chosen["decode_tps_code"])
                costs.append(
                    f"{b['backend']} would also be correct but {fig.percent(loss)} slower on code "
                    f"({fig.tps(float(b['decode_tps_code']))} tok/s)"
                )
            if costs:
                blocks.append(
                    Block(
                        "paragraph",
                        f"{fp4['backend_after']} is the fastest correct backend; " + "; ".join(costs) + ".",
                    )
                )
    return StageSection("fp4", number, title, True, blocks)
