"""Chat templates: real ones render exactly; hostile ones are refused quickly; broken ones fall back."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from app.engine.chat_template import (
    MAX_OUTPUT_CHARS,
    RenderedPrompt,
    clean_messages,
    render_chat,
    render_template,
)
from app.engine.template_runner import GRACE_S, STALL_S, TemplateLimitError, TemplateRunner, shared_runner
from app.errors import TemplateError

CONVO = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}]
CHATML = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
)

# Templates as shipped in GGUFs (Llama 3, Gemma 2, SmolLM2).
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}"
    "{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

HOSTILE_LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HOSTILE = {
    "mro": "{{ ''.__class__.__mro__ }}",
    "class": "{{ ''.__class__ }}",
    "globals": "{{ cycler.__init__.__globals__ }}",
    "template_reference": "{{ self._TemplateReference__context }}",
    "subscript": "{{ ''['__cla' ~ 'ss__'] }}",
    "mutation": "{% set x = [] %}{{ x.append(1) }}",
    "big_repeat": "{{ 'x' * 100000000 }}",
    "big_power": "{{ 2 ** 100000000 }}",
    "big_format": "{{ '{:>999999999}'.format(1) }}",
    "big_percent": "{{ '%999999999d' % 1 }}",
    "big_filter": "{{ 'x' | center(999999999) }}",
    "big_method": "{{ 'x'.ljust(999999999) }}",
    "doubling": "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                "{% endfor %}",
    "doubling_join": "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                     "{% set ns.s = [ns.s, ns.s]|join %}{% endfor %}",
    "output_flood": "{% for i in range(100000) %}{{ 'x' * 10000 }}{% endfor %}",
    "recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
}


def test_fallback_when_there_is_no_template() -> None:
    for template in (None, "", "   \n"):
        rendered = render_chat(template, CONVO, "<s>", "</s>")
        assert rendered == RenderedPrompt(
            CHATML, True, "The model has no chat template. Answering with the plain ChatML format instead.")
    no_prompt = render_chat(None, CONVO, add_generation_prompt=False)
    assert no_prompt.text == CHATML.removesuffix("<|im_start|>assistant\n")


def test_real_templates_render_exactly() -> None:
    assert render_chat(SMOLLM2, CONVO) == RenderedPrompt(CHATML, False, None)
    smol_default_system = render_chat(SMOLLM2, CONVO[1:]).text
    assert smol_default_system.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    llama = render_chat(LLAMA3, [*CONVO, {"role": "assistant", "content": " Hello. "}], "<|begin_of_text|>")
    assert llama.text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert not llama.used_fallback


def test_system_role_refused_by_the_template_is_merged() -> None:
    rendered = render_chat(GEMMA2, CONVO, "<bos>", "<eos>")
    assert rendered.text == (
        "<bos><start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n<start_of_turn>model\n")
    assert not rendered.used_fallback
    assert rendered.warning is not None
    assert "does not accept a system message" in rendered.warning
    # A refusal merging cannot fix (roles not alternating) falls back and says what the template said.
    broken = render_chat(GEMMA2, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert broken.used_fallback
    assert broken.warning is not None
    assert "Conversation roles must alternate" in broken.warning


def test_hf_helpers() -> None:
    template = (
        "{{ bos_token }}{{ messages | tojson }}|{{ {'b': 1, 'a': '<&>'} | tojson(sort_keys=True) }}|"
        "{{ strftime_now('%Y') }}|{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m.role }}{% endfor %}|{% for i in range(5) %}{% if i % 2 %}{% continue %}{% endif %}{{ i }}"
        "{% endfor %}|{{ eos_token }}{{ add_generation_prompt }}|{{ 'abc'.upper() }}"
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"
    )
    out = render_template(template, [{"role": "user", "content": "é\"x"}], bos_token="<s>", eos_token="</s>",
                          add_generation_prompt=False)
    year = time.strftime("%Y")
    # tojson as HF writes it: no HTML escaping, no ASCII escaping.
    assert out == (
        f'<s>[{{"role": "user", "content": "é\\"x"}}]|{{"a": "<&>", "b": 1}}|{year}|user|024|</s>False|ABC1')


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_templates_are_refused_quickly(name: str) -> None:
    start = time.monotonic()
    with pytest.raises(TemplateError) as info:
        render_template(HOSTILE[name], CONVO, time_limit=1.0)
    assert time.monotonic() - start < 1.5
    message = str(info.value)
    assert message.startswith("The model's chat template ")
    if name in ("mro", "class", "globals", "template_reference", "subscript", "mutation"):
        assert "tried to reach Python internals and was refused" in message
    elif name == "recursion":
        assert "recursed too deeply" in message
    else:
        assert "tried to build too much text" in message


def test_internals_are_named_in_the_message() -> None:
    with pytest.raises(TemplateError, match=r"'__globals__'|'__init__'"):
        render_template(HOSTILE["globals"], CONVO)
    with pytest.raises(TemplateError, match="_TemplateReference__context"):
        render_template(HOSTILE["template_reference"], CONVO)


def test_endless_loops_are_stopped_at_the_default_limit() -> None:
    nested = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    start = time.monotonic()
    with pytest.raises(TemplateError, match=r"spent more than 2 s of CPU time rendering and was stopped"):
        render_template(nested, CONVO)
    # 2 s of CPU take at least 2 s of wall time, more on a loaded machine; the stall bound caps the wait.
    assert 1.9 < time.monotonic() - start < 2.0 + GRACE_S + STALL_S


@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
    "{% macro spin(n) %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% endmacro %}{{ spin(1) }}",
    "{% for m in messages %}{% for i in range(100000) %}{% for j in range(100000) %}{% set x = i * j %}"
    "{% endfor %}{% endfor %}{% endfor %}",
    "{% set ns = namespace(x=0) %}{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% set ns.x = (ns.x + j) % 7 %}{% endfor %}{% endfor %}{{ ns.x }}",
])
def test_slow_shapes_are_stopped(template: str) -> None:
    start = time.monotonic()
    with pytest.raises(TemplateError, match=r"spent more than 0\.3 s of CPU time"):
        render_template(template, CONVO, time_limit=0.3)
    assert time.monotonic() - start < 0.3 + GRACE_S + STALL_S  # CPU time bounds it; wall time only at a stall


def test_hostile_template_falls_back_with_a_warning() -> None:
    rendered = render_chat(HOSTILE["mro"], CONVO)
    assert rendered.used_fallback
    assert rendered.text == CHATML
    assert rendered.warning is not None
    assert "Python internals" in rendered.warning
    assert rendered.warning.endswith("Answering with the plain ChatML format instead.")
    start = time.monotonic()
    slow = render_chat("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                       CONVO, time_limit=0.3)
    assert slow.used_fallback
    assert time.monotonic() - start < 0.3 + GRACE_S + STALL_S


@pytest.mark.parametrize(("template", "fragment"), [
    ("{% for m in messages %}", "syntax error at line 1"),
    ("line one\n{{ messages[0].content | nosuchfilter }}",
     "syntax error at line 2: No filter named 'nosuchfilter'"),
    ("{{ raise_exception('Only user and assistant roles are supported!') }}",
     "refused these messages: Only user and assistant roles are supported!"),
    ("{{ undefined_thing.attr }}", "failed while rendering: UndefinedError"),
    ("{{ 1 / 0 }}", "failed while rendering: ZeroDivisionError"),
    ("x" * (1024 * 1024 + 1), "far more than any real template"),
])
def test_broken_templates(template: str, fragment: str) -> None:
    with pytest.raises(TemplateError, match=re.escape(fragment)):
        render_template(template, CONVO)
    rendered = render_chat(template, CONVO)
    assert rendered.used_fallback
    assert rendered.text == CHATML
    assert rendered.warning is not None
    assert fragment in rendered.warning


def test_output_cap_counts_everything() -> None:
    exactly = "{% for i in range(4) %}{{ 'x' * 1048576 }}{% endfor %}"  # 4 MiB: allowed
    assert len(render_template(exactly, CONVO)) == MAX_OUTPUT_CHARS
    with pytest.raises(TemplateError, match="too much text"):
        render_template(exactly + "!", CONVO)


def test_messages_are_validated() -> None:
    with pytest.raises(TemplateError, match="Message 2 has role 'function'"):
        render_chat(None, [{"role": "user", "content": "a"}, {"role": "function", "content": "b"}])
    with pytest.raises(TemplateError, match="Message 1 has content of type list"):
        render_chat(None, [{"role": "user", "content": ["a"]}])
    with pytest.raises(TemplateError, match="Message 1 has content of type NoneType"):
        render_chat(None, [{"role": "user"}])
    with pytest.raises(TemplateError, match="list of messages"):
        render_chat(None, "hello")  # type: ignore[arg-type]


def test_bad_characters_are_repaired_and_noted() -> None:
    messages = [{"role": "user", "content": "a\udc80b\x00c \ud83d\ude00"}]
    cleaned, notes = clean_messages(messages)
    assert cleaned == [{"role": "user", "content": "a\ufffdbc 😀"}]
    assert len(notes) == 2
    rendered = render_chat(SMOLLM2, messages)
    assert "a\ufffdbc 😀" in rendered.text
    rendered.text.encode("utf-8")  # the tokenizer gets valid UTF-8
    assert not rendered.used_fallback
    assert rendered.warning is not None
    assert "U+FFFD" in rendered.warning
    assert "NUL characters" in rendered.warning
    # A valid pair split into two code points is joined silently: nothing was lost.
    assert render_chat(SMOLLM2, [{"role": "user", "content": "\ud83d\ude00"}]).warning is None


def test_the_previous_tracer_is_restored() -> None:
    calls: list[str] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> None:
        calls.append(event)

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        render_template(SMOLLM2, CONVO)
        with pytest.raises(TemplateError):
            render_template(HOSTILE_LOOP, CONVO, time_limit=0.1)
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(previous)


def test_threads_render_independently() -> None:
    results: dict[str, object] = {}

    def run(name: str, template: str, limit: float) -> None:
        try:
            results[name] = render_template(template, CONVO, time_limit=limit)
        except TemplateError as exc:
            results[name] = exc

    slow = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    threads = [threading.Thread(target=run, args=("slow", slow, 0.5))]
    threads += [threading.Thread(target=run, args=(f"ok{i}", SMOLLM2, 2.0)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(results["slow"], TemplateError)
    assert all(results[f"ok{i}"] == CHATML for i in range(4))


# --- the demo models' own templates --------------------------------------------------------------------


@pytest.mark.demo
def test_demo_model_templates(demo_models: tuple[Path, Path]) -> None:
    import llama_cpp
    smollm2, gemma = demo_models
    seen = {}
    for path in (smollm2, gemma):
        # Trusted files (their sha256 was checked at install); vocab_only reads metadata and vocabulary only.
        model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        template = model.metadata.get("tokenizer.chat_template")
        bos = model.detokenize([model.token_bos()], special=True).decode()
        eos = model.detokenize([model.token_eos()], special=True).decode()
        seen[path] = (template, render_chat(template, CONVO, bos, eos))
        model.close()

    template, rendered = seen[smollm2]
    assert template is not None
    assert "<|im_start|>" in template
    assert rendered == RenderedPrompt(CHATML, False, None)
    # Without a system message, SmolLM2's template adds its own default one.
    own_default = render_chat(template, CONVO[1:])
    assert own_default.text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")

    # The base Gemma 3 270M ships without a chat template: the documented fallback, with the reason.
    template, rendered = seen[gemma]
    assert template is None
    assert rendered.used_fallback
    assert rendered.text == CHATML
    assert rendered.warning == "The model has no chat template. Answering with the plain ChatML format instead."
    # Told its architecture, the fallback is Gemma's own turn format.
    as_gemma = render_chat(template, CONVO, "<bos>", "<eos>", architecture="gemma3")
    assert as_gemma.text.startswith("<bos><start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>")
    assert as_gemma.warning is not None
    assert "(Gemma)" in as_gemma.warning


# --- the renderer child: hard limits on time and memory --------------------------------------------------

C_LEVEL_HANG = "{% set a=[0]*4000000 %}{% set b=[a]*4000000 %}{% set c=[0]*3999999+[1] %}{{ c in b }}"
C_LEVEL_GROWTH = "{{ [[0]*4000000]*100 }}"  # one str() call: 1.2 GB of text


def test_a_hang_inside_one_c_operation_is_stopped_and_remembered() -> None:
    start = time.monotonic()
    rendered = render_chat(C_LEVEL_HANG, CONVO, time_limit=1.0)
    took = time.monotonic() - start
    assert rendered.used_fallback
    assert rendered.text == CHATML
    assert rendered.warning == (
        "The model's chat template spent more than 1 s of CPU time rendering and was stopped (it may loop forever). "
        "Answering with the plain ChatML format instead.")
    # Killed once it has spent its CPU time (or at the stall bound), not after the hours the comparison takes.
    assert took < 1.0 + GRACE_S + STALL_S
    # The same template is refused at once afterwards: no message waits for the deadline again.
    start = time.monotonic()
    with pytest.raises(TemplateLimitError, match="spent more than 1 s of CPU time"):
        render_template(C_LEVEL_HANG, CONVO, time_limit=1.0)
    assert time.monotonic() - start < 0.5
    # And the next template renders in a fresh child.
    assert render_chat(SMOLLM2, CONVO) == RenderedPrompt(CHATML, False, None)


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="stops the child with SIGSTOP")
def test_a_busy_machine_does_not_refuse_a_harmless_template() -> None:
    """The bound is CPU time: a child given no CPU for longer than its limit (stopped here, as a loaded machine
    starves it) still renders, and is not refused for the wait."""
    runner = TemplateRunner()
    try:
        assert runner.render(SMOLLM2, CONVO, {}) == CHATML  # the child is up
        pid = runner.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        resume = threading.Timer(2.0, os.kill, (pid, signal.SIGCONT))
        resume.start()
        start = time.monotonic()
        assert runner.render(SMOLLM2, CONVO, {"time_limit": 0.5}) == CHATML
        assert time.monotonic() - start >= 1.5  # it did wait for the stopped child, past 0.5 s + grace
        resume.join()
    finally:
        runner.close()


def test_memory_growth_inside_one_c_operation_is_stopped() -> None:
    runner = TemplateRunner(headroom=64 * 1024 * 1024)
    try:
        with pytest.raises(TemplateLimitError, match="used more than 64 MB of memory"):
            runner.render(C_LEVEL_GROWTH, CONVO, {"time_limit": 30.0})
        assert runner.pid is None  # the child that grew is gone
        assert runner.render(SMOLLM2, CONVO, {}) == CHATML
    finally:
        runner.close()


def test_memory_growth_through_render_chat_falls_back_with_the_reason() -> None:
    rendered = render_chat(C_LEVEL_GROWTH + "{{ 1 }}", CONVO, architecture="gemma2")
    assert rendered.used_fallback
    assert rendered.text.startswith("<start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>")
    assert rendered.warning is not None
    assert re.fullmatch(r"The model's chat template (spent more than 2 s of CPU time|used more than \d+ MB of memory"
                        r"|ran out of memory).*Answering with the Gemma format instead\.", rendered.warning)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_the_renderer_child_loads_neither_llama_cpp_nor_qt() -> None:
    runner = shared_runner()
    assert runner.render(SMOLLM2, CONVO, {}) == CHATML
    assert runner.pid is not None
    maps = Path(f"/proc/{runner.pid}/maps").read_text().lower()
    for library in ("libllama", "libggml", "qt6", "pyside6", "numpy"):
        assert library not in maps
    limits = Path(f"/proc/{runner.pid}/limits").read_text()
    address_space = next(line for line in limits.splitlines() if line.startswith("Max address space"))
    assert "unlimited" not in address_space.split()[3]  # the soft limit is set


def test_a_refused_template_falls_back_to_the_architectures_format() -> None:
    rendered = render_chat(HOSTILE["mro"], CONVO, "<bos>", "<eos>", architecture="gemma3")
    assert rendered.used_fallback
    assert rendered.text == (
        "<bos><start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n<start_of_turn>model\n")
    assert rendered.warning is not None
    assert rendered.warning.endswith("Answering with the Gemma format instead.")
    missing = render_chat(None, CONVO, architecture="gemma3")
    assert missing.used_fallback
    assert missing.warning == "The model file has no chat template; its architecture's known format (Gemma) was used."
