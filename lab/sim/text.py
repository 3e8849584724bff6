"""What the simulated model says: LAB_MODEL.md section 7, as code.

A healthy model answers the checkable prompt families of the FP4 canary suite
correctly and otherwise writes code-like text (stdlib sources) for code prompts and
prose (`pydoc_data.topics`) for prose prompts. A broken FP4 backend writes fluent
nonsense: well-formed corpus text unrelated to the prompt, plausible wrong answers to
checkable prompts, and near-uniform prompt log-probabilities. A degraded backend is
wrong on a deterministic `error_rate` share of prompts. lab/sim/README.md documents
the families and their recognizers for the people writing canaries.

Everything is deterministic from (seed, prompt) and, for sampled requests, a salt.
Replies are token ids chosen so that re-tokenizing their decoded text gives the same
count, which is what clients measure.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import re
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from tokenizers import Tokenizer

from lab.sim.tokenizer import (
    SPECIAL_TOKENS,
    code_corpus,
    default_cache_dir,
    load_tokenizer,
    prose_corpus,
    recipe_key,
    token_bytes,
)

Workload = Literal["code", "prose"]
BackendState = Literal["ok", "broken", "degraded"]

# LAB_MODEL section 7: whole words, any case; plurals and other forms do not count.
_CODE_WORDS = re.compile(
    r"\b(?:code|function|implement|program|class|def|python|script|bug|refactor)\b",
    re.IGNORECASE,
)
_CODE_FENCE = "```"


def classify_prompt(prompt: str) -> Workload:
    """`code` when the prompt holds a code fence or one of section 7's words, else `prose`."""
    if _CODE_FENCE in prompt or _CODE_WORDS.search(prompt):
        return "code"
    return "prose"


