"""`specdeck serve` and a history database another program holds locked: the answer does not wait for it, and
the turn is saved once the lock is released. A real SQLite file, locked by a real second connection."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from tests.app.test_serve import MESSAGES, start_server


def _saved(history: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(history, timeout=0.1) as db:
        return [(r[0], r[1], r[2]) for r in db.execute("SELECT role, text, status FROM messages ORDER BY id")]


def _in_order(wanted: list[tuple[str, str, str]], rows: list[tuple[str, str, str]]) -> bool:
    """Every wanted row is saved, in the order given (other rows may come between)."""
    found = iter(rows)
    return all(w in found for w in wanted)


@pytest.mark.server
def test_answers_given_while_the_history_is_locked_are_saved_once_it_is_free(tiny_target: Path,
                                                                              tmp_path: Path) -> None:
    history = tmp_path / "history.sqlite3"
    server = start_server(tiny_target, history)
    try:
        first = httpx.post(server.base_url + "/v1/chat/completions", timeout=120,
                           json={"messages": MESSAGES, "max_tokens": 4, "temperature": 0})
        assert first.status_code == 200
        locker = sqlite3.connect(history, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")  # another SpecDeck, or any program, holding the write lock
        try:
            # The lock is released only after both answers came: an answer that waited for the save would
            # never come (the client's timeout would end the test).
            plain = httpx.post(server.base_url + "/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": "asked while locked"}], "max_tokens": 6,
                "temperature": 0})
            assert plain.status_code == 200, plain.text
            streamed_text = ""
            with httpx.stream("POST", server.base_url + "/v1/chat/completions", timeout=60, json={
                    "messages": [{"role": "user", "content": "streamed while locked"}], "max_tokens": 6,
                    "temperature": 0, "stream": True}) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        for choice in json.loads(line[6:])["choices"]:
                            streamed_text += choice["delta"].get("content") or ""
            time.sleep(2)  # held a while longer: the writes must outlast the lock, not race it
        finally:
            locker.execute("COMMIT")
            locker.close()
        answer = plain.json()["choices"][0]["message"]["content"]
        deadline = time.monotonic() + 30
        while True:
            rows = _saved(history)
            wanted = [("user", "asked while locked", "complete"), ("assistant", answer, "complete"),
                      ("user", "streamed while locked", "complete"), ("assistant", streamed_text, "complete")]
            if _in_order(wanted, rows):
                break
            assert time.monotonic() < deadline, f"not saved after the lock was released: {rows}"
            time.sleep(0.2)
    finally:
        server.stop()
