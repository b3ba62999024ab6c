"""Two generate requests beside the chat: continue a partial answer (Continue after Max tokens) and a raw
prompt with no chat template (completion, for base models). Each is compared with a plain generation from
the token prompt it must build, from an empty cache, so the comparison holds on any CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.engine.session import EngineSession
from app.errors import TemplateError
from app.events import Finished, Token
from app.params import DraftSettings, LoadSettings, SamplingSettings
from tests.gguf_fixtures import BYTES_EOT_ID

GREEDY = SamplingSettings(temperature=0.0, max_tokens=12)
IM_START = 2  # the bytes vocabulary's <|im_start|>


def _answer(session: EngineSession, messages: list[dict[str, str]], **kwargs: Any) -> tuple[list[int], Finished]:
    session.decoder.reset_cache()
    events = list(session.generate(1, messages, GREEDY, **kwargs))
    finished = events[-1]
    assert isinstance(finished, Finished)
    return [t for e in events if isinstance(e, Token) for t in e.token_ids], finished


def _session(path: Path) -> EngineSession:
    return EngineSession(LoadSettings(str(path), DraftSettings(ngram=0), n_ctx=512, n_threads=1))


def test_continue_answer_goes_on_from_the_partial_answer(tiny_target: Path) -> None:
    session = _session(tiny_target)
    try:
        chat = [{"role": "user", "content": "Count with me."}]
        partial = "one two three <|im_end|>"  # control-token text in the answer stays plain text
        opened, _ = session.prompt_tokens(chat)
        expected_prompt = opened + session.target.tokenize(partial, parse_special=False)
        assert BYTES_EOT_ID not in expected_prompt[len(opened):]  # the answer is left open
        continued, finished = _answer(session, [*chat, {"role": "assistant", "content": partial}],
                                      continue_answer=True)
        direct, _ = _answer(session, [], prompt=expected_prompt)
        assert continued == direct
        assert finished.stats.prompt_tokens == len(expected_prompt)
        closed, _ = session.prompt_tokens([*chat, {"role": "assistant", "content": partial}])
        assert closed != expected_prompt  # a closed turn would end with the end-of-turn token
        with pytest.raises(TemplateError):
            _answer(session, chat, continue_answer=True)  # no partial answer to go on from
    finally:
        session.close()


def test_raw_prompt_has_no_template(tiny_model_factory: Any) -> None:
    session = _session(tiny_model_factory(chat_template=None))
    try:
        model = session.target
        messages = [{"role": "system", "content": "ignored"}, {"role": "user", "content": "Once upon a time"},
                    {"role": "assistant", "content": ", there"}]
        expected_prompt = [model.bos, *model.tokenize("Once upon a time, there", parse_special=False)]
        raw, finished = _answer(session, messages, raw=True)
        direct, _ = _answer(session, [], prompt=expected_prompt)
        assert raw == direct
        assert finished.stats.prompt_tokens == len(expected_prompt)
        assert IM_START not in session.raw_prompt_tokens(messages)
    finally:
        session.close()
