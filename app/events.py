"""What the engine worker says to the app: frozen dataclasses, picklable, Qt-free.

Requests go the other way (``Load``, ``Generate``, ``BenchRun``, ``RawDecode``, ``Cancel``, ``Unload``,
``Shutdown``).

This module also holds the one definition of the run figures (acceptance, τ, decode rate) that the chat's
stats line, ``specdeck bench`` and the dashboard all derive from (``RunCounts``). Over 500 lines: it is the
whole vocabulary that crosses the worker's pipe, so that a pickled shape changes in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from app.params import LoadSettings, SamplingSettings


@dataclass(frozen=True)
class BackendDevice:
    """One of llama.cpp's devices, as the worker reports it."""

    name: str  # llama.cpp's device name: "CPU", "CUDA0", "Vulkan0", "Metal"
    description: str  # usually the hardware's name: "NVIDIA GeForce RTX 4090", "AMD EPYC"
    type: str  # "cpu", "gpu", "igpu", "accel"
    backend: str  # the registry it belongs to: "CPU", "CUDA", "Vulkan", ...
    memory_free: int | None
    memory_total: int | None


# Where an emitted token came from.
FROM_TARGET = "target"
FROM_NGRAM = "ngram"
FROM_MODEL = "model"  # the trained drafter: a drafter model, the target's own MTP heads or an EAGLE-3 head
# How the chat and the dashboard name each draft source; the trained drafter is whichever was loaded.
SOURCE_NAMES = {FROM_NGRAM: "suffix drafter", FROM_MODEL: "trained drafter"}
TRAINED_DRAFTERS = "a drafter model, the target's own MTP heads, an EAGLE-3 or a DFlash head"


# --- requests -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    settings: LoadSettings


ChatMessage = dict[str, Any]  # "role" and "content", and a tool turn's "tool_calls", "tool_call_id", "name"
ToolSpec = dict[str, Any]  # an OpenAI function tool: {"type": "function", "function": {"name", ...}}


@dataclass(frozen=True)
class Generate:
    request_id: int
    messages: tuple[ChatMessage, ...]
    sampling: SamplingSettings
    continue_answer: bool = False  # the last message is a partial answer: go on from its end
    raw: bool = False  # completion: the messages' texts joined are the prompt, with no chat template
    tools: tuple[ToolSpec, ...] = ()  # rendered by the model's chat template


@dataclass(frozen=True)
class BenchRun:
    """One answer timed inside the worker from an empty cache, for `specdeck bench`.

    The whole answer runs without a message per token, so the pipe costs nothing inside the timed window;
    the reply is one ``BenchResult``.
    """

    request_id: int
    messages: tuple[dict[str, str], ...]
    sampling: SamplingSettings
    plain: bool  # True: without speculation (the baseline)


@dataclass(frozen=True)
class RawDecode:
    """Greedy one-token decodes on the loaded target through llama.cpp alone (no sampling, no drafting).

    Measures the bare decode loop (`specdeck bench --raw`) and checks that decoding works at all (`specdeck
    doctor --decode-check`). ``messages``, rendered as a chat answer would be, or else ``text``, tokenized with
    the model's own special tokens, is prefilled first (neither: the BOS token alone). The reply is one
    ``RawDecoded``.
    """

    request_id: int
    n_tokens: int
    text: str = ""
    messages: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True)
class ListDevices:
    """Ask the worker for llama.cpp's devices, with ``rpc_servers`` probed and registered first. The reply is
    one ``Devices``."""

    request_id: int
    rpc_servers: tuple[str, ...] = ()


@dataclass(frozen=True)
class CountTokens:
    """How many tokens ``messages`` (and ``tools``) take as a chat prompt, rendered and tokenized as ``Generate``
    would, without decoding. The reply is one ``TokensCounted``."""

    request_id: int
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()


@dataclass(frozen=True)
class Cancel:
    request_id: int


@dataclass(frozen=True)
class Unload:
    pass


