"""FP4 canaries: prompts with answers checked by code, and the run that decides a pass rate.

The set lives in `canaries.yaml` (this package) and is versioned by the sha256 of that
file. Each canary's expected answer is computed from its inputs here, never stored:
arithmetic is evaluated, a string reversed, a letter counted, a passage compared with
itself; a code task's reply is run against its tests in `sandbox.run_tests`. Checkers are
strict: the answer alone, allowing only surrounding whitespace, a final full stop, quotes
or backticks around it, and thousands separators in numbers.

`run_suite` asks the first `base` canaries, then `extend_by` more at a time while the pass
rate's Wilson interval straddles a threshold, up to a cap, and records each round.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from diagnostic.pipelines.fp4 import sandbox
from diagnostic.pipelines.fp4.passrate import PassRate

SET_PATH = Path(__file__).with_name("canaries.yaml")
SET_SCHEMA = "diagnostic.fp4-canaries/1"
FAMILIES = ("arithmetic", "reversal", "counting", "copy", "code")
# Enough room for each family's answer and a little more, so a wrong-but-long answer is
# seen as wrong rather than cut into something that happens to match.
MAX_TOKENS = {"arithmetic": 24, "reversal": 48, "counting": 16, "copy": 192, "code": 320}
_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(?P<code>.*?)```", re.DOTALL | re.IGNORECASE)
_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}


class CanarySetError(ValueError):
    """The canary file is malformed; the message names the entry."""


@dataclass(frozen=True)
class Canary:
    id: str
    family: str
    prompt: str
    inputs: dict[str, Any]

    @property
    def max_tokens(self) -> int:
        return MAX_TOKENS[self.family]

    @property
    def expected(self) -> str:
        """The answer as a person would read it (for code: what the tests require)."""
        i = self.inputs
        if self.family == "arithmetic":
            return str(_OPS[i["op"]](i["a"], i["b"]))
        if self.family == "reversal":
            return str(i["s"])[::-1]
        if self.family == "counting":
            return str(str(i["s"]).count(i["ch"]))
        if self.family == "copy":
            return str(i["passage"])
        return f"{i['signature']} passing its {len(i['tests'])} tests"


@dataclass(frozen=True)
class CanarySet:
    name: str
    sha256: str
    base: int
    extend_by: int
    canaries: tuple[Canary, ...]

    def __len__(self) -> int:
        return len(self.canaries)


def _render(template: str, **values: Any) -> str:
    return template.format(**values)


def _entries(family: str, items: Sequence[Any], template: str) -> list[Canary]:
    out = []
    for n, item in enumerate(items, 1):
        cid = f"{family}-{n:02d}"
        if family == "arithmetic":
            a, op, b = item
            if op not in _OPS or not isinstance(a, int) or not isinstance(b, int):
                raise CanarySetError(f"{cid}: expected [int, op, int], got {item!r}")
            inputs: dict[str, Any] = {"a": a, "op": op, "b": b}
        elif family == "reversal":
            s = str(item)
            if "'" in s or s != s.strip():
                raise CanarySetError(f"{cid}: the string may not hold quotes or outer spaces")
            inputs = {"s": s}
        elif family == "counting":
            ch, s = item
            if len(str(ch)) != 1 or "'" in str(s):
                raise CanarySetError(f"{cid}: expected [one letter, text without quotes]")
            inputs = {"ch": str(ch), "s": str(s)}
        elif family == "copy":
            inputs = {"passage": " ".join(str(item).split())}
        else:
            if not isinstance(item, dict) or not item.get("tests"):
                raise CanarySetError(f"{cid}: a code task needs name, signature, meaning and tests")
            inputs = {
                "name": item["name"],
                "signature": item["signature"],
                "meaning": " ".join(str(item["meaning"]).split()),
                "tests": list(item["tests"]),
            }
            cid = f"code-{item['name']}"
        out.append(Canary(cid, family, _render(template, **inputs), inputs))
    return out


@cache
def load_canaries(path: Path = SET_PATH) -> CanarySet:
    raw = path.read_bytes()
    data = yaml.safe_load(raw)
    if not isinstance(data, dict) or data.get("schema") != SET_SCHEMA:
        raise CanarySetError(f"{path.name}: schema must be {SET_SCHEMA}")
    templates = data["templates"]
    by_family = [
        _entries(family, data["families"].get(family) or [], str(templates[family])) for family in FAMILIES
    ]
    # Round-robin over the families, so every prefix of the run order covers all of them.
    ordered: list[Canary] = []
    for i in range(max(len(f) for f in by_family)):
        ordered.extend(f[i] for f in by_family if i < len(f))
    ids = [c.id for c in ordered]
    if len(set(ids)) != len(ids):
        raise CanarySetError("canary ids must be unique")
    base = int(data.get("base", 40))
    if base > len(ordered):
        raise CanarySetError(f"base {base} is more than the {len(ordered)} canaries in the set")
    return CanarySet(
        str(data.get("name", path.stem)),
        hashlib.sha256(raw).hexdigest(),
        base,
        int(data.get("extend_by", 20)),
        tuple(ordered),
    )


# -- checking ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    canary: Canary
    passed: bool
    got: str
    detail: str = ""
    sandbox: dict[str, Any] | None = None

    def as_dict(self, *, full: bool = False) -> dict[str, Any]:
        got = self.got if full or len(self.got) <= 400 else self.got[:400] + "…"
        out: dict[str, Any] = {
            "id": self.canary.id,
            "family": self.canary.family,
            "passed": self.passed,
            "prompt": self.canary.prompt,
            "expected": self.canary.expected,
            "got": got,
        }
        if self.detail:
            out["detail"] = self.detail
        if self.sandbox is not None:
            out["sandbox"] = self.sandbox
        return out


def _bare(reply: str) -> str:
    """The reply without surrounding whitespace, one final full stop, and one pair of quotes,
    backticks or bold marks around it."""
    text = reply.strip()
    for _ in range(2):
        for left, right in (("**", "**"), ("`", "`"), ('"', '"'), ("'", "'")):
            if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
                text = text[len(left) : len(text) - len(right)].strip()
        if text.endswith(".") and not text.endswith(".."):
            text = text[:-1].rstrip()
    return text


def _number(reply: str) -> str | None:
    text = _bare(reply)
    # Thousands separators between digit groups only: "12,345" and "12 345" read as 12345.
    if re.fullmatch(r"-?\d{1,3}(?:[, \u202f]\d{3})+", text):
        text = re.sub(r"[, \u202f]", "", text)
    return text if re.fullmatch(r"-?\d+", text) else None


def extract_code(reply: str) -> str:
    """The first fenced block of the reply, or the whole reply when it has no fence."""
    m = _FENCE.search(reply)
    return m.group("code") if m else reply


def check(
    canary: Canary, reply: str, *, run_code: Callable[..., sandbox.SandboxResult] | None = None
) -> Check:
    """Whether `reply` answers `canary`, by the family's own code."""
    family = canary.family
    if family in ("arithmetic", "counting"):
        got = _number(reply)
        ok = got is not None and int(got) == int(canary.expected)
        return Check(canary, ok, reply.strip(), "" if got is not None else "not a bare number")
    if family == "reversal":
        return Check(canary, _bare(reply) == canary.expected, reply.strip())
    if family == "copy":
        # Exact, except for whitespace at either end.
        return Check(canary, reply.strip() == canary.expected, reply.strip())
    result = (run_code or sandbox.run_tests)(extract_code(reply), list(canary.inputs["tests"]))
    return Check(canary, result.passed, reply.strip(), result.detail, result.as_dict())


