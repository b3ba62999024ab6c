"""The speculative decoding loop: draft, verify in one target decode, accept, emit, roll back.

Greedy accepts a draft token while it equals the target's argmax at that position. Sampling accepts x
with probability min(1, p(x) / q(x)) and on rejection samples from norm(max(0, p − q)); after a fully
accepted draft the bonus token comes from p. The output distribution is the target's own; only the
speed changes. k = 0 is plain decoding through the same code.

Over 500 lines: drafting, the one verify pass, acceptance under every sampling rule, rollback and the
figures of each pass share the pass's state; split up, each part would take the whole state as arguments.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from app.engine import sampling
from app.engine.adaptive import DepthController, DraftPlan
from app.engine.drafters import Draft, TrainedDrafter
from app.engine.grammar import GrammarMask
from app.engine.llama import ROLLBACK_CHECKPOINTS, Context, Detokenizer, Model
from app.engine.suffix_tree import SuffixDrafter
from app.errors import PromptTooLongError, SettingsError
from app.events import (
    FROM_MODEL,
    FROM_NGRAM,
    FROM_TARGET,
    MessageStats,
    PassStats,
    PromptProgress,
    RunCounts,
    Token,
    TokenLogprob,
    TopLogprob,
    acceptance,
    decode_rate,
    speedup_over_plain,
)
from app.params import SamplingSettings

# A pass slower than this: the load times fewer widths, once each (the cost model interpolates between them).
SLOW_PASS_SECONDS = 0.1
SPARSE_WIDTHS = (1, 2, 3, 5, 9, 17, 33)
# "N× the plain rate" divides by the answer's own one-token passes: an adaptive answer that has drafted this many
# passes in a row takes one plain pass, which costs it about nothing (its token comes at the plain rate) and keeps
# the plain rate measured at the same time and under the same load as the drafting passes around it.
PLAIN_PASS_EVERY = 16
MIN_PLAIN_PASSES = 3  # fewer one-token passes than this: no plain rate, so no ratio


@dataclass
class ProposalHindsight:
    """Every pass's suffix proposal, drafted or not, scored against what the target went on to emit.

    The depth policy drafts only where it expects a proposal to pay, so the acceptance of drafted tokens says
    little about the passes it skipped. Scored in hindsight over every pass, the proposals give the share of
    passes with a proposal of at least i + 1 tokens and the share whose first i + 1 tokens were right: what a
    prediction of tokens per pass and cost per pass needs, with the clustering of copies kept."""

    passes: int = 0
    lengths: list[int] = field(default_factory=list)
    matches: list[int] = field(default_factory=list)
    _open: list[tuple[list[int], int]] = field(default_factory=list)  # (proposal, tokens matched so far)

    def add(self, proposal: Sequence[int], emitted: Sequence[int]) -> None:
        """One pass: its proposal (possibly empty), then the tokens the pass emitted."""
        self.passes += 1
        count_first(self.lengths, len(proposal))
        self._open.append((list(proposal), 0))
        still: list[tuple[list[int], int]] = []
        for tokens, matched in self._open:
            for tok in emitted:
                if matched == len(tokens) or tokens[matched] != tok:
                    break
                matched += 1
            else:
                if matched < len(tokens):
                    still.append((tokens, matched))
                    continue
            count_first(self.matches, matched)
        self._open = still

    def close(self) -> None:
        """The answer ended: the proposals still open matched as far as the answer went."""
        for _tokens, matched in self._open:
            count_first(self.matches, matched)
        self._open = []


def count_first(counts: list[int], n: int) -> None:
    """One more at each of the first ``n`` positions (the list grows as needed)."""
    counts.extend([0] * (n - len(counts)))
    for i in range(n):
        counts[i] += 1


@dataclass
class RunTotals:
    """Running figures for one answer, turned into ``MessageStats`` at the end."""

    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    t_request: float = 0.0
    t_first_token: float = 0.0
    t_last_token: float = 0.0
    first_pass_tokens: int = 0  # emitted by the first pass, which ends at t_first_token
    tokens: int = 0
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    model_drafted: int = 0  # of ``drafted``, the trained drafter's tokens (the rest are the suffix drafter's)
    model_accepted: int = 0
    end_tokens: int = 0
    pos_drafted: list[int] = field(default_factory=list)
    pos_accepted: list[int] = field(default_factory=list)
    k_history: list[int] = field(default_factory=list)
    hindsight: ProposalHindsight = field(default_factory=ProposalHindsight)
    plain_passes: int = 0  # one-token passes after the first, and their seconds from the last emission on
    plain_seconds: float = 0.0
    last_plain_pass: int = 0  # ``passes`` after the latest of them

    def record_positions(self, accepted: Sequence[bool], drafted: int) -> None:
        count_first(self.pos_drafted, drafted)
        count_first(self.pos_accepted, next((i for i, ok in enumerate(accepted) if not ok), len(accepted)))
        self.pos_accepted.extend([0] * (len(self.pos_drafted) - len(self.pos_accepted)))  # as long as drafted

    def counts(self) -> RunCounts:
        """The answer's counts; its decode window runs from the end of the first pass to the last token."""
        return RunCounts(
            tokens=self.tokens, passes=self.passes, drafted=self.drafted, accepted=self.accepted,
            decode_tokens=max(self.tokens - self.first_pass_tokens, 0),
            decode_seconds=max(self.t_last_token - self.t_first_token, 0.0),
            end_tokens=self.end_tokens,
        )

    def add_plain_pass(self, seconds: float) -> None:
        self.plain_passes += 1
        self.plain_seconds += seconds
        self.last_plain_pass = self.passes

    def plain_rate(self) -> float | None:
        """Tokens per second of this answer's own one-token passes, timed as its decode window is (from one
        emission to the next, less the drafter's proposal that plain decoding does not make)."""
        if self.plain_passes < MIN_PLAIN_PASSES or self.plain_seconds <= 0:
            return None
        return self.plain_passes / self.plain_seconds

    def summary(self, plain_tps: float | None) -> MessageStats:
        counts = self.counts()
        self.hindsight.close()
        decode_tps = counts.decode_tps
        return MessageStats(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.tokens,
            ttft_seconds=max(self.t_first_token - self.t_request, 0.0) if self.tokens else 0.0,
            prefill_tps=decode_rate(self.prompt_tokens, self.prefill_seconds),
            decode_tps=decode_tps,
            decode_seconds=counts.decode_seconds,
            passes=self.passes,
            drafted=self.drafted,
            accepted=self.accepted,
            acceptance=counts.acceptance,
            tokens_per_pass=counts.tokens_per_pass,
            per_position_acceptance=tuple(
                acceptance(a, d) for a, d in zip(self.pos_accepted, self.pos_drafted, strict=True)
            ),
            k_history=tuple(self.k_history),
            speedup_estimate=speedup_over_plain(decode_tps, self.accepted, plain_tps or 0.0),
            plain_tps=plain_tps or 0.0,
            decode_tokens=counts.decode_tokens,
            end_tokens=counts.end_tokens,
            proposal_passes=self.hindsight.passes,
            proposal_lengths=tuple(self.hindsight.lengths),
            proposal_matches=tuple(self.hindsight.matches),
            model_drafted=self.model_drafted,
            model_accepted=self.model_accepted,
        )


