"""Prompts files for bench and tune: every bad file is one sentence naming the line, never a traceback or a hang."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from app.errors import SettingsError
from app.measure.prompts import read_prompts

GOOD = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(data)
    return path


def test_a_good_file_reads_in_order(tmp_path: Path) -> None:
    second = {"messages": [{"role": "user", "content": "é ✓"}]}
    path = _write(tmp_path, b"\xef\xbb\xbf" + (json.dumps(GOOD) + "\n\n" + json.dumps(second) + "\n").encode())
    assert read_prompts(path) == [GOOD["messages"], second["messages"]]


@pytest.mark.parametrize(("line", "fragment"), [
    (b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', ":2 is not UTF-8 text (byte 47 of the line)"),
    (b"[" * 100_000, ":2 is nested too deeply"),
    (b'{"messages": [{"role": "user", "content": ' + b"[" * 100_000 + b"]}", ":2 is nested too deeply"),
    (b'{"messages": [{"role": "user", "content": null}]}', "message 1 has content of type NoneType"),
    (b'{"messages": [{"role": "user", "content": {"text": "hi"}}]}', "message 1 has content of type dict"),
    (b'{"messages": [{"role": "user"}]}', "message 1 has content of type NoneType"),
    (b'{"messages": []}', '"messages" is empty'),
    (b'{"messages": "hello"}', '"messages" must be a list of messages, not str'),
    (b'{"messages": [{"role": "tool", "content": "x"}]}', "message 1 has role 'tool'"),
    (b'{"messages": ["hello"]}', "message 1 is not"),
    (b'{"prompt": "hello"}', ':2 is not {"messages"'),
    (b"[1, 2]", ':2 is not {"messages"'),
    (b"{not json", ":2 is not valid JSON"),
])
def test_bad_lines_are_named(tmp_path: Path, line: bytes, fragment: str) -> None:
    path = _write(tmp_path, json.dumps(GOOD).encode() + b"\n" + line + b"\n")
    with pytest.raises(SettingsError) as info:
        read_prompts(path)
    message = str(info.value)
    assert fragment in message
    assert message.startswith(str(path))
    assert "\n" not in message
    assert "Traceback" not in message


def test_empty_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="holds no prompts"):
        read_prompts(_write(tmp_path, b"\n  \n"))
    with pytest.raises(SettingsError, match=r"Cannot read the prompts file .*No such file"):
        read_prompts(tmp_path / "missing.jsonl")
    with pytest.raises(SettingsError, match="not a regular file"):
        read_prompts(tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    os.mkfifo(path)

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError("read_prompts blocked on the FIFO")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    try:
        with pytest.raises(SettingsError, match="not a regular file"):
            read_prompts(path)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_bench_and_tune_read_the_same_way() -> None:
    from app.measure import bench

    assert bench.read_prompts is read_prompts
