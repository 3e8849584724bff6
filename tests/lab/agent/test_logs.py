"""logs: byte offsets into a growing file, decoded without splitting characters."""

from __future__ import annotations

from pathlib import Path

from tests.lab.agent.conftest import run_agent


def _logs(path: Path, since: int, max_bytes: int | None = None) -> dict:
    args = ["logs", "--file", str(path), "--since", str(since)]
    if max_bytes is not None:
        args += ["--max", str(max_bytes)]
    return run_agent(*args).data


def test_it_returns_the_bytes_after_an_offset(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"INFO first line\nINFO second line\n")
    data = _logs(log, 16)
    assert data == {"path": str(log), "offset": 16, "next_offset": 33, "size": 33,
                    "text": "INFO second line\n"}


def test_following_next_offset_reads_a_growing_file_exactly_once(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"")
    seen, offset = [], 0
    for i in range(3):
        with log.open("ab") as f:
            f.write(f"line {i}\n".encode() * 2)
        while True:
            data = _logs(log, offset, max_bytes=9)
            if data["next_offset"] == offset:
                break
            seen.append(data["text"])
            offset = data["next_offset"]
    assert "".join(seen) == log.read_text()


def test_it_never_splits_a_multibyte_character(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    text = "Kimi – 模型 ✓ done\n"
    log.write_text(text, encoding="utf-8")
    chunks, offset = [], 0
    while offset < log.stat().st_size:
        data = _logs(log, offset, max_bytes=5)
        assert "\ufffd" not in data["text"]
        chunks.append(data["text"])
        offset = data["next_offset"]
    assert "".join(chunks) == text


def test_it_replaces_invalid_utf8_instead_of_failing(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"ok \xff\xfe bad bytes\n")
    assert _logs(log, 0)["text"] == "ok \ufffd\ufffd bad bytes\n"


def test_max_zero_reports_only_the_size(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"x" * 1234)
    data = _logs(log, 0, max_bytes=0)
    assert (data["size"], data["text"], data["next_offset"]) == (1234, "", 0)


def test_an_offset_past_the_end_restarts_a_truncated_file(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"a new engine started\n")
    data = _logs(log, 10_000)
    assert data["offset"] == 0
    assert data["text"] == "a new engine started\n"


def test_it_says_when_the_log_does_not_exist(tmp_path: Path) -> None:
    ans = run_agent("logs", "--file", str(tmp_path / "missing.log"), "--since", "0")
    assert ans.exit_status == 1
    assert ans.error["code"] == "not_found"
    assert "missing.log" in ans.error["message"]


def test_it_refuses_a_negative_offset(tmp_path: Path) -> None:
    ans = run_agent("logs", "--file", str(tmp_path / "x.log"), "--since", "-5")
    assert ans.exit_status == 2
    assert "--since" in ans.error["message"] and "'-5'" in ans.error["message"]
