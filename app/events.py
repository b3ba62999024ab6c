"""What the engine worker says to the app: frozen dataclasses, picklable, Qt-free.

Requests go the other way (``Load``, ``Generate``, ``Cancel``, ``Unload``, ``Shutdown``).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.params import LoadSettings, SamplingSettings

# Where an emitted token came from.
FROM_TARGET = "target"
FROM_NGRAM = "ngram"
FROM_MODEL = "model"


# --- requests -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    settings: LoadSettings


@dataclass(frozen=True)
class Generate:
    request_id: int
    messages: tuple[dict[str, str], ...]
    sampling: SamplingSettings


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
class LoadProgress:
    stage: str  # "target" or "drafter"
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


@dataclass(frozen=True)
class PromptProcessed:
    request_id: int
    prompt_tokens: int
    seconds: float


@dataclass(frozen=True)
class Token:
    """Tokens emitted by one verify pass, with their text and where each came from."""

    request_id: int
    text: str  # complete UTF-8 text newly available (may be shorter than the pieces while a char is split)
    token_ids: tuple[int, ...]
    sources: tuple[str, ...]  # FROM_TARGET, FROM_NGRAM or FROM_MODEL per token
    pieces: tuple[str, ...] = ()  # text per token, aligned with token_ids ("" for a split character)


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
    speedup_estimate: float  # decode tok/s over the measured plain rate (1.0 before one is known)


@dataclass(frozen=True)
class Finished:
    request_id: int
    reason: str  # "eog", "max_tokens", "cancelled", "context_full", "error"
    stats: MessageStats
    text: str


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
    Log | LoadProgress | Loaded | PromptProcessed | Token | PassStats | Finished
    | EngineError | EngineCrashed | Unloaded
)
Request = Load | Generate | Cancel | Unload | Shutdown
