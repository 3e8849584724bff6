"""Token counting: HuggingFace and tiktoken-format files, whole text once, no special tokens."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from tokenizers import Tokenizer, processors

from diagnostic.pipelines.tokens import KIMI_PAT_STR, TokenizerError, load_token_counter

from .conftest import TEXT


def test_it_counts_a_tokenizer_json_without_special_tokens(tokenizer_path: Path, tmp_path: Path) -> None:
    # A tokenizer whose post-processor adds BOS/EOS: the count must not include them.
    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))],
    )
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    counter = load_token_counter(path)
    plain = len(tok.encode(TEXT, add_special_tokens=False).ids)
    assert len(tok.encode(TEXT).ids) == plain + 2
    assert counter.count(TEXT) == plain
    assert counter.kind == "huggingface"


def test_counting_the_joined_text_differs_from_summing_chunks(tokenizer_path: Path) -> None:
    counter = load_token_counter(tokenizer_path)
    chunks = [TEXT[i : i + 3] for i in range(0, len(TEXT), 3)]
    assert counter.count("".join(chunks)) < sum(counter.count(c) for c in chunks)


def _tiktoken_file(path: Path, merges: list[bytes]) -> Path:
    ranks = [bytes([i]) for i in range(256)] + merges
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(ranks)))
    return path


def test_it_counts_a_tiktoken_model_file(tmp_path: Path) -> None:
    path = _tiktoken_file(tmp_path / "tiktoken.model", [b"th", b"the", b" th", b" the"])
    counter = load_token_counter(path)
    assert counter.kind == "tiktoken"
    assert counter.count("the the") == 2  # "the" + " the"
    assert counter.count("<|im_end|>") > 1  # text that spells a special token is ordinary text


def test_kimi_pattern_keeps_han_runs_apart_from_latin_words(tmp_path: Path) -> None:
    import tiktoken

    ranks = {bytes([i]): i for i in range(256)}
    enc = tiktoken.Encoding(name="t", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks, special_tokens={})
    pieces = [enc.decode_single_token_bytes(t) for t in enc.encode("中文English", disallowed_special=())]
    assert b"".join(pieces) == "中文English".encode()
    path = _tiktoken_file(tmp_path / "kimi.model", ["中文".encode()[:3] + "中文".encode()[3:], b"English"])
    assert load_token_counter(path).count("中文English") == 2


def test_the_format_is_recognised_by_content_when_the_name_says_nothing(
    tokenizer_path: Path, tmp_path: Path
) -> None:
    hf = tmp_path / "vocab-a"
    hf.write_bytes(tokenizer_path.read_bytes())
    tk = _tiktoken_file(tmp_path / "vocab-b", [b"ab"])
    assert load_token_counter(hf).kind == "huggingface"
    assert load_token_counter(tk).kind == "tiktoken"


def test_an_unreadable_tokenizer_is_an_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "weird.bin"
    bad.write_text("hello world this is not a tokenizer\n")
    with pytest.raises(TokenizerError, match=r"weird\.bin"):
        load_token_counter(bad)
    with pytest.raises(TokenizerError, match="no such file"):
        load_token_counter(tmp_path / "missing.json")
    broken = tmp_path / "tiktoken.model"
    broken.write_text("!!!notbase64 1\n")
    with pytest.raises(TokenizerError, match="line 1"):
        load_token_counter(broken)
