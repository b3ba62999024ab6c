"""Chat history on real SQLite files: the flow of a chat, crashes, full disks, damaged and newer files."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.errors import StorageError
from app.events import MessageStats
from app.params import SamplingSettings
from app.storage.history import HistoryStore
from app.storage.history_rows import SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[2]

STATS = MessageStats(
    prompt_tokens=12, completion_tokens=40, ttft_seconds=0.05, prefill_tps=900.0, decode_tps=80.0,
    decode_seconds=0.5, passes=12, drafted=30, accepted=24, acceptance=0.8, tokens_per_pass=3.3,
    per_position_acceptance=(0.9, 0.8, 0.7), k_history=(4, 4, 3), speedup_estimate=float("nan"),
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[HistoryStore]:
    with HistoryStore(tmp_path / "history.sqlite3") as s:
        yield s


def test_a_chat_from_start_to_end(store: HistoryStore) -> None:
    chat = store.new_chat("Speculation", "Be brief.")
    user = store.add_message(chat, "user", "What is speculative decoding?")
    answer = store.begin_answer(chat, model="/m/target.gguf", drafter="/m/draft.gguf",
                                sampling=SamplingSettings(temperature=0.7))
    assert store.message(answer).status == "streaming"
    assert store.update_answer(answer, "A small model")
    assert store.update_answer(answer, "A small model drafts")
    store.finish_answer(answer, "A small model drafts; the big one verifies.", "complete", STATS)
    assert not store.update_answer(answer, "late flush")  # a finished answer is not overwritten

    [q, a] = store.messages(chat)
    assert (q.id, q.role, q.text, q.status) == (user, "user", "What is speculative decoding?", "complete")
    assert (a.id, a.role, a.status) == (answer, "assistant", "complete")
    assert a.text == "A small model drafts; the big one verifies."
    assert (a.target_model, a.drafter) == ("/m/target.gguf", "/m/draft.gguf")
    assert a.sampling is not None
    assert a.sampling["temperature"] == 0.7
    assert a.stats is not None
    assert a.stats["per_position_acceptance"] == [0.9, 0.8, 0.7]
    assert a.stats["speedup_estimate"] is None  # NaN stored as null: the JSON stays strict
    [summary] = store.list_chats()
    assert (summary.id, summary.title, summary.system_prompt, summary.message_count) == (
        chat, "Speculation", "Be brief.", 2)
    assert store.integrity_ok()


def test_list_chats_most_recent_first(store: HistoryStore) -> None:
    first = store.new_chat("first")
    second = store.new_chat("second")
    assert [c.id for c in store.list_chats()] == [second, first]
    time.sleep(0.01)
    store.add_message(first, "user", "bump")
    assert [c.id for c in store.list_chats()] == [first, second]
    time.sleep(0.01)
    store.rename_chat(second, "renamed")
    assert [c.id for c in store.list_chats()] == [first, second]  # a rename is not activity: no move to the top
    store.set_system_prompt(second, "new prompt")
    assert store.chat(second).title == "renamed"
    assert store.chat(second).system_prompt == "new prompt"


def test_edit_regenerate_and_delete(store: HistoryStore) -> None:
    chat = store.new_chat("t")
    ids = [store.add_message(chat, role, f"m{i}") for i, role in enumerate(["user", "assistant"] * 3)]
    assert store.truncate_after(chat, ids[2]) == 3  # regenerate the answer to the second question
    assert [m.id for m in store.messages(chat)] == ids[:3]
    assert store.truncate_after(chat, ids[2], inclusive=True) == 1  # edit-and-resend the second question
    assert [m.id for m in store.messages(chat)] == ids[:2]
    new = store.add_message(chat, "user", "edited")
    assert new > max(ids)  # ids are never reused: a stale id cannot hit a newer message
    store.delete_message(ids[0])
    assert [m.text for m in store.messages(chat)] == ["m1", "edited"]
    other = store.new_chat("other")
    store.add_message(other, "user", "keep me")
    store.delete_chat(chat)
    assert store.messages(chat) == []
    assert [c.id for c in store.list_chats()] == [other]
    assert store.integrity_ok()


def test_a_deleted_streaming_answer_ignores_late_flushes(store: HistoryStore) -> None:
    chat = store.new_chat("t")
    answer = store.begin_answer(chat)
    store.delete_message(answer)
    assert not store.update_answer(answer, "late")
    with pytest.raises(KeyError):
        store.finish_answer(answer, "late", "complete")


def test_unknown_chat_and_bad_values(store: HistoryStore) -> None:
    with pytest.raises(KeyError, match="no chat 999"):
        store.add_message(999, "user", "hello")
    assert store._conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0  # rolled back
    chat = store.new_chat("t")
    with pytest.raises(ValueError, match="role"):
        store.add_message(chat, "tool", "x")
    with pytest.raises(ValueError, match="status"):
        store.add_message(chat, "user", "x", status="done")
    answer = store.begin_answer(chat)
    with pytest.raises(ValueError, match="status"):
        store.finish_answer(answer, "x", "streaming")


def test_text_that_sqlite_could_not_hold_is_cleaned(store: HistoryStore) -> None:
    chat = store.new_chat("bad\udc80title")
    store.add_message(chat, "user", "a\udc80b\x00c \ud83d\ude00")
    [m] = store.messages(chat)
    assert m.text == "a\ufffdbc 😀"
    assert store.chat(chat).title == "bad\ufffdtitle"


def test_crash_leftover_is_marked_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    store = HistoryStore(path)
    chat = store.new_chat("t")
    store.add_message(chat, "user", "q")
    answer = store.begin_answer(chat)
    store.update_answer(answer, "partial answer")
    store._conn.close()  # no finish_answer: as if the app had died
    with HistoryStore(path) as reopened:
        [_q, a] = reopened.messages(chat)
        assert (a.status, a.text) == ("interrupted", "partial answer")
        assert "interrupted" in reopened.export_markdown(chat)


def test_exports(store: HistoryStore) -> None:
    chat = store.new_chat("Export me", "You are terse.")
    store.add_message(chat, "user", "Hi *there*")
    answer = store.begin_answer(chat, model="/models/t.gguf", drafter="/models/d.gguf")
    store.finish_answer(answer, "Hello.", "cancelled", STATS)
    md = store.export_markdown(chat)
    assert md.startswith("# Export me\n")
    assert "## System\n\nYou are terse.\n" in md
    assert "## User\n\nHi *there*\n" in md
    assert "## Assistant (t.gguf + d.gguf)\n\nHello.\n" in md
    assert "_(stopped by the user)_" in md
    doc = json.loads(store.export_json(chat), parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert doc["format"] == "specdeck-chat"
    assert doc["title"] == "Export me"
    assert [(m["role"], m["content"], m["status"]) for m in doc["messages"]] == [
        ("user", "Hi *there*", "complete"), ("assistant", "Hello.", "cancelled")]
    assert doc["messages"][1]["stats"]["accepted"] == 24
    with pytest.raises(KeyError):
        store.export_json(12345)


def test_pragmas_and_schema(store: HistoryStore) -> None:
    conn = store._conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_default_path_follows_specdeck_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECK_HOME", str(tmp_path))
    with HistoryStore() as s:
        s.new_chat("x")
    assert (tmp_path / "data" / "history.sqlite3").is_file()


def test_other_threads_are_refused(store: HistoryStore) -> None:
    errors: list[BaseException] = []

    def use() -> None:
        try:
            store.list_chats()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=use)
    t.start()
    t.join()
    assert len(errors) == 1
    assert isinstance(errors[0], sqlite3.ProgrammingError)


def test_newer_history_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE future (x)")
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 3}")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StorageError, match="newer SpecDeck"):
        HistoryStore(path)
    assert path.read_bytes() == before


def test_damaged_file_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    junk = b"this is not a database" * 500
    path.write_bytes(junk)
    with HistoryStore(path) as s:
        assert s.warning is not None
        assert "was damaged" in s.warning
        assert s.list_chats() == []
        s.new_chat("fresh")
        [aside] = tmp_path.glob("h.sqlite3.bad-*")
        assert aside.read_bytes() == junk
        assert aside.name in s.warning
    with HistoryStore(path) as s:
        assert s.warning is None
        assert [c.title for c in s.list_chats()] == ["fresh"]


# --- a real crash mid-stream --------------------------------------------------------------------------

_WRITER = textwrap.dedent("""
    import sys, time
    from app.storage.history import HistoryStore
    store = HistoryStore(sys.argv[1])
    chat = store.new_chat("crash test", "system prompt")
    store.add_message(chat, "user", "Tell me a long story.")
    answer = store.begin_answer(chat, model="/m/t.gguf")
    print("ready", chat, answer, flush=True)
    text = ""
    i = 0
    while True:
        i += 1
        text += f"tok{i} "
        store.update_answer(answer, text)
        print("saved", i, flush=True)  # printed only after the commit returned
        time.sleep(0.2)
