"""Suffix-tree drafting: counts of every substring up to a depth, over the context and earlier answers.

``SuffixTree`` holds a token text and, for every substring of it up to ``max_depth`` tokens, how often it
occurs and which token most often follows it (as in SuffixDecoding, ArcticInference's ``suffix_tree.cc``).
Appending a token costs O(max_depth): the suffixes of the text that are still being repeated are kept as
a list of nodes, one per length, and each moves one step down. A substring seen once is not expanded into
nodes: its single occurrence is read from the text, and it gains a node only when it occurs again, so a
text that does not repeat itself costs a few nodes per token, not ``max_depth``.

``SuffixDrafter`` keeps one tree over the current context (prompt and answer) and a second, capped one over
earlier answers (this session's, and, where the chat history is on, the user's stored ones). At every match
length it follows the most frequent continuation, with p <- p * count(child) / count(node), until p falls
below ``min_prob``; the draft with the largest expected number of accepted tokens (the sum of p) wins. The
per-token p goes to the depth policy as the prior for each position.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from app.engine.drafters import Draft
from app.events import FROM_NGRAM

SEPARATOR = -1  # between documents of a tree's text: never matched, never followed
_ROOT = 0
_SHIFT = 32  # edge key: node << _SHIFT | token (token ids are below 2**32)
NODE_BYTES = 165  # measured with tracemalloc: seven typed arrays, the edge dict's entry and its key
TOKEN_BYTES = 8


@dataclass(frozen=True)
class Continuation:
    tokens: list[int]
    probs: list[float]  # cumulative: the chance that the draft is still right after each token
    match_len: int

    @property
    def score(self) -> float:
        return sum(self.probs)


class SuffixTree:
    """Substring counts up to ``max_depth`` over a token text made of documents.

    Per node: how many times its substring occurs (``count``), how many of those occurrences are followed
    by a token (``total``, the sum of the children's counts), its most frequent child (``best``, the latest
    of the equally frequent ones), and where its latest occurrence ends in the text (``pos``: the index of
    the token after it), from which a substring seen once, or one at the depth limit, is continued.
    """

    def __init__(self, max_depth: int = 32) -> None:
        if max_depth < 1:
            raise ValueError("max_depth must be at least 1")
        self.max_depth = max_depth
        self.clear()

    def clear(self) -> None:
        self.tokens: list[int] = []
        self._count = array("q", [0])
        self._total = array("q", [0])
        self._pos = array("q", [0])
        self._prev = array("q", [0])  # where the occurrence before the latest ends (for the latest's own match)
        self._best = array("q", [-1])
        self._depth = array("q", [0])
        self._token = array("q", [SEPARATOR])
        self._edges: dict[int, int] = {}
        self._active: list[int] = []  # nodes of the text's suffixes that occurred before, shortest first

    # --- size -------------------------------------------------------------------------------------

    @property
    def nodes(self) -> int:
        return len(self._count)

    @property
    def nbytes(self) -> int:
        """An estimate of the memory held (NODE_BYTES per node, TOKEN_BYTES per token of text)."""
        return self.nodes * NODE_BYTES + len(self.tokens) * TOKEN_BYTES

    # --- building ---------------------------------------------------------------------------------

    def _new_node(self, parent: int, token: int, pos: int) -> int:
        node = len(self._count)
        self._count.append(1)
        self._total.append(0)
        self._pos.append(pos)
        self._prev.append(pos)
        self._best.append(-1)
        self._depth.append(self._depth[parent] + 1)
        self._token.append(token)
        self._edges[parent << _SHIFT | token] = node
        self._add_child_occurrence(parent, node)
        return node

    def _add_child_occurrence(self, parent: int, child: int) -> None:
        self._total[parent] += 1
        best = self._best[parent]
        if best < 0 or self._count[child] >= self._count[best]:
            self._best[parent] = child

    def _step(self, node: int, token: int, end: int) -> int | None:
        """Extend one suffix (at ``node``) by ``token``, the text's token at index ``end``; the child, or
        None where the suffix becomes one seen only here (its continuation is read from the text)."""
        child = self._edges.get(node << _SHIFT | token)
        if child is None:
            self._new_node(node, token, end + 1)
            return None
        if self._count[child] == 1 and self._best[child] < 0 and self._depth[child] < self.max_depth:
            # A substring seen once before: its earlier occurrence gets its next token as a node now.
            after = self._pos[child]
            if self.tokens[after] != SEPARATOR:
                self._new_node(child, self.tokens[after], after + 1)
        self._count[child] += 1
        self._prev[child] = self._pos[child]
        self._pos[child] = end + 1
        self._add_child_occurrence(node, child)
        return child

    def append(self, token: int) -> None:
        """Add one token to the text: O(max_depth)."""
        end = len(self.tokens)
        self.tokens.append(token)
        if token == SEPARATOR:
            self._active = []
            return
        self._count[_ROOT] += 1
        active: list[int] = []
        for node in (_ROOT, *self._active):
            if self._depth[node] == self.max_depth:
                continue  # matched at full depth: kept for drafting, not extended
            child = self._step(node, token, end)
            if child is not None:
                active.append(child)
        self._active = active

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.append(token)

    # --- reading ----------------------------------------------------------------------------------

    def count(self, substring: Sequence[int]) -> int:
        """How many times ``substring`` (at most ``max_depth`` tokens) occurs in the text."""
        node, j = _ROOT, 0
        for token in substring:
            step = self.follow(node, j, token)
            if step is None:
                return 0
            node, j = step
        return self._count[node] if j == 0 else 1

    def follow(self, node: int, j: int, token: int) -> tuple[int, int] | None:
        """One token further from a match state: (node, j) is ``node``'s substring followed by the next j
        tokens of its latest occurrence (j > 0 only below a node that has no children)."""
        if j == 0:
            child = self._edges.get(node << _SHIFT | token)
            if child is not None:
                return child, 0
            if node == _ROOT or self._best[node] >= 0:
                return None
        at = self._pos[node] + j
        if at < len(self.tokens) and self.tokens[at] == token:
            return node, j + 1
        return None

    def depth(self, node: int) -> int:
        return self._depth[node]

    def _source(self, node: int) -> int:
        """Where the latest occurrence of a childless node's substring that has a next token ends."""
        pos = self._pos[node]
        return self._prev[node] if pos >= len(self.tokens) else pos

    def continuations(self, node: int, j: int) -> int:
        """How many earlier occurrences of the state's substring have a next token."""
        if j == 0 and self._best[node] >= 0:
            return self._total[node]
        at = self._source(node) + j
        return 1 if at < len(self.tokens) and self.tokens[at] >= 0 else 0

    def active_states(self) -> list[tuple[int, int]]:
        """The text's own suffixes as match states, shortest first (the context matching itself)."""
        return [(node, 0) for node in self._active]

    def continuation(self, node: int, j: int, k: int, min_prob: float, *,
                     periodic: bool = False) -> tuple[list[int], list[float]]:
        """Up to ``k`` tokens following the state: the most frequent child while there are children, then
        the latest occurrence's text; stops when the running probability falls below ``min_prob``.

        ``periodic`` (the state matches the end of this tree's own text): an occurrence read up to the end
        of the text, where at least one whole period matched, goes on with the draft itself, so a text
        repeating with a short period ("aye, aye, ...") is drafted to full depth, not cut where it ends."""
        matched = self._depth[node] + j
        tokens: list[int] = []
        probs: list[float] = []
        p = 1.0
        text = self.tokens
        while len(tokens) < k:
            best = self._best[node] if j == 0 else -1
            if best >= 0:
                p *= self._count[best] / self._total[node]
                if p < min_prob:
                    break
                node = best
                tokens.append(self._token[node])
                probs.append(min(p, 1.0))
                continue
            at = self._source(node) + j
            if at >= len(text):
                period = len(text) - (at - len(tokens))
                if not periodic or matched < period or at - len(text) >= len(tokens):
                    break
                tokens.append(tokens[at - len(text)])
                probs.append(min(p, 1.0))
                j += 1
                continue
            if text[at] == SEPARATOR:
                break
            tokens.append(text[at])
            probs.append(min(p, 1.0))
            j += 1
        return tokens, probs

    def best_continuation(self, states: Sequence[tuple[int, int]], k: int, min_prob: float,
                          min_match: int, *, periodic: bool = False) -> Continuation | None:
        """The continuation with the largest sum of probabilities over all match lengths (states shortest
        first). Lengths whose occurrences are the same set as a longer one's draft the same tokens, so only
        the longest of each is drafted from. ``match_len`` is the longest length that has a continuation."""
        best: Continuation | None = None
        longest = 0
        last_seen = -1
        for node, j in reversed(states):
            length = self._depth[node] + j
            if length < min_match:
                break
            seen = self.continuations(node, j)
            if seen == 0 or seen == last_seen:
                continue
            last_seen = seen
            longest = max(longest, length)
            tokens, probs = self.continuation(node, j, k, min_prob, periodic=periodic)
            if tokens and (best is None or sum(probs) > best.score):
                best = Continuation(tokens, probs, longest)
        if best is not None and best.match_len != longest:
            best = Continuation(best.tokens, best.probs, longest)
        return best


