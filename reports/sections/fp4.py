"""Section 3.2, FP4 correctness, from `findings.fp4`: what the FP4 check found with the
customer's kernels and with the chosen ones, every backend through the checks, the speed
cost of correct output against noise, and canary prompts answered side by side.

The verdicts `verdict` and `verdict_after` (garbage|degraded|correct) are the FP4
pipeline's decisions and print as it wrote them; without `verdict_after` the section
gives the canary pass rate it measured and no verdict. Also read: `canary_ci95`
{before, after}, `canaries_after`; `backends[]`: {backend, dispatch, canary_pass_rate,
perplexity, probe_max_rel_error, decode_tps_code, verdict}; `notes[]` (the winner against
the next correct backend, tested); `speed_cost` {workload: {before_tps, after_tps,
diff_tps, diff_ci95, diff_pct, p, significant}}; `examples` {before|after: [{id, prompt,
expected, got, passed, detail}]}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reports import figures as fig
from reports.structure import NOT_RUN, Block, StageSection, as_interval, as_number, p_value, present


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
        text += _canary_interval(fp4, "before")
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
                after_total = fp4.get("canaries_after") or fp4.get("canaries")
                of = f" of {after_total}" if after_total else ""
                text += f" ({fig.percent(rates['after'])}{of} canaries{_canary_interval(fp4, 'after')})"
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
        notes = [str(n) for n in fp4.get("notes") or [] if n]
        if notes:
            # The pipeline's own comparison of the winner with the next correct backend, tested.
            blocks.extend(Block("paragraph", n + ("" if n.endswith(".") else ".")) for n in notes)
        elif chosen and as_number(chosen.get("decode_tps_code")) is not None:
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
    blocks.extend(speed_cost_blocks(fp4))
    blocks.extend(example_blocks(fp4))
    return StageSection("fp4", number, title, True, blocks)


def _canary_interval(fp4: Mapping[str, Any], side: str) -> str:
    """`, 95 % interval 0–8.8 %` for a pass rate the pipeline gave an interval (`canary_ci95`)."""
    ci = as_interval((fp4.get("canary_ci95") or {}).get(side))
    if ci is None:
        return ""
    return f", 95 % interval {fig.percent(ci[0]).removesuffix(' %')}{fig.DASH}{fig.percent(ci[1])}"


def speed_cost_blocks(fp4: Mapping[str, Any]) -> list[Block]:
    """What correct output costs in speed, per workload, with the pipeline's test of it
    (`speed_cost`: {workload: {before_tps, after_tps, diff_tps, diff_ci95, diff_pct, p, significant}})."""
    cost = fp4.get("speed_cost")
    if not isinstance(cost, Mapping) or not cost:
        return []
    rows = []
    for workload, c in cost.items():
        if not isinstance(c, Mapping) or as_number(c.get("diff_tps")) is None:
            continue
        ci = as_interval(c.get("diff_ci95"))
        p = as_number(c.get("p"))
        pct = as_number(c.get("diff_pct"))
        significant = c.get("significant")
        verdict = (
            "not tested"
            if not isinstance(significant, bool)
            else ("a real difference" if significant else "within noise")
        )
        rows.append(
            [
                str(workload),
                fig.tps(float(c["before_tps"])) if as_number(c.get("before_tps")) is not None else "",
                fig.tps(float(c["after_tps"])) if as_number(c.get("after_tps")) is not None else "",
                fig.signed(float(c["diff_tps"]), fig.tps)
                + (f" ({fig.signed(pct, lambda v: f'{v:.1f} %')})" if pct is not None else ""),
                fig.signed_interval(ci, fig.tps) if ci else "",
                p_value(p) if p is not None else "",
                verdict,
            ]
        )
    if not rows:
        return []
    before, after = (
        fp4.get("backend_before") or "your kernel",
        fp4.get("backend_after") or "the correct kernel",
    )
    blocks = [
        Block("heading", "The speed cost of correct output"),
        Block(
            "table",
            caption=f"Decode rate with {before} and with {after} (tok/s), and the difference with its 95 % "
            "interval (Welch); a difference whose test does not reject equal speed is within noise.",
            columns=["Workload", str(before), str(after), "Difference", "95 % interval", "p", "Verdict"],
            numeric=[False, True, True, True, True, True, False],
            rows=rows,
        ),
    ]
    if all(isinstance(c, Mapping) and c.get("significant") is False for c in cost.values()):
        blocks.append(
            Block(
                "paragraph",
                f"On every workload {after} is as fast as {before} within noise: correct output costs "
                "no measurable speed.",
            )
        )
    return blocks


def _answer(example: Mapping[str, Any] | None) -> str:
    if not example:
        return ""
    mark = "\u2713 " if example.get("passed") else "\u2717 "
    got = str(example.get("got", ""))
    detail = example.get("detail")
    return mark + got + (f"\n({detail})" if detail and not example.get("passed") else "")


def example_blocks(fp4: Mapping[str, Any]) -> list[Block]:
    """Canary prompts with the expected answer and what the model said with each kernel
    (`examples`: {before|after: [{id, prompt, expected, got, passed, detail?}]})."""
    examples = fp4.get("examples")
    if not isinstance(examples, Mapping):
        return []
    before = {str(e.get("id")): e for e in examples.get("before") or [] if isinstance(e, Mapping)}
    after = {str(e.get("id")): e for e in examples.get("after") or [] if isinstance(e, Mapping)}
    ids = list(dict.fromkeys([*before, *after]))
    if not ids:
        return []
    rows = []
    for i in ids:
        first = before.get(i) or after.get(i) or {}
        rows.append(
            [
                str(first.get("prompt", "")),
                str(first.get("expected", "")),
                _answer(before.get(i)),
                _answer(after.get(i)),
            ]
        )
    b_name, a_name = (
        fp4.get("backend_before") or "your kernels",
        fp4.get("backend_after") or "with the change",
    )
    return [
        Block("heading", "What the model answered"),
        Block(
            "table",
            caption="Canary prompts, the answer each expects, and what the model answered with each kernel "
            "(\u2713 passed, \u2717 failed).",
            columns=["Prompt", "Expected", f"With {b_name}", f"With {a_name}"],
            rows=rows,
            wrap=True,
            compact=True,
        ),
    ]