""")


@pytest.mark.timeout(60)
@pytest.mark.process
def test_sigkill_mid_stream_keeps_all_but_the_last_second(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("ready"), proc.stderr.read() if proc.stderr else first
        _, chat_s, answer_s = first.split()
        last_seen = 0
        deadline = time.monotonic() + 20
        while last_seen < 8 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else "writer ended"
            last_seen = int(line.split()[1])
        seen_at = time.monotonic()
        time.sleep(random.uniform(0.0, 0.2))  # anywhere in the cycle, a commit in flight included
        proc.kill()  # SIGKILL on POSIX, TerminateProcess on Windows: no cleanup runs; __exit__ waits
    elapsed = time.monotonic() - seen_at
    if os.name == "posix":
        assert proc.returncode == -signal.SIGKILL

    with HistoryStore(path) as store:
        assert store.integrity_ok()
        [chat] = store.list_chats()
        assert chat.id == int(chat_s)
        assert (chat.title, chat.system_prompt) == ("crash test", "system prompt")
        question, answer = store.messages(chat.id)
        assert (question.role, question.status) == ("user", "complete")
        assert question.text == "Tell me a long story."
        assert (answer.id, answer.role, answer.status) == (int(answer_s), "assistant", "interrupted")
        saved = answer.text.split()
        assert saved == [f"tok{i}" for i in range(1, len(saved) + 1)]  # a clean prefix, nothing torn
        assert len(saved) >= last_seen  # everything confirmed before the kill is there
        # At 5 flushes a second, at most the last second (plus the kill delay) can be missing.
        assert len(saved) >= last_seen + int(elapsed / 0.2) - 5
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    check.close()


# --- a full disk -------------------------------------------------------------------------------------


def _try_mount_tmpfs(folder: Path, size: str) -> bool:
    if os.name != "posix" or os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True, check=False)
    return done.returncode == 0


def _umount(folder: Path) -> None:
    if subprocess.run(["umount", str(folder)], capture_output=True, check=False).returncode != 0:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)


@pytest.fixture(params=["tmpfs", "page_limit"])
def full_disk_kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """("tmpfs", folder) on a real 512 KiB file system where mounting works, else ("page_limit", folder):
    SQLite's max_page_count gives the same SQLITE_FULL without a mount."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if request.param == "tmpfs" and _try_mount_tmpfs(folder, "512k"):
        try:
            yield "tmpfs", folder
        finally:
            _umount(folder)
    else:
        yield "page_limit", folder


