"""The answer being written: asked of the engine, streamed into the transcript, saved at least once a second
and when it ends (with why it ended). A chat that no longer fits the context is asked again without its
oldest turns, or stopped with a new chat offered, as the overflow policy says.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer, SignalInstance, Slot

from app.engine.stops import StopCut
from app.errors import AppError
from app.events import (
    EngineCrashed,
    EngineError,
    Finished,
    MessageStats,
    PromptProcessed,
    PromptProgress,
    Token,
    continued_stats,
    drafted_by,
    drafted_spans,
    message_stats,
)
from app.params import SamplingSettings
from ui.chat.engine import ChatEngine
from ui.chat.message import ChatMessage

if TYPE_CHECKING:
    from ui.chat.panel import ChatPanel

FLUSH_INTERVAL_MS = 500  # well inside the one-second promise
FINAL_STATUS = {"cancelled": "cancelled", "error": "error"}


def _first_kept(turns: list[ChatMessage], left_out: int) -> int:
    """Where the turns the model reads begin once the ``left_out`` oldest questions (with their answers) are
    left out; the last question always stays."""
    starts = [i for i, m in enumerate(turns) if m.role == "user"]
    return starts[min(left_out, len(starts) - 1)] if left_out and starts else 0


class AnswerWriter(QObject):
    """The panel's answer in progress (one at a time); the panel holds the chat, its widgets and its history."""

    def __init__(self, panel: ChatPanel) -> None:
        super().__init__(panel)
        self.panel = panel
        self.answer: ChatMessage | None = None
        self._request_id: int | None = None
        self._awaiting_start = False
        self._left_out = 0  # turns (question and answer) left out of the prompt to fit the context
        # The first answer of a chat continued from one that outgrew the context: its carried turns are left
        # out, oldest first, until the prompt fits, and the chat keeps the ones the model read.
        self.carrying = False
        self._request: tuple[SamplingSettings, bool] | None = None  # the answer's sampling and "continue"
        self._cut = StopCut(())  # the request's stop strings, matched here for either engine
        self.overflowed_request: int | None = None  # the request whose "too long" the chat reported itself
        self._resumed_text = ""  # Continue: the partial answer the engine goes on from
        self._resumed_stats: MessageStats | None = None  # and its figures, which the footer adds to
        self._dirty = False
        self._last_flush = 0.0
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(FLUSH_INTERVAL_MS)
        self._flush_timer.timeout.connect(self._on_flush_timer_timeout)

    def engine_links(self, engine: ChatEngine) -> tuple[tuple[SignalInstance, Callable[..., None]], ...]:
        """Each of the engine's signals the chat listens to, with the slot it goes to."""
        return (
            (engine.generation_started, self._on_bridge_generation_started),
            (engine.token_received, self._on_bridge_token_received),
            (engine.prompt_progress, self._on_bridge_prompt_progress),
            (engine.prompt_processed, self._on_bridge_prompt_processed),
            (engine.generation_finished, self._on_bridge_generation_finished),
            (engine.engine_error, self._on_bridge_engine_error),
            (engine.engine_crashed, self._on_bridge_engine_crashed),
        )

    def engine_messages(self) -> list[dict[str, str]]:
        panel = self.panel
        out = []
        if panel.system_prompt.text().strip():
            out.append({"role": "system", "content": panel.system_prompt.text().strip()})
        turns = [m for m in panel.messages if m.role in ("user", "assistant")]
        out += [{"role": m.role, "content": m.text} for m in turns[_first_kept(turns, self._left_out):]]
        return out

    def _can_leave_out_more(self) -> bool:
        return sum(1 for m in self.panel.messages if m.role == "user") - 1 > self._left_out

    def start(self, sampling: SamplingSettings, resume: ChatMessage | None = None) -> None:
        """Start an answer; ``resume``: an answer cut at Max tokens, which the engine goes on from, in the
        same message (and the same stored answer)."""
        panel = self.panel
        panel.message_actions.commit_edit()  # Regenerate or Continue after Edit last: the chat shown is the chat
        panel.message_actions.commit_message_delete()
        loaded = panel.bridge.loaded
        if resume is not None:
            answer = resume
            answer.status = "streaming"
            messages = [*self.engine_messages(), {"role": "assistant", "content": resume.text}]
        else:
            answer = ChatMessage("assistant", "", "streaming",
                                 model=loaded.target.path if loaded else None,
                                 drafter=drafted_by(loaded) if loaded else None)
            messages = self.engine_messages()
        if resume is None and panel.chat_id is not None:
            answer.store_id = panel.history.begin_answer(panel.chat_id,
                                                         model=loaded.target.path if loaded else None,
                                                         drafter=answer.drafter, sampling=sampling)
        self._request = (sampling, resume is not None)
        self._cut = StopCut(sampling.stops)
        try:
            panel.bridge.generate(messages, sampling, continue_answer=resume is not None, raw=panel.completion_mode)
        except AppError as exc:
            panel.error_raised.emit(str(exc))
            if resume is not None:
                resume.status = "complete"
                panel.messages.append(resume)
                panel.view.show_messages(panel.messages)
            elif answer.store_id is not None and panel.store is not None:
                panel.history.call(panel.store.delete_message, answer.store_id)
            return
        self._resumed_text = resume.text if resume is not None else ""
        self._resumed_stats = message_stats(resume.stats) if resume is not None else None
        self.answer = answer
        self._request_id = None
        self._awaiting_start = True
        panel.view.begin_answer()
        if resume is not None:
            panel.view.update_answer(answer)  # the partial answer, which the continuation extends
        panel.view.follow_end()
        panel.progress_label.setText(f"Processing the prompt ({len(self.engine_messages())} messages)…")
        panel.progress_label.setVisible(True)
        panel.set_generating(True)
        self._last_flush = time.monotonic()
        self._flush_timer.start()

    # --- engine events ------------------------------------------------------------------------------

    @Slot(int)
    def _on_bridge_generation_started(self, request_id: int) -> None:
        if self._awaiting_start:
            self._request_id = request_id
            self._awaiting_start = False

    def _mine(self, request_id: int | None) -> bool:
        return self.answer is not None and request_id is not None and request_id == self._request_id

    @Slot(PromptProgress)
    def _on_bridge_prompt_progress(self, event: PromptProgress) -> None:
        if self._mine(event.request_id):
            self.panel.progress_label.setText(f"Processing prompt {event.done:,} / {event.total:,}")
            self.panel.prompt_bar.setRange(0, max(event.total, 1))
            self.panel.prompt_bar.setValue(event.done)
            self.panel.prompt_bar.setVisible(True)

    @Slot(PromptProcessed)
    def _on_bridge_prompt_processed(self, event: PromptProcessed) -> None:
        if self._mine(event.request_id):
            self.panel.prompt_bar.setVisible(False)
            self.panel.progress_label.setText(f"Prompt processed: {event.prompt_tokens:,} tokens in "
                                              f"{event.seconds:.1f} s; writing…")

    @Slot(Token)
    def _on_bridge_token_received(self, event: Token) -> None:
        if not self._mine(event.request_id) or self.answer is None or self._cut.stopped:
            return  # past a stop string the engine runs on until it hears the cancel
        event = self._cut.token(event)
        if self._cut.stopped:
            self.panel.bridge.cancel()
        self.answer.text += event.text
        pieces = event.pieces or ((event.text,) if len(event.sources) <= 1 else ())
        self.answer.pieces.extend(zip(pieces, event.sources, strict=False))
        self._dirty = True
        self.panel.view.update_answer(self.answer)

    @Slot(Finished)
    def _on_bridge_generation_finished(self, event: Finished) -> None:
        # request_id -1: the bridge could not even send the request
        failed_to_send = self._awaiting_start and event.request_id == -1
        if self.answer is None or not (self._mine(event.request_id) or failed_to_send):
            return
        answer = self.answer
        answer.text += self._cut.tail()
        event = self._cut.finished(event, answer.text[len(self._resumed_text):])
        if event.text or event.reason != "error":
            answer.text = self._resumed_text + event.text if event.text else answer.text
        answer.status = FINAL_STATUS.get(event.reason, "complete")
        answer.stop_reason = event.reason
        answer.stop_sequence = event.stop_sequence
        answer.stats = self._answer_stats(event) if event.reason != "error" else self._resumed_stats
        self._end(answer)

    def _answer_stats(self, event: Finished) -> MessageStats:
        """The answer's figures as the engine measured them (its speedup over the plain rate of the same
        moment), a continued answer's over both parts."""
        stats = event.stats
        if self._resumed_stats is not None:
            stats = continued_stats(self._resumed_stats, stats)
        return stats

    @Slot(EngineError)
    def _on_bridge_engine_error(self, event: EngineError) -> None:
        if self.answer is not None and (self._mine(event.request_id) or (event.request_id is None
                                        and self._awaiting_start)):
            if event.kind == "PromptTooLongError" and self._overflowed(event):
                return
            self.answer.status = "error"
            self.answer.stop_reason = "error"
            self._end(self.answer)
        # The window shows engine errors (one place for every error the engine reports).

    def _overflowed(self, event: EngineError) -> bool:
        """The chat no longer fits the context and nothing was written: per the overflow policy, ask again
        without the oldest turn, or stop with no empty answer left behind and offer a new chat. True when
        handled here (the window then shows no error of its own)."""
        panel = self.panel
        answer = self.answer
        if answer is None or answer.text or self._request is None:
            return False
        self.overflowed_request = event.request_id
        if (panel.overflow_policy() == "drop_oldest" or self.carrying) and self._can_leave_out_more():
            self._left_out += 1
            sampling, resumed = self._request
            messages = self.engine_messages()
            if resumed:
                messages.append({"role": "assistant", "content": answer.text})
            self._request_id = None
            self._awaiting_start = True
            self._cut = StopCut(sampling.stops)
            panel.progress_label.setText(f"The chat is longer than the context: asking again without the oldest "
                                         f"{self._left_out} question{'s' if self._left_out > 1 else ''} and "
                                         "answers…")
            try:
                panel.bridge.generate(messages, sampling, continue_answer=resumed, raw=panel.completion_mode)
            except AppError as exc:
                panel.error_raised.emit(str(exc))
            else:
                return True
        # Stop: the empty answer goes; the question stays, and a new chat can take it. Nothing is lost, so the
        # reason is said beside the button (and on the status bar), not in a message box.
        self._leave()
        self._left_out = 0
        self.carrying = False
        if answer.store_id is not None and panel.store is not None:
            panel.history.call(panel.store.delete_message, answer.store_id)
        panel.view.show_messages(panel.messages)
        panel.set_generating(False)
        offer = any(m.role == "user" for m in panel.messages)
        panel.new_chat_with_last_button.setVisible(offer)
        notice = (f"{event.message} “Continue in a new chat” sends your last message there, with the latest turns "
                  "that fit." if offer else event.message)
        panel.progress_label.setText(notice)
        panel.progress_label.setVisible(True)
        panel.notice_raised.emit(notice)
        return True

    @Slot(EngineCrashed)
    def _on_bridge_engine_crashed(self, _event: EngineCrashed) -> None:
        if self.answer is not None:
            self.answer.status = "interrupted"
            self.answer.stop_reason = "crashed"
            self._end(self.answer)

    def _leave(self) -> None:
        """No answer is being written any more: its timer, progress and handles go."""
        self._flush_timer.stop()
        self.panel.progress_label.setVisible(False)
        self.panel.prompt_bar.setVisible(False)
        self.answer = None
        self._request_id = None
        self._awaiting_start = False

    def _end(self, answer: ChatMessage) -> None:
        panel = self.panel
        left_out, self._left_out = self._left_out, 0
        self._leave()
        if answer.store_id is not None and panel.store is not None:
            panel.history.call(panel.store.finish_answer, answer.store_id, answer.text, answer.status,
                               answer.stats, stop_reason=answer.stop_reason,
                               drafted=drafted_spans(answer.pieces, len(answer.text)))
        panel.messages.append(answer)
        panel.view.finish_answer(answer)
        if self.carrying:
            self.carrying = False
            self._drop_carried(left_out)
        panel.view.show_alternatives(panel.messages)
        panel.set_generating(False)
        panel.refresh_history()
        panel.answer_finished.emit(answer)

    def _drop_carried(self, left_out: int) -> None:
        """A continued chat keeps the carried turns the model read: the ``left_out`` oldest questions, with
        their answers, leave it."""
        panel = self.panel
        cut = _first_kept(panel.messages, left_out)  # the chat's messages are its turns (no system rows)
        if not cut:
            return
        for message in panel.messages[:cut]:
            if message.store_id is not None and panel.store is not None:
                panel.history.call(panel.store.delete_message, message.store_id)
        del panel.messages[:cut]
        panel.view.show_messages(panel.messages)

    @Slot()
    def _on_flush_timer_timeout(self) -> None:
        self.flush()

    def flush(self) -> None:
        """Save the answer so far, if it grew since it was last saved."""
        panel = self.panel
        answer = self.answer
        if answer is None or answer.store_id is None or panel.store is None or not self._dirty:
            return
        self._dirty = False
        self._last_flush = time.monotonic()
        panel.history.call(panel.store.update_answer, answer.store_id, answer.text)
