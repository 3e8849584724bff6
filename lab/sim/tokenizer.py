"""The simulated model's tokenizer: a real byte-level BPE trained on stdlib corpora.

The simulated lab's model directory holds this `tokenizer.json`; clients fetch it to
count delivered tokens exactly as they would fetch a real model's. It is trained once
per machine with the `tokenizers` library on the two corpora every Python install
carries (the standard library's own sources for code, `pydoc_data.topics` for English
prose) and cached under a name derived from the training recipe and the corpus bytes,
so a different Python (different corpus) gets its own file instead of a stale one.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
import tempfile
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# Bumped whenever the recipe below changes in a way the corpus hash cannot see.
RECIPE_VERSION = "labsim-bpe/1"
VOCAB_SIZE = 12000
MIN_FREQUENCY = 2
# Prose is a tenth the size of the code corpus; repeating it gives English words merges
# of their own instead of being spelled out letter by letter.
PROSE_WEIGHT = 3
# Kimi K2's chat-template markers, so that chat prompts count the way they would.
SPECIAL_TOKENS = (
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
)
CACHE_ENV = "GB10_DIAG_CACHE"


def default_cache_dir() -> Path:
    """`$GB10_DIAG_CACHE`, else ~/.cache/gb10-diag."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "gb10-diag"


def code_corpus_files() -> list[Path]:
    """Public top-level stdlib modules, by name: the code corpus.

    Private modules (leading underscore) are left out: they include generated data
    such as `_sysconfigdata*` that is machine-specific and not code a person writes.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in stdlib.glob("*.py") if not p.name.startswith("_"))


@lru_cache(maxsize=1)
def code_corpus() -> tuple[tuple[str, str], ...]:
    """(module name, source text) for every code corpus file; undecodable bytes replaced."""
    docs = []
    for path in code_corpus_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        docs.append((path.stem, text))
    return tuple(docs)


@lru_cache(maxsize=1)
def prose_corpus() -> tuple[tuple[str, str], ...]:
    """(topic name, text) for every `pydoc_data.topics` entry, by name."""
    from pydoc_data.topics import topics

    return tuple((name, topics[name]) for name in sorted(topics))


def recipe_key() -> str:
    """Hash of everything that decides the trained tokenizer, corpus bytes included."""
    h = hashlib.sha256()
    recipe = {
        "version": RECIPE_VERSION,
        "vocab_size": VOCAB_SIZE,
        "min_frequency": MIN_FREQUENCY,
        "prose_weight": PROSE_WEIGHT,
        "special_tokens": list(SPECIAL_TOKENS),
    }
    h.update(json.dumps(recipe, sort_keys=True).encode())
    for corpus in (code_corpus(), prose_corpus()):
        for name, text in corpus:
            h.update(name.encode())
            h.update(b"\0")
            h.update(text.encode("utf-8"))
            h.update(b"\0")
    return h.hexdigest()[:16]


def train_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    # Byte-level pieces round-trip any text exactly, whitespace and indentation included,
    # which is what makes re-tokenizing delivered text reproduce the generated count.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=MIN_FREQUENCY,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [text for _, text in code_corpus()]
    texts += [text for _, text in prose_corpus()] * PROSE_WEIGHT
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def ensure_tokenizer(cache_dir: Path) -> Path:
    """Path of the cached tokenizer.json for this machine's corpora, training it if absent.

    The file is written under a temporary name and renamed into place, so processes
    that race to build it each see either no file or a complete one.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"tokenizer-{recipe_key()}.json"
    if path.exists():
        return path
    tokenizer = train_tokenizer()
    fd, tmp = tempfile.mkstemp(prefix=".tokenizer-", suffix=".json", dir=cache_dir)
    os.close(fd)
    try:
        tokenizer.save(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load_tokenizer(path: Path | str) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    """Tokens in `text` as a client counts delivered text: no special tokens added."""
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def _byte_alphabet() -> dict[str, int]:
    """The byte-level alphabet: which printable character stands for which byte.

    Printable Latin-1 bytes stand for themselves; the rest (controls, space, a few
    others) are shifted past 255 in byte order, so every byte has a visible symbol.
    """
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    mapping = {chr(b): b for b in kept}
    shifted = 0
    for b in range(256):
        if b not in kept:
            mapping[chr(256 + shifted)] = b
            shifted += 1
    return mapping


def token_bytes(tokenizer: Tokenizer) -> list[bytes]:
    """The raw bytes each token id stands for, indexed by id (special tokens: their text).

    Streaming needs bytes, not text: a multi-byte character can be split across two
    tokens, and only an incremental UTF-8 decoder over the bytes joins it correctly.
    """
    # Map each alphabet symbol to the Latin-1 character of its byte, then encode as
    # Latin-1: one C-level pass per token instead of a Python loop per character.
    to_latin1 = {ord(symbol): byte for symbol, byte in _byte_alphabet().items()}
    special = set(SPECIAL_TOKENS)
    table = [b""] * tokenizer.get_vocab_size()
    for piece, token_id in tokenizer.get_vocab().items():
        if piece in special:
            table[token_id] = piece.encode()
        else:
            table[token_id] = piece.translate(to_latin1).encode("latin-1")
    return table
