"""The suffix tree and its drafter: counts, probabilities, bounds, memory caps, earlier answers.

Plain token lists, built so that the right answer holds by construction (counts are checked against a
brute-force count of the same text); no model, no timing.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.suffix_tree import SEPARATOR, SuffixDrafter, SuffixTree, stored_answers, suffix_drafter
from app.storage.history import HistoryStore


def occurrences(text: list[int], sub: list[int]) -> int:
    """Brute force: how many times ``sub`` occurs in ``text`` within one document."""
    n = len(sub)
    return sum(1 for i in range(len(text) - n + 1) if text[i : i + n] == sub and SEPARATOR not in sub)


def proposals(drafter: SuffixDrafter, prompt: list[int], answer: list[int], k: int = 4) -> list[list[int]]:
    """The drafter's proposal before each answer token, as the decoder asks for them."""
    tokens, out = list(prompt), []
    for tok in answer:
        out.append(drafter.propose(tokens, k).tokens)
        tokens.append(tok)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=120), st.integers(1, 8), st.data())
def test_counts_equal_a_brute_force_count(text: list[int], depth: int, data: st.DataObject) -> None:
    tree = SuffixTree(depth)
    tree.extend(text)
    for _ in range(10):
        start = data.draw(st.integers(0, len(text) - 1))
        length = data.draw(st.integers(1, depth))
        sub = text[start : start + length]
        assert tree.count(sub) == occurrences(text, sub)
    assert tree.count([99]) == 0


def test_documents_are_counted_apart() -> None:
    tree = SuffixTree(4)
    tree.extend([1, 2, 3])
    tree.append(SEPARATOR)
    tree.extend([3, 1, 2])
    assert tree.count([1, 2]) == 2
    assert tree.count([2, 3]) == 1
    assert tree.count([3, 3]) == 0  # across the separator: no such substring
    assert tree.count([2, 3, 1]) == 0


def test_the_probability_is_the_product_of_count_ratios() -> None:
    # After "5 6": 7 three times, 8 once; after "5 6 7": 9 twice, 10 once.
    text = [5, 6, 7, 9, 0, 5, 6, 7, 9, 0, 5, 6, 7, 10, 0, 5, 6, 8, 0, 5, 6]
    draft = SuffixDrafter().propose(text, 2)
    assert draft.tokens == [7, 9]
    assert draft.probs[0] == 3 / 4
    assert abs(draft.probs[1] - 3 / 4 * 2 / 3) < 1e-12


def test_drafting_stops_below_the_threshold() -> None:
    # "1 2" was followed by twelve different tokens once each: no continuation is likely enough.
    text: list[int] = []
    for i in range(12):
        text += [1, 2, 100 + i, 50 + i]
    assert SuffixDrafter(1).propose([*text, 1, 2], 4).tokens == []


def test_a_unique_long_match_is_followed_to_full_depth_with_certainty() -> None:
    code = list(range(100, 160))
    draft = SuffixDrafter().propose([*code, 7, 8, *code[:20]], 16)
    assert draft.tokens == code[20:36]
    assert draft.probs == [1.0] * 16
    assert draft.match_len == SuffixDrafter.MAX_DEPTH  # matched as deep as the tree goes


def test_the_furthest_reaching_match_wins() -> None:
    # "x a b c" and "y a b c" occur; the end "y a b" matches the second one further back.
    seq = [1, 5, 6, 7, 40, 2, 5, 6, 7, 41, 3, 2, 5, 6]
    draft = SuffixDrafter(1).propose(seq, 2)
    assert draft.tokens == [7, 41]
    assert draft.match_len == 3


def test_rewritten_context_starts_over() -> None:
    drafter = SuffixDrafter(2)
    proposals(drafter, [1, 2, 3, 60, 61, 99, 4], [60, 61])
    assert drafter.propose([60, 61, 62, 60, 61], 3).tokens == [62, 60, 61]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=60), st.lists(st.integers(0, 6), max_size=30),
       st.integers(0, 12), st.integers(1, 4))
