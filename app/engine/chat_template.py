"""Render a model's chat template (Jinja text from the GGUF) safely, or fall back to a known format.

Over 450 lines because the sandbox's bounds, and the fallback they lead to, are one safety argument.

A chat template is code from a downloaded file (CVE-2024-34359 was remote code execution through one),
so it runs in ``ImmutableSandboxedEnvironment`` with extra bounds:

- reaching for Python internals (``''.__class__``, ``cycler.__init__.__globals__``, ...) raises at once
  instead of quietly rendering as empty;
- rendering stops after ``time_limit`` seconds of CPU time: the sandbox does not stop loops, so a trace function
  (``sys.settrace``, this thread only, while rendering) raises once the deadline has passed;
- output is capped at ``max_chars``, and so are the sizes a single operation may build (``'x' * n``,
  ``'{:>n}'.format``, ``center(n)``...), which the time bound cannot interrupt mid-way.

One C-level operation still runs to its end inside the sandbox, so :func:`render_template` runs it in a
child process that is killed at a hard deadline or past a memory limit (``template_runner``); the
in-process renderer, ``template_sandbox.render_in_process``, is what that child calls.

``render_chat`` never fails on a missing or broken template: it renders this documented fallback and
says why in ``RenderedPrompt.warning``::

    <|im_start|>system\\n{content}<|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n            (when add_generation_prompt)

No BOS text is added by the fallback: the tokenizer adds BOS when the model asks for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.engine.template_runner import shared_runner
from app.engine.template_sandbox import MAX_OUTPUT_CHARS, TIME_LIMIT_S, check_template_text, render_in_process
from app.errors import TemplateError

ROLES = ("system", "user", "assistant", "tool")
TOOL_KEYS = ("tool_calls", "tool_call_id", "name")  # what a tool turn carries beside its content


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    used_fallback: bool  # True: the ChatML fallback was used (warning says why)
    warning: str | None
    tool_format: str = ""  # with tools: the format the answer's calls are read in (app.engine.tool_calls)


def render_template(
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
    """Render ``template`` strictly in the renderer child: any problem raises TemplateError with a sentence.

    ``messages`` should come from :func:`clean_messages`. Stopped for time or memory, the template raises
    ``TemplateLimitError`` at once on every later call in this process.
    """
    check_template_text(template)
    options: dict[str, Any] = {
        "bos_token": bos_token, "eos_token": eos_token, "add_generation_prompt": add_generation_prompt,
        "extra_context": dict(extra_context or {}), "time_limit": time_limit, "max_chars": max_chars,
    }
    return shared_runner().render(template, [dict(m) for m in messages], options)


def warm_renderer() -> None:
    """Start the renderer child ahead of the first message (a cold start takes about a second)."""
    shared_runner().warm()


def _clean_content(text: str) -> tuple[str, bool, bool]:
    """(text, had lone surrogates, had NULs)."""
    bad_surrogates = False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Joins valid surrogate pairs (as JSON decoders may leave them) and replaces lone ones.
        fixed = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        bad_surrogates = "\ufffd" in fixed and fixed.count("\ufffd") > text.count("\ufffd")
        text = fixed
    has_nul = "\x00" in text
    return (text.replace("\x00", "") if has_nul else text), bad_surrogates, has_nul


def completion_text(messages: Sequence[Mapping[str, str]]) -> str:
    """Completion mode's prompt (base models, no template): the user and assistant texts joined as written. The
    local engine and a remote server's /v1/completions read the same text."""
    return "".join(m.get("content", "") for m in messages if m.get("role") in ("user", "assistant"))


