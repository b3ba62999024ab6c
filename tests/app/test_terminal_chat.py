"""`specdeck chat` end to end (a real worker, a real tiny model, a real pipe): hostile names, refused
prompts, and engine crashes while idle and while answering."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from app.engine.supervisor import MAX_LOAD_CRASHES, gave_up_sentence
from app.engine.template_status import template_status
from app.events import EngineCrashed, Finished
from tests.gguf_fixtures import write_tiny_model

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0
HOSTILE_NAME = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x1b[8mhidden\x1b[0m evil\nloaded; safe model verified\r"
CONTROL = [chr(c) for c in (*range(0, 9), *range(11, 32), 0x7F)]


class Chat:
    """A `specdeck chat` process fed line by line; stdout and stderr are collected as they come."""

    def __init__(self, model: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())", "chat",
             "--target", str(model), "--max-tokens", "8", "--ngram", "0", *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, cwd=REPO,
        )
        self.out: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.stdout = b""
        self.stderr = b""
        self.pumps = [threading.Thread(target=self._pump, args=(name, stream), daemon=True)
                      for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr))]
        for pump in self.pumps:
            pump.start()

    def _pump(self, name: str, stream: object) -> None:
        read = stream.read1  # type: ignore[attr-defined]
        while chunk := read(4096):
            self.out.put((name, chunk))

    def _drain(self, timeout: float) -> None:
        try:
            name, chunk = self.out.get(timeout=timeout)
        except queue.Empty:
            return
        if name == "out":
            self.stdout += chunk
        else:
            self.stderr += chunk

    def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {TIMEOUT:.0f} s; stdout={self.stdout!r} "
                                     f"stderr={self.stderr!r}")
            self._drain(0.1)

    def expect_err(self, text: str) -> None:
        """stderr and stdout are separate pipes: wait for a message rather than assume it came first."""
        self.wait_for(lambda: text.encode() in self.stderr, repr(text))

    def prompts(self) -> int:
        """Prompts shown so far: each starts a line or follows a prompt (an answer may hold "> " itself)."""
        count, at = 0, self.stdout.find(b"> ")
        while at >= 0:
            if at == 0 or self.stdout[at - 1:at] == b"\n" or self.stdout[max(0, at - 2):at] == b"> ":
                count += 1
            at = self.stdout.find(b"> ", at + 2)
        return count

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def ask(self, line: str) -> None:
        """Send a line and wait for the next prompt (the answer, or the error, came first)."""
        before = self.prompts()
        self.send(line)
        self.wait_for(lambda: self.prompts() > before, "next prompt")

    def worker(self) -> psutil.Process:
        [worker] = [p for p in psutil.Process(self.proc.pid).children()
                    if p.is_running() and "spawn_main" in " ".join(p.cmdline())]
        return worker

    def finish(self) -> int:
        if self.proc.poll() is None and self.proc.stdin is not None:
            self.proc.stdin.close()
        code = self.proc.wait(TIMEOUT)
        self.wait_for(lambda: self.out.empty(), "end of output")
        time.sleep(0.2)
        while not self.out.empty():
            self._drain(0.0)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pump in self.pumps:
            pump.join(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def chat_factory() -> Iterator[Callable[..., Chat]]:
    chats: list[Chat] = []

    def make(model: Path, *extra: str) -> Chat:
        chat = Chat(model, *extra)
        chats.append(chat)
        chat.wait_for(lambda: chat.prompts() >= 1, "first prompt")
        return chat

    yield make
    for chat in chats:
        chat.close()


def test_hostile_metadata_cannot_drive_the_terminal(tmp_path: Path, chat_factory: Callable[..., Chat]) -> None:
    model = write_tiny_model(tmp_path / "evil.gguf", name=HOSTILE_NAME)
    chat = chat_factory(model)
    chat.ask("hello")
    assert chat.finish() == 0
    err = chat.stderr.decode()
    [loaded] = [line for line in err.splitlines() if "loaded; empty line" in line]
    assert "\\x1b]52;c;" in loaded  # shown, visibly escaped
    assert "evil\\nloaded; safe model verified\\r" in loaded  # no line of its own
    for text in (err, chat.stdout.decode(errors="replace")):
        assert not [c for c in text if c in CONTROL and c not in "\n\t"]


def test_a_too_long_prompt_is_refused_and_later_turns_work(tiny_target: Path,
                                                           chat_factory: Callable[..., Chat]) -> None:
    chat = chat_factory(tiny_target, "--ctx", "256")
    chat.ask("x " * 2000)
    chat.expect_err("the context holds")
    errors_before = chat.stderr.count(b"specdeck chat:")
    chat.ask("hi")  # the refused message was dropped: this one fits and is answered
    assert chat.stderr.count(b"specdeck chat:") == errors_before
    assert chat.finish() == 0


def test_a_context_below_256_is_raised_with_a_note(tiny_target: Path, chat_factory: Callable[..., Chat]) -> None:
    chat = chat_factory(tiny_target, "--ctx", "100")
    assert chat.finish() == 0
    assert b"The context was raised from the 100 tokens asked for to 256" in chat.stderr


def test_a_crash_while_idle_is_reported_and_the_engine_comes_back(tiny_target: Path,
                                                                  chat_factory: Callable[..., Chat]) -> None:
    chat = chat_factory(tiny_target)
    chat.ask("hello")
    first = chat.worker()
    first.kill()
    time.sleep(2.0)  # the crash happens while the chat waits for input (its threads take a moment to end)
    chat.ask("again")
    chat.expect_err("Restarting the engine")
    assert "was killed by SIGKILL while idle" in chat.stderr.decode()
    assert chat.worker().pid != first.pid
    assert chat.prompts() == 3
    assert chat.finish() == 0


def test_a_crash_while_answering_restarts_and_advice_fits_the_build(tiny_target: Path,
                                                                    chat_factory: Callable[..., Chat]) -> None:
    chat = chat_factory(tiny_target)
    worker = chat.worker()
    worker.suspend()  # the answer cannot start before the kill: a crash "while generating", every time
    before = chat.prompts()
    chat.send("hello")
    time.sleep(0.5)
    worker.kill()
    chat.wait_for(lambda: chat.prompts() > before, "prompt after the crash")
    chat.expect_err("send it again")
    err = chat.stderr.decode()
    assert "while generating" in err
    assert "GPU" not in err  # a CPU build: no advice about GPU layers or GPU memory
    assert "send it again" in err
    chat.ask("hello again")  # answered by the restarted engine
    assert chat.finish() == 0


@pytest.mark.process
def test_the_partial_answer_is_kept_marked_as_cut(tiny_target: Path) -> None:
    from app.cli.chat import CUT_MARK, TerminalChat
    from app.engine.client import EngineClient
    from app.params import DraftSettings, LoadSettings, SamplingSettings

    settings = LoadSettings(str(tiny_target), DraftSettings(), n_ctx=512, n_batch=64, n_threads=1)
    client = EngineClient()
    client.start()
    chat = TerminalChat(client, settings, SamplingSettings(max_tokens=400), stats=False)
    written: list[str] = []

    class KillOnFirstToken:
        def write(self, text: str) -> int:
            if not written and client.pid is not None:
                os.kill(client.pid, signal.SIGKILL)
            written.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    try:
        assert chat.load()
        real_stdout, sys.stdout = sys.stdout, KillOnFirstToken()  # type: ignore[assignment]
        try:
            assert chat.ask("tell me a story")
        finally:
            sys.stdout = real_stdout
        assert "".join(written).count(CUT_MARK) == 1
        user, cut = chat.messages
        assert user == {"role": "user", "content": "tell me a story"}
        assert cut["role"] == "assistant"
        assert cut["content"]  # the partial answer stays in the conversation
        assert CUT_MARK not in cut["content"]  # the mark is for the reader, not sent to the model
        assert chat.ask("and then?")  # the restarted engine answers with the cut answer in context
        assert chat.messages[-1]["role"] == "assistant"
    finally:
        client.close()


def test_an_engine_that_cannot_come_back_exits_non_zero(tmp_path: Path, tiny_target: Path,
                                                        chat_factory: Callable[..., Chat]) -> None:
    model = tmp_path / "moved-away.gguf"
    shutil.copy(tiny_target, model)
    chat = chat_factory(model)
    model.unlink()  # the reload after the crash cannot find the model
    chat.worker().kill()
    chat.send("hello")
    code = chat.finish()
    assert code == 3
    assert b"could not be restarted" in chat.stderr


def test_template_status_for_doctor(tmp_path: Path) -> None:
    fine = template_status(write_tiny_model(tmp_path / "fine.gguf"))
    assert fine.ok
    assert fine.message == "The model's chat template renders correctly."
    missing = template_status(write_tiny_model(tmp_path / "none.gguf", chat_template=None))
    assert (missing.ok, missing.fallback) == (False, "plain ChatML")
    assert missing.message == "The model has no chat template; SpecDeck answers with the plain ChatML format."
    hostile = template_status(write_tiny_model(tmp_path / "hostile.gguf",
                                               chat_template="{{ ''.__class__.__mro__ }}"))
    assert not hostile.ok
    assert hostile.message.startswith("The model's chat template is refused: The model's chat template tried to "
                                      "reach Python internals")
    assert hostile.message.endswith("Answering with the plain ChatML format instead.")


@pytest.mark.process
def test_a_refused_template_is_announced_before_the_answer(tmp_path: Path) -> None:
    from app.engine.client import EngineClient
    from app.events import PromptProcessed
    from app.params import DraftSettings, LoadSettings, SamplingSettings

    model = write_tiny_model(tmp_path / "hang.gguf", chat_template=(
        "{% set a=[0]*4000000 %}{% set b=[a]*4000000 %}{% set c=[0]*3999999+[1] %}{{ c in b }}"))
    client = EngineClient()
    try:
        client.load(LoadSettings(str(model), DraftSettings(), n_ctx=256, n_batch=64, n_threads=1))
        list(client.events(TIMEOUT))
        for _ in range(2):  # the second message does not wait for the deadline again
            started = time.monotonic()
            client.generate([{"role": "user", "content": "hi"}], SamplingSettings(max_tokens=4))
            events = list(client.events(TIMEOUT))
            assert not any(isinstance(e, EngineCrashed) for e in events)
            assert isinstance(events[-1], Finished)
            [processed] = [e for e in events if isinstance(e, PromptProcessed)]
            assert processed.warning is not None
            assert "spent more than 2 s of CPU time rendering and was stopped" in processed.warning
            assert processed.warning.endswith("Answering with the plain ChatML format instead.")
            assert time.monotonic() - started < 30.0  # not the 120 s watchdog, and no crash
    finally:
        client.close()


def test_a_model_that_crashes_every_reload_is_given_up_after_the_supervisors_limit(
        tmp_path: Path, tiny_target: Path, chat_factory: Callable[..., Chat]) -> None:
    model = tmp_path / "turns-bad.gguf"
    shutil.copy(tiny_target, model)
    chat = chat_factory(model)
    # The file becomes a model that aborts llama.cpp as its load is timed: every reload crashes the worker.
    write_tiny_model(tmp_path / "aborts.gguf", name="aborts", aborting=True).replace(model)
    chat.worker().kill()
    chat.send("hello")
    code = chat.finish()
    assert code == 3
    err = chat.stderr.decode()
    assert err.count("Restarting the engine and reloading the model") == MAX_LOAD_CRASHES
    assert gave_up_sentence(MAX_LOAD_CRASHES) in err