def test_full_disk(full_disk_kind: tuple[str, Path]) -> None:
    kind, folder = full_disk_kind
    path = folder / "history.sqlite3"
    ballast = folder / "ballast"
    store = HistoryStore(path)
    try:
        chat = store.new_chat("fill")
        answer = store.begin_answer(chat)
        assert store.update_answer(answer, "saved before the disk filled")
        if kind == "tmpfs":
            ballast.write_bytes(b"\0" * 96 * 1024)
        else:
            pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
            store._conn.execute(f"PRAGMA max_page_count={pages + 40}")
        saved: list[int] = []

        def fill() -> None:
            for i in range(1000):
                saved.append(store.add_message(chat, "user", f"{i}:{'x' * 8000}"))

        with pytest.raises(StorageError) as info:
            fill()
        message = str(info.value)
        assert message.startswith("Could not save the chat history: the disk is full")
        assert "messages already saved are kept" in message
        assert saved  # some went in before the disk filled
        with pytest.raises(StorageError, match="disk is full"):
            store.update_answer(answer, "y" * 200_000)
        assert store.message(answer).text == "saved before the disk filled"
        assert [m.id for m in store.messages(chat)] == [answer, *saved]
        assert store.integrity_ok()

        # Space comes back: the same store goes on working.
        if kind == "tmpfs":
            ballast.unlink()
        else:
            store._conn.execute("PRAGMA max_page_count=1073741823")
        later = store.add_message(chat, "user", "after space was freed")
        store.finish_answer(answer, "finished after all", "complete")
    finally:
        store.close()
    with HistoryStore(path) as reopened:
        texts = [m.text for m in reopened.messages(chat)]
        assert texts[0] == "finished after all"
        assert len(texts) == len(saved) + 2
        assert reopened.messages(chat)[-1].id == later
        assert reopened.integrity_ok()


