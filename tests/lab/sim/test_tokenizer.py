"""The simulated model's tokenizer: trained once, cached by recipe, exact round trips."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from lab.sim import tokenizer as tk


@pytest.fixture(scope="module")
def lab_tokenizer() -> Tokenizer:
    # The machine-wide cache: trained at most once per machine, as the lab does.
    return tk.load_tokenizer(tk.ensure_tokenizer(tk.default_cache_dir()))


@pytest.fixture
def tiny_corpora(monkeypatch: pytest.MonkeyPatch) -> None:
    """Swap the stdlib corpora for a few lines, so that training takes milliseconds."""
    code = (("alpha", "def add(a, b):\n    return a + b\n" * 40),)
    prose = (("beta", "The quick brown fox jumps over the lazy dog.\n" * 40),)
    monkeypatch.setattr(tk, "code_corpus", lambda: code)
    monkeypatch.setattr(tk, "prose_corpus", lambda: prose)
    monkeypatch.setattr(tk, "VOCAB_SIZE", 400)


def test_vocabulary_is_a_real_bpe_of_the_stated_size(lab_tokenizer: Tokenizer) -> None:
    assert 8000 <= lab_tokenizer.get_vocab_size() <= 16000
    assert lab_tokenizer.get_vocab_size() == tk.VOCAB_SIZE


@pytest.mark.parametrize(
    "text",
    [
        "def f(x):\n    return x  # trailing  spaces   \n\n\tpass\n",
        "Exceptions are a means of breaking out of the normal flow of control.",
        "naïve café — 東京 🙂 mixed\r\nline endings",
    ],
)
def test_decoding_an_encoding_gives_back_the_exact_text(lab_tokenizer: Tokenizer, text: str) -> None:
    ids = lab_tokenizer.encode(text, add_special_tokens=False).ids
    assert lab_tokenizer.decode(ids, skip_special_tokens=False) == text


def test_common_words_and_keywords_are_single_tokens(lab_tokenizer: Tokenizer) -> None:
    for piece in (" the", " return", " def", "self", " import"):
        assert tk.count_tokens(lab_tokenizer, piece) == 1, piece


def test_chat_template_markers_are_single_special_tokens(lab_tokenizer: Tokenizer) -> None:
    text = "<|im_user|>user<|im_middle|>hi<|im_end|>"
    tokens = lab_tokenizer.encode(text, add_special_tokens=False).tokens
    assert tokens[0] == "<|im_user|>"
    assert "<|im_middle|>" in tokens and tokens[-1] == "<|im_end|>"


def test_token_bytes_agree_with_the_decoder_for_every_id(lab_tokenizer: Tokenizer) -> None:
    table = tk.token_bytes(lab_tokenizer)
    assert len(table) == lab_tokenizer.get_vocab_size()
    for token_id, raw in enumerate(table):
        decoded = lab_tokenizer.decode([token_id], skip_special_tokens=False)
        assert raw.decode("utf-8", errors="replace") == decoded, token_id


def test_byte_pieces_join_split_characters(lab_tokenizer: Tokenizer) -> None:
    table = tk.token_bytes(lab_tokenizer)
    ids = lab_tokenizer.encode("東京", add_special_tokens=False).ids
    assert len(ids) > 1
    assert b"".join(table[i] for i in ids).decode() == "東京"


def test_ensure_tokenizer_trains_once_and_reuses_the_file(
    tiny_corpora: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tk.ensure_tokenizer(tmp_path)
    assert path.exists() and path.parent == tmp_path
    assert Tokenizer.from_file(str(path)).get_vocab_size() <= 400

    def no_training() -> Tokenizer:
        raise AssertionError("trained again although the cache holds the file")

    monkeypatch.setattr(tk, "train_tokenizer", no_training)
    assert tk.ensure_tokenizer(tmp_path) == path
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


def test_cache_key_follows_the_corpus_bytes(tiny_corpora: None, monkeypatch: pytest.MonkeyPatch) -> None:
    before = tk.recipe_key()
    monkeypatch.setattr(tk, "prose_corpus", lambda: (("beta", "Another sentence entirely.\n"),))
    assert tk.recipe_key() != before


def test_cache_key_follows_the_recipe(tiny_corpora: None, monkeypatch: pytest.MonkeyPatch) -> None:
    before = tk.recipe_key()
    monkeypatch.setattr(tk, "VOCAB_SIZE", 401)
    assert tk.recipe_key() != before


def test_default_cache_dir_honours_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(tk.CACHE_ENV, str(tmp_path))
    assert tk.default_cache_dir() == tmp_path
    monkeypatch.delenv(tk.CACHE_ENV)
    assert tk.default_cache_dir() == Path.home() / ".cache" / "gb10-diag"


def test_code_corpus_is_the_public_stdlib_modules() -> None:
    names = [name for name, _ in tk.code_corpus()]
    assert "argparse" in names and "textwrap" in names
    assert not any(name.startswith("_") for name in names)
    assert names == sorted(names)
