"""Typed, validated settings for loading models, drafting and sampling.

Every value is checked here before it reaches llama.cpp, since some bad values (n_batch 0, n_ctx 1,
NaN temperatures) make it assert and abort the process.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from app.engine_limits import DEPTH_CAP, KV_TYPES, kv_quantized
from app.errors import SettingsError

MAX_CTX = 1 << 20


def _show(value: float) -> str:
    """A number as a user reads it: whole numbers in full (1048576, not 1.04858e+06), others short."""
    if isinstance(value, int) or (math.isfinite(value) and value.is_integer() and abs(value) < 1e15):
        return str(int(value))
    return f"{value:g}"


def _number(name: str, value: object, lo: float, hi: float, *, integer: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SettingsError(f"{name} must be a number, not {value!r}.")
    if isinstance(value, float) and not math.isfinite(value):
        raise SettingsError(f"{name} must be a finite number, not {value}.")
    if integer and not float(value).is_integer():
        raise SettingsError(f"{name} must be a whole number, not {value}.")
    if not lo <= value <= hi:
        raise SettingsError(f"{name} must be between {_show(lo)} and {_show(hi)}; {_show(value)} is out of range.")


def _flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise SettingsError(f"{name} must be true or false, not {value!r}.")


def _path(name: str, value: object) -> None:
    """A model file path, or none (None or ""); a NUL byte would end the path early in llama.cpp's C strings."""
    if value is not None and (not isinstance(value, str) or "\x00" in value):
        raise SettingsError(f"{name} must be a file path, not {value!r}.")


JSON_OBJECT = "json_object"  # SamplingSettings.response_format for "any JSON object"
MAX_RESPONSE_FORMAT_CHARS = 64 << 10  # a JSON schema; the grammar made from it grows with its size
MAX_LOGIT_BIAS = 1024  # tokens given a bias in one request
MAX_BIAS = 100.0  # OpenAI's bound: -100 bans a token, +100 all but forces it
MAX_TOP_LOGPROBS = 20  # OpenAI's bound
MAX_STOP_LENGTH = 256  # characters in one stop sequence (the window's and the API's)
MAX_STOPS = 16  # the window's stop strings; the API takes OpenAI's 4


MAX_SERVERS = 16  # GGML_RPC_MAX_SERVERS
# A host name or an IPv4 address: ggml-rpc splits an endpoint at its first colon and resolves IPv4 only.
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?")
_PORT = re.compile(r"[0-9]{1,5}")


def parse_rpc_servers(value: str | Iterable[str]) -> tuple[str, ...]:
    """"host:port,host:port" (or a list of them) as a tuple of endpoints; SettingsError names a bad one."""
    parts = value.split(",") if isinstance(value, str) else list(value)
    servers: list[str] = []
    for raw in parts:
        if not isinstance(raw, str):
            raise SettingsError(f"An RPC server is written host:port, not {raw!r}.")
        endpoint = raw.strip()
        if not endpoint:
            continue
        host, sep, port = endpoint.rpartition(":")
        if not sep or not _HOST.fullmatch(host) or not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
            shown = endpoint if len(endpoint) <= 80 else endpoint[:80] + "…"
            raise SettingsError(f"An RPC server is written host:port, such as 192.168.1.20:50052, not {shown!r}.")
        endpoint = f"{host}:{int(port)}"
        if endpoint in servers:
            raise SettingsError(f"The RPC server {endpoint} is listed twice.")
        servers.append(endpoint)
    if len(servers) > MAX_SERVERS:
        raise SettingsError(f"llama.cpp takes at most {MAX_SERVERS} RPC servers; {len(servers)} are listed.")
    return tuple(servers)



