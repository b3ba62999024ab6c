"""Who frees which llama.cpp object, and in what order.

Every llama.cpp object SpecDeck creates (a model, a context, a batch, a grammar sampler) is a ``Native``
registered with the objects it borrows: a context borrows its model, a drafter's context borrows the target's
context it reads (``ctx_other``), a batch its context, a grammar sampler the model's vocabulary. Closing a
``Native`` closes its borrowers first, newest first, then frees its own object, once.

The Python objects that hold them (``Model``, ``Context``...) close them by hand, and ``own`` closes them
when the garbage collector drops the holder. It must not be ``__del__``: in a reference cycle Python
finalizes objects in no set order, so a model could be freed before a context that still uses it. The
finalizer holds the ``Native`` alone, never its holder, and a ``Native`` holds only other ``Native``s, so the
order comes from the borrowing and holds whatever order the collector picks.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from app.errors import EngineLoadError

# One lock for every close: a finalizer may run on any thread, while another thread closes by hand.
_lock = threading.RLock()


class Native:
    """One llama.cpp object, freed by ``free(ptr)`` after every ``Native`` that borrows it."""

    __slots__ = ("_borrowers", "_free", "_lenders", "_ptr", "what")

    def __init__(self, ptr: Any, free: Callable[[Any], None], what: str,
                 lenders: Sequence[Native] = ()) -> None:
        for lender in lenders:
            lender.get()  # borrowing from a freed object would be a use after free later
        self._ptr = ptr
        self._free = free
        self.what = what
        self._lenders = tuple(lenders)
        self._borrowers: dict[int, Native] = {}  # by id, in the order they were made
        with _lock:
            for lender in self._lenders:
                lender._borrowers[id(self)] = self

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def get(self) -> Any:
        """The pointer, or a clear error once freed (never a freed pointer handed to llama.cpp)."""
        ptr = self._ptr
        if ptr is None:
            raise EngineLoadError(f"{self.what} was already closed; load the model again.")
        return ptr

    def close(self) -> None:
        with _lock:
            if self._ptr is None:
                return
            for borrower in reversed(list(self._borrowers.values())):
                borrower.close()
            ptr, self._ptr = self._ptr, None
            for lender in self._lenders:
                lender._borrowers.pop(id(self), None)
            self._free(ptr)


def own(holder: object, native: Native) -> Native:
    """Close ``native`` when ``holder`` is collected. Not at interpreter exit: a daemon thread may still be
    decoding then, and the process's memory goes back to the system anyway."""
    finalizer = weakref.finalize(holder, native.close)
    finalizer.atexit = False
    return native