class SuffixDrafter:
    """Drafts from a suffix tree over the context and a second, capped tree over earlier answers.

    ``observe`` (also called by ``propose``) brings the context tree up to the token sequence so far; a
    sequence that is not an extension of the last one starts a new context, and the answer of the old one
    (what came after its first observed length, the prompt) goes to the earlier-answers tree.
    """

    MAX_DEPTH = 16  # as good as 24 or 32 in the replays of the edit prompts, and half the nodes of a copy
    MATCH_CAP = 64  # longest match length reported (and followed in the earlier-answers tree)
    MIN_PROB = 0.1
    CONTEXT_TOKENS = 1 << 17  # past this the context tree is rebuilt from its newer half
    HISTORY_TOKENS = 1 << 16  # the earlier-answers tree's caps (the oldest answers go first)
    HISTORY_BYTES = 32 << 20
    HISTORY_MIN_MATCH = 2  # one token says too little about which earlier answer is being repeated

    def __init__(self, min_match: int = 1, *, max_depth: int | None = None, history_tokens: int | None = None,
                 history_bytes: int | None = None) -> None:
        self.min_match = max(1, min_match)
        self.max_depth = max_depth or self.MAX_DEPTH
        self.history_tokens = self.HISTORY_TOKENS if history_tokens is None else history_tokens
        self.history_bytes = self.HISTORY_BYTES if history_bytes is None else history_bytes
        self.context = SuffixTree(self.max_depth)
        self.history = SuffixTree(self.max_depth)
        self._answers: list[list[int]] = []  # the documents of the history tree, oldest first
        self._seen: list[int] = []  # the whole sequence observed (to tell an extension from a new context)
        self._offset = 0  # how many leading tokens of _seen the context tree dropped (rebuilds)
        self._prompt_len = 0
        self._states: list[tuple[int, int]] = []  # the context's suffixes matched in the history tree

    # --- memory across contexts -------------------------------------------------------------------

    def reset(self) -> None:
        """Forget everything, earlier answers included (so runs that start from a reset are comparable)."""
        self._forget_context()
        self.history.clear()
        self._answers = []

    def remember(self, answers: Iterable[Sequence[int]]) -> None:
        """Add earlier answers (token lists, oldest first) to the history tree, within its caps."""
        for answer in answers:
            if len(answer) > self.HISTORY_MIN_MATCH and self.history_tokens > 0:
                self._answers.append(list(answer[-self.history_tokens :]))
        self._rebuild_history()

    @property
    def history_answers(self) -> int:
        return len(self._answers)

    def _rebuild_history(self) -> None:
        """Add the answers not yet in the tree; past a cap, drop the oldest down to half of it and rebuild
        (once per half-cap of new tokens, not per answer)."""
        built = sum(1 for t in self.history.tokens if t == SEPARATOR)
        tokens = sum(len(d) + 1 for d in self._answers)
        if tokens > self.history_tokens:
            while self._answers and tokens > self.history_tokens // 2:
                tokens -= len(self._answers.pop(0)) + 1
            self.history.clear()
            built = 0
        for doc in self._answers[built:]:
            self.history.append(SEPARATOR)
            self.history.extend(doc)
        while self.history.nbytes > self.history_bytes and self._answers:
            del self._answers[: max(1, len(self._answers) // 2)]
            self.history.clear()
            for doc in self._answers:
                self.history.append(SEPARATOR)
                self.history.extend(doc)
        self._rematch()

    def _rematch(self) -> None:
        self._states = []
        for token in self._seen[-self.MATCH_CAP :]:
            self._match_history(token)

    def _match_history(self, token: int) -> None:
        if not self._answers:
            return
        states: list[tuple[int, int]] = []
        for node, j in ((_ROOT, 0), *self._states):
            step = self.history.follow(node, j, token)
            if step is not None and self.history.depth(step[0]) + step[1] <= self.MATCH_CAP:
                states.append(step)
        self._states = states

    # --- the context ------------------------------------------------------------------------------

    def _forget_context(self) -> None:
        self.context.clear()
        self._seen = []
        self._offset = 0
        self._prompt_len = 0
        self._states = []

    def observe(self, tokens: Sequence[int]) -> None:
        """Bring the context tree up to ``tokens`` (the whole sequence so far)."""
        seen = self._seen
        n = len(seen)
        if len(tokens) < n or list(tokens[:n]) != seen:
            if self._prompt_len and n > self._prompt_len:
                self.remember([seen[self._prompt_len :]])
            self._forget_context()
            n = 0
        if n == 0:
            self._prompt_len = len(tokens)
        for token in tokens[n:]:
            self.context.append(token)
            self._match_history(token)
        seen.extend(tokens[n:])
        if len(self.context.tokens) > self.CONTEXT_TOKENS:
            keep = self.CONTEXT_TOKENS // 2
            self.context.clear()
            self.context.extend(seen[-keep:])
            self._offset = len(seen) - keep

    def propose(self, tokens: Sequence[int], k: int) -> Draft:
        self.observe(tokens)
        if k <= 0:
            return Draft()
        own = self.context.best_continuation(self.context.active_states(), k, self.MIN_PROB, self.min_match,
                                             periodic=True)
        earlier = self.history.best_continuation(self._states, k, self.MIN_PROB,
                                                 max(self.min_match, self.HISTORY_MIN_MATCH)) \
            if self._states else None
        if earlier is not None and (own is None or earlier.score > own.score):
            own = earlier
        if own is None:
            return Draft()
        return Draft(tokens=own.tokens, q=[None] * len(own.tokens), sources=[FROM_NGRAM] * len(own.tokens),
                     match_len=min(own.match_len, self.MATCH_CAP), probs=own.probs)



CHARS_PER_TOKEN = 4  # to read about the number of tokens asked for from the history's text


def stored_answers(max_tokens: int, tokenize: Callable[[str], list[int]], path: str | None = None,
                   log: Callable[[str], None] | None = None) -> list[list[int]]:
    """The user's newest complete answers from the chat history, tokenized, oldest first (about
    ``max_tokens`` in all). A history that cannot be read gives none and a log line: drafting from it is an
    optimisation, never a reason to fail a load."""
    import sqlite3
    from pathlib import Path

    from app.errors import StorageError
    from app.paths import data_dir
    from app.storage.history import FILE_NAME, HistoryStore

    if not Path(path if path is not None else data_dir() / FILE_NAME).exists():
        return []  # no history yet: nothing to read, and none is created from here
    try:
        store = HistoryStore(path, check_damage=False)
        try:
            texts = store.recent_answers(max_tokens * CHARS_PER_TOKEN)
        finally:
            store.close()
    except (StorageError, OSError, sqlite3.Error) as exc:
        if log is not None:
            log(f"suffix drafter: the chat history could not be read ({exc}); drafting without it")
        return []
    answers = [tokenize(text) for text in texts]
    while answers and sum(len(a) for a in answers) > max_tokens:
        del answers[0]
    return answers


def suffix_drafter(min_match: int, history_tokens: int, tokenize: Callable[[str], list[int]],
                   log: Callable[[str], None] | None = None, history_path: str | None = None) -> SuffixDrafter:
    """The session's suffix drafter, with the user's earlier answers in its history tree when asked."""
    drafter = SuffixDrafter(min_match)
    if history_tokens > 0:
        answers = stored_answers(min(history_tokens, drafter.history_tokens), tokenize, history_path, log)
        drafter.remember(answers)
        if log is not None and answers:
            log(f"suffix drafter: {drafter.history_answers} earlier answers "
                f"({len(drafter.history.tokens)} tokens) from the chat history")
    return drafter
