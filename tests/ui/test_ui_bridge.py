"""The bridge without a real worker: token coalescing, typed signals, and the automatic-restart rule."""

from __future__ import annotations

from collections import deque
from typing import Any

from pytestqt.qtbot import QtBot

from app.engine.supervisor import MAX_LOAD_CRASHES
from app.events import EngineCrashed, Finished, MessageStats, PassStats, Token
from app.params import LoadSettings
from ui.bridge import EngineBridge
from ui.event_pump import coalesce


def _stats(request_id: int) -> PassStats:
    return PassStats(request_id, 0.0, 0.0, 0.0, 0, 0, (), 1, 0, 0, 10, 0, 1)


def test_tokens_of_one_request_are_merged_across_pass_stats() -> None:
    a = Token(1, "he", (1,), ("target",), ("he",))
    b = Token(1, "llo", (2, 3), ("ngram", "model"), ("l", "lo"))
    c = Token(1, "!", (4,), ("target",), ("!",))
    s1, s2 = _stats(1), _stats(1)
    done = Finished(1, "eog", MessageStats(0, 0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0.0, 0.0, (), (), 1.0), "")
    merged = coalesce([a, s1, b, s2, done, c])
    assert merged[0] == Token(1, "hello", (1, 2, 3), ("target", "ngram", "model"), ("he", "l", "lo"))
    assert merged[1:] == [s1, s2, done, c]  # nothing moves past Finished


class CrashingClient:
    """Stands in for EngineClient: every load ends in a crash during load."""

    def __init__(self) -> None:
        self.state = "stopped"
        self.crashes_on_load = 0
        self.pid = 4242
        self.calls: list[str] = []
        self.events: deque[Any] = deque()

    def start(self) -> None:
        self.calls.append("start")
        self.state = "idle"

    def restart(self) -> None:
        self.calls.append("restart")
        self.state = "idle"

    def load(self, settings: LoadSettings) -> None:
        self.calls.append("load")
        self.state = "load"
        self.events.append("crash")

    def poll(self, timeout: float | None = 0.0) -> Any:
        if not self.events:
            return None
        self.events.popleft()
        self.crashes_on_load += 1
        self.state = "stopped"
        return EngineCrashed(None, "SIGABRT", "load", ("ggml assert",), "The engine was killed by SIGABRT.")

    def close(self) -> None:
        self.calls.append("close")
        self.state = "stopped"


def test_automatic_restart_stops_after_three_crashes_during_load(qtbot: QtBot, tmp_path: Any) -> None:
    client = CrashingClient()
    bridge = EngineBridge(client)  # type: ignore[arg-type]
    crashes: list[EngineCrashed] = []
    bridge.engine_crashed.connect(crashes.append)
    bridge.start()
    try:
        bridge.load(LoadSettings(str(tmp_path / "model.gguf"), n_threads=1))
        qtbot.waitUntil(lambda: len(crashes) >= MAX_LOAD_CRASHES, timeout=10_000)
        qtbot.wait(300)  # no fourth attempt follows
        assert len(crashes) == MAX_LOAD_CRASHES
        assert client.calls.count("load") == MAX_LOAD_CRASHES
        assert bridge.crashes_on_load == MAX_LOAD_CRASHES
        assert all(c.signal_name == "SIGABRT" for c in crashes)
    finally:
        bridge.close()
    assert client.calls[-1] == "close"


class SlowLoadClient(CrashingClient):
    """A load that never finishes, as a huge model on a slow disk."""

    def load(self, settings: LoadSettings) -> None:
        self.calls.append("load")
        self.state = "load"

    def kill(self) -> None:
        self.calls.append("kill")
        self.state = "stopped"

    def poll(self, timeout: float | None = 0.0) -> Any:
        return None


def test_cancel_load_ends_the_worker_and_starts_a_fresh_one(qtbot: QtBot, tmp_path: Any) -> None:
    client = SlowLoadClient()
    bridge = EngineBridge(client)  # type: ignore[arg-type]
    bridge.start()
    try:
        bridge.load(LoadSettings(str(tmp_path / "model.gguf"), n_threads=1))
        qtbot.waitUntil(lambda: client.state == "load", timeout=5_000)
        with qtbot.waitSignal(bridge.load_cancelled, timeout=5_000):
            bridge.cancel_load()
        assert client.calls[-3:] == ["load", "kill", "start"]
        assert client.state == "idle"
    finally:
        bridge.close()


def test_unexpected_errors_from_threads_reach_the_notifier(qtbot: QtBot) -> None:
    import threading

    from ui.notifier import Notifier

    notifier = Notifier(modal=False)
    notifier.install_hooks()
    try:
        def boom() -> None:
            raise RuntimeError("worker exploded")

        with qtbot.waitSignal(notifier.message_shown, timeout=5_000) as shown:
            thread = threading.Thread(target=boom)
            thread.start()
            thread.join()
        assert "worker exploded" in shown.args[0]
        assert "Your chat is safe" in shown.args[0]
    finally:
        notifier.uninstall_hooks()
