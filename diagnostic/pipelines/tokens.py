"""Counting delivered tokens with the model's own tokenizer.

Delivered tokens are counted by re-tokenizing the whole joined text a client received,
once, with no special tokens added: chunk boundaries are not token boundaries, and an
SSE chunk may carry several tokens. Two tokenizer formats are read: a HuggingFace
`tokenizer.json` (the `tokenizers` library) and Kimi's tiktoken-format `tiktoken.model`
(one `base64-token rank` pair a line), chosen by the file's name and, failing that, its
content.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tiktoken
from tokenizers import Tokenizer

# Kimi K2's pre-tokenizer pattern, as published in the `pat_str` of the model's
# `tokenization_kimi.py` (moonshotai/Kimi-K2-Instruct on Hugging Face; the same file is
# mirrored in public repositories, e.g. troy12x/quasar-kimi/tokenization_kimi.py). Han
# runs are their own pre-tokens, which is why Han is subtracted from the letter classes.
KIMI_PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
        r"""[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
        r"""[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# tiktoken's regex engine can exhaust its stack on very long runs of whitespace or of
# non-whitespace; Kimi's own tokenizer cuts such runs before encoding, and so do we. A cut
# can only add a boundary inside a 25,000-character run, which no real reply contains.
_MAX_RUN_CHARS = 25_000


class TokenizerError(ValueError):
    """The tokenizer file cannot be read; the message names the file and what was expected."""


@dataclass(frozen=True)
class TokenCounter:
    """Counts tokens of a text with one tokenizer file."""

    path: Path
    kind: str  # "huggingface" | "tiktoken"
    _encode: Callable[[str], int]

    def count(self, text: str) -> int:
        """Tokens in `text`, no special tokens added."""
        if not text:
            return 0
        return self._encode(text)

    def describe(self) -> dict[str, str]:
        return {"path": str(self.path), "format": self.kind}


def load_token_counter(path: str | Path) -> TokenCounter:
    """A counter for a `tokenizer.json` (HuggingFace) or a `tiktoken.model` file."""
    file = Path(path)
    if not file.is_file():
        raise TokenizerError(f"tokenizer {file}: no such file (expected tokenizer.json or tiktoken.model)")
    kind = _detect_format(file)
    if kind == "huggingface":
        return _huggingface_counter(file)
    return _tiktoken_counter(file)


def _detect_format(file: Path) -> str:
    name = file.name.lower()
    if name.endswith(".json"):
        return "huggingface"
    if name.endswith((".model", ".tiktoken")):
        return "tiktoken"
    with file.open("rb") as fh:
        head = fh.read(4096).lstrip()
    if head.startswith(b"{"):
        return "huggingface"
    first = head.split(b"\n", 1)[0].split()
    if len(first) == 2 and first[1].isdigit():
        return "tiktoken"
    raise TokenizerError(
        f"tokenizer {file}: neither a HuggingFace tokenizer.json (a JSON object) nor a tiktoken "
        f"file (lines of 'base64-token rank')"
    )


def _huggingface_counter(file: Path) -> TokenCounter:
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as exc:  # the tokenizers library raises a bare Exception on bad files
        raise TokenizerError(f"tokenizer {file}: not a readable HuggingFace tokenizer.json ({exc})") from exc

    def encode(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return TokenCounter(file, "huggingface", encode)


def read_tiktoken_ranks(file: Path) -> dict[bytes, int]:
    """The mergeable ranks of a tiktoken-format file: `base64-token rank` per line."""
    ranks: dict[bytes, int] = {}
    with file.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            line = raw.strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2 or not parts[1].isdigit():
                raise TokenizerError(
                    f"tokenizer {file}: line {number} is not 'base64-token rank': {line[:60]!r}"
                )
            try:
                token = base64.b64decode(parts[0], validate=True)
            except binascii.Error as exc:
                raise TokenizerError(
                    f"tokenizer {file}: line {number}: bad base64 token {parts[0][:40]!r}"
                ) from exc
            ranks[token] = int(parts[1])
    if not ranks:
        raise TokenizerError(f"tokenizer {file}: no token ranks in the file")
    return ranks


def _tiktoken_counter(file: Path) -> TokenCounter:
    encoding = tiktoken.Encoding(
        name=file.name, pat_str=KIMI_PAT_STR, mergeable_ranks=read_tiktoken_ranks(file), special_tokens={}
    )

    def encode(text: str) -> int:
        # disallowed_special=() : text that happens to spell a special token is ordinary text.
        return sum(len(encoding.encode(piece, disallowed_special=())) for piece in _bounded_runs(text))

    return TokenCounter(file, "tiktoken", encode)


def _bounded_runs(text: str) -> list[str]:
    """`text` cut so that no piece has a whitespace or non-whitespace run over the limit."""
    if len(text) <= _MAX_RUN_CHARS:
        return [text]
    pieces: list[str] = []
    start = 0
    run = 0
    in_space = text[0].isspace()
    for i, ch in enumerate(text):
        space = ch.isspace()
        if space != in_space:
            in_space, run = space, 1
            continue
        run += 1
        if run > _MAX_RUN_CHARS:
            pieces.append(text[start:i])
            start, run = i, 1
    pieces.append(text[start:])
    return pieces
