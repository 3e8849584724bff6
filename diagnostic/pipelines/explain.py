"""Where the rest goes: the tuned configuration's measured step time split into its parts
(METHODOLOGY.md, "The gap to the lab's own best", "Explain what is left").

A customer told "16 % of what this hardware allows" asks where the other 84 % goes. The
answer has to add up to what was measured and must not claim more than the day's evidence
shows, so every part says whether it is measured or an estimate:

- the step time itself is measured: the delivered rate's mean, times the tokens a step
  emits (the engine's own acceptance counters) with speculative decoding;
- the weights' read is the bytes a token reads (the lab's catalog) over the
  tensor-parallel group's memory bandwidth. Preflight measures the bandwidth a streaming
  read reaches on every node (the agent's `mem-bw-probe`); with that figure the part is
  "catalog bytes at the measured bandwidth", marked measured: the bandwidth is this day's
  measurement, the bytes per token are the catalog's. The catalog's bytes are the
  model's average; the routed experts are not read evenly across the ranks, so the
  slowest rank reads more and waits longer, and that lands in the remainder. Without a
  measurement (a node without torch answers `unsupported`) the part falls back to the
  accelerator's specified peak from the hardware catalog, an estimate: the least time the
  read can take, with what the hardware loses below its peak in the remainder. Either
  way the part says both figures where it has them ("reached 205 GB/s of the 273
  specified"); the roofline (diagnostic.pipelines.roofline) stays on the specified peak,
  the physical bound;
- speculation's verify and draft cost is measured: the tuned step against the measured
  step of the same configuration without speculation (the speculative search's runs);
- communication and the engine's fixed per-step work are the measured remainder. The
  day's runs do not separate the two, so they are given together, with what the remainder
  would be per layer if it were all communication (an upper bound, not a split).

The parts sum to the measured step time by construction: the remainder is what is left.
Nothing here reads the simulator's truth; every input is a measurement of this day, the
lab's facts or its catalogs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from diagnostic.pipelines.catalogs import CatalogError, accelerator
from diagnostic.pipelines.roofline import gpu_names
from lab.catalog import ModelProfile

SCHEMA = "diagnostic.explain/1"
MEASURED = "measured"
ESTIMATE = "estimate"


def _bandwidth(facts: Mapping[str, Mapping[str, Any]]) -> tuple[float | None, str]:
    """The accelerator's memory bandwidth (GB/s) by the name the nodes report, and its source."""
    names = gpu_names(facts)
    if len(names) != 1:
        return None, ("the nodes report no accelerator" if not names
                      else f"the nodes report different accelerators: {', '.join(names)}")
    try:
        gpu = accelerator(names[0])
    except CatalogError as exc:
        return None, str(exc)
    return float(gpu["mem_bw_gbs"]), f"{gpu['name']}: {gpu.get('source') or 'the hardware catalog'}"


def measured_bandwidth(measured_bw: Mapping[str, Any] | None) -> tuple[float | None, str]:
    """The lab-wide measured bandwidth (GB/s) of preflight's `memory_bandwidth` entry, or
    None and why not."""
    if not isinstance(measured_bw, Mapping):
        return None, "preflight measured no memory bandwidth on this day"
    if measured_bw.get("unavailable"):
        return None, f"preflight could not measure the memory bandwidth: {measured_bw['unavailable']}"
    value = measured_bw.get("median_gbs")
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return None, "preflight's memory bandwidth holds no figure"
    return float(value), ""


def _probe_words(measured_bw: Mapping[str, Any]) -> str:
    """Where the measured figure comes from: the probe, its repeats and nodes."""
    nodes = measured_bw.get("nodes") if isinstance(measured_bw.get("nodes"), Mapping) else {}
    repeats = measured_bw.get("repeats")
    text = "preflight's mem-bw-probe"
    if nodes:
        text += (f", the median of {len(nodes)} node{'s' if len(nodes) != 1 else ''}' medians of "
                 f"{repeats} repeat{'s' if repeats != 1 else ''} each" if repeats else
                 f" on {len(nodes)} node{'s' if len(nodes) != 1 else ''}")
    return text