def test_proposals_are_bounded_and_come_from_the_context(prompt: list[int], answer: list[int], k: int,
                                                        n: int) -> None:
    drafter = SuffixDrafter(n)
    tokens = list(prompt)
    for tok in [*answer, None]:
        draft = drafter.propose(tokens, k)
        assert len(draft.tokens) <= k
        assert set(draft.tokens) <= set(tokens)
        assert len(draft.q) == len(draft.sources) == len(draft.tokens) == len(draft.probs)
        assert all(0.0 < p <= 1.0 for p in draft.probs)
        assert list(draft.probs) == sorted(draft.probs, reverse=True)  # a running product never rises
        assert 0 <= draft.match_len <= SuffixDrafter.MATCH_CAP
        if draft.tokens:
            assert draft.match_len >= n
        if tok is not None:
            tokens.append(tok)


def test_nodes_grow_with_repeats_not_with_depth() -> None:
    """A text that never repeats a pair costs a few nodes per token, whatever the depth: substrings seen
    once are read from the text, not expanded. Work per token is bounded by the depth."""
    text = list(range(5000))
    shallow, deep = SuffixTree(4), SuffixTree(64)
    shallow.extend(text)
    deep.extend(text)
    assert deep.nodes == shallow.nodes <= 2 * len(text)
    assert max(len(deep.active_states()), len(shallow.active_states())) <= 1


def test_the_context_tree_is_rebuilt_from_its_newer_half_past_its_cap() -> None:
    class Small(SuffixDrafter):
        CONTEXT_TOKENS = 1000

    drafter = Small()
    seq = list(range(1500))
    drafter.observe(seq)
    assert len(drafter.context.tokens) <= Small.CONTEXT_TOKENS
    assert drafter.propose([*seq, 1400, 1401], 2).tokens == [1402, 1403]  # the newer half is still known
    assert drafter.context.count([100, 101]) == 0


def test_earlier_answers_draft_in_a_new_context() -> None:
    drafter = SuffixDrafter()
    answer = [70, 71, 72, 73, 74, 75, 76, 77]
    proposals(drafter, [1, 2, 3], answer)  # the first chat: its answer goes to the history when the next starts
    draft = drafter.propose([9, 8, 70, 71], 4)  # a new chat whose context has "70 71" only once
    assert draft.tokens == [72, 73, 74, 75]
    assert drafter.history_answers == 1


def test_remembered_answers_draft_from_the_first_token() -> None:
    """An answer from the stored chat history, given at load, drafts a new chat's repeat of it at once."""
    drafter = SuffixDrafter()
    drafter.remember([[40, 41, 42, 43, 44, 45, 46]])
    assert drafter.propose([1, 2, 3, 40, 41], 3).tokens == [42, 43, 44]
    assert drafter.propose([1, 2, 3, 40], 3).tokens == []  # one token is too little to go on


def test_history_follows_the_most_frequent_continuation() -> None:
    drafter = SuffixDrafter()
    drafter.remember([[5, 6, 30, 31], [5, 6, 30, 32], [5, 6, 30, 33], [5, 6, 35, 36]])
    draft = drafter.propose([4, 5, 6], 4)
    # 30 with 3/4; then 31, 32 and 33 once each: the latest of them, at 3/4 * 1/3; then the answer ends.
    assert draft.tokens == [30, 33]
    assert draft.probs == [0.75, 0.25]


def test_reset_empties_the_history() -> None:
    drafter = SuffixDrafter()
    proposals(drafter, [1, 2, 3], [70, 71, 72, 73])
    drafter.observe([9])
    drafter.reset()
    assert drafter.propose([9, 70, 71], 4).tokens == []


