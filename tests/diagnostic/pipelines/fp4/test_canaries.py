"""The canary set (versioned, 40+ prompts, every family early) and its strict checkers."""

from __future__ import annotations

import hashlib
from pathlib import Path

from diagnostic.pipelines.fp4 import canaries as cn


def test_the_set_is_versioned_by_its_bytes_and_covers_every_family_in_the_base() -> None:
    s = cn.load_canaries()
    assert s.sha256 == hashlib.sha256(Path(cn.SET_PATH).read_bytes()).hexdigest()
    assert len(s) >= 80 and s.base >= 40
    assert {c.family for c in s.canaries[: s.base]} == set(cn.FAMILIES)
    assert len({c.prompt for c in s.canaries}) == len(s)


def test_expected_answers_are_computed_from_the_inputs() -> None:
    by_id = {c.id: c for c in cn.load_canaries().canaries}
    assert by_id["arithmetic-01"].expected == "8728"  # 4821 + 3907
    assert by_id["arithmetic-24"].expected == "-400"  # -25 * 16
    assert by_id["reversal-04"].expected == "ippississiM"
    assert by_id["counting-01"].expected == "4"  # s in Mississippi
    assert by_id["counting-20"].expected == "0"


def _canary(cid: str) -> cn.Canary:
    return next(c for c in cn.load_canaries().canaries if c.id == cid)


def test_number_checkers_are_strict() -> None:
    c = _canary("arithmetic-01")
    for ok in ("8728", " 8728.\n", "`8728`", "**8728**", "8,728"):
        assert cn.check(c, ok).passed, ok
    for wrong in ("8718", "The answer is 8728", "8728 or 8729", "", "87,28"):
        assert not cn.check(c, wrong).passed, wrong


def test_reversal_and_copy_are_exact() -> None:
    r = _canary("reversal-01")
    assert cn.check(r, "esuohthgil").passed and cn.check(r, "'esuohthgil'").passed
    assert not cn.check(r, "seuohthgil").passed and not cn.check(r, "Esuohthgil").passed
    c = _canary("copy-01")
    assert cn.check(c, c.expected + "\n").passed
    assert not cn.check(c, c.expected.replace("keeper climbed", "climbed keeper")).passed
    assert not cn.check(c, "Sure! " + c.expected).passed


def test_code_is_run_against_its_tests() -> None:
    c = _canary("code-gcd")
    good = "```python\ndef gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n```"
    bad = "```python\ndef gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return b\n```"
    assert cn.check(c, good).passed
    got = cn.check(c, bad)
    assert not got.passed and got.sandbox and got.sandbox["outcome"] == "failed"
    assert not cn.check(c, "Here is a function that computes it.").passed


def test_examples_put_failures_first_one_per_family() -> None:
    s = cn.load_canaries()
    suite = cn.run_suite(lambda c: c.expected if c.family != "copy" else "no", s)
    ex = suite.examples()
    assert ex[0]["family"] == "copy" and not ex[0]["passed"]
    assert {e["family"] for e in ex} >= {"copy", "arithmetic"}
    assert all({"prompt", "expected", "got"} <= set(e) for e in ex)