@dataclass
class StopReason:
    reason: str = ""


def check_logit_bias(settings: SamplingSettings, n_vocab: int) -> None:
    """Refuse a logit bias on a token the target does not have, naming it and the vocabulary's size."""
    outside = [int(t) for t, _ in settings.logit_bias if t >= n_vocab]
    if outside:
        raise SettingsError(f"Logit bias names token {outside[0]}, but this model's vocabulary has {n_vocab} "
                            f"tokens (ids 0 to {n_vocab - 1}).")


class SpeculativeDecoder:
    """Runs one answer at a time on a target context, with optional n-gram and model drafters."""

    def __init__(
        self,
        target: Model,
        ctx: Context,
        *,
        ngram: SuffixDrafter | None = None,
        drafter: TrainedDrafter | None = None,
        controller: DepthController | None = None,
    ) -> None:
        self.target = target
        self.ctx = ctx
        self.ngram = ngram
        self.drafter = drafter
        self.controller = controller or DepthController(k_max=0, fixed=0)
        self.k_cap = max(0, ctx.n_batch - 1)
        self.plain_tps: float | None = None  # measured plain decode rate, for the speedup estimate
        self.kv_bytes_per_token = 0
        self.state_bytes = 0  # a recurrent state (and its snapshots), whatever the context length
        self.checkpoint_bytes = 0  # one checkpoint of the recurrent state, as llama.cpp copies it

    def reset_cache(self) -> None:
        """Forget every cached token (target and drafters), as before a fresh, comparable run."""
        self.ctx.clear()
        if self.drafter is not None:
            self.drafter.reset()
        if self.ngram is not None:
            self.ngram.reset()

    # --- cost calibration -----------------------------------------------------------------------

    def calibrate(self, widths: Sequence[int] = (1, 2, 3, 5, 9), repeats: int = 2,
                  progress: Callable[[float], object] | None = None) -> None:
        """Time target passes of several widths once, so the first choices of k are already informed.

        Where one pass is slow (a big model on a CPU, a software Vulkan device at about a second a pass),
        fewer widths are timed, once each; the cost model interpolates between them and the loop measures the
        rest. ``progress`` gets the fraction done before each pass, so a long timing never looks hung."""
        ctx = self.ctx
        ctx.clear()
        widths = list(widths)
        probe = [self.target.bos if self.target.bos >= 0 else 0] * max([*widths, 8])
        ctx.decode(probe[:8])  # also the warm-up: the first pass after a load is slow on any device
        self.checkpoint_bytes = ctx.recurrent_state_bytes()
        if progress is not None:
            progress(0.0)
        first = self._time_pass(probe, widths[0])
        if first is not None and first > SLOW_PASS_SECONDS:
            widths = [w for i, w in enumerate(widths) if w in SPARSE_WIDTHS or i in (0, len(widths) - 1)]
            repeats = 1
        total, n = repeats * len(widths), 1
        for r in range(repeats):
            for w in widths[1:] if r == 0 else widths:
                if progress is not None:
                    progress(n / total)
                n += 1
                self._time_pass(probe, w)
        if self.drafter is not None:
            dctx = self.drafter.ctx
            dctx.clear()
            dctx.decode(probe[:8])
            t0 = time.perf_counter()
            for _ in range(4):
                dctx.decode(probe[:1])
            dctx.synchronize()
            self.controller.cost.observe_draft(4, time.perf_counter() - t0)
            self.drafter.reset()
        ctx.clear()
        one = self.controller.cost.widths.get(1)
        if one:
            self.plain_tps = 1.0 / one

    def _time_pass(self, probe: Sequence[int], width: int) -> float | None:
        """Seconds of one target pass of ``width`` tokens (logits for all), recorded in the cost model and
        rolled back; None where the context has no room for it."""
        ctx = self.ctx
        if width > ctx.n_batch or ctx.n_past + width > ctx.n_ctx:
            return None
        n_keep = ctx.n_past
        ctx.prepare_rollback(width, width)
        t0 = time.perf_counter()
        ctx.decode(probe[:width], all_logits=True)
        ctx.synchronize()
        seconds = time.perf_counter() - t0
        self.controller.cost.observe_verify(width, seconds)
        ctx.truncate(n_keep)
        rollback = ctx.take_rollback_seconds()
        if ctx.rollback == ROLLBACK_CHECKPOINTS:  # a checkpoint's copy and restore: the loop adds the re-decode
            self.controller.cost.observe_rollback(rollback)
        return seconds

    # --- the loop -------------------------------------------------------------------------------

    def generate(
        self,
        prompt: Sequence[int],
        settings: SamplingSettings,
        request_id: int = 0,
        *,
        totals: RunTotals | None = None,
        stop: StopReason | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Iterator[Token | PassStats | PromptProgress]:
        """Yield a ``PromptProgress`` per prefill chunk, then a ``Token`` and a ``PassStats`` per verify pass;
        ``stop.reason`` says why it ended.

        ``cancelled`` is asked once per pass, so a Cancel takes effect within one verify pass.
        """
        totals = totals if totals is not None else RunTotals()
        stop = stop if stop is not None else StopReason()
        ctx, model = self.ctx, self.target
        if len(prompt) == 0:
            raise PromptTooLongError("The prompt is empty; type a message first.")
        if len(prompt) >= ctx.n_ctx:
            raise PromptTooLongError(
                f"The prompt is {len(prompt)} tokens but the context holds {ctx.n_ctx}; "
                "shorten it or load the model with a larger context."
            )
        check_logit_bias(settings, model.n_vocab)
        seed = settings.seed if settings.seed >= 0 else None
        rng = np.random.default_rng(seed)
        draws = sampling.SeededDraws(seed) if seed is not None and not settings.greedy else None
        # response_format: the target's rows are masked by a grammar (freed with the generator).
        grammar = GrammarMask(model.vocab, model.n_vocab, settings.response_format, model.native) \
            if settings.response_format else None
        greedy = settings.greedy
        penalize = settings.penalized  # the window is read only then; the logit bias applies regardless
        controller = self.controller
        detok = Detokenizer(model)

        totals.t_request = time.perf_counter()
        totals.prompt_tokens = len(prompt)
        # Reuse the KV cache of a shared prefix (an earlier turn of the same chat).
        tokens: list[int] = list(prompt)
        ctx.reuse_prefix(tokens[:-1])
        t0 = time.perf_counter()
        if ctx.n_past < len(tokens) - 1:
            cached = ctx.n_past
            for done, _ in ctx.prefill_chunks(tokens[cached:-1]):
                yield PromptProgress(request_id, cached + done, len(tokens))
        if self.drafter is not None:
            # The drafter reads the prompt with the target, as part of prompt processing: left to the first
            # draft, a 250-token prompt made the first pass 1.5 s and counted prompt work as decode time.
            t_drafter = time.perf_counter()
            read = self.drafter.prefill(tokens[:-1])
            controller.cost.observe_catch_up(read, time.perf_counter() - t_drafter)
        ctx.synchronize()
        totals.prefill_seconds = time.perf_counter() - t0
        if self.ngram is not None:
            self.ngram.observe(tokens)

        produced = 0
        controller.start_answer()
        while True:
            if cancelled is not None and cancelled():
                stop.reason = "cancelled"
                break
            room = ctx.n_ctx - ctx.n_past  # the pending token needs one slot, each draft token one more
            if room < 1:
                stop.reason = "context_full"
                break
            remaining = settings.max_tokens - produced
            if remaining <= 0:
                stop.reason = "max_tokens"
                break
            t_pass = time.perf_counter()
            # --- draft ---
            ng_draft = self.ngram.propose(tokens, controller.k_max) if self.ngram else Draft()
            # Probes also run in greedy n-gram mode, where acceptance is scored without drafting: they keep
            # the cost of a wide pass measured.
            # The split between the suffix draft and the trained drafter's is the controller's, from each
            # source's measured acceptance per position and cost.
            if controller.fixed is None and controller.k_max > 0 \
                    and totals.passes - totals.last_plain_pass >= PLAIN_PASS_EVERY:
                plan = DraftPlan(0, 0)
            else:
                plan = controller.plan(len(ng_draft), self.drafter is not None, ng_draft.match_len,
                                       probs=ng_draft.probs)
            k = max(0, min(plan.k, self.k_cap, room - 1, remaining - 1, ctx.rollback_limit()))
            n_ngram = min(plan.ngram, k)
            draft = Draft(ng_draft.tokens[:n_ngram], ng_draft.q[:n_ngram], ng_draft.sources[:n_ngram])
            if self.drafter is not None and len(draft) < k:
                recent = np.array(tokens[-settings.repeat_last_n :], dtype=np.int64) if penalize else None
                draft.extend(self.drafter.propose(tokens + draft.tokens, k - len(draft), settings, rng, recent))
            ctx.prepare_rollback(len(draft), len(draft) + 1)  # a recurrent state's checkpoint, where needed
            t_drafted = time.perf_counter()
            # --- verify in one decode ---
            n_before = ctx.n_past
            rows = ctx.decode([tokens[-1], *draft.tokens], all_logits=True)
            width = len(draft) + 1 + ctx.replayed  # with the tokens a checkpoint restore left to re-decode
            ctx.synchronize()
            if grammar is not None:  # the target's constrained distribution: forbidden drafts are rejected
                # Log probabilities need whole masked rows; the greedy shortcut leaves a row unmasked.
                pick = self._greedy_pick(tokens, draft.tokens, settings, penalize) \
                    if greedy and not settings.logprobs else None
                rows = grammar.mask_rows(rows, draft.tokens, pick)
            t_verified = time.perf_counter()
            # --- accept ---
            emitted, accepted = self._accept(rows, draft, tokens, settings, rng, greedy, penalize, draws)
            t_accepted = time.perf_counter()
            # From the verify rows, before anything else decodes on this context (the rows are its buffer).
            logprobs = self._logprobs(rows, emitted, tokens, settings, penalize) if settings.logprobs else []
            n_acc = sum(accepted)
            ctx.truncate(n_before + 1 + n_acc)
            if draft:
                # What taking back a recurrent state costs a drafting pass: the checkpoint's copy and restore,
                # and the accepted tokens decoded again before the next checkpoint.
                controller.cost.observe_rollback(ctx.take_rollback_seconds())
            # --- bookkeeping ---
            if greedy:
                # Greedy output does not depend on speculation, so every n-gram proposal, drafted or not,
                # is scored against what the target emits: acceptance at every depth stays measured,
                # also while the policy drafts little or nothing.
                controller.score_proposal(ng_draft.tokens, ng_draft.match_len, emitted, ng_draft.probs)
            if self.ngram is not None:
                totals.hindsight.add(ng_draft.tokens, emitted)
            controller.observe(draft.sources, accepted, ng_draft.match_len, ngram_scored_elsewhere=greedy,
                               probs=ng_draft.probs)
            # A pass of this width costs its decode plus building a distribution per row to accept from.
            controller.cost.observe_verify(width, t_accepted - t_drafted)
            if draft.model_steps:
                controller.cost.observe_draft(draft.model_steps, draft.model_seconds)
            stop_now = False
            out_ids: list[int] = []
            pieces: list[str] = []
            for tok in emitted:
                if model.is_eog(tok):
                    stop_now = True
                    break
                out_ids.append(tok)
                pieces.append(detok.feed(tok))
                if produced + len(out_ids) >= settings.max_tokens:
                    break
            tokens.extend(out_ids)
            if grammar is not None:
                grammar.accept(out_ids)
            produced += len(out_ids)
            sources = [draft.sources[i] if i < n_acc else FROM_TARGET for i in range(len(out_ids))]
            now = time.perf_counter()
            if totals.tokens and len(out_ids) == 1 and width == 1:
                totals.add_plain_pass(now - totals.t_last_token - (t_drafted - t_pass))
            if out_ids:
                if totals.tokens == 0:
                    totals.t_first_token = now
                    totals.first_pass_tokens = len(out_ids)
                totals.t_last_token = now
            totals.tokens += len(out_ids)
            totals.passes += 1
            totals.end_tokens += stop_now
            totals.drafted += len(draft)
            totals.accepted += n_acc
            totals.model_drafted += len(draft) - n_ngram
            totals.model_accepted += max(0, n_acc - n_ngram)  # the suffix tokens come first in a draft
            totals.record_positions(accepted, len(draft))
            totals.k_history.append(k)
            overhead = time.perf_counter() - t_pass - (t_verified - t_drafted) - draft.model_seconds
            if out_ids:
                yield Token(request_id, "".join(pieces), tuple(out_ids), tuple(sources), tuple(pieces),
                            tuple(logprobs[: len(out_ids)]))
            yield PassStats(
                request_id=request_id,
                t_start=t_pass,
                draft_seconds=t_drafted - t_pass,
                verify_seconds=t_verified - t_drafted,
                k=k,
                drafted=len(draft),
                accepted=tuple(accepted),
                emitted=len(out_ids),
                from_ngram=sum(1 for s in sources if s == FROM_NGRAM),
                from_model=sum(1 for s in sources if s == FROM_MODEL),
                context_tokens=ctx.n_past,
                kv_bytes_used=ctx.n_past * self.kv_bytes_per_token + self.state_bytes,
                verify_width=len(draft) + 1,
                overhead_seconds=overhead,
                accept_seconds=t_accepted - t_verified,
                t_emitted=now,
                ended=stop_now,
                drafted_ngram=n_ngram,
            )
            if stop_now:
                stop.reason = "eog"
                break
        tail = detok.flush()
        if tail:
            yield Token(request_id, tail, (), (), ())
        # Keep the KV of every token but the last emitted one, ready for the next turn's prefix reuse. A
        # recurrent state that cannot go back keeps them all: the next turn's prefix match decides.
        n_keep = min(ctx.n_past, len(tokens) - 1)
        if ctx.can_truncate_cheaply(n_keep):
            ctx.truncate(n_keep)

    def _logprobs(self, rows: npt.NDArray[np.float32], emitted: list[int], tokens: list[int],
                  settings: SamplingSettings, penalize: bool) -> list[TokenLogprob]:
        """Each emitted token's log probability from the row that emitted it (row i after ``emitted[:i]``), through
        the same adjustment as ``_accept``; with the ``top_logprobs`` most likely tokens of that row."""
        model = self.target
        window = settings.repeat_last_n
        out: list[TokenLogprob] = []
        for i, tok in enumerate(emitted):
            recent = np.array((tokens + emitted[:i])[-window:], dtype=np.int64) if penalize else None
            lp = sampling.log_softmax(sampling.adjust(rows[i], settings, recent))
            top = tuple(TopLogprob(model.piece_text(t), model.piece(t), float(lp[t]))
                        for t in sampling.most_likely(lp, settings.top_logprobs).tolist())
            out.append(TokenLogprob(model.piece_text(tok), model.piece(tok), float(lp[tok]), top))
        return out

    @staticmethod
    def _greedy_pick(tokens: list[int], draft: list[int], settings: SamplingSettings,
                     penalize: bool) -> Callable[[int, npt.NDArray[np.float32]], int]:
        """The token row i gives a greedy answer, penalties included, once ``draft[:i]`` was accepted (as
        ``_accept`` computes it)."""
        window = settings.repeat_last_n

        def pick(i: int, row: npt.NDArray[np.float32]) -> int:
            recent = np.array((tokens + draft[:i])[-window:], dtype=np.int64) if penalize else None
            return sampling.greedy_token(row, settings, recent)

        return pick

    def _accept(
        self,
        rows: npt.NDArray[np.float32],
        draft: Draft,
        tokens: list[int],
        settings: SamplingSettings,
        rng: np.random.Generator,
        greedy: bool,
        penalize: bool,
        draws: sampling.SeededDraws | None = None,
    ) -> tuple[list[int], list[bool]]:
        """Compare the draft with the target's rows; return (emitted tokens, accept flag per position).

        ``draws`` (a fixed seed): each position's token is drawn from p with the seed's own noise for that
        position, and a draft token is kept when it equals that draw."""
        emitted: list[int] = []
        accepted: list[bool] = []
        window = settings.repeat_last_n
        for i, x in enumerate(draft.tokens):
            recent = np.array((tokens + emitted)[-window:], dtype=np.int64) if penalize else None
            if greedy:
                target_tok = sampling.greedy_token(rows[i], settings, recent)
                if target_tok == x:
                    accepted.append(True)
                    emitted.append(x)
                    continue
                accepted.append(False)
                emitted.append(target_tok)
                return emitted, accepted
            p = sampling.distribution(rows[i], settings, recent)
            if draws is not None:
                drawn = draws.token(p, len(tokens) + i)
                accepted.append(drawn == x)
                emitted.append(drawn)
                if drawn == x:
                    continue
                return emitted, accepted
            q = draft.q[i]
            px = p.prob(x)
            qx = 1.0 if q is None else q.prob(x)
            if qx > 0 and rng.random() < min(1.0, px / qx):
                accepted.append(True)
                emitted.append(x)
                continue
            accepted.append(False)
            resid = sampling.residual(p, q if q is not None else sampling.point_mass(x))
            emitted.append(resid.sample(rng))
            return emitted, accepted
        last = len(draft.tokens)
        recent = np.array((tokens + emitted)[-window:], dtype=np.int64) if penalize else None
        if greedy:
            emitted.append(sampling.greedy_token(rows[last], settings, recent))
        else:
            p = sampling.distribution(rows[last], settings, recent)
            emitted.append(draws.token(p, len(tokens) + last) if draws is not None else p.sample(rng))
        return emitted, accepted
