"""The sandbox a chat template renders in, in this process: Jinja's ``ImmutableSandboxedEnvironment`` with bounds
on time, output and the size of what one operation builds (the safety argument is ``chat_template``'s
docstring). The renderer child of ``template_runner`` calls :func:`render_in_process`; nothing here starts a
process or imports more than Jinja, so the child stays small."""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import FrameType
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.errors import TemplateError

MAX_OUTPUT_CHARS = 4 * 1024 * 1024
MAX_TEMPLATE_CHARS = 1024 * 1024  # real templates are at most tens of KB
TIME_LIMIT_S = 2.0


class TemplateLimitError(TemplateError):
    """The template was stopped for time or memory; it is refused at once for chats at least that large."""


class TemplateMemoryError(TemplateLimitError):
    """The template ran out of the memory it may use."""


def time_message(seconds: float) -> str:
    return (f"The model's chat template spent more than {seconds:g} s of CPU time rendering and was stopped "
            "(it may loop forever).")


class _TemplateRaised(Exception):
    """raise_exception() called by the template itself (e.g. "roles must alternate")."""


class _Deadline(BaseException):
    # A BaseException so that no `except Exception` inside Jinja can swallow it.
    pass


class _TooLarge(Exception):
    pass


def _raise_exception(message: object = "") -> None:
    raise _TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # HF's tojson: plain json.dumps (Jinja's own escapes <, >, & and ' for HTML, which templates don't want).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


_WIDTH = re.compile(r"\d+")


def _check_format_string(text: str, limit: int) -> None:
    # '%999999999d' % x and '{:>999999999}'.format(x) build huge strings in one C call.
    for m in _WIDTH.finditer(text):
        if len(m.group()) > 9 or int(m.group()) > limit:
            raise _TooLarge(f"a format width of {m.group()[:12]}")


def _check_args(args: Sequence[Any], kwargs: Mapping[str, Any], limit: int) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int | float) and not isinstance(value, bool) and abs(value) > limit:
            raise _TooLarge(f"an argument of {value:g}")


def _size(value: Any) -> int | None:
    return len(value) if isinstance(value, str | bytes | list | tuple) else None


def _check_result(value: Any, limit: int) -> Any:
    size = _size(value)
    if size is not None and size > limit:
        raise _TooLarge(f"a value of {size:,} items")
    return value


