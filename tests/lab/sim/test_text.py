"""The simulated model's text: workloads, checkable families, nonsense, exact token counts."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest

from lab.sim.text import CODE_TASKS, Reply, TextModel, classify_prompt, encoded_corpora, recognize
from lab.sim.tokenizer import count_tokens, default_cache_dir, ensure_tokenizer, load_tokenizer

ARITHMETIC = "What is 123 + 456? Answer with the number only."
REVERSAL = "Reverse the string 'abcdef'. Answer with the reversed string only."
COUNTING = "How many times does the letter 'r' appear in 'strawberry'? Answer with the number only."
PASSAGE = "The lighthouse keeper counted ships, not days; the sea kept its own calendar."
COPY = f"Repeat exactly: {PASSAGE}"
CODE = "Write a Python function add(a, b) that returns the sum of a and b. Reply with code only."


@pytest.fixture(scope="module")
def model() -> TextModel:
    path = ensure_tokenizer(default_cache_dir())
    return TextModel(load_tokenizer(path), seed=7, model_vocab=163840, corpora=encoded_corpora(path))


def answer(model: TextModel, question: str, state: str = "ok", **kw: Any) -> tuple[str, Reply]:
    options: dict[str, Any] = {"max_tokens": 256, "ignore_eos": False, "error_rate": 0.0, **kw}
    reply = model.reply(question, workload=classify_prompt(question), backend_state=state, **options)
    return model.decode(reply.token_ids), reply


def run_code(source: str, name: str) -> Callable[..., Any]:
    body = source.removeprefix("```python\n").removesuffix("\n```")
    namespace: dict[str, Any] = {}
    exec(body, namespace)  # the simulated model's own catalogue, not outside input
    fn: Callable[..., Any] = namespace[name]
    return fn


# -- workload classification ------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt",
    [
        "Write a function that merges two sorted lists.",
        "Please REFACTOR this.",
        "Here:\n```\nx = 1\n```\nwhat does it print?",
        "Explain this Python behaviour.",
        "Is there a bug here?",
        "def foo(): pass -- explain",
    ],
)
def test_prompts_with_a_code_word_or_fence_are_code(prompt: str) -> None:
    assert classify_prompt(prompt) == "code"


@pytest.mark.parametrize(
    "prompt",
    [
        "Summarise the history of the lighthouse.",
        "A classic novel about functions of the state",  # only whole words count
        "Define the word 'debugging'.",
        "Tell me a story about the sea.",
    ],
)
def test_prompts_without_them_are_prose(prompt: str) -> None:
    assert classify_prompt(prompt) == "prose"


# -- checkable families -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        (ARITHMETIC, "579"),
        ("What is 17 * 23? Answer with the number only.", "391"),
        ("What is 1000 - 1? Answer with the number only.", "999"),
        (REVERSAL, "fedcba"),
        ('Reverse the string "hello world". Answer with the reversed string only.', "dlrow olleh"),
        (COUNTING, "3"),
        ("How many times does the letter 'z' appear in 'banana'?", "0"),
        (COPY, PASSAGE),
        ("Repeat exactly:\nline one\n  line two\n", "line one\n  line two"),
    ],
)
def test_healthy_model_answers_checkable_questions_and_stops(
    model: TextModel, question: str, expected: str
) -> None:
    text, reply = answer(model, question)
    assert text == expected
    assert reply.finish_reason == "stop"


@pytest.mark.parametrize("name", sorted(CODE_TASKS))
def test_healthy_code_answers_are_fenced_and_defined(model: TextModel, name: str) -> None:
    task = CODE_TASKS[name]
    text, reply = answer(model, f"Write a Python function {task.signature} that returns {task.meaning}.")
    assert reply.family == "code"
    assert text.startswith("```python\n") and text.endswith("\n```")
    assert callable(run_code(text, name))


CODE_CHECKS: dict[str, list[tuple[tuple[Any, ...], Any]]] = {
    "add": [((2, 3), 5), ((-1, 1), 0)],
    "multiply": [((4, 5), 20), ((0, 9), 0)],
    "factorial": [((0,), 1), ((5,), 120)],
    "fibonacci": [((0,), 0), ((1,), 1), ((10,), 55)],
    "is_palindrome": [(("racecar",), True), (("abca",), False)],
    "is_prime": [((1,), False), ((4,), False), ((13,), True)],
    "gcd": [((12, 18), 6), ((7, 0), 7)],
    "reverse_words": [(("a b  c",), "c b a")],
    "count_vowels": [(("Education",), 5)],
    "max_of": [(([-5, -2, -9],), -2), (([1, 3, 2],), 3)],
    "flatten": [(([[1, 2], [], [3]],), [1, 2, 3])],
    "fizzbuzz": [
        (
            (15,),
            [
                "1",
                "2",
                "Fizz",
                "4",
                "Buzz",
                "Fizz",
                "7",
                "8",
                "Fizz",
                "Buzz",
                "11",
                "Fizz",
                "13",
                "14",
                "FizzBuzz",
            ],
        )
    ],
    "celsius_to_fahrenheit": [((100,), 212), ((0,), 32)],
}


@pytest.mark.parametrize("name", sorted(CODE_TASKS))
def test_code_catalogue_is_right_when_healthy_and_wrong_when_broken(model: TextModel, name: str) -> None:
    assert set(CODE_CHECKS) == set(CODE_TASKS)
    question = f"Write a Python function {CODE_TASKS[name].signature}."
    good = run_code(answer(model, question)[0], name)
    bad = run_code(answer(model, question, "broken")[0], name)
    assert all(good(*args) == want for args, want in CODE_CHECKS[name])
    assert not all(bad(*args) == want for args, want in CODE_CHECKS[name])


def test_unknown_function_names_are_not_checkable(model: TextModel) -> None:
    assert recognize("Write a Python function frobnicate(x).", random.Random(0)) is None
    _, reply = answer(model, "Write a Python function frobnicate(x).", max_tokens=40)
    assert reply.family is None and len(reply.token_ids) == 40


@pytest.mark.parametrize("question", [ARITHMETIC, REVERSAL, COUNTING, COPY, CODE])
def test_broken_model_answers_plausibly_but_wrongly(model: TextModel, question: str) -> None:
    good, _ = answer(model, question)
    bad, reply = answer(model, question, "broken")
    assert bad != good
    assert reply.finish_reason == "stop" and not reply.correct
    if good.isdigit():
        assert bad.lstrip("-").isdigit()  # a number, just not the right one
    if question is REVERSAL:
        assert sorted(bad) == sorted(good)  # the same letters, in a wrong order
    if question is COPY:
        assert sorted(bad.split()) == sorted(good.split())


def test_degraded_model_is_wrong_on_about_error_rate_of_questions(model: TextModel) -> None:
    questions = [f"What is {a} + {a * 7}? Answer with the number only." for a in range(300)]
    wrong = [answer(model, q, "degraded", error_rate=0.3)[0] != str(a * 8) for a, q in enumerate(questions)]
    assert 0.2 < sum(wrong) / len(wrong) < 0.4
    # Deterministic per question: asking again gives the same verdict.
    again = [answer(model, q, "degraded", error_rate=0.3)[0] != str(a * 8) for a, q in enumerate(questions)]
    assert again == wrong


def test_ignore_eos_keeps_writing_after_the_answer(model: TextModel) -> None:
    text, reply = answer(model, ARITHMETIC, ignore_eos=True, max_tokens=50)
    assert len(reply.token_ids) == 50 and reply.finish_reason == "length"
    assert text.startswith("579\n")
    assert count_tokens(model.tokenizer, text) == 50


def test_answer_longer_than_max_tokens_is_cut(model: TextModel) -> None:
    text, reply = answer(model, COPY, max_tokens=3)
    assert len(reply.token_ids) == 3 and reply.finish_reason == "length"
    assert PASSAGE.startswith(text)


# -- free text --------------------------------------------------------------------------


def test_code_prompts_get_code_and_prose_prompts_get_prose(model: TextModel) -> None:
    code, _ = answer(model, "Implement a function that parses dates.", max_tokens=120, ignore_eos=True)
    prose, _ = answer(model, "Describe how the seasons change.", max_tokens=120, ignore_eos=True)
    assert any(marker in code for marker in ("def ", "class ", "return", "self", "    "))
    assert code.lstrip().startswith(("def ", "class "))
    assert prose[0].isupper() and " the " in prose
    assert not prose.lstrip().startswith(("def ", "class "))


def test_healthy_text_follows_the_topic_the_prompt_names(model: TextModel) -> None:
    text, _ = answer(model, "Explain how exceptions propagate.", max_tokens=200, ignore_eos=True)
    assert "exception" in text.lower()


def test_broken_text_is_fluent_but_unrelated(model: TextModel) -> None:
    healthy, _ = answer(model, "Explain how exceptions propagate.", max_tokens=200, ignore_eos=True)
    broken, _ = answer(model, "Explain how exceptions propagate.", "broken", max_tokens=200, ignore_eos=True)
    assert broken != healthy
    # Fluent: mostly words and ordinary punctuation, like any corpus text.
    assert sum(c.isalpha() or c.isspace() for c in broken) / len(broken) > 0.7


@pytest.mark.parametrize("state", ["ok", "broken"])
def test_generated_text_re_tokenizes_to_the_generated_count(model: TextModel, state: str) -> None:
    rng = random.Random(42)
    prompts = [
        "Write code for a queue.",
        "Tell me about the ocean.",
        ARITHMETIC,
        "Explain lambda expressions.",
        "Implement a parser class.",
    ]
    for i in range(120):
        n = rng.randint(1, 900)
        text, reply = answer(model, f"{rng.choice(prompts)} ({i})", state, max_tokens=n, ignore_eos=True)
        assert len(reply.token_ids) == n
        assert count_tokens(model.tokenizer, text) == n, (i, n, text[-60:])


def test_same_seed_and_prompt_give_the_same_reply(model: TextModel) -> None:
    other = TextModel(model.tokenizer, seed=8, model_vocab=163840, corpora=model.corpora)
    kw: dict[str, Any] = {
        "workload": "prose",
        "max_tokens": 64,
        "ignore_eos": True,
        "backend_state": "ok",
        "error_rate": 0.0,
    }
    first = model.reply("Tell me about rivers.", **kw)
    assert model.reply("Tell me about rivers.", **kw) == first
    assert other.reply("Tell me about rivers.", **kw) != first
    sampled = [model.reply("Tell me about rivers.", salt=salt, **kw) for salt in (1, 2)]
    assert sampled[0] != sampled[1]


# -- log-probabilities ------------------------------------------------------------------

REFERENCE = (
    "Exceptions are a means of breaking out of the normal flow of control of a code block in "
    "order to handle errors or other exceptional conditions."
)


def mean_logprob(model: TextModel, text: str, state: str, error_rate: float = 0.0) -> float:
    values = model.prompt_logprobs(model.encode(text), backend_state=state, error_rate=error_rate)
    assert values[0] is None
    rest = [v for v in values[1:] if v is not None]
    return sum(rest) / len(rest)


def test_healthy_prompt_logprobs_are_low_surprise_for_natural_text(model: TextModel) -> None:
    assert -2.0 <= mean_logprob(model, REFERENCE, "ok") <= -0.8


def test_broken_prompt_logprobs_are_near_uniform_over_the_vocabulary(model: TextModel) -> None:
    assert mean_logprob(model, REFERENCE, "broken") == pytest.approx(-math.log(163840), abs=0.2)


def test_degraded_prompt_perplexity_sits_between(model: TextModel) -> None:
    healthy = mean_logprob(model, REFERENCE, "ok")
    degraded = mean_logprob(model, REFERENCE, "degraded", 0.3)
    assert mean_logprob(model, REFERENCE, "broken") < degraded < healthy


def test_healthy_model_is_more_surprised_by_gibberish(model: TextModel) -> None:
    assert mean_logprob(model, "qx zvkj wpqa mmrt bbnz qqpl xk", "ok") < mean_logprob(model, REFERENCE, "ok")


def test_generated_tokens_are_confident_whatever_the_backend(model: TextModel) -> None:
    values = model.completion_logprobs(list(range(50)), salt="r1")
    assert all(-1.0 < v < 0 for v in values)