@dataclass(frozen=True)
class Shutdown:
    pass


# --- events -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Log:
    line: str


@dataclass(frozen=True)
class WorkerReady:
    """A new worker's first event, before it reads any request: what its llama.cpp build can do, so crash
    advice fits the build even when the first load crashes."""

    gpu_offload: bool  # llama_supports_gpu_offload() once the backends are loaded


@dataclass(frozen=True)
class Devices:
    """llama.cpp's devices as the worker sees them (name, kind, memory), and the build's backend. ``error``:
    why the RPC servers asked for could not be added (the local devices are still listed)."""

    request_id: int
    devices: tuple[BackendDevice, ...]
    backend: str
    gpu_offload: bool
    rpc_available: bool
    error: str | None = None


@dataclass(frozen=True)
class LoadProgress:
    stage: str  # "target", "drafter", or "timing" (passes of each draft width timed after the load)
    fraction: float


@dataclass(frozen=True)
class ModelSummary:
    path: str
    name: str
    architecture: str
    n_params: int
    size_bytes: int
    n_ctx_train: int
    n_layer: int
    n_vocab: int
    has_chat_template: bool = True  # False: a base model, offered completion rather than chat


@dataclass(frozen=True)
class Loaded:
    target: ModelSummary
    drafter: ModelSummary | None
    ngram: int
    n_ctx: int
    backend: str  # "cpu", "cuda", "vulkan", "metal"
    gpu_offload: bool
    kv_bytes_per_token: int  # target + drafter
    kv_bytes_total: int  # allocated for n_ctx
    load_seconds: float
    plain_tps: float = 0.0  # one-token passes per second measured at load: the delivered 1-token ceiling
    # The devices the layers went to, in llama.cpp's order, with their memory after the load (RPC servers'
    # included: only this worker can ask them while it holds their connection); empty on the CPU alone.
    devices: tuple[BackendDevice, ...] = ()
    main_gpu: int | None = None  # the one GPU chosen (``devices`` is then that GPU alone); None: all GPUs
    network_seconds: float = 0.0  # per pass: the RPC servers' round trips measured at load (0 without RPC)
    # Where "--gpu-layers auto" put the layers, in one line ("" when nothing was chosen: no GPU, or a count
    # given); n_gpu_layers: the count llama.cpp was asked for.
    gpu_layers_note: str = ""
    n_gpu_layers: int = 0
    mtp: bool = False  # the target's own MTP heads draft


def drafted_by(loaded: Loaded) -> str | None:
    """What drafts for a loaded pair, as the chat's footer and the history name it: the drafter model's path,
    the suffix drafter with its shortest match, or both ("<path> + suffix drafter (3)"); None for plain
    decoding."""
    parts = [loaded.drafter.path] if loaded.drafter is not None else ["the target's MTP heads"] if loaded.mtp else []
    if loaded.ngram:
        parts.append(f"suffix drafter ({loaded.ngram})")
    return " + ".join(parts) or None


@dataclass(frozen=True)
class PromptProgress:
    """One chunk of the prompt is in the KV cache: ``done`` of ``total`` prompt tokens (a cached prefix counts)."""

    request_id: int
    done: int
    total: int


@dataclass(frozen=True)
class PromptProcessed:
    request_id: int
    prompt_tokens: int
    seconds: float
    warning: str | None = None  # the chat template was refused or the messages repaired: tell the user
    tool_format: str = ""  # a request with tools: the format its calls are read in (app.engine.tool_calls)


@dataclass(frozen=True)
class TopLogprob:
    """One of the most likely tokens at a position, under the target."""

    token: str  # the token's text
    token_bytes: bytes  # the token's raw bytes (a piece of a split UTF-8 character has its own bytes)
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log probability under the target: the log-softmax of its row after the logit bias,
    the penalties and a grammar's mask, before temperature and the filters. A token ruled out reads -9999."""

    token: str
    token_bytes: bytes
    logprob: float
    top: tuple[TopLogprob, ...] = ()  # SamplingSettings.top_logprobs tokens, most likely first


