"""The memory roofline of a configuration: how fast one stream could decode if every token
only had to read the model's active weights once at the hardware's peak bandwidth.

Batch-1 decode on these machines is bound by memory: a token reads the active weights
(`decode_bytes_per_token_gb`, from the profile of the model's entry in the lab's catalog:
its published sizes, lab.catalog) spread over the tensor-parallel group, each rank at its
accelerator's peak bandwidth (from the node facts' GPU name and the hardware catalog).
Pipeline stages run one after another for a single stream, so they add no bandwidth. With
speculative decoding a step emits the measured mean acceptance length, so the bound is
multiplied by it. A delivered rate is then "x % of what this hardware allows", which tells
a customer whether more tuning can pay.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from diagnostic.pipelines.catalogs import CatalogError, accelerator
from lab.catalog import Catalog, ModelProfile, reference_catalog

ROOFLINE_FORMULA = "bound = tp × mem_bw_gbs / decode_bytes_per_token_gb × mean_acceptance_length"


def gpu_names(facts: Mapping[str, Mapping[str, Any]], nodes: list[str] | None = None) -> list[str]:
    """The distinct accelerator names the nodes report (all nodes when `nodes` is None)."""
    names = []
    for node, data in facts.items():
        if nodes is not None and node not in nodes:
            continue
        for gpu in data.get("gpus") or []:
            if gpu.get("name"):
                names.append(str(gpu["name"]))
    return sorted(set(names))


def served_profile(config: Mapping[str, Any], catalog: Catalog) -> tuple[ModelProfile | None, str]:
    """The profile of the model `config` serves, from the lab's catalog, or None and why."""
    model = catalog.served(config)
    named = config["model"].get("path") or config["model"].get("id")
    if model is None:
        return None, (f"{named!r} is not a model this lab's catalog (version {catalog.version}) holds; "
                      f"it holds {catalog.describe()}")
    if model.profile is None or model.profile.decode_bytes_per_token_gb is None:
        return None, (f"the lab's catalog (version {catalog.version}) gives no decode_bytes_per_token_gb "
                      f"in the profile of {model.id}, so the weights a token reads are not known")
    return model.profile, ""


def roofline(
    config: Mapping[str, Any],
    facts: Mapping[str, Mapping[str, Any]],
    *,
    catalog: Catalog | None = None,
    mean_acceptance_length: float | None = None,
) -> dict[str, Any]:
    """The bound for `config` on the lab whose node facts are `facts` and whose catalog is
    `catalog` (the model's profile comes from its entry), with its inputs.

    `catalog`: the lab's (lab.inventory.Inventory.catalog); None only where no lab is named,
    which reads the reference lab's. `mean_acceptance_length`: tokens emitted per step as the
    engine measured it (its spec-decode counters), for a speculative configuration; None or 1
    for none. An input the catalogs do not know (a model without a profile, an accelerator
    the hardware catalog does not list) leaves the bound out and says why, rather than
    guessing a figure.
    """
    tp = int(config["parallel"]["tp"])
    inputs: dict[str, Any] = {"tp": tp, "pp": int(config["parallel"]["pp"]), "model": config["model"]["id"]}
    lab_catalog = catalog if catalog is not None else reference_catalog()
    model, why = served_profile(config, lab_catalog)
    if model is None or model.decode_bytes_per_token_gb is None:
        return {"bound_tps": None, "inputs": inputs, "unavailable": why, "formula": ROOFLINE_FORMULA}
    names = gpu_names(facts)
    if len(names) != 1:
        why = ("the nodes report no accelerator" if not names
               else f"the nodes report different accelerators: {', '.join(names)}")
        return {"bound_tps": None, "inputs": inputs, "unavailable": why, "formula": ROOFLINE_FORMULA}
    try:
        gpu = accelerator(names[0])
    except CatalogError as exc:
        return {"bound_tps": None, "inputs": inputs, "unavailable": str(exc), "formula": ROOFLINE_FORMULA}
    bytes_per_token = float(model.decode_bytes_per_token_gb)
    bw = float(gpu["mem_bw_gbs"])
    spec = mean_acceptance_length
    acceptance = float(spec) if spec and spec > 1 else 1.0
    bound = tp * bw / bytes_per_token * acceptance
    inputs.update({
        "decode_bytes_per_token_gb": bytes_per_token,
        "model_source": model.source or f"the lab's catalog, version {lab_catalog.version}",
        "catalog_version": lab_catalog.version,
        "accelerator": gpu["name"],
        "mem_bw_gbs": bw,
        "accelerator_source": gpu.get("source"),
        "mean_acceptance_length": acceptance,
    })
    return {"bound_tps": round(bound, 3), "inputs": inputs, "formula": ROOFLINE_FORMULA}


def fraction_of_bound(delivered_tps: float | None, bound: Mapping[str, Any]) -> float | None:
    """Delivered over the bound (0..1), or None when either is missing."""
    limit = bound.get("bound_tps")
    if delivered_tps is None or not limit:
        return None
    return round(float(delivered_tps) / float(limit), 4)