@dataclass(frozen=True)
class SamplingSettings:
    """Temperature 0 is greedy. Each filter is off at its neutral value (top_k 0, top_p 1, min_p 0)."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int = -1
    max_tokens: int = 512
    # Structured output (app.engine.grammar): "" free text, "json_object" any JSON object, else a JSON Schema.
    response_format: str = ""
    # OpenAI's penalties, as llama.cpp's penalties sampler applies them over the last repeat_last_n tokens.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # (token id, bias) pairs added to the logits before the penalties; ids are checked against the vocabulary
    # when an answer starts (app.engine.speculative), since only the loaded model knows its size.
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: bool = False  # each emitted token's log probability under the target (app.events.TokenLogprob)
    top_logprobs: int = 0  # and the most likely tokens at its position, up to MAX_TOP_LOGPROBS
    # The window's stop strings: the answer ends before the first (app.engine.stops); the API's are Job.stops.
    stops: tuple[str, ...] = ()

    def validate(self) -> SamplingSettings:
        _number("Temperature", self.temperature, 0.0, 5.0)
        _number("Top-k", self.top_k, 0, 1_000_000, integer=True)
        _number("Top-p", self.top_p, 0.0, 1.0)
        if self.top_p == 0.0:
            raise SettingsError("Top-p must be above 0 (1 turns it off).")
        _number("Min-p", self.min_p, 0.0, 1.0)
        _number("Repetition penalty", self.repeat_penalty, 0.5, 3.0)
        _number("Repetition window", self.repeat_last_n, 0, 65536, integer=True)
        _number("Seed", self.seed, -1, 2**63 - 1, integer=True)
        _number("Max tokens", self.max_tokens, 1, MAX_CTX, integer=True)
        if len(self.response_format) > MAX_RESPONSE_FORMAT_CHARS:
            raise SettingsError(f"The response format is {len(self.response_format)} characters; at most "
                                f"{MAX_RESPONSE_FORMAT_CHARS} are taken.")
        _number("Presence penalty", self.presence_penalty, -2.0, 2.0)
        _number("Frequency penalty", self.frequency_penalty, -2.0, 2.0)
        _logit_bias(self.logit_bias)
        _flag("Log probabilities", self.logprobs)
        _number("Top log probabilities", self.top_logprobs, 0, MAX_TOP_LOGPROBS, integer=True)
        if self.top_logprobs and not self.logprobs:
            raise SettingsError("Top log probabilities need log probabilities turned on.")
        _stops(self.stops)
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether any penalty changes the logits (each is off at its neutral value, or with no window)."""
        return self.repeat_last_n > 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0)


def _logit_bias(value: object) -> None:
    """(token id, bias) pairs: each id once, biases as OpenAI bounds them."""
    if not isinstance(value, tuple | list):
        raise SettingsError(f"Logit bias must be a list of (token id, bias) pairs, not {reprlib.repr(value)}.")
    if len(value) > MAX_LOGIT_BIAS:
        raise SettingsError(f"Logit bias takes at most {MAX_LOGIT_BIAS} tokens; {len(value)} are given.")
    seen: set[int] = set()
    for pair in value:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise SettingsError(f"Logit bias must be a list of (token id, bias) pairs, not {reprlib.repr(pair)}.")
        token, bias = pair
        _number("A logit bias's token id", token, 0, 2**31 - 1, integer=True)
        _number(f"The logit bias of token {token}", bias, -MAX_BIAS, MAX_BIAS)
        if token in seen:
            raise SettingsError(f"Logit bias lists token {token} twice.")
        seen.add(token)


def _stops(value: object) -> None:
    if not isinstance(value, tuple | list) or not all(isinstance(s, str) for s in value):
        raise SettingsError(f"Stop strings must be a list of text, not {reprlib.repr(value)}.")
    if len(value) > MAX_STOPS:
        raise SettingsError(f"At most {MAX_STOPS} stop strings are taken; {len(value)} are given.")
    seen: set[str] = set()
    for s in value:
        if not s:
            raise SettingsError("A stop string cannot be empty.")
        if len(s) > MAX_STOP_LENGTH:
            raise SettingsError(f"A stop string is at most {MAX_STOP_LENGTH} characters; "
                                f"“{stops_text([s[:20]])}…” has {len(s)}.")
        if s in seen:
            raise SettingsError(f"The stop string “{stops_text([s])}” is listed twice.")
        seen.add(s)


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}
_UNESCAPE = re.compile(r"\\([nt\\])")


def parse_stops(text: str) -> tuple[str, ...]:
    """The window's stop strings field: one per line, spaces kept; ``\\n`` is a new line, ``\\t`` a tab and
    ``\\\\`` a backslash (a line cannot hold a new line itself). Empty lines are skipped."""
    return tuple(_UNESCAPE.sub(lambda m: _ESCAPES[m.group(1)], line) for line in text.split("\n") if line)