def stable_int(*parts: object) -> int:
    """A 64-bit integer from the parts, the same on every machine and run."""
    digest = hashlib.sha256("\0".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def stable_unit(*parts: object) -> float:
    """A number in [0, 1) from the parts, the same on every machine and run."""
    return stable_int(*parts) / 2.0**64


# ---------------------------------------------------------------------------------------
# Checkable prompt families


@dataclass(frozen=True)
class CodeTask:
    signature: str
    meaning: str  # what the canary's tests may assume, for the README
    correct: str
    buggy: str  # plausible, runs, fails the tests


CODE_TASKS: dict[str, CodeTask] = {
    "add": CodeTask(
        "add(a, b)",
        "the sum a + b",
        "def add(a, b):\n    return a + b",
        "def add(a, b):\n    return a - b",
    ),
    "multiply": CodeTask(
        "multiply(a, b)",
        "the product a * b",
        "def multiply(a, b):\n    return a * b",
        "def multiply(a, b):\n    return a + b",
    ),
    "factorial": CodeTask(
        "factorial(n)",
        "n! for n >= 0, factorial(0) == 1",
        "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n"
        "        result *= i\n    return result",
        "def factorial(n):\n    result = 1\n    for i in range(2, n):\n"
        "        result *= i\n    return result",
    ),
    "fibonacci": CodeTask(
        "fibonacci(n)",
        "the n-th Fibonacci number, fibonacci(0) == 0, fibonacci(1) == 1",
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        "def fibonacci(n):\n    a, b = 1, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
    ),
    "is_palindrome": CodeTask(
        "is_palindrome(s)",
        "True when the string s reads the same reversed (exact characters)",
        "def is_palindrome(s):\n    return s == s[::-1]",
        "def is_palindrome(s):\n    half = len(s) // 2\n    return s[:half] == s[len(s) - half :]",
    ),
    "is_prime": CodeTask(
        "is_prime(n)",
        "True when the integer n is prime (False below 2)",
        "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n"
        "    while i * i <= n:\n        if n % i == 0:\n            return False\n"
        "        i += 1\n    return True",
        "def is_prime(n):\n    for i in range(2, n // 2):\n        if n % i == 0:\n"
        "            return False\n    return True",
    ),
    "gcd": CodeTask(
        "gcd(a, b)",
        "the greatest common divisor of non-negative integers a and b",
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a",
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return b",
    ),
    "reverse_words": CodeTask(
        "reverse_words(s)",
        "the words of s (split on whitespace) in reverse order, joined by single spaces",
        'def reverse_words(s):\n    return " ".join(reversed(s.split()))',
        "def reverse_words(s):\n    return s[::-1]",
    ),
    "count_vowels": CodeTask(
        "count_vowels(s)",
        "how many characters of s are vowels a, e, i, o, u in either case",
        'def count_vowels(s):\n    return sum(1 for c in s if c in "aeiouAEIOU")',
        'def count_vowels(s):\n    return sum(1 for c in s if c in "aeiou")',
    ),
    "max_of": CodeTask(
        "max_of(xs)",
        "the largest number of the non-empty list xs",
        "def max_of(xs):\n    best = xs[0]\n    for x in xs[1:]:\n        if x > best:\n"
        "            best = x\n    return best",
        "def max_of(xs):\n    best = 0\n    for x in xs:\n        if x > best:\n"
        "            best = x\n    return best",
    ),
    "flatten": CodeTask(
        "flatten(xss)",
        "one list of the items of the lists in xss, in order (one level)",
        "def flatten(xss):\n    return [x for xs in xss for x in xs]",
        "def flatten(xss):\n    return [xs[0] for xs in xss if xs]",
    ),
    "fizzbuzz": CodeTask(
        "fizzbuzz(n)",
        'the list of strings for 1..n: "Fizz", "Buzz", "FizzBuzz" or the number',
        "def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n"
        '        if i % 15 == 0:\n            out.append("FizzBuzz")\n'
        '        elif i % 3 == 0:\n            out.append("Fizz")\n'
        '        elif i % 5 == 0:\n            out.append("Buzz")\n'
        "        else:\n            out.append(str(i))\n    return out",
        "def fizzbuzz(n):\n    out = []\n    for i in range(1, n):\n"
        '        if i % 3 == 0:\n            out.append("Fizz")\n'
        '        elif i % 5 == 0:\n            out.append("Buzz")\n'
        "        else:\n            out.append(str(i))\n    return out",
    ),
    "celsius_to_fahrenheit": CodeTask(
        "celsius_to_fahrenheit(c)",
        "c * 9 / 5 + 32",
        "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32",
        "def celsius_to_fahrenheit(c):\n    return c * 5 / 9 + 32",
    ),
}

_COPY = re.compile(r"repeat exactly:[ \t]*\n?(?P<passage>.*)", re.IGNORECASE | re.DOTALL)
_CODE_TASK = re.compile(r"write a python function\s+`?(?P<name>[A-Za-z_]\w*)\s*\(", re.IGNORECASE)
_REVERSE = re.compile(r"reverse the string\s+(?P<q>['\"])(?P<s>.*?)(?P=q)", re.IGNORECASE | re.DOTALL)
_COUNT = re.compile(
    r"how many times does the (?:letter|character)\s+(?P<q1>['\"])(?P<ch>.)(?P=q1)\s+"
    r"appear in\s+(?P<q2>['\"])(?P<s>.*?)(?P=q2)",
    re.IGNORECASE | re.DOTALL,
)
_ARITHMETIC = re.compile(r"what is\s+(?P<a>-?\d+)\s*(?P<op>[-+*×])\s*(?P<b>-?\d+)\s*\?", re.IGNORECASE)


@dataclass(frozen=True)
class CheckableTask:
    family: str  # arithmetic | reversal | counting | copy | code
    answer: str
    wrong: str  # what a broken model says instead: plausible, and never the answer


def _fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def _wrong_number(correct: int, rng: random.Random) -> int:
    return correct + rng.choice((1, -1, 2, 10, -10, 100))


def _wrong_reversal(s: str, rng: random.Random) -> str:
    answer = s[::-1]
    pairs = [i for i in range(len(answer) - 1) if answer[i] != answer[i + 1]]
    if pairs:
        i = rng.choice(pairs)
        return answer[:i] + answer[i + 1] + answer[i] + answer[i + 2 :]
    if answer:
        # Every character the same: swapping changes nothing, so lose one instead.
        return answer[:-1]
    return "a"


def _wrong_copy(passage: str, rng: random.Random) -> str:
    words = passage.split(" ")
    pairs = [i for i in range(len(words) - 1) if words[i] != words[i + 1]]
    if pairs:
        i = rng.choice(pairs)
        words[i], words[i + 1] = words[i + 1], words[i]
        return " ".join(words)
    return passage + " again"


def recognize(question: str, rng: random.Random) -> CheckableTask | None:
    """The checkable family a question belongs to, with its answer and a wrong answer.

    Tried in this order, first match wins: copy, code, reversal, counting, arithmetic
    (a passage to copy may itself contain a question; the copy instruction governs).
    """
    if m := _COPY.search(question):
        passage = m.group("passage").rstrip()
        if passage:
            return CheckableTask("copy", passage, _wrong_copy(passage, rng))
    if (m := _CODE_TASK.search(question)) and m.group("name") in CODE_TASKS:
        task = CODE_TASKS[m.group("name")]
        return CheckableTask("code", _fenced(task.correct), _fenced(task.buggy))
    if m := _REVERSE.search(question):
        s = m.group("s")
        return CheckableTask("reversal", s[::-1], _wrong_reversal(s, rng))
    if m := _COUNT.search(question):
        n = m.group("s").count(m.group("ch"))
        wrong = n + 1 if n == 0 or rng.random() < 0.5 else n - 1
        return CheckableTask("counting", str(n), str(wrong))
    if m := _ARITHMETIC.search(question):
        a, b = int(m.group("a")), int(m.group("b"))
        op = m.group("op")
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return CheckableTask("arithmetic", str(value), str(_wrong_number(value, rng)))
    return None


# ---------------------------------------------------------------------------------------
# Free text


@dataclass(frozen=True)
class Reply:
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop" (answered, end of sequence) | "length" (max_tokens)
    family: str | None  # the checkable family answered, or None for free text
    correct: bool  # whether the model answered as a healthy one would


_MIN_TOPIC_NAME = 5  # shorter topic names ("if", "in", "for") are ordinary words
# How many start places to try for a cut that ends on a word boundary; about seven in
# ten tokens begin a word, so a handful nearly always suffices.
_CUT_ATTEMPTS = 256


class TextModel:
    """The simulated model's text, given the lab's tokenizer and seed."""

    def __init__(self, tokenizer: Tokenizer, *, seed: int, model_vocab: int, corpora: EncodedCorpora) -> None:
        self.tokenizer = tokenizer
        self.seed = seed
        self.model_vocab = model_vocab
        self.corpora = corpora
        self.token_bytes = token_bytes(tokenizer)
        self._special_ids = {i for t in SPECIAL_TOKENS if (i := tokenizer.token_to_id(t)) is not None}
        self._first_merge_id = len(self._special_ids) + 256

    # -- encoding ----------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_text(self, token_id: int) -> str:
        return self.token_bytes[token_id].decode("utf-8", errors="replace")

    # -- replies -----------------------------------------------------------------------

    def is_wrong_for(self, question: str, backend_state: str, error_rate: float) -> bool:
        """Whether this backend gets this question wrong: always when broken; when
        degraded, for a fixed `error_rate` share of questions chosen by hash."""
        if backend_state == "broken":
            return True
        if backend_state == "degraded":
            return stable_unit(self.seed, "degraded", question) < error_rate
        return False

    def reply(
        self,
        question: str,
        *,
        workload: Workload,
        max_tokens: int,
        ignore_eos: bool,
        backend_state: str,
        error_rate: float,
        salt: int | None = None,
    ) -> Reply:
        """The model's answer to `question` as token ids.

        `salt` is None for greedy requests (same question, same answer); sampled
        requests pass a per-request salt so their text varies.
        """
        rng = random.Random(stable_int(self.seed, "reply", salt, question))
        wrong = self.is_wrong_for(question, backend_state, error_rate)
        task = recognize(question, rng)
        family = task.family if task else None
        if max_tokens <= 0:
            return Reply((), "length", family, not wrong)
        prefix: list[int] = []
        if task is not None:
            answer = task.wrong if wrong else task.answer
            if not ignore_eos:
                ids = self.encode(answer)
                if len(ids) > max_tokens:
                    return Reply(tuple(ids[:max_tokens]), "length", family, not wrong)
                return Reply(tuple(ids), "stop", family, not wrong)
            # Told to ignore the end of sequence, the model keeps writing after its answer.
            prefix = self.encode(answer)
            if len(prefix) >= max_tokens:
                return Reply(tuple(prefix[:max_tokens]), "length", family, not wrong)
        corpus, doc = self._source(question, workload, wrong, rng)
        body = corpus.cut(doc, max_tokens - len(prefix), rng, after_text=bool(prefix))
        return Reply(tuple(prefix + body), "length", family, not wrong)

    def _source(
        self, question: str, workload: Workload, wrong: bool, rng: random.Random
    ) -> tuple[EncodedCorpus, int]:
        """Which corpus and document the reply's free text comes from.

        Healthy text comes from the prompt's workload corpus, from the document the
        prompt names when it names one (a stdlib module, a pydoc topic). Nonsense comes
        from either corpus, from a document chosen without looking at the prompt.
        """
        if wrong:
            corpus = self.corpora.code if rng.random() < 0.5 else self.corpora.prose
            return corpus, rng.randrange(len(corpus.names))
        corpus = self.corpora.code if workload == "code" else self.corpora.prose
        relevant = _relevant_document(question, corpus.names)
        return corpus, relevant if relevant is not None else rng.randrange(len(corpus.names))

    # -- log-probabilities -------------------------------------------------------------

    def prompt_logprobs(
        self, ids: Sequence[int], *, backend_state: str, error_rate: float
    ) -> list[float | None]:
        """Log-probability of each prompt token given the ones before it (first: None).

        Healthy: common tokens cost ~0.5-1.5 nats, rare fragments and raw bytes up to
        ~6, so natural text averages ~1-2. Broken: every token ~ln(vocab) (a model
        whose weights are scrambled spreads its mass over the whole vocabulary).
        Degraded: an `error_rate` share of positions look broken.
        """
        out: list[float | None] = []
        for pos, token_id in enumerate(ids):
            if pos == 0:
                out.append(None)
                continue
            u = stable_unit(self.seed, "plp", pos, token_id, ids[pos - 1])
            scrambled = backend_state == "broken" or (
                backend_state == "degraded" and stable_unit(self.seed, "plp-bad", pos, token_id) < error_rate
            )
            if scrambled:
                out.append(-(math.log(self.model_vocab) + 0.5 * (u - 0.5)))
            else:
                out.append(-self._surprise(token_id) * (0.8 + 0.4 * u))
        return out

    def completion_logprobs(self, ids: Sequence[int], *, salt: object) -> list[float]:
        """Log-probabilities of generated tokens: a model is confident in what it writes,
        scrambled or not, which is why fluent nonsense does not show here."""
        rng = random.Random(stable_int(self.seed, "clp", salt))
        return [-(0.02 + 0.6 * rng.random() ** 2) for _ in ids]

    def alternatives(self, token_id: int, logprob: float, n: int, position: int) -> list[tuple[int, float]]:
        """Top-n candidates at a position: the token itself and n-1 less likely others."""
        out = [(token_id, logprob)]
        vocab = len(self.token_bytes)
        j = 0
        while len(out) < n:
            j += 1
            other = stable_int(self.seed, "alt", position, token_id, j) % vocab
            if other in self._special_ids or any(other == t for t, _ in out):
                continue
            out.append((other, logprob - 0.75 * j))
        return out

    def _surprise(self, token_id: int) -> float:
        if token_id in self._special_ids:
            return 0.5
        raw = self.token_bytes[token_id]
        if len(raw) == 1 and token_id < self._first_merge_id:
            ch = raw[0]
            if ch < 0x80 and (chr(ch).isspace() or chr(ch) in ".,:;()[]{}'\"-_=+*/#"):
                return 1.2
            if ch < 0x80 and chr(ch).isalnum():
                return 3.0
            return 6.0
        # BPE numbers merges in the order it learned them, most frequent pairs first:
        # a merge's rank stands in for how common the token is.
        span = max(1, len(self.token_bytes) - self._first_merge_id)
        rank = (token_id - self._first_merge_id) / span
        return 0.5 + 2.5 * rank


def _relevant_document(question: str, names: Sequence[str]) -> int | None:
    """The longest document name the question uses as a word, if any."""
    words = {w.lower() for w in re.findall(r"[A-Za-z][\w-]*", question)}
    named = [(len(n), i) for i, n in enumerate(names) if len(n) >= _MIN_TOPIC_NAME and n.lower() in words]
    return max(named)[1] if named else None


# ---------------------------------------------------------------------------------------
# The corpora as token streams


@dataclass(frozen=True)
class EncodedCorpus:
    """One corpus (documents joined by blank lines) encoded once, with where replies may
    start and where they may end.

    A reply is a slice of the stream. It starts at a place that reads as a beginning
    (a `def`/`class` line, a paragraph) and ends where a pre-token (word) ends, because
    a cut inside a word can merge differently when re-tokenized; cut at word edges,
    encode(decode(slice)) is the slice and a client counts exactly what was generated.
    """

    names: tuple[str, ...]
    ids: np.ndarray  # uint16 token ids of the whole stream
    word_start: np.ndarray  # bool per token: the token begins a pre-token
    doc_start: np.ndarray  # token index where each document begins, then the stream's end
    starts: np.ndarray  # sorted token indices where a reply may begin
    blank: np.ndarray  # bool per token: whitespace only

    def cut(self, doc: int, n: int, rng: random.Random, *, after_text: bool) -> list[int]:
        """n tokens from a start place in (or after) document `doc`, ending on a word edge.

        A slice may not end on a blank token (a trailing blank run re-tokenizes as one
        token). `after_text`: the slice follows other text, so it takes the blank run
        before its start place with it; a run tokenizes by itself and the character
        after it, not by what precedes it.
        """
        total = len(self.ids)
        blank = self.blank
        first = int(np.searchsorted(self.starts, self.doc_start[doc]))
        last = int(np.searchsorted(self.starts, self.doc_start[doc + 1]))
        at = rng.randrange(first, last) if last > first else first
        fallback: int | None = None
        for i in range(_CUT_ATTEMPTS):
            start = int(self.starts[(at + i) % len(self.starts)])
            if after_text:
                run = start
                while run > 0 and blank[run - 1]:
                    run -= 1
                if run == start:
                    continue
                start = run
            end = start + n
            if end > total:
                continue
            fallback = start if fallback is None else fallback
            if end == total or (self.word_start[end] and not blank[end - 1]):
                return [int(t) for t in self.ids[start:end].tolist()]
        # No word-edge cut nearby (or n is longer than what follows): take what there is;
        # a client may then count one token more or fewer than was generated.
        start = fallback if fallback is not None else 0
        return [int(t) for t in self.ids[start : start + n].tolist()]


@dataclass(frozen=True)
class EncodedCorpora:
    code: EncodedCorpus
    prose: EncodedCorpus


def _code_starts(text: str) -> list[int]:
    """Offsets of `def`/`class` lines: where a piece of code reads as a whole. For an
    indented one, the offset of the space before the keyword, where its token begins."""
    out = []
    for m in re.finditer(r"^(    )?(?:def|class) ", text, re.MULTILINE):
        out.append(m.start() + 3 if m.group(1) else m.start())
    return out


def _prose_starts(text: str) -> list[int]:
    """Offsets of paragraphs that begin with a capitalised word (not grammar or tables)."""
    return [m.start(1) for m in re.finditer(r"\n\n([A-Z][a-z]+ )", text)]


_SEPARATOR = "\n\n"


def blank_tokens(tokenizer: Tokenizer) -> np.ndarray:
    """Per vocabulary id: whether the token is whitespace only."""
    return np.asarray([bool(b) and not b.strip() for b in token_bytes(tokenizer)], dtype=bool)


def encode_corpus(
    tokenizer: Tokenizer, docs: Sequence[tuple[str, str]], starts_in: Callable[[str], list[int]]
) -> EncodedCorpus:
    text = _SEPARATOR.join(body for _, body in docs)
    doc_chars = []
    pos = 0
    for _, body in docs:
        doc_chars.append(pos)
        pos += len(body) + len(_SEPARATOR)
    encoding = tokenizer.encode(text, add_special_tokens=False)
    ids = np.asarray(encoding.ids, dtype=np.uint16)
    words = np.asarray([-1 if w is None else w for w in encoding.word_ids], dtype=np.int64)
    word_start = np.ones(len(ids), dtype=bool)
    word_start[1:] = words[1:] != words[:-1]
    token_chars = np.asarray([o[0] for o in encoding.offsets], dtype=np.int64)
    doc_start = np.append(np.searchsorted(token_chars, doc_chars), len(ids)).astype(np.int64)
    candidates = np.asarray(
        [doc_chars[d] + c for d, (_, body) in enumerate(docs) for c in starts_in(body)], dtype=np.int64
    )
    at = np.searchsorted(token_chars, candidates)
    at = at[at < len(ids)]
    # Keep places where a word begins exactly there, so the slice re-tokenizes alike.
    exact = (token_chars[at] == candidates[: len(at)]) & word_start[at]
    starts = np.unique(at[exact])
    blank = blank_tokens(tokenizer)[ids]
    return EncodedCorpus(tuple(name for name, _ in docs), ids, word_start, doc_start, starts, blank)


def _save(path: Path, corpora: EncodedCorpora) -> None:
    code, prose = corpora.code, corpora.prose
    fd, tmp = tempfile.mkstemp(prefix=".corpus-", suffix=".npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            np.savez(
                out,
                code_ids=code.ids,
                code_word_start=code.word_start,
                code_doc_start=code.doc_start,
                code_starts=code.starts,
                prose_ids=prose.ids,
                prose_word_start=prose.word_start,
                prose_doc_start=prose.doc_start,
                prose_starts=prose.starts,
            )
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load(path: Path, blank: np.ndarray) -> EncodedCorpora:
    with np.load(path) as data:
        code_names = tuple(name for name, _ in code_corpus())
        prose_names = tuple(name for name, _ in prose_corpus())
        return EncodedCorpora(
            *(
                EncodedCorpus(
                    names,
                    data[f"{label}_ids"],
                    data[f"{label}_word_start"],
                    data[f"{label}_doc_start"],
                    data[f"{label}_starts"],
                    blank[data[f"{label}_ids"]],
                )
                for label, names in (("code", code_names), ("prose", prose_names))
            )
        )


_corpora_lock = threading.Lock()
_corpora_memo: dict[str, EncodedCorpora] = {}


def encoded_corpora(tokenizer_path: Path, cache_dir: Path | None = None) -> EncodedCorpora:
    """Both corpora encoded with this tokenizer: from this process's memory, else the
    file cache, else encoded now (a few seconds, once per machine) and cached.

    Keyed by the tokenizer file's bytes and the corpus recipe, so a copy of the same
    tokenizer in a simulated model directory shares the cache.
    """
    digest = hashlib.sha256(Path(tokenizer_path).read_bytes()).hexdigest()[:16]
    key = f"{digest}-{recipe_key()}"
    with _corpora_lock:
        if key in _corpora_memo:
            return _corpora_memo[key]
        directory = cache_dir or default_cache_dir()
        path = directory / f"corpus-{key}.npz"
        tokenizer = load_tokenizer(tokenizer_path)
        if path.exists():
            corpora = _load(path, blank_tokens(tokenizer))
        else:
            corpora = EncodedCorpora(
                encode_corpus(tokenizer, code_corpus(), _code_starts),
                encode_corpus(tokenizer, prose_corpus(), _prose_starts),
            )
            directory.mkdir(parents=True, exist_ok=True)
            _save(path, corpora)
        _corpora_memo[key] = corpora
        return corpora