def explain_step(
    measured_tps: float,
    *,
    acceptance_len: float | None,
    k: int | None,
    profile: ModelProfile | None,
    nodes_facts: Mapping[str, Mapping[str, Any]],
    config: Mapping[str, Any],
    no_spec_tps: float | None = None,
    measured_bw: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Split one verify step of the configuration (ms, lab time) into its parts.

    `measured_tps`: the delivered mean rate; `acceptance_len`: tokens a step emits as the
    engine counted them (None without speculation); `k`: the draft length; `no_spec_tps`:
    the measured rate of the same configuration without speculation, which separates
    speculation's own cost; `measured_bw`: preflight's `memory_bandwidth` entry (its
    `median_gbs` is the lab-wide figure), None or `{unavailable}` to read the weights at the
    specified peak. Returns {schema, per_token_ms, step_ms, tokens_per_step, parts
    [{part, label, ms, share, kind, how, basis}], sum_ms, notes}; the parts sum to `step_ms`.
    """
    speculative = bool(config.get("speculative")) and bool(k)
    tokens = float(acceptance_len) if speculative and acceptance_len and acceptance_len > 1 else 1.0
    per_token_ms = 1000.0 / measured_tps
    step_ms = per_token_ms * tokens
    tp = int(config["parallel"]["tp"])
    layers = profile.layers if profile is not None else None
    notes: list[str] = []
    parts: list[dict[str, Any]] = []

    weights = _weights_part(profile, tp, nodes_facts, measured_bw, notes)
    weights_ms = weights["ms"] if weights else None
    if weights:
        parts.append(weights)
    base_ms = step_ms
    if speculative:
        if no_spec_tps:
            base_ms = 1000.0 / no_spec_tps
            parts.append({
                "part": "speculation", "label": f"Speculation: drafting {k} tokens and verifying them",
                "ms": step_ms - base_ms, "kind": MEASURED,
                "how": f"the measured step ({tokens:.2f} tokens each) less the measured step without "
                       f"speculation ({no_spec_tps:.1f} tok/s): the draft model's {k} passes and the wider "
                       "verify pass, together",
                "inputs": {"no_spec_tps": no_spec_tps, "k": k, "tokens_per_step": tokens},
            })
        else:
            notes.append("Speculation's cost is not separated: no rate of this configuration without "
                         "speculation was measured on this day.")
    rest_ms = base_ms - (weights_ms or 0.0)
    parts.insert(1 if weights_ms is not None else 0,
                 _rest_part(rest_ms, speculative=speculative, no_spec_tps=no_spec_tps,
                            weights_ms=weights_ms, layers=layers, tp=tp))
    if rest_ms < 0:
        notes.append("The weights' read exceeds the measured step: the catalog's bytes per token "
                     "or the bandwidth do not fit this lab.")
    for part in parts:
        part["ms"] = round(float(part["ms"]), 3)
        part["share"] = round(part["ms"] / step_ms, 4) if step_ms else None
    return {
        "schema": SCHEMA,
        "measured_tps": measured_tps,
        "per_token_ms": round(per_token_ms, 3),
        "step_ms": round(step_ms, 3),
        "tokens_per_step": round(tokens, 3),
        "tokens_per_step_kind": MEASURED if tokens > 1 else None,
        "k": k if speculative else None,
        "parts": parts,
        "sum_ms": round(sum(p["ms"] for p in parts), 3),
        "notes": notes,
    }


def _weights_part(
    profile: ModelProfile | None, tp: int, nodes_facts: Mapping[str, Mapping[str, Any]],
    measured_bw: Mapping[str, Any] | None, notes: list[str],
) -> dict[str, Any] | None:
    """The weights' read of one step: the catalog's bytes at the bandwidth measured on this
    lab, else at the specified peak, else none (saying why in `notes`)."""
    peak, peak_source = _bandwidth(nodes_facts)
    reached, why_not_measured = measured_bandwidth(measured_bw)
    per_token = profile.decode_bytes_per_token_gb if profile is not None else None
    gb = float(per_token) if per_token else None
    if gb and reached and measured_bw is not None:
        weights_ms = gb / (tp * reached) * 1000.0
        of_peak = f" of the {peak:g} specified" if peak else ""
        spread = ""
        low = measured_bw.get("min_gbs")
        if isinstance(low, int | float) and not isinstance(low, bool) and low < reached:
            spread = f", the slowest node {low:.0f} GB/s"
        part = {
            "part": "weights_read", "label": "Weights read for one step", "ms": weights_ms, "kind": MEASURED,
            "basis": "catalog bytes at the measured bandwidth",
            "how": f"{gb:g} GB of active weights per step (the lab's catalog) over {tp} accelerators at "
                   f"{reached:.0f} GB/s each, the bandwidth a streaming read reached on this lab "
                   f"({_probe_words(measured_bw)}{spread}): reached {reached:.0f} GB/s{of_peak}",
            "inputs": {"decode_bytes_per_token_gb": gb, "tp": tp, "mem_bw_gbs": reached,
                       "bandwidth_source": _probe_words(measured_bw), "bandwidth_kind": MEASURED,
                       "measured_gbs": reached, "measured_min_gbs": measured_bw.get("min_gbs"),
                       "probe_nodes": len(measured_bw.get("nodes") or {}),
                       "probe_repeats": measured_bw.get("repeats"), "probe_method": measured_bw.get("method"),
                       "peak_gbs": peak, "peak_source": peak_source if peak else None},
        }
        notes.append(
            "The weights' read is the catalog's bytes per token at the bandwidth measured on this lab: the "
            "bandwidth is measured, the bytes are the catalog's average. The routed experts are not read "
            "evenly across the ranks, so the slowest rank reads more than its share and the step waits "
            "for it; that time is in the remainder.")
        return part
    if gb and peak:
        weights_ms = gb / (tp * peak) * 1000.0
        part = {
            "part": "weights_read", "label": "Weights read for one step", "ms": weights_ms, "kind": ESTIMATE,
            "basis": "catalog bytes at the specified peak",
            "how": f"{gb:g} GB of active weights per step over {tp} accelerators at {peak:g} GB/s each, the "
                   "specified peak; the bandwidth reached was not measured, so this is the least the read "
                   "takes",
            "inputs": {"decode_bytes_per_token_gb": gb, "tp": tp, "mem_bw_gbs": peak,
                       "bandwidth_source": peak_source, "bandwidth_kind": ESTIMATE,
                       "peak_gbs": peak, "peak_source": peak_source},
        }
        notes.append(f"The weights' read is at the specified peak: {why_not_measured}.")
        return part
    notes.append("The weights' read is not estimated: "
                 + ("the lab's catalog gives no bytes read per token for this model" if not gb
                    else peak_source) + ".")
    return None


def _rest_part(
    rest_ms: float, *, speculative: bool, no_spec_tps: float | None, weights_ms: float | None,
    layers: int | None, tp: int,
) -> dict[str, Any]:
    """What the step spends beyond the weights' read: communication and fixed work."""
    rest: dict[str, Any] = {
        "part": "communication_and_overhead",
        "label": "Communication between the nodes and the engine's fixed work per step",
        "ms": rest_ms, "kind": MEASURED,
        "how": ("the measured step without speculation" if speculative and no_spec_tps
                else "the measured step")
               + (" less the weights' read" if weights_ms is not None else "")
               + ": the collectives of every layer across the tensor-parallel group, kernel launches, "
                 "sampling and the scheduler; this day's runs do not separate them",
    }
    if speculative and not no_spec_tps:
        rest["label"] += ", with speculation's drafting and verifying"
    if layers and tp > 1:
        rest["per_layer_ms_at_most"] = rest_ms / layers
        rest["how"] += (f"; were it all communication, {rest_ms / layers * 1000:.0f} µs for each of the "
                        f"{layers} layers, an upper bound")
    return rest


def distance(tuned_tps: float | None, other_tps: float | None) -> dict[str, Any] | None:
    """How far the tuned rate is from another (the baseline's, the bound): the gap in tok/s
    and the tuned rate's share of the other. None when either is missing."""
    if tuned_tps is None or not other_tps:
        return None
    return {"tuned_tps": tuned_tps, "other_tps": other_tps, "gap_tps": round(other_tps - tuned_tps, 4),
            "share": round(tuned_tps / other_tps, 4)}
