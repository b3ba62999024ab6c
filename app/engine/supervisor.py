"""What every front end does after the engine's worker dies (the window's bridge, serve's engine thread, the
terminal chat): restart it and load the model again, unless the model crashed the worker ``MAX_LOAD_CRASHES``
loads in a row, in which case it stays unloaded and says so in one sentence. A crash while answering is always
followed by a restart: the answer is lost, not the model. The client counts the crashes while loading
(``EngineClient.crashes_on_load``, back to 0 at each load that ends)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.engine.client import EngineClient
    from app.params import LoadSettings

MAX_LOAD_CRASHES = 3


def may_restart(crashes_on_load: int) -> bool:
    """Whether the worker is restarted (and the model loaded again) after its latest crash."""
    return crashes_on_load < MAX_LOAD_CRASHES


def restart_worker(client: EngineClient, settings: LoadSettings | None) -> None:
    """A fresh worker, and the model loaded into it when ``settings`` are given (its events follow)."""
    client.restart()
    if settings is not None:
        client.load(settings)


def gave_up_sentence(crashes_on_load: int) -> str:
    """Why the worker is not restarted again."""
    return (f"The model crashed the engine {crashes_on_load} times in a row while loading, so it is not loaded "
            "again: check the model file and the load settings.")
