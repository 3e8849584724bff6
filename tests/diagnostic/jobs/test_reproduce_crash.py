"""Whose an engine crash at start is (METHODOLOGY "Money back"): the reproduce stage starts
the same configuration a second time. The same crash again is the configuration's (a
finding, the job stops, the customer's side); a start that serves means the first crash
was not the configuration's and the day goes on; a different crash is a lab fault that
holds the day. An engine refusing its arguments is the configuration's at once."""

from __future__ import annotations

from typing import Any

import pytest

from diagnostic.jobs import reproduce
from diagnostic.jobs.faults import LabFault, classify
from diagnostic.jobs.stage_context import FindingDraft, StopJob
from lab.clock import LabClock
from lab.engines.base import argument_refusal
from lab.engines.logs import crash_family
from lab.session import LaunchFailed, LaunchResult

CONFIG: dict[str, Any] = {"engine": {"name": "vllm", "version": "0.29.0"}}
BOOM = "RuntimeError: CUDA error: an illegal memory access was encountered"


def crash(error: str = BOOM, node: str = "spark-03") -> LaunchFailed:
    return LaunchFailed(node, 1, f"Traceback (most recent call last):\n  ...\n{error}\n", error)


def served() -> LaunchResult:
    return LaunchResult(endpoint="http://head:8000", cold_start_s=300.0, started_at=0.0, ready_at=300.0,
                        specs=[], warm=False)


class Session:
    """The lab calls a second start makes, the launch answering from a script."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.clock = LabClock(1.0, 0.0)
        self.launches = 0

    def start_sampler(self, *args: Any, **kwargs: Any) -> None:
        pass

    def stop_sampler(self, *args: Any, **kwargs: Any) -> None:
        pass

    def telemetry(self, since: float = 0.0, nodes: Any = None) -> dict[str, Any]:
        return {}

    def specs_for(self, config: Any) -> list[dict[str, Any]]:
        return [{"node": "spark-01"}]

    def launch(self, config: Any, **kwargs: Any) -> LaunchResult:
        self.launches += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome  # type: ignore[no-any-return]


class Ctx:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.lines: list[str] = []
        self.findings: list[FindingDraft] = []

    def log(self, line: str) -> None:
        self.lines.append(line)

    def attach(self, title: str, text: str, **kwargs: Any) -> None:
        self.lines.append(title)

    def progress(self, percent: float, message: str) -> None:
        self.lines.append(message)

    def add_finding(self, code: str, title: str, *, evidence: dict[str, Any], change: dict[str, Any],
                    impact: Any = None, blocking: bool = False) -> None:
        self.findings.append(FindingDraft(code, title, evidence, change, impact, blocking))


def test_the_same_crash_twice_is_the_configurations_finding() -> None:
    ctx = Ctx(Session(crash()))
    with pytest.raises(StopJob) as stopped:
        reproduce._start_after_crash(ctx, CONFIG, crash())  # type: ignore[arg-type]
    assert stopped.value.side == "customer"
    [finding] = ctx.findings
    assert finding.code == "config.engine_crash" and finding.blocking
    assert [s["engine_error"] for s in finding.evidence["starts"]] == [BOOM, BOOM]
    assert ctx.session.launches == 1


def test_a_second_start_that_serves_goes_on_and_the_first_crash_is_noted() -> None:
    ctx = Ctx(Session(served()))
    launched, _, _ = reproduce._start_after_crash(ctx, CONFIG, crash())  # type: ignore[arg-type]
    assert launched.cold_start_s == 300.0
    assert ctx.findings == []
    assert any("did not repeat" in line for line in ctx.lines)


def test_a_different_crash_is_a_lab_fault_that_holds_the_day() -> None:
    ctx = Ctx(Session(crash("RuntimeError: NCCL error: unhandled system error", node="spark-06")))
    with pytest.raises(LabFault) as fault:
        reproduce._start_after_crash(ctx, CONFIG, crash())  # type: ignore[arg-type]
    assert fault.value.what == "engine_crash" and fault.value.nodes == ["spark-03", "spark-06"]
    assert classify(fault.value).holds_the_day
    assert ctx.findings == []


def test_the_same_crash_in_other_words_is_still_the_configurations() -> None:
    # The attack that held a day: an out-of-memory error naming another free figure on the
    # second start read as "a different crash", a lab fault, and the day went free.
    first = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has 1.37 GiB free."
    again = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has 0.91 GiB free."
    ctx = Ctx(Session(crash(again)))
    with pytest.raises(StopJob) as stopped:
        reproduce._start_after_crash(ctx, CONFIG, crash(first))  # type: ignore[arg-type]
    assert stopped.value.side == "customer"
    [finding] = ctx.findings
    assert [s["family"] for s in finding.evidence["starts"]] == ["out_of_memory", "out_of_memory"]


@pytest.mark.parametrize(("error", "exit_code", "family"), [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", 1, "out_of_memory"),
    ("ValueError: To serve at least one request with the models's max seq len (262144), (24.0 GiB KV "
     "cache is needed, which is larger than the available KV cache memory (3.18 GiB).", 1, "out_of_memory"),
    ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled system "
     "error, NCCL version 2.27.3", 1, "nccl"),
    ("torch.distributed.DistBackendError: NCCL error: remote process exited", 1, "nccl"),
    (BOOM, 1, "cuda"),
    ("ValueError: max_num_batched_tokens (4) must be greater than or equal to max_num_seqs (8).", 1,
     "python:ValueError"),
    ("ValueError: something else entirely", 1, "python:ValueError"),
    ("KeyError: 'model.layers.0'", 1, "python:KeyError"),
    (None, -9, "signal:SIGKILL"),
    (None, 137, "signal:SIGKILL"),
    (None, 3, "exit:3"),
])
def test_a_crash_is_classified_by_its_family(error: str | None, exit_code: int, family: str) -> None:
    assert crash_family(error, exit_code) == family


@pytest.mark.parametrize(("error", "code", "words"), [
    ("vllm serve: error: unrecognized arguments: --swap-space 4", 2,
     "unrecognized arguments: --swap-space 4"),
    ("api_server.py: error: argument --max-num-seqs: invalid int value: 'x'", 2,
     "argument --max-num-seqs: invalid int value: 'x'"),
    ("usage: vllm serve [model_tag] [options]\nvllm serve: error: argument --quantization: invalid choice: "
     "'bogus'", 2, "argument --quantization: invalid choice: 'bogus'"),
    ("vllm serve: error: unrecognized arguments: --foo", 1, None),  # not argparse's exit status
    (BOOM, 2, None),
    (None, 2, None),
])
def test_an_argument_refusal_is_told_by_argparse_words_and_exit_status(
    error: str | None, code: int, words: str | None
) -> None:
    assert argument_refusal(error, code) == words
    if words is not None:
        assert not reproduce._a_crash(LaunchFailed("spark-01", code, error or "", error), "vllm")
