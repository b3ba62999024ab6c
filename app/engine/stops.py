"""Stop sequences: an answer ends before the first of them. One matcher for every front end (the server's
runner and the window's answer), so an answer is cut the same way wherever it is read."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from app.events import Finished, Token


@dataclass
class StopMatcher:
    """Cuts the answer at the first stop sequence; holds back text that may be the start of one."""

    stops: tuple[str, ...]
    _held: str = ""
    stopped: bool = False
    matched: str | None = None  # the stop sequence that ended the answer

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buffer = self._held + text
        hits = [(at, s) for at, s in ((buffer.find(s), s) for s in self.stops) if at >= 0]
        if hits:
            at, self.matched = min(hits)
            self.stopped = True
            self._held = ""
            return buffer[:at]
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buffer)), 0, -1):
                if buffer.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held


def _token_starts(event: Token, offset: int) -> list[int]:
    """Where each of the event's tokens starts in the answer's text, ``offset`` being where the event starts."""
    if not event.pieces:
        return [offset] * len(event.token_ids)
    out, at = [], offset
    for piece in event.pieces:
        out.append(min(at, offset + len(event.text)))  # a split character's text comes with a later token
        at += len(piece)
    return out


@dataclass
class StopCut:
    """One answer's events cut at its first stop sequence. Past a stop the engine runs on until it hears the
    cancel (``stopped`` says to send it), and only the tokens of the text kept are the answer's."""

    stops: tuple[str, ...]
    matcher: StopMatcher = field(init=False)
    _starts: list[int] = field(default_factory=list)  # each generated token's start in the uncut text
    _generated: int = 0

    def __post_init__(self) -> None:
        self.matcher = StopMatcher(self.stops)

    @property
    def stopped(self) -> bool:
        return self.matcher.stopped

    def token(self, event: Token) -> Token:
        """The event with the text the answer keeps of it ("" past the stop; held back while it may begin one)."""
        self._starts += _token_starts(event, self._generated)
        self._generated += len(event.text)
        return replace(event, text=self.matcher.feed(event.text))

    def tail(self) -> str:
        """At the end: the text held back that turned out not to begin a stop sequence."""
        return self.matcher.flush()

    def finished(self, event: Finished, kept: str) -> Finished:
        """The end as told: after a stop, reason "stop" with the sequence, ``kept`` (the text given out, tail
        included) as the answer and its tokens counted; otherwise the event as it came."""
        if not self.matcher.stopped:
            return event
        counted = sum(1 for start in self._starts if start < len(kept))
        return replace(event, reason="stop", text=kept, stop_sequence=self.matcher.matched,
                       stats=replace(event.stats, completion_tokens=counted))
