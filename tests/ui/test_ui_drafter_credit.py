"""An answer's footer credits its drafter model only when the drafter drafted in it (issue 38: footers credited
a drafter that had drafted nothing); answers saved before the count was kept are credited as before."""

from __future__ import annotations

from dataclasses import asdict

from app.events import MessageStats
from ui.chat.message import ChatMessage, footer_text


def answer(model_drafted: int) -> MessageStats:
    return MessageStats(prompt_tokens=5, completion_tokens=40, ttft_seconds=0.1, prefill_tps=50.0, decode_tps=20.0,
                        decode_seconds=2.0, passes=40, drafted=12, accepted=6, acceptance=0.5,
                        tokens_per_pass=1.0, per_position_acceptance=(0.5,), k_history=(), speedup_estimate=1.1,
                        model_drafted=model_drafted, model_accepted=0)


def test_the_footer_names_a_drafter_that_drafted_nothing_as_such() -> None:
    def footer(stats: object) -> str:
        return footer_text(ChatMessage("assistant", "hi", stats=stats, model="/m/target.gguf",  # type: ignore[arg-type]
                                       drafter="/m/draft.gguf"))

    assert "target.gguf (draft.gguf drafted nothing)" in footer(answer(0))
    assert "target.gguf + draft.gguf" in footer(answer(7))
    assert "target.gguf + draft.gguf" in footer(answer(-1))  # not counted
    saved = asdict(answer(0))
    assert "drafted nothing" in footer(saved)  # read back from the history as JSON
    del saved["model_drafted"], saved["model_accepted"]
    assert "target.gguf + draft.gguf" in footer(saved)  # an answer saved before the count existed
