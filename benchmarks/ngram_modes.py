"""llama.cpp's n-gram modes, replayed on recorded greedy answers (``app.measure.replay``) for the benchmarks
that compare SpecDeck's suffix drafter with them: ngram-simple and ngram-mod, reimplemented from
``common/ngram-map.cpp`` (``common_ngram_simple_draft``) and ``common/ngram-mod.cpp`` with the ``ngram_mod``
driver in ``common/speculative.cpp`` (llama.cpp as vendored by llama-cpp-python 0.3.36), with their defaults.
The product never drafts with these; they live beside the benchmarks that use them."""

from __future__ import annotations

from collections.abc import Sequence

from app.measure.replay import CostCurve, Replayed, Trace, replay_trace

# llama.cpp's defaults (common/common.h, the vendored build): ngram-simple size_n / size_m, ngram-mod
# n_match / n_min / n_max, and ngram-mod's table size, chunk and reset rules (common/speculative.cpp).
SIMPLE_N, SIMPLE_M = 12, 48
MOD_MATCH, MOD_MIN, MOD_MAX = 24, 48, 64
MOD_CHUNK = 32
MOD_LOW_ACCEPT, MOD_LOW_STREAK = 0.25, 5


# --- llama.cpp's n-gram modes ----------------------------------------------------------------------------

def ngram_simple_draft(tokens: Sequence[int], n: int = SIMPLE_N, m: int = SIMPLE_M) -> list[int]:
    """``common_ngram_simple_draft``: the last n tokens (the sampled one included) searched backwards in the
    earlier text; the m tokens after the latest match, or nothing when fewer than n follow it."""
    history, sampled = tokens[:-1], tokens[-1]
    cur = len(history)
    if cur <= n + m + 1:
        return []
    pattern = [*history[cur - n + 1 :], sampled]
    for j in range(cur - n - 1, 0, -1):
        if history[j : j + n] == pattern:
            copy = min(m, cur - (j + n))
            return list(history[j + n : j + n + copy]) if copy >= n else []
    return []


def replay_ngram_simple(traces: Sequence[Trace], curve: CostCurve, n: int = SIMPLE_N,
                        m: int = SIMPLE_M) -> list[Replayed]:
    return [replay_trace(t, curve, lambda tokens, _left: ngram_simple_draft(tokens, n, m)) for t in traces]


class NgramMod:
    """``common_ngram_mod`` with the ``ngram_mod`` speculative driver: one table from the hash of n_match
    tokens to the next token (last write wins), shared by every request of one server; the prompt is indexed
    at the start of a request, generated text only once more than MOD_CHUNK tokens have piled up; a draft
    shorter than n_min is dropped; five drafts in a row with acceptance under a quarter empty the table.

    The table is a dict keyed by the tokens themselves: llama.cpp's 4 Mi-entry hash table can collide,
    which at these text sizes is rare enough to leave out."""

    def __init__(self, n_match: int = MOD_MATCH, n_min: int = MOD_MIN, n_max: int = MOD_MAX) -> None:
        self.n, self.n_min, self.n_max = n_match, n_min, n_max
        self.table: dict[tuple[int, ...], int] = {}
        self.i_last = 0
        self.n_draft_last = 0
        self.n_low = 0

    def begin(self, prompt: Sequence[int]) -> None:
        self.i_last = 0
        self.n_draft_last = 0
        if len(prompt) < self.n:
            return
        for i in range(len(prompt) - self.n):
            self.table[tuple(prompt[i : i + self.n])] = prompt[i + self.n]
        self.i_last = len(prompt) - self.n

    def draft(self, tokens: Sequence[int]) -> list[int]:
        """``tokens``: the prompt and answer so far, the last one being the sampled token (id_last)."""
        self.n_draft_last = 0
        cur = len(tokens) - 1  # llama.cpp's prompt excludes id_last
        n = self.n
        if cur < n:
            return []
        if self.i_last + MOD_CHUNK < cur:
            for i in range(self.i_last, cur - n):
                self.table[tuple(tokens[i : i + n])] = tokens[i + n]
            self.i_last = cur - n
        window = list(tokens[cur - n + 1 : cur + 1])
        out: list[int] = []
        for i in range(self.n_max):
            token = self.table.get(tuple(window[i : i + n]))
            if token is None:
                if i < self.n_min:
                    return []
                break
            window.append(token)
            out.append(token)
        self.n_draft_last = len(out)
        return out

    def accept(self, n_accepted: int) -> None:
        if self.n_draft_last > 0:
            if n_accepted / self.n_draft_last < MOD_LOW_ACCEPT:
                self.n_low += 1
                if self.n_low >= MOD_LOW_STREAK:
                    self.table.clear()
                    self.n_low = 0
                    self.i_last = 0
            else:
                self.n_low = 0


def replay_ngram_mod(traces: Sequence[Trace], curve: CostCurve, **settings: int) -> list[Replayed]:
    """One table across the traces, in order, as one llama-server serves a bench's prompts."""
    mod = NgramMod(**settings)
    runs = []
    for trace in traces:
        mod.begin(trace.prompt)
        runs.append(replay_trace(trace, curve, lambda tokens, _left: mod.draft(tokens), lambda _d, n: mod.accept(n)))
    return runs
