"""What the chat panel calls on an engine: the window's own (``ui.bridge.EngineBridge``) or a remote server's
model (``ui.remote.route.RemoteChat``).

Both are QObjects whose signals carry ``app.events`` types, so the Protocol lives beside its one caller in
``ui/`` (Qt's signals have no Qt-free description). A Protocol rather than a base class: a QObject's metaclass
does not mix with ABCMeta, and the two share no code.
"""

from __future__ import annotations

from typing import Protocol

from PySide6.QtCore import SignalInstance

from app.events import Loaded
from app.params import SamplingSettings


class ChatEngine(Protocol):
    """Requests return at once; what follows arrives as signals on the GUI thread."""

    @property
    def loaded(self) -> Loaded | None:
        """The model answering (None: none is loaded)."""

    @property
    def generation_started(self) -> SignalInstance:
        """(int) the request id the answer's later events carry."""

    @property
    def prompt_progress(self) -> SignalInstance:
        """(PromptProgress)"""

    @property
    def prompt_processed(self) -> SignalInstance:
        """(PromptProcessed)"""

    @property
    def token_received(self) -> SignalInstance:
        """(Token)"""

    @property
    def generation_finished(self) -> SignalInstance:
        """(Finished)"""

    @property
    def engine_error(self) -> SignalInstance:
        """(EngineError) an answer's, or one without a request id (the request could not be sent)."""

    @property
    def engine_crashed(self) -> SignalInstance:
        """(EngineCrashed)"""

    def generate(self, messages: list[dict[str, str]], sampling: SamplingSettings, *,
                 continue_answer: bool = False, raw: bool = False) -> None:
        """Raises AppError (SettingsError) at once for a request that cannot be sent."""

    def cancel(self) -> None:
        """Stop the current answer; it ends with ``generation_finished`` (reason "cancelled")."""