@dataclass(frozen=True)
class Token:
    """Tokens emitted by one verify pass, with their text and where each came from."""

    request_id: int
    text: str  # complete UTF-8 text newly available (may be shorter than the pieces while a char is split)
    token_ids: tuple[int, ...]
    sources: tuple[str, ...]  # FROM_TARGET, FROM_NGRAM or FROM_MODEL per token
    pieces: tuple[str, ...] = ()  # text per token, aligned with token_ids ("" for a split character)
    logprobs: tuple[TokenLogprob, ...] = ()  # aligned with token_ids when SamplingSettings.logprobs, else empty


@dataclass(frozen=True)
class PassStats:
    request_id: int
    t_start: float  # perf_counter seconds in the worker
    draft_seconds: float
    verify_seconds: float
    k: int  # depth the policy chose
    drafted: int  # tokens actually proposed (a drafter may stop early)
    accepted: tuple[bool, ...]  # per draft position
    emitted: int  # accepted + the target's own token
    from_ngram: int
    from_model: int
    context_tokens: int
    kv_bytes_used: int
    verify_width: int  # tokens in the target decode
    overhead_seconds: float = 0.0  # Python work in the pass outside llama_decode (sampling, acceptance, bookkeeping)
    accept_seconds: float = 0.0  # the part of the overhead spent building distributions and accepting
    t_emitted: float = 0.0  # perf_counter seconds when its tokens were emitted: the clock of RunCounts' decode window
    ended: bool = False  # the pass also yielded the end-of-turn token (not in ``emitted``: it has no text)
    drafted_ngram: int = 0  # the draft's first tokens that came from the n-gram drafter; the trained drafter's follow


@dataclass(frozen=True)
class SourceCounts:
    """One draft source's drafted and accepted tokens, in all and per position within its part of the draft
    (the trained drafter's position 0 is its first token, after any n-gram tokens). Per position, only the
    drafts the target reached count: the same conditional acceptance the depth controller keeps per source."""

    source: str
    drafted: int = 0
    accepted: int = 0
    position_drafted: tuple[int, ...] = ()
    position_accepted: tuple[int, ...] = ()

    @property
    def acceptance(self) -> float:
        return acceptance(self.accepted, self.drafted)

    @property
    def per_position_acceptance(self) -> tuple[float, ...]:
        return tuple(acceptance(a, d) for a, d in zip(self.position_accepted, self.position_drafted, strict=True))

    def __add__(self, other: SourceCounts) -> SourceCounts:
        n = max(len(self.position_drafted), len(other.position_drafted))  # accepted stays as long as drafted
        return SourceCounts(
            self.source, self.drafted + other.drafted, self.accepted + other.accepted,
            add_counts(self.position_drafted, other.position_drafted, n),
            add_counts(self.position_accepted, other.position_accepted, n),
        )

    def as_json(self) -> dict[str, Any]:
        return {"drafted": self.drafted, "accepted": self.accepted, "acceptance": round(self.acceptance, 4),
                "per_position_acceptance": [round(a, 4) for a in self.per_position_acceptance],
                "per_position_drafted": list(self.position_drafted)}

    def add(self, drafted: int, accepted: Sequence[bool], *, reached: bool = True) -> SourceCounts:
        """These counts with one pass's part of the draft: ``drafted`` tokens, ``accepted`` a flag for each up
        to the first rejection. Positions count as drafted there only where the target ``reached`` this part
        (every earlier token of the draft accepted), so a source is not blamed for another's miss."""
        n = max(len(self.position_drafted), drafted if reached else 0)
        pos_d = [*self.position_drafted, *[0] * (n - len(self.position_drafted))]
        pos_a = [*self.position_accepted, *[0] * (n - len(self.position_accepted))]
        hits = 0
        for i in range(drafted if reached else 0):
            pos_d[i] += 1
            if i < len(accepted) and accepted[i] and hits == i:
                pos_a[i] += 1
                hits += 1
        return SourceCounts(self.source, self.drafted + drafted, self.accepted + hits, tuple(pos_d), tuple(pos_a))


