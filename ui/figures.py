"""How each figure reads on screen, in one place: the chat's stats line and the dashboard's numbers strip
show an answer's totals with these, so the two always read the same."""

from __future__ import annotations

# A prompt found in the cache is "processed" in next to no time and its rate is meaningless (20 million
# tok/s was seen); no real prefill comes near this.
CACHED_PREFILL_TPS = 1_000_000


def decode_text(tps: float) -> str:
    return f"{tps:.1f} tok/s"


def acceptance_text(acceptance: float) -> str:
    return f"{acceptance * 100:.0f}%"


def tau_text(tokens_per_pass: float) -> str:
    return f"{tokens_per_pass:.2f}"


def prefill_text(prefill_tps: float) -> str:
    if prefill_tps <= 0 or prefill_tps >= CACHED_PREFILL_TPS:
        return "prefill cached"
    return f"prefill {prefill_tps:.0f} tok/s"


# The one name for the plain decoding rate measured at load: the dashboard's line and the chat's footer use it.
PLAIN_RATE = "plain rate"


def speedup_text(speedup: float) -> str:
    return f"{speedup:.2f}× the {PLAIN_RATE}"