class _BoundedCodeGenerator(CodeGenerator):
    """Compiles ``a ~ b`` through the environment's bounded join (Jinja's own cannot be intercepted)."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, made loud about unsafe access and bounded in what one operation builds."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, limit: int) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=False,
            extensions=["jinja2.ext.loopcontrols"],
            autoescape=False,
        )
        self.limit = limit
        self.filters["tojson"] = _tojson
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        for name, fn in list(self.filters.items()):
            self.filters[name] = self._guard_filter(name, fn)

    def bounded_concat(self, parts: tuple[Any, ...]) -> str:
        strings = [str(p) for p in parts]
        if sum(map(len, strings)) > self.limit:
            raise _TooLarge(f"a concatenation of {sum(map(len, strings)):,} characters")
        return "".join(strings)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Undefined:
        # The default returns an Undefined that prints as "", so a probing template would render quietly.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def call_binop(self, context: Context, operator_: str, left: Any, right: Any) -> Any:
        limit = self.limit
        if operator_ == "*":
            for seq, n in ((left, right), (right, left)):
                size = _size(seq)
                if size is not None and isinstance(n, int) and size * n > limit:
                    raise _TooLarge(f"a sequence of {size} repeated {n} times")
        elif operator_ == "**":
            # Huge integers take unbounded time in one C call.
            if (isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0
                    and abs(left).bit_length() * right > 1 << 16):
                raise _TooLarge(f"{left} ** {right}")
        elif operator_ == "+":
            a, b = _size(left), _size(right)
            if a is not None and b is not None and a + b > limit:
                raise _TooLarge(f"a concatenation of {a + b:,} items")
        elif operator_ == "%" and isinstance(left, str):
            _check_format_string(left, limit)
        return super().call_binop(context, operator_, left, right)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _check_args(args, kwargs, __self.limit)
        bound_to = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
        if isinstance(bound_to, str) and getattr(__obj, "__name__", "") in ("format", "format_map"):
            _check_format_string(bound_to, __self.limit)
        return _check_result(super().call(__context, __obj, *args, **kwargs), __self.limit)

    def _guard_filter(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        skip = 2 if getattr(fn, "jinja_pass_arg", None) is not None else 1  # (context,) value, args...

        @functools.wraps(fn)  # copies jinja_pass_arg too, so Jinja still passes the context
        def guarded(*args: Any, **kwargs: Any) -> Any:
            _check_args(args[skip:], kwargs, self.limit)
            value = args[skip - 1] if len(args) >= skip else None
            if name == "format" and isinstance(value, str):
                _check_format_string(value, self.limit)
            if name == "join" and isinstance(value, list | tuple):
                total = sum(len(v) for v in value if isinstance(v, str))
                if total > self.limit:
                    raise _TooLarge(f"a join of {total:,} characters")
            # Checked after the fact: one filter call on bounded inputs builds a bounded amount.
            return _check_result(fn(*args, **kwargs), self.limit)

        return guarded


@functools.lru_cache(maxsize=4)
def _environment(limit: int) -> _BoundedSandbox:
    return _BoundedSandbox(limit)  # read-only once built, so threads may share it


@functools.lru_cache(maxsize=16)
def _compile(source: str, limit: int) -> jinja2.Template:
    return _environment(limit).from_string(source)


class _Timer:
    """Raises _Deadline in this thread's Python code once it has spent ``seconds`` of CPU time
    (sys.settrace). CPU time, not wall time: on a loaded machine a harmless template gets less of the CPU and
    takes longer, and must not be refused for it."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.thread_time() + seconds

    def trace(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if time.thread_time() > self.deadline:
            raise _Deadline
        return self.trace  # keep tracing line events inside this frame (loops live in one frame)

    def __enter__(self) -> _Timer:
        self.previous = sys.gettrace()  # a debugger's or coverage's tracer, restored afterwards
        sys.settrace(self.trace)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self.previous)


def check_template_text(template: object) -> None:
    if not isinstance(template, str) or not template.strip():
        raise TemplateError("The model has no chat template.")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateError(
            f"The model's chat template is {len(template):,} characters long, far more than any real "
            "template; it was not used."
        )


def render_in_process(
    template: str,
    messages: Sequence[Mapping[str, str]],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    extra_context: Mapping[str, Any] | None = None,
    time_limit: float = TIME_LIMIT_S,
    max_chars: int = MAX_OUTPUT_CHARS,
) -> str:
    """Render ``template`` in this process (the renderer child's side of :func:`render_template`).

    Python-level loops stop at ``time_limit``; a single C-level operation does not.
    """
    check_template_text(template)
    context: dict[str, Any] = {
        "messages": [dict(m) for m in messages],
        "bos_token": bos_token,
        "eos_token": eos_token,
        "add_generation_prompt": add_generation_prompt,
        **(extra_context or {}),
    }
    out: list[str] = []
    total = 0
    try:
        with _Timer(time_limit):
            compiled = _compile(template, max_chars)
            for chunk in compiled.generate(context):
                total += len(chunk)
                if total > max_chars:
                    raise _TooLarge(f"more than {max_chars:,} characters of output")
                out.append(chunk)
    except _Deadline:
        raise TemplateLimitError(time_message(time_limit)) from None
    except _TooLarge as exc:
        raise TemplateError(
            f"The model's chat template tried to build too much text ({exc}) and was stopped."
        ) from None
    except SecurityError as exc:
        raise TemplateError(
            f"The model's chat template tried to reach Python internals and was refused ({exc})."
        ) from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"The model's chat template has a syntax error at line {exc.lineno}: {exc.message}."
        ) from None
    except _TemplateRaised as exc:
        raise TemplateError(f"The model's chat template refused these messages: {exc}") from None
    except RecursionError:
        raise TemplateError("The model's chat template recursed too deeply and was stopped.") from None
    except MemoryError:
        raise TemplateMemoryError("The model's chat template ran out of memory and was stopped.") from None
    except Exception as exc:  # UndefinedError, TypeError, ... from the template's own code
        raise TemplateError(
            f"The model's chat template failed while rendering: {type(exc).__name__}: {exc}."
        ) from None
    return "".join(out)