def source_counts(passes: Iterable[PassStats]) -> tuple[SourceCounts, SourceCounts]:
    """(n-gram drafter, trained drafter) counts over ``passes``; the one place a pass is split by source."""
    ngram, trained = SourceCounts(FROM_NGRAM), SourceCounts(FROM_MODEL)
    for p in passes:
        n = min(p.drafted_ngram, p.drafted)
        ngram = ngram.add(n, p.accepted[:n])
        reached = len(p.accepted) >= n and all(p.accepted[:n])
        trained = trained.add(p.drafted - n, p.accepted[n:], reached=reached)
    return ngram, trained


@dataclass(frozen=True)
class RunCounts:
    """The counts behind every speed and acceptance figure, and the one place they are turned into rates.

    ``decode_tokens`` and ``decode_seconds`` cover the same window: from the end of the first pass (which
    carries the time to first token) to the last emitted token. Tokens the first pass emitted are outside
    it, on the plain and the speculative side alike. Counts add up, so totals over many runs are sums.
    """

    tokens: int = 0  # emitted
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    end_tokens: int = 0  # end-of-turn tokens the passes yielded: not emitted as text, but a pass's output

    def __add__(self, other: RunCounts) -> RunCounts:
        return RunCounts(self.tokens + other.tokens, self.passes + other.passes, self.drafted + other.drafted,
                         self.accepted + other.accepted, self.decode_tokens + other.decode_tokens,
                         self.decode_seconds + other.decode_seconds, self.end_tokens + other.end_tokens)

    @property
    def acceptance(self) -> float:
        return acceptance(self.accepted, self.drafted)

    @property
    def tokens_per_pass(self) -> float:
        # A pass whose only output is the end-of-turn token still yielded one token: counting only the
        # emitted text would make an answer of 7 tokens in 8 passes read 0.88 tokens/pass.
        return tokens_per_pass(self.tokens + self.end_tokens, self.passes)

    @property
    def decode_tps(self) -> float:
        return decode_rate(self.decode_tokens, self.decode_seconds)


def drafted_spans(pieces: Sequence[tuple[str, str]], length: int | None = None) -> list[tuple[int, int, str]]:
    """The character spans of an answer that a drafter proposed, ``(start, end, source)``, from its (text,
    source) pieces: what the history keeps so a reopened chat can be highlighted (a few spans, not a source
    per token). ``length``: the answer's length; spans are cut to it."""
    spans: list[tuple[int, int, str]] = []
    at = 0
    for text, source in pieces:
        end = at + len(text)
        if length is not None:
            end = min(end, length)
        if source != FROM_TARGET and end > at:
            if spans and spans[-1][2] == source and spans[-1][1] == at:
                spans[-1] = (spans[-1][0], end, source)
            else:
                spans.append((at, end, source))
        at = end
    return spans


def pieces_from_spans(text: str, spans: Sequence[Sequence[Any]]) -> list[tuple[str, str]]:
    """An answer's (text, source) pieces again from its stored spans; text outside them is the target's."""
    pieces: list[tuple[str, str]] = []
    at = 0
    for start, end, source in sorted((int(a), int(b), str(c)) for a, b, c in spans):
        start, end = max(start, at), min(end, len(text))
        if end <= start:
            continue
        if start > at:
            pieces.append((text[at:start], FROM_TARGET))
        pieces.append((text[start:end], source))
        at = end
    if at < len(text):
        pieces.append((text[at:], FROM_TARGET))
    return pieces


def acceptance(accepted: int | float, drafted: int | float) -> float:
    """Accepted draft tokens over drafted ones; 0 when nothing was drafted."""
    return accepted / drafted if drafted else 0.0


