"""Hypothesis strategies for environments the lab permits (lab/env_policy.yaml): each
variable a configuration may set for an engine version, with values that meet its rule."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from lab.env_policy import permitted

_DEVICE = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
_SECRET = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=24)


def values(rule: dict[str, Any]) -> st.SearchStrategy[str]:
    """Values that meet `rule`, as strings."""
    kind = rule["rule"]
    if kind == "interface":
        item = _DEVICE.map(lambda d: d + ":1") if rule.get("ports") else _DEVICE
        return st.lists(item, min_size=1, max_size=3).map(",".join)
    if kind == "number":
        if rule["type"] == "int":
            return st.integers(rule["min"], rule["max"]).map(str)
        return st.floats(rule["min"], rule["max"]).map(lambda f: f"{f:.3f}").filter(
            lambda s: rule["min"] <= float(s) <= rule["max"])
    if kind == "choice":
        if rule.get("list"):
            return st.lists(st.sampled_from(rule["choices"]), min_size=1, max_size=3,
                            unique=True).map(",".join)
        return st.sampled_from(rule["choices"])
    if kind == "bool":
        return st.sampled_from(["0", "1"])
    assert kind == "secret", kind
    return _SECRET


@st.composite
def environments(draw: st.DrawFn, engine: str, version: str, max_size: int = 4) -> dict[str, str]:
    """An env a configuration for `engine` `version` may set."""
    allowed = permitted(engine, version)
    names = draw(st.lists(st.sampled_from(sorted(allowed)), max_size=max_size, unique=True))
    return {name: draw(values(allowed[name])) for name in names}
