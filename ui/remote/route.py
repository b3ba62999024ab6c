"""The chat's engine when the picker's model is a remote server's: the same requests and signals as the
local ``EngineBridge`` (what ``ChatPanel`` uses), answered through the server's ``/v1/chat/completions``
(``/v1/completions`` in completion mode).

Each answer streams on its own thread; events are queued and emitted on the GUI thread by a ~30 Hz timer,
tokens merged as the local bridge merges them. Stop closes the stream at its next chunk (the server sees a
client that went away) and the answer ends "cancelled" with the server's last figures; a server that sends
nothing more within ``CANCEL_GRACE_MS`` ends it as an error, the text so far kept.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.engine.chat_template import completion_text
from app.errors import AppError
from app.events import (
    EngineCrashed,
    EngineError,
    Finished,
    Loaded,
    ModelSummary,
    PromptProcessed,
    PromptProgress,
    Token,
)
from app.params import SamplingSettings
from app.remote.client import RemoteEngine, RemoteModel, sampling_options
from ui.event_pump import EventPump

CANCEL_GRACE_MS = 3000
FIRST_REQUEST_ID = 1 << 30  # far from the local worker's ids, and within the 32-bit int a Qt signal carries


def remote_summary(model: RemoteModel, n_ctx: int | None) -> Loaded:
    """What the chat records as the answer's writer: the server's model, named with where it runs."""
    target = ModelSummary(path=f"{model.name} (remote, {model.where})", name=model.name, architecture="remote",
                          n_params=0, size_bytes=0, n_ctx_train=n_ctx or 0, n_layer=0, n_vocab=0)
    return Loaded(target=target, drafter=None, ngram=0, n_ctx=n_ctx or 0, backend="remote", gpu_offload=False,
                  kv_bytes_per_token=0, kv_bytes_total=0, load_seconds=0.0)


class RemoteChat(QObject):
    """One connected server's model as the chat's engine. Create and use on the GUI thread."""

    generation_started = Signal(int)
    prompt_progress = Signal(PromptProgress)  # never emitted: the API streams no prompt progress
    prompt_processed = Signal(PromptProcessed)  # when the server's per-chunk timings give its prompt figures
    token_received = Signal(Token)
    generation_finished = Signal(Finished)
    engine_error = Signal(EngineError)
    engine_crashed = Signal(EngineCrashed)  # never emitted: a server that dies is an error of the answer

    def __init__(self, model: RemoteModel, api_key: str | None, n_ctx: int | None = None,
                 parent: QObject | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.loaded: Loaded | None = remote_summary(model, n_ctx)
        self.generating = False
        self._engine = RemoteEngine(model.base_url, api_key, headers=headers)
        self._ids = itertools.count(FIRST_REQUEST_ID)
        self._current: int | None = None
        self._cancelled: set[int] = set()
        self._threads: list[threading.Thread] = []
        self._pump = EventPump(self._emit, self)  # the answer's thread → GUI thread, as the engine bridge's

    # --- requests (GUI thread) ----------------------------------------------------------------------

    def generate(self, messages: list[dict[str, str]], sampling: SamplingSettings, *,
                 continue_answer: bool = False, raw: bool = False) -> None:
        """As ``EngineBridge.generate``; raises AppError at once for what a server cannot do."""
        sampling.validate()
        if continue_answer and not raw:
            raise AppError("A remote model cannot go on from a cut answer: the OpenAI API has no request for "
                           "it. Ask again with a larger Max tokens.")
        request_id = next(self._ids)
        self._current = request_id
        self.generating = True
        thread = threading.Thread(target=self._run, args=(request_id, list(messages), sampling, raw),
                                  name="specdeck-remote-chat", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        self._push(request_id)  # started
        thread.start()
        self._pump.start()

    def cancel(self) -> None:
        """Stop the answer: its stream is closed at the next chunk, and it ends "cancelled"."""
        request_id = self._current
        if request_id is None or request_id in self._cancelled:
            return
        self._cancelled.add(request_id)
        QTimer.singleShot(CANCEL_GRACE_MS, lambda: self._give_up(request_id))

    def _give_up(self, request_id: int) -> None:
        if request_id == self._current:  # nothing came from the server since Stop
            self.drain()
        if request_id == self._current:
            self._emit(EngineError(f"{self.model.where} sent nothing for {CANCEL_GRACE_MS // 1000} s after Stop; "
                                   "the answer ends here, with the text that arrived.",
                                   request_id=request_id, kind="remote"))

    def close(self, timeout: float = 5.0) -> None:
        """Stop the answer (if any) and wait for its thread; safe to call twice."""
        if self._current is not None:
            self._cancelled.add(self._current)
        for thread in self._threads:
            thread.join(timeout)
        self._pump.stop()
        self._engine.close()

    # --- answer thread ------------------------------------------------------------------------------

    def _run(self, request_id: int, messages: list[dict[str, str]], sampling: SamplingSettings, raw: bool) -> None:
        common: dict[str, Any] = {"model": self.model.model, "max_tokens": sampling.max_tokens,
                                  "temperature": sampling.temperature, "request_id": request_id,
                                  "options": sampling_options(sampling),
                                  "cancelled": lambda: request_id in self._cancelled}
        if raw:  # the same prompt the local engine's completion mode reads: the turns' texts joined
            prompt = completion_text(messages)
            answer = self._engine.complete(prompt, **common)
        else:
            answer = self._engine.chat(messages, **common)
        try:
            for event in answer:
                self._push(event)
        except AppError as exc:
            self._push(EngineError(str(exc), request_id=request_id, kind="remote"))
        except Exception as exc:  # a bug must end the answer with a message, never leave it waiting
            self._push(EngineError(f"The remote answer failed: {type(exc).__name__}: {exc}", request_id=request_id,
                                   kind="remote"))
        finally:
            answer.close()

    def _push(self, item: Any) -> None:
        self._pump.push(item)

    # --- GUI thread ---------------------------------------------------------------------------------

    def drain(self) -> None:
        self._pump.drain()

    def _emit(self, item: Any) -> None:
        request_id = item if isinstance(item, int) else getattr(item, "request_id", None)
        if request_id != self._current:
            return  # an answer already ended (stopped): its late events are not the chat's any more
        if isinstance(item, int):
            self.generation_started.emit(item)
        elif isinstance(item, Token):
            self.token_received.emit(item)
        elif isinstance(item, PromptProcessed):
            self.prompt_processed.emit(item)
        elif isinstance(item, Finished | EngineError):
            self._current = None
            self.generating = False
            self._pump.stop()
            if isinstance(item, Finished):
                self.generation_finished.emit(item)
            else:
                self.engine_error.emit(item)