def clean_messages(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Check roles and content; return ``{"role", "content"}`` dicts (with a tool turn's ``tool_calls``,
    ``tool_call_id`` and ``name``) and notes about what was changed.

    Raises TemplateError for a role other than system/user/assistant/tool or content that is not text.
    """
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise TemplateError("The conversation must be a list of messages.")
    cleaned: list[dict[str, Any]] = []
    surrogates = nuls = False
    for i, m in enumerate(messages, 1):
        if not isinstance(m, Mapping):
            raise TemplateError(f"Message {i} is not a role and a content.")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise TemplateError(
                f"Message {i} has role {role!r}; only system, user, assistant and tool are supported."
            )
        if not isinstance(content, str):
            raise TemplateError(f"Message {i} has content of type {type(content).__name__}; it must be text.")
        text, s, n = _clean_content(content)
        surrogates, nuls = surrogates or s, nuls or n
        message: dict[str, Any] = {"role": str(role), "content": text}
        message.update({key: m[key] for key in TOOL_KEYS if m.get(key) is not None})
        if not isinstance(message.get("tool_calls", []), list):
            raise TemplateError(f"Message {i} has tool calls that are not a list.")
        cleaned.append(message)
    notes = []
    if surrogates:
        notes.append("Broken characters (lone UTF-16 surrogates) in the messages were replaced with U+FFFD.")
    if nuls:
        notes.append("NUL characters in the messages were removed.")
    return cleaned, notes


def has_tool_turns(messages: Sequence[Mapping[str, Any]]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def render_chatml(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
    """The fallback format (see the module docstring)."""
    parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _merge_system(messages: list[dict[str, str]]) -> list[dict[str, str]] | None:
    """System messages folded into the first user message, for templates that refuse a system role."""
    system = [m["content"] for m in messages if m["role"] == "system"]
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if not system:
        return None
    prefix = "\n\n".join(system)
    for m in rest:
        if m["role"] == "user":
            m["content"] = f"{prefix}\n\n{m['content']}" if m["content"] else prefix
            return rest
    return [{"role": "user", "content": prefix}, *rest]


def render_chat(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    *,
    architecture: str = "",
    tools: Sequence[Mapping[str, Any]] = (),
    time_limit: float = TIME_LIMIT_S,
    max_chars: int = MAX_OUTPUT_CHARS,
) -> RenderedPrompt:
    """The prompt text for ``messages``: the model's template, or a fallback format with a warning.

    The fallback is the architecture's known format (:func:`builtin_template`) when there is one, else
    plain ChatML. Raises TemplateError only for invalid messages (see :func:`clean_messages`).

    ``tools`` (OpenAI function tools) and tool turns go to the model's own template; one that does not show
    the tools, or refuses the tool turns, gets them as text instead (:func:`_render_tools_as_text`).
    """
    cleaned, notes = clean_messages(messages)
    if tools or has_tool_turns(cleaned):
        return _render_with_tools(template, cleaned, notes, bos_token, eos_token, add_generation_prompt,
                                  architecture, tools, time_limit, max_chars)

    def result(text: str, fallback: bool, extra: list[str]) -> RenderedPrompt:
        warning = " ".join([*extra, *notes]) or None
        return RenderedPrompt(text, fallback, warning)

    def attempt(msgs: list[dict[str, str]]) -> str:
        return render_template(template or "", msgs, bos_token=bos_token, eos_token=eos_token,
                               add_generation_prompt=add_generation_prompt, time_limit=time_limit,
                               max_chars=max_chars)

    builtin = builtin_template(architecture)
    if builtin is not None and not (template or "").strip():
        text = render_in_process(builtin, cleaned, bos_token=bos_token, eos_token=eos_token,
                                 add_generation_prompt=add_generation_prompt)
        return result(text, True, [f"The model file has no chat template; its architecture's known format "
                                   f"({fallback_name(architecture)}) was used."])
    try:
        return result(attempt(cleaned), False, [])
    except TemplateError as exc:
        first = exc
    merged = _merge_system(cleaned) if "refused these messages" in str(first) else None
    if merged is not None:
        # Some templates (Gemma 2, Mistral) refuse a system role; the common remedy is to prepend it
        # to the first user message, which keeps the model's own format.
        try:
            text = attempt(merged)
        except TemplateError:
            pass
        else:
            return result(text, False, [
                "The model's chat template does not accept a system message, so it was put at the start "
                "of the first user message."
            ])
    if builtin is not None:
        text = render_in_process(builtin, cleaned, bos_token=bos_token, eos_token=eos_token,
                                 add_generation_prompt=add_generation_prompt)
    else:
        text = render_chatml(cleaned, add_generation_prompt)
    return result(text, True, [f"{first} {fallback_sentence(architecture)}"])


TOOLS_AS_TEXT = ("The model's chat template does not take tools, so they were described in the system message "
                 "and its calls are read as <tool_call> blocks.")


def _render_with_tools(template: str | None, cleaned: list[dict[str, Any]], notes: list[str], bos_token: str,
                       eos_token: str, add_generation_prompt: bool, architecture: str,
                       tools: Sequence[Mapping[str, Any]], time_limit: float, max_chars: int) -> RenderedPrompt:
    from app.engine import tool_calls

    if (template or "").strip():
        try:
            text = render_template(template or "", tool_calls.template_messages(cleaned), bos_token=bos_token,
                                   eos_token=eos_token, add_generation_prompt=add_generation_prompt,
                                   extra_context={"tools": [dict(t) for t in tools]} if tools else None,
                                   time_limit=time_limit, max_chars=max_chars)
        except TemplateError:  # refused the tool turns (or stopped): they go in as text
            pass
        else:
            if not tools or tool_calls.template_renders_tools(text, tools):
                return RenderedPrompt(text, False, " ".join(notes) or None, tool_calls.detect_format(template))
    return _render_tools_as_text(template, cleaned, bos_token, eos_token, add_generation_prompt, architecture,
                                 tools, time_limit, max_chars)


def _render_tools_as_text(template: str | None, cleaned: list[dict[str, Any]], bos_token: str, eos_token: str,
                          add_generation_prompt: bool, architecture: str, tools: Sequence[Mapping[str, Any]],
                          time_limit: float, max_chars: int) -> RenderedPrompt:
    """Tools described in the system turn and tool turns as plain text, answered in the generic format."""
    from app.engine import tool_calls

    plain: list[dict[str, Any]] = list(tool_calls.plain_history(cleaned))
    if tools:
        described = tool_calls.tools_system_text(tools)
        if plain and plain[0]["role"] == "system":
            plain[0] = {**plain[0], "content": f"{plain[0]['content']}\n\n{described}"}
        else:
            plain.insert(0, {"role": "system", "content": described})
    rendered = render_chat(template, plain, bos_token, eos_token, add_generation_prompt, architecture=architecture,
                           time_limit=time_limit, max_chars=max_chars)
    warning = " ".join(w for w in (TOOLS_AS_TEXT, rendered.warning) if w)
    return replace(rendered, warning=warning, tool_format="generic")


def fallback_name(architecture: str) -> str:
    """The format used when a model's own template is missing or refused: "Gemma" or "plain ChatML"."""
    for family, (name, _template) in BUILTIN_TEMPLATES.items():
        if architecture.startswith(family):
            return name
    return "plain ChatML"


def fallback_sentence(architecture: str) -> str:
    return f"Answering with the {fallback_name(architecture)} format instead."


# Formats for architectures whose GGUFs often ship without a template, as llama.cpp recognises them.
BUILTIN_TEMPLATES = {
    "gemma": ("Gemma", (
        "{{ bos_token }}{% set ns = namespace(sys='') %}"
        "{% for m in messages %}"
        "{% if m['role'] == 'system' %}{% set ns.sys = m['content'] ~ '\\n\\n' %}"
        "{% else %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
        "{{ (ns.sys if m['role'] == 'user' else '') ~ m['content'] | trim }}<end_of_turn>\n"
        "{% if m['role'] == 'user' %}{% set ns.sys = '' %}{% endif %}{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    )),
}


def builtin_template(architecture: str) -> str | None:
    """The known chat format for an architecture family (``gemma3`` → ``gemma``), if there is one."""
    for family, (_name, template) in BUILTIN_TEMPLATES.items():
        if architecture.startswith(family):
            return template
    return None
