"""Drive the real window from a script: load a model, send prompts, save a screenshot, quit.

Set ``SPECDECK_AUTOPILOT`` to a JSON object before starting ``specdeck``::

    {"target": PATH, "drafter": PATH | null, "ngram": 3, "threads": 0, "n_ctx": 4096,
     "prompts": ["..."], "max_tokens": 256, "screenshot": PATH | null,
     "report": PATH | null, "quit": true, "hide_dashboard": false, "window_size": [W, H] | null,
     "duration_s": null, "new_chat_every": null, "load": true, "highlight": false, "serve": false,
     "after": null}

``duration_s``: stop sending prompts once this many seconds have passed (the soak script); ``new_chat_every``:
start a new chat every N prompts, so a long run never outgrows the context. ``load``: false takes the
screenshot of the window as a fresh start shows it (the target chosen, nothing loaded; ``ngram`` and
``drafter`` are then left at the window's defaults). ``highlight``: tint drafted tokens. ``serve``: serve the loaded
model (Model → Serve), watch it in the Remote engine dock and send the prompts through it. ``after``: before the
screenshot, "reopen" opens another chat and the first one again (a reopened chat, as a later start shows it);
"message_menu" opens the newest answer's message menu (the screenshot is then the screen's, menu included).
The report then also holds what was sent, the event loop's worst lateness (a 20 ms timer's) and the GUI
thread's stacks behind each late tick (``ui/soak/stall_watch.py``), for the soak's checks.

Used by the screenshot script, the crash-safety test and the dashboard-cost measurement. Progress lines
go to stdout (``autopilot: ...``) so a parent process can follow the stream.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Slot
from PySide6.QtGui import QGuiApplication, QTextCursor
from PySide6.QtWidgets import QMenu

from app.events import EngineCrashed, EngineError, Finished, Loaded, Token
from ui.main_window import MainWindow
from ui.soak import AUTOPILOT_ENV
from ui.soak.stall_watch import StallWatch


def say(line: str) -> None:
    print(f"autopilot: {line}", flush=True)


class Autopilot(QObject):
    def __init__(self, window: MainWindow, spec: dict[str, Any]) -> None:
        super().__init__(window)
        self.window = window
        self.spec = spec
        self.prompts: list[str] = list(spec.get("prompts", []))
        self.results: list[dict[str, Any]] = []
        self.chars = 0
        self._folder_added = False
        self._cpu0, self._wall0 = 0.0, 0.0
        self.sent: list[str] = []
        self._dock_waited = False
        self._after_done = False
        self._menu: QMenu | None = None
        self.started = time.monotonic()
        self.first_loaded_at: float | None = None  # wall clock: stalls before it are the window's start
        self._ticks_before_load = 0
        self.lags: list[float] = []  # seconds the 20 ms timer fired late, for the soak's freeze check
        self._tick = time.monotonic()
        # The soak asks why the loop was late: the GUI thread's stack, sampled while it stalls.
        self.stall_watch = StallWatch() if spec.get("duration_s") is not None else None
        self._lag_timer = QTimer(self)
        self._lag_timer.timeout.connect(self._on_lag_timer_timeout)
        self._lag_timer.start(20)
        bridge = window.bridge
        bridge.model_loaded.connect(self._on_bridge_model_loaded)
        bridge.token_received.connect(self._on_bridge_token_received)
        bridge.generation_finished.connect(self._on_bridge_generation_finished)
        bridge.engine_error.connect(self._on_bridge_engine_error)
        bridge.engine_crashed.connect(self._on_bridge_engine_crashed)
        if spec.get("hide_dashboard"):
            window.dashboard_dock.hide()
        size = spec.get("window_size")
        if size:
            window.resize(int(size[0]), int(size[1]))
        QTimer.singleShot(0, self._load)

    def _load(self) -> None:
        """Pick the model in the picker and press Load, as a user would (once the library scan is in)."""
        picker = self.window.picker
        if not picker.entries:
            picker.library_changed.connect(self._on_picker_library_changed)
            return
        spec = self.spec
        form = self.window.sampling_form
        if "max_tokens" in spec:
            form.set_settings(replace(form.settings(), max_tokens=int(spec["max_tokens"])))
        target = str(spec["target"])
        fresh = not spec.get("load", True)
        if fresh and (picker.select_target(target) or picker.target_path() == target):
            picker.drafters_ranked.connect(self._on_picker_drafters_ranked_fresh)
            if picker._report_for == target:
                self._on_picker_drafters_ranked_fresh()
            return
        if not picker.select_target(target):
            if self._folder_added:
                say(f"load refused: {target} is not in the library even after adding its folder")
                self.window.close()
                return
            say(f"{target} is not in the library; adding its folder")
            self._folder_added = True
            picker.library_changed.connect(self._on_picker_library_changed)  # then try again
            picker.add_folder(str(Path(target).parent))
            return
        self.window.chat.highlight_check.setChecked(bool(spec.get("highlight")))
        if spec.get("drafter"):
            picker.select_drafter(str(spec["drafter"]))
        ngram = int(spec.get("ngram", 3))
        picker.ngram_check.setChecked(ngram > 0)
        if ngram > 0:
            picker.ngram_spin.setValue(ngram)
        picker.load_box.threads_spin.setValue(int(spec.get("threads", 0)))
        picker.load_box.ctx_spin.setValue(int(spec.get("n_ctx", 4096)))
        say(f"loading {target}")
        if not picker.request_load():
            say(f"load refused: {picker.load_box.status_label.text()}")
            self.window.close()

    @Slot()
    def _on_picker_drafters_ranked_fresh(self) -> None:
        """A fresh start, as the user first sees it: the choice made, nothing loaded."""
        self.window.picker.drafters_ranked.disconnect(self._on_picker_drafters_ranked_fresh)
        say("fresh start shown")
        QTimer.singleShot(500, self._finish)

    @Slot(list)
    def _on_picker_library_changed(self, _entries: list[object]) -> None:
        self.window.picker.library_changed.disconnect(self._on_picker_library_changed)
        QTimer.singleShot(0, self._load)

    @Slot(Loaded)
    def _on_bridge_model_loaded(self, event: Loaded) -> None:
        say(f"loaded {event.target.name}")
        if self.first_loaded_at is None:
            self.first_loaded_at = time.time()
            self._ticks_before_load = len(self.lags)
        if self.spec.get("serve") and self.window.remote.route is None:
            self.window.remote.serve_action.setChecked(True)
            QTimer.singleShot(500, self._use_server)
            return
        self._next()

    def _use_server(self) -> None:
        """Once the dock watches the served model, choose it in the picker so the chat goes through it."""
        remote = self.window.remote
        models = self.window.picker.remote_models
        server = remote.switch.server
        if remote.dashboard.info is None or not models or server is None or server.runner.state != "ready":
            QTimer.singleShot(500, self._use_server)
            return
        self.window.picker.select_remote(models[0])
        route = remote.route
        if route is None:
            say("the served model could not be chosen")
            self._finish()
            return
        route.token_received.connect(self._on_bridge_token_received)
        route.generation_finished.connect(self._on_bridge_generation_finished)
        say(f"answering through {models[0].base_url}")
        QTimer.singleShot(300, self._next)

    @Slot()
    def _on_lag_timer_timeout(self) -> None:
        now = time.monotonic()
        self.lags.append(max(0.0, now - self._tick - 0.020))
        self._tick = now
        if self.stall_watch is not None:
            self.stall_watch.beat()

    def _next(self) -> None:
        duration = self.spec.get("duration_s")
        if not self.prompts or (duration is not None and time.monotonic() - self.started > float(duration)):
            self._finish()
            return
        if self.window.chat.generating:
            return  # a reload after a crash while answering: the answer's end sends the next prompt
        self.chars = 0
        self._cpu0, self._wall0 = time.process_time(), time.monotonic()
        every = self.spec.get("new_chat_every")
        if every and self.sent and len(self.sent) % int(every) == 0:
            self.window.chat.new_chat()
        prompt = self.prompts.pop(0)
        say(f"sending {len(prompt)} chars")
        if self.window.chat.send(prompt):
            self.sent.append(prompt)
        else:
            QTimer.singleShot(1000, self._next)  # refused (reloading, say): try again shortly

    @Slot(Token)
    def _on_bridge_token_received(self, event: Token) -> None:
        self.chars += len(event.text)
        say(f"streamed {self.chars} chars at {time.time():.3f}")

    @Slot(Finished)
    def _on_bridge_generation_finished(self, event: Finished) -> None:
        s = event.stats
        # CPU the window's own process used while answering: what the GUI takes from the engine.
        gui_cpu = (time.process_time() - self._cpu0) / max(time.monotonic() - self._wall0, 1e-9)
        self.results.append({"reason": event.reason, "tokens": s.completion_tokens, "decode_tps": s.decode_tps,
                             "acceptance": s.acceptance, "tokens_per_pass": s.tokens_per_pass,
                             "gui_cpu_share": gui_cpu})
        say(f"finished {event.reason}: {s.completion_tokens} tokens, {s.decode_tps:.1f} tok/s, "
            f"window process CPU {100 * gui_cpu:.0f} % of a core")
        QTimer.singleShot(300, self._next)  # let the last paint land before the next prompt or the screenshot

    @Slot(EngineError)
    def _on_bridge_engine_error(self, event: EngineError) -> None:
        say(f"error: {event.message}")

    @Slot(EngineCrashed)
    def _on_bridge_engine_crashed(self, event: EngineCrashed) -> None:
        say(f"engine crashed: {event.message}")

    def _finish(self) -> None:
        if self.spec.get("serve") and not self._dock_waited:
            self._dock_waited = True  # the dock reads the server once a second: its figures of the answer
            QTimer.singleShot(2500, self._finish)
            return
        after = self.spec.get("after")
        if after and not self._after_done:
            self._after_done = True
            self._before_screenshot(str(after))
            QTimer.singleShot(800, self._finish)
            return
        shot = self.spec.get("screenshot")
        if shot:
            if self._menu is not None:  # a popup is a window of its own: the screen holds both
                screen = QGuiApplication.primaryScreen()
                screen.grabWindow(0).save(str(shot))
                self._menu.close()
            else:
                self.window.grab().save(str(shot))
            say(f"screenshot {shot}")
        report = self.spec.get("report")
        if report:
            self._lag_timer.stop()
            lags = sorted(self.lags)
            doc: Any = self.results
            if self.spec.get("duration_s") is not None:
                doc = {"results": self.results, "sent": self.sent, "ticks": len(lags),
                       "max_lag_s": lags[-1] if lags else 0.0,
                       "p99_lag_s": lags[int(0.99 * (len(lags) - 1))] if lags else 0.0,
                       "lags_over_100ms": sum(1 for lag in lags if lag > 0.1),
                       "first_loaded_at": self.first_loaded_at,
                       "max_lag_after_load_s": max(self.lags[self._ticks_before_load:], default=0.0)}
                if self.stall_watch is not None:
                    self.stall_watch.stop()
                    doc["stall_watch"] = self.stall_watch.report()
            with open(report, "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=2)
        if self.spec.get("quit", True):
            say("quitting")
            self.window.close()


    def _before_screenshot(self, after: str) -> None:
        chat = self.window.chat
        if after == "reopen" and chat.chat_id is not None:
            first = chat.chat_id
            chat.new_chat()
            chat.open_chat(first)
            say("reopened the chat")
        elif after == "message_menu":
            answers = [i for i, m in enumerate(chat.messages) if m.role == "assistant"]
            if not answers:
                return
            view = chat.view
            cursor = QTextCursor(view.document())
            cursor.setPosition(view.message_position(answers[-1]))
            view.setTextCursor(cursor)
            view.ensureCursorVisible()
            rect = view.cursorRect(cursor)
            self._menu = view.message_menu(answers[-1])
            self._menu.popup(view.viewport().mapToGlobal(rect.center()))
            say("message menu open")


def start_if_requested(window: MainWindow) -> Autopilot | None:
    raw = os.environ.get(AUTOPILOT_ENV)
    if not raw:
        return None
    try:
        spec = json.loads(raw)
        if not isinstance(spec, dict) or "target" not in spec:
            raise ValueError("it needs an object with a target")
    except ValueError as exc:
        print(f"{AUTOPILOT_ENV} is not usable: {exc}", file=sys.stderr)
        return None
    return Autopilot(window, spec)