def tokens_per_pass(tokens: int | float, passes: int | float) -> float:
    """τ: tokens emitted per target pass; 0 before the first pass."""
    return tokens / passes if passes else 0.0


def decode_rate(tokens: int | float, seconds: float) -> float:
    """Tokens per second over one window; 0 for an empty window."""
    return tokens / seconds if seconds > 0 and tokens > 0 else 0.0


@dataclass(frozen=True)
class MessageStats:
    prompt_tokens: int
    completion_tokens: int
    ttft_seconds: float
    prefill_tps: float
    decode_tps: float
    decode_seconds: float
    passes: int
    drafted: int
    accepted: int
    acceptance: float  # accepted / drafted (0 when nothing was drafted)
    tokens_per_pass: float
    per_position_acceptance: tuple[float, ...]
    k_history: tuple[int, ...]
    # decode tok/s over the plain rate of the answer's own time (speedup_over_plain); 0: no ratio
    speedup_estimate: float
    decode_tokens: int = 0  # tokens in the decode window (see RunCounts)
    # One-token passes per second at the end of this answer, from the passes the answer itself timed (the
    # engine's live cost model): the plain rate its speedup is measured against. 0: not measured.
    plain_tps: float = 0.0
    end_tokens: int = 0  # see RunCounts
    # Every pass's suffix proposal in hindsight, drafted or not (see ProposalHindsight): passes asked, and per
    # position i the passes whose proposal had i + 1 tokens, and those whose first i + 1 the target then emitted.
    proposal_passes: int = 0
    proposal_lengths: tuple[int, ...] = ()
    proposal_matches: tuple[int, ...] = ()
    # Of ``drafted`` and ``accepted``, the trained drafter's tokens (a model, MTP heads, EAGLE-3, DFlash): what
    # it did when it drafted beside the suffix drafter. -1: not counted (answers saved before these fields).
    model_drafted: int = -1
    model_accepted: int = -1

    @property
    def counts(self) -> RunCounts:
        return RunCounts(self.completion_tokens, self.passes, self.drafted, self.accepted, self.decode_tokens,
                         self.decode_seconds, self.end_tokens)


def speedup_over_plain(decode_tps: float, accepted: int, plain_tps: float) -> float:
    """An answer's decode rate over the plain (one token per pass) rate measured at the same time, by the
    same passes (``MessageStats.plain_tps``), never a rate timed at load on a machine since busier or quieter;
    0 when there is nothing to compare: no plain rate, or no draft token accepted (an answer that kept no
    draft decoded as plain decoding does, and its ratio would only measure noise)."""
    if accepted <= 0 or plain_tps <= 0 or decode_tps <= 0:
        return 0.0
    return decode_tps / plain_tps


def message_stats(value: MessageStats | Mapping[str, Any] | None) -> MessageStats | None:
    """Stats as read back from the history (a JSON object) as MessageStats; None when they are not whole."""
    if value is None or isinstance(value, MessageStats):
        return value
    names = {f.name for f in fields(MessageStats)}
    try:
        known: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items() if k in names}
        return MessageStats(**known)
    except TypeError:
        return None


def continued_stats(first: MessageStats, then: MessageStats) -> MessageStats:
    """One answer's stats over its first part and a Continue: counts add up, the prompt figures and the time
    to first token are the first part's. Per-position acceptance cannot be added from two ratios: it is the
    continuation's when that drafted, else the first part's."""
    counts = first.counts + then.counts
    return replace(
        then,
        prompt_tokens=first.prompt_tokens,
        ttft_seconds=first.ttft_seconds,
        prefill_tps=first.prefill_tps,
        completion_tokens=counts.tokens,
        decode_tps=counts.decode_tps,
        decode_seconds=counts.decode_seconds,
        passes=counts.passes,
        drafted=counts.drafted,
        accepted=counts.accepted,
        acceptance=counts.acceptance,
        tokens_per_pass=counts.tokens_per_pass,
        per_position_acceptance=then.per_position_acceptance if then.drafted else first.per_position_acceptance,
        k_history=first.k_history + then.k_history,
        decode_tokens=counts.decode_tokens,
        end_tokens=counts.end_tokens,
        speedup_estimate=speedup_over_plain(counts.decode_tps, counts.accepted, then.plain_tps or first.plain_tps),
        proposal_passes=first.proposal_passes + then.proposal_passes,
        proposal_lengths=add_counts(first.proposal_lengths, then.proposal_lengths),
        proposal_matches=add_counts(first.proposal_matches, then.proposal_matches),
        model_drafted=_add_known(first.model_drafted, then.model_drafted),
        model_accepted=_add_known(first.model_accepted, then.model_accepted),
    )