def test_history_is_capped_in_tokens_and_drops_the_oldest_answers_first() -> None:
    drafter = SuffixDrafter(history_tokens=3000)
    chunk = 1000
    drafter.remember([list(range(i * chunk, (i + 1) * chunk)) for i in range(5)])
    assert len(drafter.history.tokens) <= 3000
    first, last = 0, 4 * chunk
    assert drafter.propose([-2, first, first + 1], 2).tokens == []
    assert drafter.propose([-3, last, last + 1], 2).tokens == [last + 2, last + 3]


def test_history_is_capped_in_bytes() -> None:
    answers = [[(i * 7 + j * j) % 50 for j in range(400)] for i in range(20)]  # repetitive: many nodes
    uncapped = SuffixDrafter()
    uncapped.remember(answers)
    assert uncapped.history_answers == 20
    cap = uncapped.history.nbytes // 2
    drafter = SuffixDrafter(history_bytes=cap)
    drafter.remember(answers)
    assert 0 < drafter.history.nbytes <= cap
    assert 0 < drafter.history_answers < 20
    assert drafter.history.count(answers[-1][:8]) >= 1  # the newest answers are the ones kept


def test_history_off_keeps_nothing() -> None:
    drafter = SuffixDrafter(history_tokens=0)
    drafter.remember([[40, 41, 42, 43]])
    proposals(drafter, [1, 2], [40, 41, 42, 43])
    drafter.observe([9])
    assert drafter.history_answers == 0
    assert drafter.propose([9, 40, 41], 2).tokens == []


def test_the_session_drafter_reads_the_users_earlier_answers_from_the_chat_history(tmp_path: Path) -> None:
    """A real history file: complete answers are read (newest within the cap), others are not; with history
    off nothing is read."""
    path = tmp_path / "history.sqlite3"
    with HistoryStore(path) as store:
        chat = store.new_chat()
        store.add_message(chat, "user", "please repeat")
        store.add_message(chat, "assistant", "def read_records(path): return open(path).read()")
        store.add_message(chat, "assistant", "half an answer", status="cancelled")

    def tokenize(text: str) -> list[int]:
        return [ord(c) for c in text]

    drafter = suffix_drafter(1, 1000, tokenize, history_path=str(path))
    assert drafter.history_answers == 1
    assert drafter.propose(tokenize("x = def read_rec"), 4).tokens == tokenize("ords")
    assert suffix_drafter(1, 0, tokenize, history_path=str(path)).history_answers == 0
    assert stored_answers(10, tokenize, str(path)) == []  # the one answer is longer than the cap
    lines: list[str] = []
    unreadable = tmp_path / "a-folder.sqlite3"
    unreadable.mkdir()
    assert stored_answers(1000, tokenize, str(unreadable), lines.append) == []
    assert len(lines) == 1
    assert "could not be read" in lines[0]


def test_a_session_loads_the_users_earlier_answers_into_its_drafter(tiny_target: Path, specdeck_home: Path) -> None:
    """Through EngineSession, as the window loads it: the history in SPECDECK_HOME (a scratch home) is read at
    load when history_tokens is set, and not at all when it is 0."""
    from app.engine.session import EngineSession
    from app.params import DraftSettings, LoadSettings

    with HistoryStore() as store:
        chat = store.new_chat()
        store.add_message(chat, "assistant", "apples and pears and plums, apples and pears")
    lines: list[str] = []
    for tokens, expected in ((1000, 1), (0, 0)):
        settings = LoadSettings(str(tiny_target), DraftSettings(ngram=2, history_tokens=tokens, k_max=4),
                                n_ctx=256, n_threads=1)
        session = EngineSession(settings, log=lines.append)
        try:
            drafter = session.decoder.ngram
            assert drafter is not None
            assert drafter.history_answers == expected
        finally:
            session.close()
    assert any("earlier answers" in line for line in lines)


def test_no_history_file_is_created_by_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    assert stored_answers(1000, lambda text: [1], str(path)) == []
    assert not path.exists()