# -- the run -----------------------------------------------------------------------------


@dataclass
class SuiteResult:
    checks: list[Check] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    cap: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> PassRate:
        return PassRate(sum(c.passed for c in self.checks), len(self.checks))

    @property
    def decided(self) -> bool:
        return not self.rate.undecided

    def examples(self, k: int = 6) -> list[dict[str, Any]]:
        """A few canaries for the report, one per family first, failures before passes."""
        chosen: list[Check] = []
        for passed in (False, True):
            for family in FAMILIES:
                pick = next(
                    (
                        c
                        for c in self.checks
                        if c.canary.family == family and c.passed == passed and c not in chosen
                    ),
                    None,
                )
                if pick is not None and len(chosen) < k:
                    chosen.append(pick)
        return [c.as_dict() for c in chosen]

    def as_dict(self) -> dict[str, Any]:
        by_family: dict[str, dict[str, int]] = {}
        for c in self.checks:
            f = by_family.setdefault(c.canary.family, {"passed": 0, "n": 0})
            f["n"] += 1
            f["passed"] += int(c.passed)
        return {
            **self.rate.as_dict(),
            "decided": self.decided,
            "cap": self.cap,
            "rounds": self.rounds,
            "by_family": by_family,
            "notes": self.notes,
            "failed": [c.canary.id for c in self.checks if not c.passed],
        }


def run_suite(
    ask: Callable[[Canary], str],
    canaries: CanarySet,
    *,
    cap: int | None = None,
    check_cancelled: Callable[[], None] = lambda: None,
    log: Callable[[str], None] = lambda _m: None,
    run_code: Callable[..., sandbox.SandboxResult] | None = None,
) -> SuiteResult:
    """Ask canaries in order (base first, then extensions) until the pass rate is decided
    or the cap is reached. `ask(canary)` returns the model's reply text."""
    cap = min(cap or len(canaries), len(canaries))
    out = SuiteResult(cap=cap)
    target = min(canaries.base, cap)
    with ThreadPoolExecutor(max_workers=2) as pool:
        while True:
            batch = canaries.canaries[len(out.checks) : target]
            replies = []
            for canary in batch:
                check_cancelled()
                replies.append((canary, ask(canary)))
            # Code checks are subprocesses; two at a time is what this kind of machine affords.
            out.checks.extend(pool.map(lambda cr: check(cr[0], cr[1], run_code=run_code), replies))
            rate = out.rate
            out.rounds.append(
                {
                    "n": rate.n,
                    "passed": rate.passed,
                    "ci95": [round(x, 4) for x in rate.ci95],
                    "straddles": rate.undecided,
                }
            )
            if not rate.undecided:
                break
            if len(out.checks) >= cap:
                out.notes.append(
                    f"at the cap of {cap} canaries the 95 % interval {_pct(rate.ci95)} still straddles "
                    f"{', '.join(_pct1(t) for t in rate.undecided)}; classified by the pass rate itself "
                    f"({rate.passed}/{rate.n})"
                )
                break
            target = min(cap, len(out.checks) + canaries.extend_by)
            msg = (
                f"{rate.passed}/{rate.n} canaries passed; the 95 % interval {_pct(rate.ci95)} straddles "
                f"{', '.join(_pct1(t) for t in rate.undecided)}, so {target - rate.n} more are run"
            )
            out.notes.append(msg)
            log(msg)
    return out


def _pct(interval: tuple[float, float]) -> str:
    return f"[{interval[0] * 100:.1f} %, {interval[1] * 100:.1f} %]"


def _pct1(x: float) -> str:
    return f"{x * 100:.0f} %"