def _add_known(a: int, b: int) -> int:
    """A sum of two counts where -1 means not counted."""
    return -1 if a < 0 or b < 0 else a + b


def add_counts(a: Sequence[int], b: Sequence[int], length: int | None = None) -> tuple[int, ...]:
    """Two per-position count lists added position by position, padded with zeros to ``length`` (default: the
    longer one's)."""
    n = max(len(a), len(b)) if length is None else length
    return tuple((a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n))


@dataclass(frozen=True)
class Finished:
    request_id: int
    reason: str  # "eog", "max_tokens", "cancelled", "context_full", "error", "stop" (a stop sequence)
    stats: MessageStats
    text: str
    stop_sequence: str | None = None  # reason "stop": the sequence that ended the answer


@dataclass(frozen=True)
class BenchResult:
    """The reply to ``BenchRun``: the answer and its figures, measured in the worker."""

    request_id: int
    prompt_tokens: int
    token_ids: tuple[int, ...]
    text: str
    reason: str
    stats: MessageStats
    seconds: float  # wall time in the worker, prefill included
    ttft_seconds: float
    overhead_seconds: tuple[float, ...]  # per pass
    verify_cost: tuple[tuple[int, float], ...]  # (width, seconds) the cost model holds after the run
    warning: str | None = None  # the chat template was refused or the messages repaired: tell the user
    tool_format: str = ""  # a request with tools: the format its calls are read in (app.engine.tool_calls)
    draft_step_seconds: float = 0.0  # the cost model's median model-drafter step (0: no model drafted)
    sources: tuple[SourceCounts, ...] = ()  # (n-gram drafter, trained drafter), from the run's passes
    prompt_ids: tuple[int, ...] = ()  # the prompt's tokens (tune replays the answers offline)


@dataclass(frozen=True)
class RawDecoded:
    """The reply to ``RawDecode``."""

    request_id: int
    prompt_tokens: int
    tokens: int  # decoded one at a time after the prompt
    seconds: float  # for those decodes only

    @property
    def tokens_per_second(self) -> float:
        return decode_rate(self.tokens, self.seconds)


@dataclass(frozen=True)
class TokensCounted:
    """The reply to ``CountTokens``."""

    request_id: int
    prompt_tokens: int
    warning: str | None = None  # the chat template was refused or the messages repaired


@dataclass(frozen=True)
class EngineError:
    """A recoverable failure: the worker is still alive and can take the next request."""

    message: str
    kind: str = "error"
    request_id: int | None = None


@dataclass(frozen=True)
class EngineCrashed:
    """The worker process died; a new one can be started."""

    exit_code: int | None
    signal_name: str | None
    during: str  # "load", "generate", "idle"
    last_log_lines: tuple[str, ...] = ()
    message: str = ""


@dataclass(frozen=True)
class Unloaded:
    pass


Event = (
    Log | WorkerReady | LoadProgress | Loaded | PromptProgress | PromptProcessed | Token | PassStats | Finished
    | BenchResult | RawDecoded | TokensCounted | EngineError | EngineCrashed | Unloaded | Devices
)
Request = Load | Generate | BenchRun | RawDecode | CountTokens | ListDevices | Cancel | Unload | Shutdown
