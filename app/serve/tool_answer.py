"""One answer's text as content and tool calls, whole or as it streams, for either API's shapes.

- No tools: the text is the content.
- ``auto``: the model's own format (``PromptProcessed.tool_format``) is read as the text streams; content is sent
  at once except what may be the start of a call, and a malformed call comes back as text.
- A named function: the grammar made the text the arguments object, so it streams as argument fragments.
- ``required``: the grammar made the text a JSON list of calls, read when it is complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.engine import tool_calls
from app.engine.tool_calls import ParsedAnswer, ToolCall, ToolCallStream
from app.serve.tools import ToolRequest


@dataclass
class ToolAnswer:
    request: ToolRequest | None
    tool_format: str = "generic"
    calls: tuple[ToolCall, ...] = ()
    _stream: ToolCallStream | None = None
    _named_id: str = ""
    _text: list[str] = field(default_factory=list)

    @property
    def _choice(self) -> str | None:
        return self.request.choice if self.request is not None else None

    @property
    def forced(self) -> bool:
        return self._choice not in (None, "auto", "none")

    @property
    def named(self) -> str | None:
        """The function a named tool choice forces, if any."""
        return self._choice if self.forced and self._choice != "required" else None

    def start(self, tool_format: str) -> None:
        """The prompt is in: the format the answer's calls are written in is known."""
        self.tool_format = tool_format or "generic"
        if self.request is not None and not self.forced:
            self._stream = ToolCallStream(self.tool_format, self.request.tools)

    def feed(self, text: str) -> tuple[str, list[tuple[ToolCall, str]]]:
        """(content to send now, argument fragments to send now as (call, fragment); a call's first fragment
        comes with its name)."""
        self._text.append(text)
        if self.named is not None:
            if not self._named_id:
                self._named_id = tool_calls.new_call_id()
            return "", [(ToolCall(self._named_id, self.named, ""), text)] if text else []
        if self.forced:
            return "", []
        if self._stream is not None:
            return self._stream.feed(text), []
        return text, []

    def finish(self) -> tuple[str, tuple[ToolCall, ...]]:
        """(content not yet sent, the calls), once the answer is complete; ``self.calls`` holds the calls."""
        text = "".join(self._text)
        if self.request is None:
            return "", ()
        if self.forced:
            choice = self.named or "required"
            try:
                self.calls = tool_calls.parse_forced(text, self.request.tools, choice)
            except ValueError:  # cut short (max_tokens): not a complete call, so it is text, unless it went out
                self.calls = ()  # as a call's argument fragments already
                return ("" if self._named_id else text), ()
            if self.named and self.calls:  # the id its stream's fragments went out under
                self.calls = (ToolCall(self._named_id or self.calls[0].id, self.named, self.calls[0].arguments),)
            return "", self.calls
        parsed: ParsedAnswer = (self._stream.finish() if self._stream is not None
                                else tool_calls.parse_answer(text, self.tool_format, self.request.tools))
        self.calls = parsed.calls
        return parsed.content, parsed.calls

    def whole(self, text: str) -> tuple[str, tuple[ToolCall, ...]]:
        """A complete answer's (content, calls), for a response that is not streamed."""
        if self.request is None:
            return text, ()
        self._stream = None
        self._text = [text]
        return self.finish()
