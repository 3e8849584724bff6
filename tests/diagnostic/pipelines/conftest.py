"""Fixtures for the measurement tests: a small real tokenizer and the text it streams."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# Plain ASCII prose and code, so each token's piece of text is whole characters.
TEXT = (
    "The lighthouse keeper climbed the stairs every evening to light the lamp. "
    "Ships passed far out at sea, and the beam swept the water in slow circles. "
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i))\n"
    "In winter the storms came from the north and the waves broke over the rocks. "
)


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE trained on TEXT: a real tokenizer.json, made in a fraction of a second."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TEXT] * 20, trainer=trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="session")
def pieces(tokenizer_path: Path) -> list[str]:
    """TEXT cut at its token boundaries: what the test server emits, one string per token."""
    tok = Tokenizer.from_file(str(tokenizer_path))
    enc = tok.encode(TEXT, add_special_tokens=False)
    cut = [TEXT[a:b] for a, b in enc.offsets]
    assert "".join(cut) == TEXT
    return cut