def stops_text(stops: Iterable[str]) -> str:
    """``parse_stops``'s inverse: the stop strings as the field shows them."""
    return "\n".join(s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") for s in stops)


NGRAM_KEY_LENGTH = 3  # the suffix drafter's shortest match where none is chosen (window, chat, serve, tune, bench)
K_MAX = 16  # the adaptive depth's cap: measured against 8 and 32 on code edits (README, "Speed")
HISTORY_TOKENS = 1 << 16  # earlier answers from the chat history the suffix drafter reads at load, at most


@dataclass(frozen=True)
class DraftSettings:
    """How drafts are made: an optional model drafter, an optional n-gram drafter, and the depth policy."""

    drafter_path: str | None = None
    # The suffix drafter (the setting keeps the n-gram drafter's name): the shortest match it drafts from;
    # 0 = off.
    ngram: int = 0
    # Tokens of the user's earlier answers, from the chat history, that the suffix drafter reads at load (its
    # memory across chats); 0 = none. The window passes HISTORY_TOKENS unless the user turned it off.
    history_tokens: int = 0
    adaptive: bool = True
    k: int = 4  # fixed depth when not adaptive
    k_max: int = K_MAX
    p_min: float = 0.1  # a model drafter stops when its own top probability falls below this
    # The model drafter's acceptance to start from (this pair's figure measured in earlier runs); None: the
    # policy's own prior. The window, chat and serve pass the measured figure; bench only when asked, so that
    # its runs do not depend on what earlier runs recorded.
    model_start: float | None = None
    mtp: bool = False  # the target's own MTP heads draft (in the model drafter's place)

    def validate(self) -> DraftSettings:
        _path("The drafter model", self.drafter_path)
        _number("Shortest suffix match", self.ngram, 0, 16, integer=True)
        _number("Earlier answers to draft from", self.history_tokens, 0, MAX_CTX, integer=True)
        _flag("Adaptive draft depth", self.adaptive)
        _number("Draft depth k", self.k, 0, DEPTH_CAP, integer=True)
        _number("Maximum draft depth", self.k_max, 0, DEPTH_CAP, integer=True)
        _number("Drafter confidence cut", self.p_min, 0.0, 1.0)
        if self.model_start is not None:
            _number("Model drafter's starting acceptance", self.model_start, 0.0, 1.0)
        _flag("Drafting with the target's own MTP heads", self.mtp)
        if self.mtp and self.drafter_path:
            raise SettingsError("Choose a drafter model or the target's own MTP heads, not both.")
        return self

    @property
    def speculative(self) -> bool:
        return bool(self.drafter_path) or self.ngram > 0 or self.mtp


RECURRENT_ROLLBACKS = ("auto", "checkpoints")
FLASH_ATTN_MODES = ("auto", "on", "off")
# LoadSettings.n_gpu_layers: -1 puts every layer on the GPUs (llama.cpp's own "all"); AUTO_GPU_LAYERS asks the
# fit (app.ceiling.device_fit) for the most layers that fit in the GPUs' free memory, the rest on the CPU.
ALL_GPU_LAYERS = -1
AUTO_GPU_LAYERS = -2
GPU_LAYER_WORDS = {AUTO_GPU_LAYERS: "auto", ALL_GPU_LAYERS: "all"}  # how the commands and the window say them
MAX_GPU_LAYERS = 10_000


@dataclass(frozen=True)
class LoadSettings:
    target_path: str
    draft: DraftSettings = field(default_factory=DraftSettings)
    n_ctx: int = 4096
    n_batch: int = 512
    n_gpu_layers: int = AUTO_GPU_LAYERS  # AUTO_GPU_LAYERS: as many as fit; ALL_GPU_LAYERS (-1): all; N: N layers
    main_gpu: int | None = None  # None: llama.cpp spreads the layers over its GPUs; an index: that GPU alone
    flash_attn: str = "auto"  # auto | on | off
    kv_type: str = "f16"
    n_threads: int = 0  # 0 = physical cores
    # How a recurrent or hybrid target takes back rejected drafts: "auto" uses llama.cpp's state snapshots
    # where its architecture has them and checkpoints elsewhere; "checkpoints" always saves a checkpoint.
    recurrent_rollback: str = "auto"
    # llama.cpp RPC servers ("host:port") that take the layers, split by their free memory (app.ceiling.rpc).
    rpc_servers: tuple[str, ...] = ()

    def validate(self) -> LoadSettings:
        if not self.target_path:
            raise SettingsError("Choose a target model first.")
        _path("The target model", self.target_path)
        _number("Context size", self.n_ctx, 16, MAX_CTX, integer=True)
        _number("Batch size", self.n_batch, 16, 65536, integer=True)
        layers = self.n_gpu_layers
        if layers != AUTO_GPU_LAYERS:
            if isinstance(layers, str) or (isinstance(layers, int | float) and layers < ALL_GPU_LAYERS):
                raise SettingsError(f"GPU layers must be auto, all or a number from 0 to {MAX_GPU_LAYERS}, not "
                                    f"{layers if isinstance(layers, str) else _show(layers)}.")
            _number("GPU layers", layers, ALL_GPU_LAYERS, MAX_GPU_LAYERS, integer=True)
        if self.main_gpu is not None:
            _number("Main GPU", self.main_gpu, 0, 64, integer=True)
        _number("Threads", self.n_threads, 0, 1024, integer=True)
        if self.flash_attn not in FLASH_ATTN_MODES:
            raise SettingsError(f"Flash attention must be auto, on or off, not {self.flash_attn!r}.")
        if self.kv_type not in KV_TYPES:
            raise SettingsError(f"KV cache type must be one of {', '.join(KV_TYPES)}, not {self.kv_type!r}.")
        if self.recurrent_rollback not in RECURRENT_ROLLBACKS:
            raise SettingsError(f"Recurrent rollback must be one of {', '.join(RECURRENT_ROLLBACKS)}, "
                                f"not {self.recurrent_rollback!r}.")
        if parse_rpc_servers(self.rpc_servers) != tuple(self.rpc_servers):
            raise SettingsError("RPC servers are written host:port, each once.")
        if self.rpc_servers and self.main_gpu is not None:
            raise SettingsError("With RPC servers the layers are split over every device: choose all GPUs, not "
                                "one GPU.")
        if kv_quantized(self.kv_type) and self.flash_attn == "off":
            raise SettingsError("A quantized KV cache needs flash attention: set it to auto or on.")
        self.draft.validate()  # first: an out-of-range depth is named with its own limit
        if self.draft.k_max + 1 > self.n_batch:
            raise SettingsError(f"The batch size ({self.n_batch}) must be larger than the maximum draft depth "
                                f"({self.draft.k_max}); raise the batch size or lower the depth.")
        return self

    def context_note(self, loaded_n_ctx: int) -> str | None:
        """What to tell the user when llama.cpp made the context larger than asked (it rounds up to 256)."""
        if loaded_n_ctx <= self.n_ctx:
            return None
        return (f"The context was raised from the {self.n_ctx} tokens asked for to {loaded_n_ctx}, the "
                "smallest size llama.cpp allocates for it.")




def flash_attention_mode(setting: str, backend: str, n_gpu_layers: int, kv_type: str = "f16") -> str:
    """The flash-attention setting as llama.cpp gets it: "auto" is "off" where layers go to a Vulkan device.

    The vendored llama.cpp's Vulkan flash attention crashes (SIGSEGV) on a pass after a rollback of the KV
    cache (SmolLM2-135M on Mesa's llvmpipe: 8 tokens, +1, rolled back, +3), and speculative decoding rolls
    back after every rejected draft; "auto" turns it on there. "on" stays the user's choice, and a quantized
    KV cache keeps "auto" (llama.cpp refuses a quantized V cache without flash attention).
    """
    if setting == "auto" and backend == "vulkan" and n_gpu_layers != 0 and not kv_quantized(kv_type):
        return "off"
    return setting


def fit_flash_attention(setting: str, backend: str, n_gpu_layers: int, kv_type: str = "f16") -> bool:
    """Whether the fit estimate counts flash attention on: as the load will run it (``flash_attention_mode``;
    llama.cpp's "auto" turns it on wherever the layers' device supports it, as every backend here does)."""
    return flash_attention_mode(setting, backend, n_gpu_layers, kv_type) != "off"


def threads_beside_window() -> int:
    """CPU threads for the engine when the window shares the machine.

    llama.cpp's threads meet at a barrier after every operation, so one thread preempted by the window
    stalls all of them; leaving the window one core costs far less than sharing (measured on 2 cores:
    plain decode 137 tok/s on one thread alone, about 100 on two threads beside the window).
    """
    import os

    import psutil

    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return max(1, cores - 1)