# --- damage in the middle of the file, leftovers, other writers (issue 13 §7–9) ---------------------------


def _history_with_chats(path: Path, n_chats: int) -> None:
    with HistoryStore(path) as s:
        for i in range(n_chats):
            chat = s.new_chat(f"chat {i}")
            s.add_message(chat, "user", f"question {i} " + "q" * 1500)
            answer = s.begin_answer(chat)
            s.finish_answer(answer, f"answer {i} " + "a" * 1500)


def _damage_pages(path: Path, first: int, count: int) -> None:
    page = sqlite3.connect(path).execute("PRAGMA page_size").fetchone()[0]
    rng = random.Random(7)
    with path.open("r+b") as fh:
        fh.seek(first * page)
        fh.write(bytes(rng.randrange(256) for _ in range(count * page)))


def test_damage_in_the_middle_is_found_moved_aside_and_salvaged(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    _history_with_chats(path, 60)
    pages = path.stat().st_size // sqlite3.connect(path).execute("PRAGMA page_size").fetchone()[0]
    _damage_pages(path, pages // 2, 3)  # the header and the schema are intact: the file still opens
    damaged = path.read_bytes()
    with HistoryStore(path) as s:
        assert s.warning is not None
        assert "The chat history file was damaged" in s.warning
        match = __import__("re").search(r"(\d+) of (\d+) chats could be read", s.warning)
        assert match is not None, s.warning
        recovered, seen = int(match.group(1)), int(match.group(2))
        assert 0 < recovered <= seen <= 60
        assert recovered < 60 or seen < 60 or len(s.list_chats()) == 60
        chats = s.list_chats()
        assert len(chats) == recovered
        for chat in chats:  # what was recovered reads back whole
            for m in s.messages(chat.id):
                assert m.text.split(" ")[0] in ("question", "answer")
        kept_messages = sum(len(s.messages(chat.id)) for chat in chats)
        assert kept_messages < 120  # the damage hit messages (two per chat): the warning must say so
        assert "Some messages were in the damaged part" in s.warning
        assert s.integrity_ok()
        s.add_message(s.new_chat("after"), "user", "still works")
        [aside] = tmp_path.glob("history.sqlite3.bad-*")
        assert aside.read_bytes() == damaged  # the damaged file is kept as it was
        assert aside.name in s.warning
    with HistoryStore(path) as s:
        assert s.warning is None


_READONLY_SHM = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from app.storage.history import HistoryStore
    path = Path(sys.argv[1]) / "history.sqlite3"
    with HistoryStore(path) as s:
        s.new_chat("before")
    shm = Path(f"{path}-shm")
    shm.write_bytes(bytes(32768))
    shm.chmod(0o444)  # as left behind after the user fixed the database's own permissions
    with HistoryStore(path) as s:
        s.new_chat("after")
        print(len(s.list_chats()), os.access(shm, os.W_OK) or not shm.exists())
""")


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
@pytest.mark.process
def test_a_leftover_read_only_shm_does_not_break_the_history() -> None:
    import pwd
    import tempfile

    # Root writes read-only files anyway: as root, the scenario runs as the unprivileged user "nobody".
    as_user: dict[str, object] = {}
    if os.geteuid() == 0:
        try:
            nobody = pwd.getpwnam("nobody")
        except KeyError:
            pytest.skip("no unprivileged user to run as")
        as_user = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
    folder = Path(tempfile.mkdtemp(prefix="specdeck-shm-"))
    try:
        folder.chmod(0o777)
        done = subprocess.run([sys.executable, "-c", _READONLY_SHM, str(folder)], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/", timeout=60,
                              **as_user)  # type: ignore[call-overload]
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == ["2", "True"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_BUSY_WRITER = textwrap.dedent("""
    import sys, time
    from app.storage.history import HistoryStore
    path, name, rounds, start_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    while time.time() < start_at:  # all writers open the new file at the same moment
        time.sleep(0.001)
    store = HistoryStore(path)
    for i in range(rounds):
        chat = store.new_chat(f"{name} {i}")
        store.add_message(chat, "user", f"{name} question {i}")
        answer = store.begin_answer(chat)
        for j in range(3):
            assert store.update_answer(answer, f"{name} answer {i} " + "x" * j)
        store.finish_answer(answer, f"{name} answer {i}")
    store.close()
    print("done", name, flush=True)
""")


@pytest.mark.timeout(120)
@pytest.mark.process
def test_three_instances_writing_at_once_all_succeed(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    rounds = 40
    start_at = time.time() + 1.0
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = [
        subprocess.Popen([sys.executable, "-c", _BUSY_WRITER, str(path), f"w{n}", str(rounds), str(start_at)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for n in range(3)
    ]
    outputs = [w.communicate(timeout=100) for w in writers]
    for w, (out, err) in zip(writers, outputs, strict=True):
        assert w.returncode == 0, err[-2000:]
        assert out.startswith("done")
    with HistoryStore(path) as s:
        chats = s.list_chats()
        assert len(chats) == 3 * rounds
        for chat in chats:
            name, i = chat.title.split()
            assert [(m.role, m.text, m.status) for m in s.messages(chat.id)] == [
                ("user", f"{name} question {i}", "complete"), ("assistant", f"{name} answer {i}", "complete")]


def test_drafted_spans_are_stored_and_an_old_history_is_migrated(tmp_path: Path) -> None:
    """History version 4 keeps each answer's drafted spans; a version-3 file opens, keeps its messages and
    gives them none; damaged spans are dropped, not trusted."""
    path = tmp_path / "old.sqlite3"
    with HistoryStore(path) as store:
        chat = store.new_chat("c")
        old = store.add_message(chat, "assistant", "before the upgrade")
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE messages DROP COLUMN drafted")
    conn.execute("ALTER TABLE chats DROP COLUMN version_of")
    conn.execute("ALTER TABLE chats DROP COLUMN mode")
    conn.execute("DROP TABLE alternatives")
    conn.execute("PRAGMA user_version=3")
    conn.commit()
    conn.close()
    with HistoryStore(path) as store:
        assert store.message(old).text == "before the upgrade"
        assert store.message(old).drafted == ()
        answer = store.begin_answer(chat)
        store.finish_answer(answer, "copied text", drafted=[(0, 6, "ngram"), (7, 11, "model")])
        assert store.message(answer).drafted == ((0, 6, "ngram"), (7, 11, "model"))
        store._conn.execute("UPDATE messages SET drafted='[[1,\"x\"],[5,2,\"ngram\"],{}]' WHERE id=?", (answer,))
        assert store.message(answer).drafted == ()
        assert store.chat(chat).version_of is None
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
